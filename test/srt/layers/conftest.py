"""The KDA kernel interface tests drive our Triton kernels on CPU through Triton's interpreter."""

import os

os.environ["TRITON_INTERPRET"] = "1"
