"""KDA / GDN ops in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

Two ops, each with a plan (what ``delta_rule/dispatch.py`` picks on a device for
the shapes we serve) and a boot gate (the picked implementation on a few tiny
shapes against an FP64 oracle of a *different* algorithm, so one broken
building block cannot make the path and its oracle agree):

| op | implementations | oracle |
|---|---|---|
| ``delta_rule_decode`` (decode, verify) | ``triton:<tile table>``: ``gated_delta_recurrent_triton``; ``torch``: :func:`decode_torch` (token loop) | chunked WY form (``naive.kda_chunk``), FP64 |
| ``delta_rule_prefill`` (extend) | ``triton:...``: ``gated_delta_chunk_triton``; ``torch``: :func:`prefill_torch` (chunked WY form) | token-by-token recurrence (``naive.gated_delta_recurrent``), FP64 |

Gate cases (issue 9): KDA safe gate with a padding row, KDA standard gate over a
3-token verify window, GDN with grouped value heads; prefill over two packed
sequences (one resumed from a state, one from zeros) that cross chunk borders.
"""

from __future__ import annotations

from typing import Callable, List, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch
from sgl_hybrid_kernel.delta_rule.dispatch import choose_chunk, choose_group_scan, choose_recurrent
from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA_SAFE
from sgl_hybrid_kernel.delta_rule.naive import decode_torch, gated_delta_recurrent, prefill_torch, _chunked_fp64, _gate
from sgl_hybrid_kernel.norm import reference as norm_ref

# The shapes the plan asks the dispatchers about: Kimi K3 at TP8 (12 KDA heads x 128).
PLAN_HEADS, PLAN_HEAD_DIM = 12, 128
# FP32 paths vs an FP64 oracle on O(1) values: observed errors are ~1e-7 (CPU,
# interpreter) to ~1e-6 (GPU); a wrong gate, sign or state row is off by ~1e-1.
TOLERANCE = 1e-4


# ------------------------------------------------------------------ gate inputs
def _inputs(seed, N, H, HV, K, V, gate, slots, device):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(N, H, K, generator=gen), torch.randn(N, H, K, generator=gen)
    v = torch.randn(N, HV, V, generator=gen)
    f = torch.randn(N, HV, K, generator=gen) if gate == "kda" else torch.randn(N, HV, generator=gen)
    b = torch.randn(N, HV, generator=gen)
    A_log = torch.rand(HV, generator=gen)
    dt_bias = torch.randn(HV * K if gate == "kda" else HV, generator=gen)
    pool = 0.5 * torch.randn(slots, HV, V, K, generator=gen)  # SGLang's KDA pool layout ("vk")
    return [t.to(device) for t in (q, k, v, f, b, A_log, dt_bias, pool)]


# (name, gate, lower_bound, B, T, H, HV, K, V, slot per request)
DECODE_CASES = [
    ("kda-safe decode", "kda", -5.0, 3, 1, 2, 2, 16, 8, [4, -1, 1]),
    ("kda verify", "kda", None, 2, 3, 2, 2, 16, 8, [0, 3]),
    ("gdn decode GVA", "gdn", None, 2, 1, 1, 2, 16, 8, [2, 0]),
]
# (name, gate, lower_bound, sequence lengths, H, HV, K, V, slots, resume from the slot's state?)
PREFILL_CASES = [
    ("kda-safe extend", "kda", -5.0, [5, 19], 2, 2, 16, 8, [3, 1], [1, 0]),
    ("gdn extend GVA", "gdn", None, [18, 7], 1, 2, 16, 8, [0, 2], [0, 1]),
]


def _describe(cases, prefill: bool) -> str:
    if prefill:
        return "; ".join(f"{c[0]} lens={c[3]} H={c[4]} HV={c[5]} K={c[6]} V={c[7]}" for c in cases)
    return "; ".join(f"{c[0]} B={c[3]} T={c[4]} H={c[5]} HV={c[6]} K={c[7]} V={c[8]}" for c in cases)


def _decode_impl(impl: str) -> Callable:
    if impl == "torch":
        return decode_torch
    if impl.startswith("triton"):
        from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton

        return gated_delta_recurrent_triton
    raise ValueError(f"impl: no delta_rule_decode implementation named {impl!r}")


def _prefill_impl(impl: str) -> Callable:
    if impl == "torch":
        return lambda *a, **kw: prefill_torch(*a, chunk_size=8, **kw)  # several chunks on the short gate sequences
    if impl.startswith("triton"):
        from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton

        return gated_delta_chunk_triton
    raise ValueError(f"impl: no delta_rule_prefill implementation named {impl!r}")


def gate_decode(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``delta_rule_decode``: outputs and committed states of ``impl`` vs the FP64 chunked form.

    Raises:
        ValueError: unknown ``impl``.
    """
    fn = _decode_impl(impl)
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, gate, lb, B, T, H, HV, K, V, slots) in enumerate(DECODE_CASES):
        q, k, v, f, b, A_log, dt_bias, pool = _inputs(100 + n, B * T, H, HV, K, V, gate, 5, device)
        before = pool.clone()
        idx = torch.tensor(slots, dtype=torch.int32, device=device)
        o = fn(q, k, v, f, b, A_log, dt_bias, pool, idx, T, gate, lb, state_layout="vk")
        g = _gate(f, A_log, dt_bias, gate, lb)
        for i, slot in enumerate(slots):
            sl = slice(i * T, (i + 1) * T)
            if slot < 0:
                pairs.append((o[sl], torch.zeros_like(o[sl])))
                continue
            ro, rS = _chunked_fp64(norm_ref.l2_norm(q[sl]), norm_ref.l2_norm(k[sl]), v[sl], g[sl], torch.sigmoid(b[sl].float()),
                                   before[slot].transpose(-1, -2), chunk_size=2)
            pairs += [(o[sl], ro), (pool[slot].transpose(-1, -2), rS)]
        untouched = [s for s in range(pool.shape[0]) if s not in slots]
        pairs.append((pool[untouched], before[untouched]))
    return _dispatch.GateResult("delta_rule_decode", impl, _dispatch.max_abs_error(pairs), TOLERANCE,
                                _describe(DECODE_CASES, prefill=False))


def gate_prefill(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``delta_rule_prefill``: outputs and final states of ``impl`` vs the FP64 token recurrence.

    Raises:
        ValueError: unknown ``impl``.
    """
    fn = _prefill_impl(impl)
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, gate, lb, lens, H, HV, K, V, slots, resume) in enumerate(PREFILL_CASES):
        q, k, v, f, b, A_log, dt_bias, pool = _inputs(200 + n, sum(lens), H, HV, K, V, gate, 4, device)
        before = pool.clone()
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
        idx = torch.tensor(slots, dtype=torch.int32, device=device)
        init = torch.tensor(resume, dtype=torch.int32, device=device)
        o = fn(q, k, v, f, b, A_log, dt_bias, cu, pool, idx, init, gate, lb, state_layout="vk")
        g = _gate(f, A_log, dt_bias, gate, lb)
        for i, slot in enumerate(slots):
            sl = slice(int(cu[i]), int(cu[i + 1]))
            s0 = before[slot].transpose(-1, -2) if resume[i] else None
            ro, rS, _ = gated_delta_recurrent(norm_ref.l2_norm(q[sl]), norm_ref.l2_norm(k[sl]), v[sl], g[sl],
                                                        torch.sigmoid(b[sl].float()), initial_state=s0, acc_dtype=torch.float64)
            pairs += [(o[sl], ro), (pool[slot].transpose(-1, -2), rS)]
    return _dispatch.GateResult("delta_rule_prefill", impl, _dispatch.max_abs_error(pairs), TOLERANCE,
                                _describe(PREFILL_CASES, prefill=True))


# ------------------------------------------------------------------ plans
def _plan_tensors(device):
    q = torch.empty(1, PLAN_HEADS, PLAN_HEAD_DIM, device=device)
    state = torch.empty(1, PLAN_HEADS, PLAN_HEAD_DIM, PLAN_HEAD_DIM, dtype=torch.float32, device=device)
    return q, q, state


def _recorded(op: str) -> _dispatch.KernelChoice:
    return next(c for c in _dispatch.chosen_paths() if c.op == op)


def plan_decode(device) -> _dispatch.KernelChoice:
    """What ``choose_recurrent`` picks on ``device`` for Kimi K3 TP8 shapes (recorded and returned)."""
    choose_recurrent(*_plan_tensors(device), 1, GATE_KDA_SAFE)
    return _recorded("delta_rule_decode")


def plan_prefill(device) -> _dispatch.KernelChoice:
    """What ``choose_chunk`` picks on ``device`` for Kimi K3 TP8 shapes (recorded and returned); also
    records the group-scan choice (``choose_group_scan``) for one 4,096-token sequence, the shape the
    mode is for, so the start-up table lists it."""
    q, v, state = _plan_tensors(device)
    choose_chunk(q, v, state, GATE_KDA_SAFE, -5.0)
    choose_group_scan(q, v, [4096])
    return _recorded("delta_rule_prefill")


_dispatch.register_op("delta_rule_decode", plan_decode, gate_decode, "KDA/GDN decode and verify (gated delta rule)")
_dispatch.register_op("delta_rule_prefill", plan_prefill, gate_prefill, "KDA/GDN chunked prefill / extend")
