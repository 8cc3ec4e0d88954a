"""MLA decode / extend in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

| op | implementations | oracle |
|---|---|---|
| ``mla_decode`` | ``aiter`` (``mla_decode_fwd`` through ``aiter_adapter.mla_decode_aiter``, query heads padded), ``triton`` (``mla_attention_paged_triton`` with the dispatcher's tile for the device), ``torch`` (``mla_attention_paged_reference``) | FP64 softmax over the gathered cache rows |
| ``mla_extend`` (prefill after a prefix hit, verify) | ``triton``, ``torch`` | the same FP64 oracle with the causal limit per row |

The plans run ``mla.dispatch.mla_decode`` / ``mla_extend`` once on a one-request,
one-position problem of Kimi K3's TP8 shapes (12 query heads per rank,
``kv_lora_rank`` 512, rope dim 64, BF16 query and cache): the dispatcher has no
public function that only names its choice, so it is asked by a tiny call, which
records the choice (on ROCm with aiter: the ``aiter`` row with its head padding).

Gate cases: pages out of order, a request with no cached position (must give
``(0, -inf)``), ``R = 128, P = 16`` with 3 heads, and Kimi K3's ``R = 512, P = 64``
at 12 heads. FP32 on the Triton / torch paths; the aiter path takes BF16 and
Kimi K3's shape only (its assembly kernels exist for ``R + P = 576``).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch
from sgl_hybrid_kernel.delta_rule.dispatch import device_kind

# Kimi K3 at TP8: 12 query heads per rank, latent rank 512, rope dim 64.
PLAN_HEADS, PLAN_RANK, PLAN_ROPE = 12, 512, 64
PLAN_EXTEND_TOKENS = 5  # a verify window (draft tokens + 1)
# FP32 vs FP64 on O(1) values: ~1e-7 observed; BF16 (aiter): inputs and output rounded
# to BF16 (2^-9 relative). A wrong scale, mask or page lookup is off by >= ~1e-1.
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}

# (name, heads, R, P, page size, kv_lens, query rows per request (extend))
DECODE_CASES = [
    ("shuffled pages + empty request", 3, 128, 16, 4, [9, 0, 5], None),
    ("kimi-k3 TP8 heads", PLAN_HEADS, PLAN_RANK, PLAN_ROPE, 1, [6, 3], None),
]
EXTEND_CASES = [
    ("prefix hit + verify", 3, 128, 16, 4, [11, 4], [3, 1]),
    ("kimi-k3 TP8 heads", PLAN_HEADS, PLAN_RANK, PLAN_ROPE, 1, [5], [2]),
]


def _describe(cases) -> str:
    out = []
    for name, H, R, P, ps, lens, T in cases:
        out.append(f"{name} H={H} R={R} P={P} page={ps} lens={lens}" + (f" T={T}" if T else ""))
    return "; ".join(out)


def _problem(seed: int, H: int, R: int, P: int, page_size: int, lens: Sequence[int], T: Optional[Sequence[int]],
             dtype: torch.dtype, device):
    """Random query rows and a paged cache whose pages are handed out in a shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    rows_per = list(T) if T else [1] * len(lens)
    pages = [max(1, math.ceil(L / page_size)) for L in lens]
    total = sum(pages) + 1  # one page nobody owns
    perm = torch.randperm(total, generator=gen)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at:at + n].to(torch.int32)
        at += n
    q = torch.randn(sum(rows_per), H, R + P, generator=gen)
    cache = torch.randn(total, page_size, R + P, generator=gen)
    qo = torch.tensor([0] + torch.tensor(rows_per).cumsum(0).tolist(), dtype=torch.int32)
    kv = torch.tensor(lens, dtype=torch.int32)
    move = lambda t: t.to(device)  # noqa: E731
    return move(q.to(dtype)), move(cache.to(dtype)), move(table), move(kv), move(qo), rows_per


def _oracle(q, cache, table, lens, rows_per, page_size: int, R: int, sm_scale: float):
    """FP64: each query row's softmax over the cache rows it may see, gathered by position."""
    q, cache = q.double().cpu(), cache.double().cpu().reshape(-1, q.shape[-1])
    table = table.cpu().long()
    N, H = q.shape[:2]
    o = torch.zeros(N, H, R, dtype=torch.float64)
    lse = torch.full((N, H), float("-inf"), dtype=torch.float64)
    n = 0
    for b, (L, T) in enumerate(zip(lens, rows_per)):
        for t in range(T):
            visible = L - T + t + 1  # causal: the row's own position is the last it sees
            if visible > 0:
                pos = torch.arange(visible)
                kv = cache[table[b, pos // page_size] * page_size + pos % page_size]  # [S, R + P]
                s = sm_scale * q[n] @ kv.T  # [H, S]
                lse[n] = torch.logsumexp(s, -1)
                o[n] = torch.softmax(s, -1) @ kv[:, :R]
            n += 1
    return o, lse


def _lse_pairs(got: torch.Tensor, want: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """LSE compared where finite, and ``-inf`` exactly where the oracle has it."""
    got, want = got.double().cpu(), want.double().cpu()
    empty = torch.isneginf(want)
    return [(torch.isneginf(got).double(), empty.double()),
            (got.masked_fill(empty, 0.0), want.masked_fill(empty, 0.0))]


def _run(op: str, impl: str, q, cache, table, kv, qo, max_T: int, sm_scale: float, page_size: int, R: int):
    from sgl_hybrid_kernel.mla.reference import mla_attention_paged_reference

    decode = op == "mla_decode"
    if impl == "torch":
        return mla_attention_paged_reference(q, cache, table, kv, sm_scale, page_size, None if decode else qo, R)
    if impl == "triton":
        from sgl_hybrid_kernel.mla.attention import choose_tile, default_tile, mla_attention_paged_triton

        _, rows = choose_tile(q.shape[1], max_T)
        tile = default_tile(device_kind(q), rows, R, False)  # the dispatcher's tile for this device
        if decode:
            return mla_attention_paged_triton(q, cache, table, kv, sm_scale, page_size, None, 1, R, **tile)
        return mla_attention_paged_triton(q, cache, table, kv, sm_scale, page_size, qo, max_T, R, **tile)
    if impl == "aiter" and decode:
        from sgl_hybrid_kernel.mla.aiter_adapter import mla_decode_aiter
        from sgl_hybrid_kernel.mla.dispatch import aiter_mla_decode_fn

        fn = aiter_mla_decode_fn()
        if fn is None:
            raise ValueError("impl: 'aiter' chosen but aiter does not import")
        return mla_decode_aiter(q, cache, table, kv, sm_scale, page_size, R, decode_fn=fn)
    raise ValueError(f"impl: no {op} implementation named {impl!r}")


def _gate(op: str, impl: str, device) -> _dispatch.GateResult:
    if impl not in (("aiter", "triton", "torch") if op == "mla_decode" else ("triton", "torch")):
        raise ValueError(f"impl: no {op} implementation named {impl!r}")
    cases = DECODE_CASES if op == "mla_decode" else EXTEND_CASES
    if impl == "aiter":  # aiter's decode kernels: BF16, R + P = 576 only
        cases = [c for c in cases if (c[2], c[3]) == (PLAN_RANK, PLAN_ROPE)]
        cases = [(n, H, R, P, ps, lens + [0], T) for n, H, R, P, ps, lens, T in cases]  # + an empty request
    dtype, tol = (torch.bfloat16, TOLERANCE["bf16"]) if impl == "aiter" else (torch.float32, TOLERANCE["fp32"])
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, H, R, P, ps, lens, T) in enumerate(cases):
        q, cache, table, kv, qo, rows_per = _problem(500 + n, H, R, P, ps, lens, T, dtype, device)
        sm_scale = (R + P) ** -0.5
        o, lse = _run(op, impl, q, cache, table, kv, qo, max(rows_per), sm_scale, ps, R)
        want_o, want_lse = _oracle(q, cache, table, lens, rows_per, ps, R, sm_scale)
        pairs += [(o, want_o)] + _lse_pairs(lse, want_lse)
    return _dispatch.GateResult(op, impl, _dispatch.max_abs_error(pairs), tol, _describe(cases))


def gate_mla_decode(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``mla_decode``: ``impl`` (``aiter`` / ``triton`` / ``torch``) vs the FP64 oracle.

    Raises:
        ValueError: unknown ``impl``, or ``"aiter"`` without aiter.
    """
    return _gate("mla_decode", impl, device)


def gate_mla_extend(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``mla_extend``: ``impl`` (``triton`` / ``torch``) vs the FP64 causal oracle (ValueError for others)."""
    return _gate("mla_extend", impl, device)


def _recorded(op: str) -> _dispatch.KernelChoice:
    return next(c for c in _dispatch.chosen_paths() if c.op == op)


def _plan_problem(device, tokens: int):
    D = PLAN_RANK + PLAN_ROPE
    q = torch.zeros(tokens, PLAN_HEADS, D, dtype=torch.bfloat16, device=device)
    cache = torch.zeros(tokens, 1, D, dtype=torch.bfloat16, device=device)  # page size 1, as SGLang's MLA pool
    table = torch.arange(tokens, dtype=torch.int32, device=device).view(1, tokens)
    kv = torch.full((1,), tokens, dtype=torch.int32, device=device)
    return q, cache, table, kv


def plan_mla_decode(device) -> _dispatch.KernelChoice:
    """What ``mla.dispatch.mla_decode`` picks on ``device`` for Kimi K3 TP8 (BF16, 12 heads, 512 + 64; recorded)."""
    from sgl_hybrid_kernel.mla.dispatch import mla_decode

    q, cache, table, kv = _plan_problem(device, 1)
    mla_decode(q, cache, table, kv, (PLAN_RANK + PLAN_ROPE) ** -0.5, page_size=1, kv_lora_rank=PLAN_RANK,
               num_splits=1)
    return _recorded("mla_decode")


def plan_mla_extend(device) -> _dispatch.KernelChoice:
    """What ``mla.dispatch.mla_extend`` picks on ``device`` for a Kimi K3 TP8 verify window (recorded)."""
    from sgl_hybrid_kernel.mla.dispatch import mla_extend

    T = PLAN_EXTEND_TOKENS
    q, cache, table, kv = _plan_problem(device, T)
    qo = torch.tensor([0, T], dtype=torch.int32, device=device)
    mla_extend(q, cache, table, kv, qo, T, (PLAN_RANK + PLAN_ROPE) ** -0.5, page_size=1, kv_lora_rank=PLAN_RANK)
    return _recorded("mla_extend")


_dispatch.register_op("mla_decode", plan_mla_decode, gate_mla_decode, "MLA decode over the paged latent cache")
_dispatch.register_op("mla_extend", plan_mla_extend, gate_mla_extend, "MLA extend / verify with a cached prefix")
