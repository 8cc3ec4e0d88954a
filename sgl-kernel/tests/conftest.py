"""Kernel tests run the Triton kernels on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` is read when a kernel is *decorated*, so it is set here,
before any test imports a kernel module. The cross-compile gate, which needs
compiled (not interpreted) kernels, runs in a subprocess without it.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def _pin_xdist_worker():
    """Under pytest-xdist (``make test`` runs two workers), give each worker its own share of the
    cores and one thread per core, inherited by the servers and subprocesses it starts. Without
    it two workers' torch / OpenMP thread pools (and their servers') each spin on every core, and
    on the 2-core CI machine a test that takes a minute alone took over ten. (test/conftest.py has the
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
