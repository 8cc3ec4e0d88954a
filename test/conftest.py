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


import pytest


@pytest.fixture(autouse=True)
def _restore_plugin_environment():
    """Our plugin's CLI hooks export flags as ``SGLANG_HYBRID_*`` environment variables for the
    scheduler processes; a test that parses such flags in-process must not leak them into later
    tests (a leaked precision or boot-gate flag would change every server started afterwards)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("SGLANG_HYBRID_")}
    yield
    for k in [k for k in os.environ if k.startswith("SGLANG_HYBRID_")]:
        if k not in before:
            del os.environ[k]
    os.environ.update(before)
