"""The start-up op table and the boot gates (issue 9).

For every op registered in ``sgl_hybrid_kernel.dispatch`` (``registered_ops``):

1. *plan*: ask its dispatcher what it picks on this process's device for the
   shapes we serve (aiter / ``triton:<config>`` / ``torch``) and why;
2. log the table op -> implementation -> why, once per process;
3. *gate*: run the picked implementation on a few tiny shapes on the device and
   compare it with an FP64 torch oracle; if any op fails (error above its
   tolerance, NaN, or an exception), raise :class:`BootGateError` naming each
   failed op, so the server refuses to start instead of serving wrong numbers.

``--skip-boot-gates`` (or ``SGLANG_HYBRID_SKIP_BOOT_GATES=1``) keeps step 2 and
skips step 3. On CPU every op's path is plain torch: the gates take well under a
second.
"""

from __future__ import annotations

import logging
import os
import time
from typing import List, Optional, Sequence, Tuple

from sgl_hybrid_kernel.dispatch import GateResult, KernelChoice, RegisteredOp, chosen_paths, quiet_choices, registered_ops

from sglang_hybrid.platforms import Platform, current_platform

logger = logging.getLogger("sglang_hybrid.boot")

SKIP_ENV = "SGLANG_HYBRID_SKIP_BOOT_GATES"
SKIP_FLAG = "--skip-boot-gates"


class BootGateError(RuntimeError):
    """A chosen kernel path disagrees with its torch oracle on this device."""


def skip_requested() -> bool:
    """True if ``--skip-boot-gates`` was given (the launcher exports it as ``SGLANG_HYBRID_SKIP_BOOT_GATES=1``)."""
    return os.environ.get(SKIP_ENV, "0").lower() in ("1", "true", "yes")


PLAN_ERROR = "plan-error"  # impl recorded when an op's plan raised


def plan_ops(platform: Platform, ops: Optional[Sequence[RegisteredOp]] = None) -> List[Tuple[RegisteredOp, KernelChoice]]:
    """Each op's plan on ``platform.torch_device`` (each dispatcher records its choice)."""
    device = platform.torch_device
    out = []
    for op in registered_ops() if ops is None else ops:
        try:
            with quiet_choices():  # the table (op_table) lists them once
                out.append((op, op.plan(device)))
        except Exception as exc:  # a dispatcher that cannot plan fails its gate with the reason (not a traceback)
            out.append((op, KernelChoice(op.op, PLAN_ERROR, f"{type(exc).__name__} in its plan: {exc}")))
    return out


def run_gates(plans: Sequence[Tuple[RegisteredOp, KernelChoice]], platform: Platform) -> List[GateResult]:
    """Run every planned op's gate; an exception becomes a failed :class:`GateResult` carrying its text."""
    device = platform.torch_device
    results = []
    for op, choice in plans:
        if choice.impl == PLAN_ERROR:
            results.append(GateResult(op.op, choice.impl, float("nan"), 0.0, "-", error=choice.reason))
            continue
        try:
            results.append(op.gate(choice.impl, device))
        except Exception as exc:  # a crashing kernel is a failed gate, reported with the others
            results.append(GateResult(op.op, choice.impl, float("nan"), 0.0, "-", error=f"{type(exc).__name__}: {exc}"))
    return results


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join("  " + line.rstrip() for line in lines)


def op_table(platform: Platform, choices: Sequence[KernelChoice]) -> str:
    """The start-up table: platform line, aiter line, then op -> implementation -> why."""
    aiter_ok, aiter_why = platform.aiter()
    head = (f"sglang-hybrid kernel paths on {platform.describe()} (every op of the kernel package, for both "
            f"models; the served model calls its own subset)\n"
            f"  aiter: {'usable' if aiter_ok else 'not used'} ({aiter_why})\n")
    return head + _table(("op", "implementation", "why"), [(c.op, c.impl, c.reason) for c in choices])


def gate_table(results: Sequence[GateResult]) -> str:
    """One row per gate: op, implementation, max |error|, tolerance, ok/FAIL, shapes tried."""
    rows = []
    for r in results:
        verdict = "ok" if r.ok else ("FAIL: " + r.error if r.error else "FAIL")
        rows.append((r.op, r.impl, f"{r.max_abs_err:.2e}", f"{r.tolerance:.0e}", verdict, r.cases))
    return _table(("op", "implementation", "max |err|", "tolerance", "gate", "cases"), rows)


def failure_message(platform: Platform, failed: Sequence[GateResult]) -> str:
    lines = [
        f"sglang-hybrid boot gate failed on {' '.join(filter(None, (platform.device, platform.arch)))}: "
        f"{len(failed)} kernel path(s) disagree with their torch oracle, so the server will not start:"
    ]
    for r in failed:
        if r.error:
            lines.append(f"  - {r.op} [{r.impl}]: raised {r.error}")
        else:
            lines.append(f"  - {r.op} [{r.impl}]: max |err| {r.max_abs_err:.3e} > tolerance {r.tolerance:.0e} ({r.cases})")
    lines.append(f"Start anyway with {SKIP_FLAG} (or {SKIP_ENV}=1) only if you accept wrong numbers from these paths.")
    return "\n".join(lines)


def run_boot(platform: Optional[Platform] = None, skip: Optional[bool] = None, log: Optional[logging.Logger] = None,
             full_log: bool = True) -> List[GateResult]:
    """Plan every registered op, log the op table, run the boot gates, log their results.

    Args:
        platform: default :func:`current_platform`.
        skip: default :func:`skip_requested`; True logs the table and runs no gate.
        log: logger for the tables (default ``sglang_hybrid.boot``).
        full_log: False logs one summary line instead of the tables (TP ranks > 0).

    Returns:
        The gate results (empty when skipped).

    Raises:
        BootGateError: any gate failed; the message names each op, its path and error.
    """
    platform = platform or current_platform()
    skip = skip_requested() if skip is None else skip
    log = log or logger
    t0 = time.perf_counter()
    plans = plan_ops(platform)
    planned = {c.op for _, c in plans}
    # Choices recorded earlier by other dispatchers are part of the same table.
    choices = [c for _, c in plans] + [c for c in chosen_paths() if c.op not in planned]
    if full_log:
        log.info("%s", op_table(platform, choices))
    if skip:
        log.warning("sglang-hybrid boot gates SKIPPED (%s / %s=1): kernel paths are not checked against their oracles",
                    SKIP_FLAG, SKIP_ENV)
        return []
    results = run_gates(plans, platform)
    failed = [r for r in results if not r.ok]
    if full_log:
        log.info("sglang-hybrid boot gates (%.2f s):\n%s", time.perf_counter() - t0, gate_table(results))
    else:
        log.info("sglang-hybrid boot gates: %d/%d passed", len(results) - len(failed), len(results))
    if failed:
        msg = failure_message(platform, failed)
        log.critical("%s", msg)
        raise BootGateError(msg)
    return results
