"""Shared pytest setup for the sglang-hybrid test suite (CPU CI)."""

import os
import sys

if os.environ.get("SGLANG_HYBRID_TEST_DEVICE", "cpu") == "cpu":  # `make test-gpu` sets it to cuda (test/gpu)
    # Tests run on a CPU machine; upstream's CPU engine needs this flag before
    # any sglang module decides its platform.
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    # The interface tests run our Triton kernels through upstream's call signatures on CPU tensors,
    # i.e. in Triton's interpreter, which is chosen when a kernel is decorated: set it before any
    # test imports a kernel module (sgl-kernel/tests/conftest.py does the same for the kernel tests;
    # without this line ``pytest test`` alone failed every Triton case). ``LaunchedServer`` removes it
    # from the servers' environment.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _pin_xdist_worker():
    """Under pytest-xdist (``make test`` runs two workers), give each worker its own share of the
    cores and one thread per core, inherited by the servers and subprocesses it starts. Without
    it two workers' torch / OpenMP thread pools (and their servers') each spin on every core, and
    on the 2-core CI machine a test that takes a minute alone took over ten. (sgl-kernel/tests/conftest.py has the
    same function: each suite also runs on its own, the kernel one on GPU machines without SGLang.)"""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    mine = cores[int(worker[2:]) % len(cores)::count] or cores
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))
    torch = sys.modules.get("torch")
    if torch is not None:  # imported before this conftest: its thread pool is sized already
        torch.set_num_threads(len(mine))


_pin_xdist_worker()

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
