"""KDA / GDN ops in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

Two ops, each with a plan (what ``delta_rule/dispatch.py`` picks on a device for
the shapes we serve) and a boot gate (the picked implementation on a few tiny
shapes against an FP64 oracle of a *different* algorithm, so one broken
building block cannot make the path and its oracle agree):

| op | implementations | oracle |
|---|---|---|
| ``delta_rule_decode`` (decode, verify) | ``triton:<tile table>``: ``gated_delta_recurrent_triton``; ``torch``: :func:`decode_torch` (token loop) | chunked WY form (``kda.reference.kda_chunk``), FP64 |
| ``delta_rule_prefill`` (extend) | ``triton:...``: ``gated_delta_chunk_triton``; ``torch``: :func:`prefill_torch` (chunked WY form) | token-by-token recurrence (``delta_rule.reference``), FP64 |

Gate cases (issue 9): KDA safe gate with a padding row, KDA standard gate over a
3-token verify window, GDN with grouped value heads; prefill over two packed
sequences (one resumed from a state, one from zeros) that cross chunk borders.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch
from sgl_hybrid_kernel.delta_rule import reference as delta_ref
from sgl_hybrid_kernel.delta_rule.dispatch import choose_chunk, choose_group_scan, choose_recurrent
from sgl_hybrid_kernel.gdn import reference as gdn_ref
from sgl_hybrid_kernel.kda import reference as kda_ref
from sgl_hybrid_kernel.norm import reference as norm_ref

# The shapes the plan asks the dispatchers about: Kimi K3 at TP8 (12 KDA heads x 128).
PLAN_HEADS, PLAN_HEAD_DIM = 12, 128
# FP32 paths vs an FP64 oracle on O(1) values: observed errors are ~1e-7 (CPU,
# interpreter) to ~1e-6 (GPU); a wrong gate, sign or state row is off by ~1e-1.
TOLERANCE = 1e-4


def _gate(f, A_log, dt_bias, gate, lower_bound):
    if gate == "kda":
        return kda_ref.kda_gate(f, A_log, dt_bias, lower_bound)
    if gate == "gdn":
        return gdn_ref.gdn_gate(f, A_log, dt_bias)
    raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")


def _slot_state(state, slot, state_layout):
    return state[slot] if state_layout == "kv" else state[slot].transpose(-1, -2)


def _store_state(state, slot, S, state_layout):
    state[slot] = (S if state_layout == "kv" else S.transpose(-1, -2)).to(state.dtype)


def decode_torch(q, k, v, f, b, A_log, dt_bias, state, state_indices, tokens_per_request: int = 1, gate: str = "kda",
                 lower_bound: Optional[float] = None, state_layout: str = "vk") -> torch.Tensor:
    """Plain-torch twin of ``gated_delta_recurrent_triton`` (commit, no extras): what CPU serving runs.

    Args and layouts as the Triton wrapper: ``q, k`` ``[N, H, K]``, ``v`` ``[N, HV, V]``,
    ``N = B * T`` request-major; raw ``f`` (``[N, HV, K]`` KDA, ``[N, HV]`` GDN) and ``b``;
    FP32 pool ``[slots, HV, V, K]`` (``"vk"``) or ``[slots, HV, K, V]`` (``"kv"``); slot < 0 = padding.

    Returns:
        ``o`` ``[N, HV, V]`` (zeros on padding rows); the pool is updated in place.
    """
    T = int(tokens_per_request)
    H, HV = q.shape[1], v.shape[1]
    g = _gate(f, A_log, dt_bias, gate, lower_bound)
    beta = torch.sigmoid(b.float())
    o = torch.zeros_like(v)
    for i, slot in enumerate(state_indices.tolist()):
        if slot < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        qi, ki = norm_ref.l2_norm(q[sl]), norm_ref.l2_norm(k[sl])
        s0 = _slot_state(state, slot, state_layout)
        if gate == "kda" and H == HV:
            oi, S = kda_ref.kda_recurrent(qi, ki, v[sl], g[sl], beta[sl], initial_state=s0)
        else:
            oi, S, _ = delta_ref.gated_delta_recurrent(qi, ki, v[sl], g[sl], beta[sl], initial_state=s0)
        o[sl] = oi
        _store_state(state, slot, S, state_layout)
    return o


def _chunked_fp64(q, k, v, g, beta, s0, chunk_size):
    """The chunked WY form in FP64, for grouped value heads and per-head decay too."""
    G = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(G, 1), k.repeat_interleave(G, 1)
    if g.dim() == 2:
        g = g.unsqueeze(-1).expand_as(q)
    o, S, _ = kda_ref.kda_chunk(q, k, v, g, beta, initial_state=s0, chunk_size=chunk_size, acc_dtype=torch.float64)
    return o, S


def prefill_torch(q, k, v, f, b, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state=None,
                  gate: str = "kda", lower_bound: Optional[float] = None, state_layout: str = "vk",
                  chunk_size: int = 64) -> torch.Tensor:
    """Plain-torch twin of ``gated_delta_chunk_triton`` (no checkpoints): the chunked WY form
    (``kda.reference.kda_chunk``) per packed sequence, in FP32.

    Args: as the Triton wrapper; ``chunk_size`` tokens per chunk (CPU serving uses 64).

    Returns:
        ``o`` ``[N, HV, V]``; each sequence's final state is written to its slot.
    """
    G = v.shape[1] // q.shape[1]
    g = _gate(f, A_log, dt_bias, gate, lower_bound)
    beta = torch.sigmoid(b.float())
    o = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_indices.tolist()):
        sl = slice(bounds[i], bounds[i + 1])
        resume = has_initial_state is None or bool(has_initial_state[i])
        s0 = _slot_state(state, slot, state_layout).float() if resume else None
        qi = norm_ref.l2_norm(q[sl]).repeat_interleave(G, 1)
        ki = norm_ref.l2_norm(k[sl]).repeat_interleave(G, 1)
        gi = g[sl] if g.dim() == 3 else g[sl].unsqueeze(-1).expand_as(qi)
        oi, S, _ = kda_ref.kda_chunk(qi, ki, v[sl], gi, beta[sl], initial_state=s0, chunk_size=chunk_size)
        o[sl] = oi
        _store_state(state, slot, S, state_layout)
    return o


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
        from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton

        return gated_delta_recurrent_triton
    raise ValueError(f"impl: no delta_rule_decode implementation named {impl!r}")


def _prefill_impl(impl: str) -> Callable:
    if impl == "torch":
        return lambda *a, **kw: prefill_torch(*a, chunk_size=8, **kw)  # several chunks on the short gate sequences
    if impl.startswith("triton"):
        from sgl_hybrid_kernel.delta_rule.chunk import gated_delta_chunk_triton

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
            ro, rS, _ = delta_ref.gated_delta_recurrent(norm_ref.l2_norm(q[sl]), norm_ref.l2_norm(k[sl]), v[sl], g[sl],
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
    choose_recurrent(*_plan_tensors(device))
    return _recorded("delta_rule_decode")


def plan_prefill(device) -> _dispatch.KernelChoice:
    """What ``choose_chunk`` picks on ``device`` for Kimi K3 TP8 shapes (recorded and returned); also
    records the group-scan choice (``choose_group_scan``) for one 4,096-token sequence, the shape the
    mode is for, so the start-up table lists it."""
    q, v, state = _plan_tensors(device)
    choose_chunk(q, v, state)
    choose_group_scan(q, v, [4096])
    return _recorded("delta_rule_prefill")


_dispatch.register_op("delta_rule_decode", plan_decode, gate_decode, "KDA/GDN decode and verify (gated delta rule)")
_dispatch.register_op("delta_rule_prefill", plan_prefill, gate_prefill, "KDA/GDN chunked prefill / extend")
