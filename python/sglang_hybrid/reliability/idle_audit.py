"""Idle pool audit: free + evictable + locked == capacity, and no lock held, each time the scheduler goes idle (issue 11, K12).

Upstream's idle check (``Scheduler.on_idle`` → ``SchedulerInvariantChecker``)
verifies ``available + evictable + protected (+ session-held) == total`` for
the KV pool and the recurrent-state ("mamba") pool, and with
``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1`` raises on a mismatch. It does
not see a *leaked lock*: a radix node whose ``lock_ref`` was never released
moves its tokens from "evictable" to "protected", and the sum still holds.
This audit (on only when :data:`AUDIT_ENV` is ``1``; it is a test and soak
aid) adds that check and writes the numbers to the server log, one line per
idle period:

``sglang-hybrid idle audit #3 ok: kv total=4096 free=3968 evictable=128 locked=0 session=0 |
state total=64 free=60 evictable=4 locked=0 session=0 | req_slots total=8 free=8 session=0``

========  ==================================================================
pool      quantities (units)
========  ==================================================================
``kv``    KV pool tokens: ``free`` = allocator's available size, ``evictable``
          = radix-cached and unlocked, ``locked`` = radix-cached with
          ``lock_ref > 0`` (upstream's "protected"), ``session`` = held by
          streaming sessions; ``total`` = the scheduler's capacity
``state`` recurrent-state slots (one per request or checkpoint), same columns
========  ==================================================================

``ok`` means, for both pools, ``free + evictable + locked + session == total``
and ``locked == 0`` (at idle no request runs, so nothing may hold a lock), and
every request-to-token slot is free or held by an open streaming session (which
keeps its request's row, KV and state between turns: the ``session`` columns). Otherwise the line says ``VIOLATION``
and is logged as an error. Tests parse the lines (:func:`parse_audit_lines`).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Dict, List

logger = logging.getLogger("sglang_hybrid.reliability")

AUDIT_ENV = "SGLANG_HYBRID_IDLE_AUDIT"
_LINE = re.compile(
    r"sglang-hybrid idle audit #(\d+) (ok|VIOLATION): "
    r"kv total=(-?\d+) free=(-?\d+) evictable=(-?\d+) locked=(-?\d+) session=(-?\d+) \| "
    r"state total=(-?\d+) free=(-?\d+) evictable=(-?\d+) locked=(-?\d+) session=(-?\d+) \| "
    r"req_slots total=(-?\d+) free=(-?\d+) session=(-?\d+)"
)
_POOL_KEYS = ("total", "free", "evictable", "locked", "session")


def pool_figures(scheduler) -> Dict[str, Dict[str, int]]:
    """The audit's numbers for ``scheduler`` (an upstream ``Scheduler``) at this moment.

    Returns ``{"kv": {...}, "state": {...}, "req_slots": {"total", "free", "session"}}`` with
    the columns of the module docstring (tokens for ``kv``, slots otherwise);
    ``state`` is all zeros for a model without a recurrent-state pool.
    """
    ps = scheduler.pool_stats_observer.get_pool_stats()
    tree = scheduler.tree_cache
    obs = scheduler.pool_stats_observer
    r2t = scheduler.req_to_token_pool
    alloc = scheduler.token_to_kv_pool_allocator
    hybrid_ssm = bool(getattr(ps, "is_hybrid_ssm", False))
    if hybrid_ssm:
        kv_total = r2t.schedulable_token_capacity(alloc.size)
        kv_locked = tree.full_protected_size()
    else:
        kv_total = scheduler.max_total_num_tokens
        kv_locked = tree.protected_size()
    kv = dict(total=int(kv_total), free=int(ps.full_available_size), evictable=int(ps.full_evictable_size),
              locked=int(kv_locked), session=int(obs.session_held_tokens()))
    if hybrid_ssm and ps.mamba_available_size is not None:
        state = dict(total=int(r2t.mamba_pool.size), free=int(ps.mamba_available_size),
                     evictable=int(ps.mamba_evictable_size), locked=int(tree.mamba_protected_size()),
                     session=int(obs.session_held_mamba_slots()))
    else:
        state = dict.fromkeys(_POOL_KEYS, 0)
    slots = dict(total=int(r2t.size), free=int(r2t.available_size()), session=int(obs.session_held_req_count()))
    return {"kv": kv, "state": state, "req_slots": slots}


def figures_ok(fig: Dict[str, Dict[str, int]]) -> bool:
    """True when both pools balance with nothing locked and every request slot is free."""
    for name in ("kv", "state"):
        p = fig[name]
        if p["free"] + p["evictable"] + p["locked"] + p["session"] != p["total"] or p["locked"] != 0:
            return False
    rs = fig["req_slots"]
    return rs["free"] + rs["session"] == rs["total"]


def format_audit_line(n: int, fig: Dict[str, Dict[str, int]]) -> str:
    """The log line of audit number ``n`` (parsed back by :func:`parse_audit_lines`)."""
    kv, st, rs = fig["kv"], fig["state"], fig["req_slots"]
    pool = lambda p: " ".join(f"{k}={p[k]}" for k in _POOL_KEYS)
    return (f"sglang-hybrid idle audit #{n} {'ok' if figures_ok(fig) else 'VIOLATION'}: kv {pool(kv)} | "
            f"state {pool(st)} | req_slots total={rs['total']} free={rs['free']} session={rs['session']}")


def parse_audit_lines(log_text: str) -> List[Dict[str, Any]]:
    """Every audit line in a server log, in order: ``{"n", "ok", "kv": {...}, "state": {...}, "req_slots": {...}}``."""
    out = []
    for m in _LINE.finditer(log_text):
        v = [int(x) for x in m.groups()[2:]]
        out.append({
            "n": int(m.group(1)), "ok": m.group(2) == "ok",
            "kv": dict(zip(_POOL_KEYS, v[0:5])), "state": dict(zip(_POOL_KEYS, v[5:10])),
            "req_slots": {"total": v[10], "free": v[11], "session": v[12]},
        })
    return out


def _after_on_idle(_result, scheduler, *args, **kwargs):
    # one audit per idle period: the first idle call after a forward pass
    ct = getattr(scheduler, "forward_ct", 0)
    if getattr(scheduler, "_sglang_hybrid_audit_ct", None) == ct:
        return None
    if not scheduler.is_fully_idle():
        return None
    scheduler._sglang_hybrid_audit_ct = ct
    n = getattr(scheduler, "_sglang_hybrid_audit_n", 0) + 1
    scheduler._sglang_hybrid_audit_n = n
    fig = pool_figures(scheduler)
    line = format_audit_line(n, fig)
    (logger.info if figures_ok(fig) else logger.error)(line)
    return None


def enabled() -> bool:
    return os.environ.get(AUDIT_ENV, "0") not in ("0", "", "false")


def install() -> None:
    """Register the AFTER hook on ``Scheduler.on_idle`` when :data:`AUDIT_ENV` is on (else nothing)."""
    if not enabled():
        return
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)
