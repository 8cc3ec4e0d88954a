"""Shared pytest setup for the sglang-hybrid test suite (CPU CI)."""

import os
import sys

# Tests run on a CPU machine; upstream's CPU engine needs this flag before
# any sglang module decides its platform.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

_HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("srt", os.path.join("srt", "models"), os.path.join("srt", "server")):
    path = os.path.join(_HERE, sub)
    if path not in sys.path:
        sys.path.insert(0, path)
