"""The GPU suite (``make test-gpu``): real servers on a CUDA device, upstream's model classes with our
kernels, compared with the CPU reference models' fixtures (``make_fixtures.py``).

Runs only with ``SGLANG_HYBRID_TEST_DEVICE=cuda`` (the Makefile sets it) on a machine where torch sees a
CUDA device; ``make test`` leaves this folder out. Anywhere else every test here is reported as skipped,
with that reason.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("", os.path.join("..", "srt", "server"), os.path.join("..", "srt", "models"),
            os.path.join("..", "srt", "speculative")):
    path = os.path.normpath(os.path.join(HERE, sub))
    if path not in sys.path:
        sys.path.insert(0, path)


def _why_not_runnable():
    if os.environ.get("SGLANG_HYBRID_TEST_DEVICE") != "cuda":
        return "GPU suite: run it with `make test-gpu` (SGLANG_HYBRID_TEST_DEVICE=cuda) on a CUDA machine"
    import torch

    if not torch.cuda.is_available():
        return "GPU suite: torch sees no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    why = _why_not_runnable()
    if why is None:
        return
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.skip(reason=why))
