"""Kernel-path choices: every dispatcher records what it picked and why, once.

``record_choice`` logs the first decision per op (the start-up table the
architecture asks for) and ``chosen_paths`` returns them all, e.g. for a run
manifest. Kernels here never import SGLang; the caller passes its logger.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

_LOCK = threading.Lock()
_CHOICES: Dict[str, "KernelChoice"] = {}
_CALLS: Dict[str, int] = {}  # "op=impl" -> calls (eager calls and CUDA-graph captures; a replay runs no Python)
_logger = logging.getLogger(__name__)
_QUIET = threading.local()  # set inside quiet_choices(): record without logging


@dataclass(frozen=True)
class KernelChoice:
    """One op's implementation: ``impl`` is ``"torch"``, ``"triton:<config>"`` or ``"aiter"``."""

    op: str
    impl: str
    reason: str


def record_choice(op: str, impl: str, reason: str, log: Optional[logging.Logger] = None) -> KernelChoice:
    """Record (and log once) the implementation chosen for ``op``; count the call (:func:`call_counts`)."""
    choice = KernelChoice(op, impl, reason)
    key = f"{op}={impl}"
    with _LOCK:
        previous = _CHOICES.get(op)
        _CHOICES[op] = choice
        _CALLS[key] = _CALLS.get(key, 0) + 1
    if previous != choice and not getattr(_QUIET, "on", False):
        (log or _logger).info("kernel path: %-16s -> %-10s (%s)", op, impl, reason)
    return choice


@contextlib.contextmanager
def quiet_choices():
    """Within this block (this thread) :func:`record_choice` records and counts but logs nothing:
    the start-up planning prints all its choices as one table instead of one line each."""
    before = getattr(_QUIET, "on", False)
    _QUIET.on = True
    try:
        yield
    finally:
        _QUIET.on = before


def count_call(op: str, impl: str) -> None:
    """Count one call of ``impl`` for ``op`` without logging (hot paths whose choice was logged
    at construction, e.g. the linear-attention kernels behind upstream's dispatcher)."""
    key = f"{op}={impl}"
    with _LOCK:
        _CALLS[key] = _CALLS.get(key, 0) + 1


def call_counts() -> Dict[str, int]:
    """Calls per ``"op=impl"`` in this process since start: eager calls plus CUDA-graph captures
    (a graph replay runs no Python, so it is not counted; a captured call is what every replay
    runs). The GPU tests read them through ``/get_server_info`` to prove which kernels served."""
    with _LOCK:
        return dict(sorted(_CALLS.items()))


def recorded_choice(op: str) -> Optional[KernelChoice]:
    """The choice last recorded for ``op`` (the object :func:`record_choice` returned), or None."""
    with _LOCK:
        return _CHOICES.get(op)


def chosen_paths() -> List[KernelChoice]:
    """All recorded choices, sorted by op name."""
    with _LOCK:
        return sorted(_CHOICES.values(), key=lambda c: c.op)


# ---------------------------------------------------------------- op registry
# Every op that joins the start-up table and the boot gates (issue 9) registers
# here with two functions:
#   plan(device) -> KernelChoice   ask the op's dispatcher what it picks on this
#                                  torch.device for the shapes we serve (it calls
#                                  record_choice, so the table lists it);
#   gate(impl, device) -> GateResult
#                                  run that implementation on a few tiny shapes on
#                                  the device and compare with the plain-torch oracle.
# Modules in OP_MODULES register their ops when imported; a new op family adds
# its module to the list (sglang_hybrid.boot runs plans and gates at start-up).

OP_MODULES: List[str] = [
    "sgl_hybrid_kernel.delta_rule.ops",
    "sgl_hybrid_kernel.norm.ops",
    "sgl_hybrid_kernel.moe.experts",
    "sgl_hybrid_kernel.moe.routing_ops",
    "sgl_hybrid_kernel.mla.ops",
    "sgl_hybrid_kernel.dcp.ops",
    "sgl_hybrid_kernel.qsa.ops",
    "sgl_hybrid_kernel.attn_res.ops",
]


@dataclass(frozen=True)
class GateResult:
    """One boot gate: ``impl`` of ``op`` against its oracle on ``cases`` (shapes, one line).

    ``max_abs_err`` is the largest absolute difference over every output and
    state compared; ``error`` holds the exception text if the path raised.
    """

    op: str
    impl: str
    max_abs_err: float
    tolerance: float
    cases: str
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        # NaN compares False, so a NaN output fails the gate.
        return self.error is None and self.max_abs_err <= self.tolerance


@dataclass(frozen=True)
class RegisteredOp:
    """An op of the start-up table: ``plan`` and ``gate`` as described above."""

    op: str
    plan: Callable[[Any], KernelChoice]
    gate: Callable[[str, Any], GateResult]
    description: str = ""


_OPS: Dict[str, RegisteredOp] = {}


def register_op(op: str, plan: Callable[[Any], KernelChoice], gate: Callable[[str, Any], GateResult],
                description: str = "") -> RegisteredOp:
    """Register ``op`` (idempotent for the same functions).

    Raises:
        ValueError: ``op`` is already registered with different functions.
    """
    entry = RegisteredOp(op, plan, gate, description)
    with _LOCK:
        previous = _OPS.get(op)
        if previous is not None and (previous.plan, previous.gate) != (plan, gate):
            raise ValueError(f"op {op!r} is already registered by {previous.plan.__module__}")
        _OPS[op] = entry
    return entry


def registered_ops() -> List[RegisteredOp]:
    """Import every module of :data:`OP_MODULES` (they register on import); all ops, sorted by name."""
    import importlib

    for name in OP_MODULES:
        importlib.import_module(name)
    with _LOCK:
        return sorted(_OPS.values(), key=lambda e: e.op)


def max_abs_error(pairs) -> float:
    """Largest ``|got - want|`` over ``(got, want)`` tensor pairs, compared in FP64 on the CPU
    (NaN if any value is NaN, so the gate fails)."""
    worst = 0.0
    for got, want in pairs:
        diff = (got.detach().double().cpu() - want.detach().double().cpu()).abs()
        if diff.isnan().any():
            return float("nan")
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst
