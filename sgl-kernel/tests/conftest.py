"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` is read when a kernel is *decorated*, so it is set here,
before any test imports a kernel module. The cross-compile gate, which needs
compiled (not interpreted) kernels, runs in a subprocess without it.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
