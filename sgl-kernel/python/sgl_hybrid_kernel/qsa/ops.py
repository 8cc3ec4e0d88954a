"""QSA attention in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

Two ops, one per walk that ``qsa.dispatch.choose_qsa_path`` can take (seeds digest item 13):

| op | implementations | oracle |
|---|---|---|
| ``qsa_dense`` (every visible position fits the budget) | ``triton`` (``qsa_attention_triton``, ``block_indices=None``), ``torch`` (``qsa_attention_reference``) | FP64 masked softmax over all positions |
| ``qsa_sparse`` (the indexer's selected blocks) | ``triton`` (sparse walk), ``torch`` | FP64 masked softmax, mask = causal and in a selected block |

The plans run ``qsa.dispatch.qsa_attention`` once per walk on Qwen3.8's
per-rank shapes (24 query heads over 2 KV heads, head dim 128, MTP verify of 5
positions, BF16) with host bounds that select the walk (4 requests at 2,000
visible positions: dense; 1 request at 32K: sparse over 512 blocks of 4). The
dispatcher has no public function that names its implementation without running.

Gate cases: GQA with pages handed out in shuffled order and two requests of
different verify lengths; the sparse case has a row whose selection is empty
(must give ``(0, -inf)``) and a selection with ``-1`` holes; Qwen3.8's heads
(``G = 12``, 5 positions: a 60-row dense tile) with the key range split in two
partitions (merged by LSE).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch
from sgl_hybrid_kernel.delta_rule.dispatch import device_kind

# Qwen3.8 per rank: 24 query heads over 2 KV heads, head dim 128; MTP verify of 5 positions.
PLAN_HQ, PLAN_HKV, PLAN_DIM, PLAN_T, PLAN_RATIO = 24, 2, 128, 5, 4
PLAN_DENSE = (4, 2000)  # requests, visible positions: inside every dense guard
PLAN_SPARSE = (1, 32768)  # beyond the 2,048-position budget
PLAN_BLOCKS = 2048 // PLAN_RATIO
# FP32 vs FP64 on O(1) values: ~1e-7 observed; a wrong mask, page or head group is off by >= ~1e-1.
TOLERANCE = 1e-4

# (name, Hq, Hkv, D, page size, kv_lens, rows per request, ratio, splits, selected blocks per row or None)
CASES = [
    ("GQA shuffled pages", 4, 2, 16, 2, [9, 4], [2, 1], 2, 1, [[0, 3, -1], [-1, -1, -1], [1, -1, 0]]),
    ("qwen3.8 heads, 2 partitions", PLAN_HQ, PLAN_HKV, PLAN_DIM, 1, [13], [PLAN_T], PLAN_RATIO, 2,
     [[0, 2, -1], [2, 0, 1], [1, -1, -1], [3, 0, -1], [2, 1, 0]]),
]


def _describe(sparse: bool) -> str:
    return "; ".join(f"{c[0]} Hq={c[1]} Hkv={c[2]} D={c[3]} lens={c[5]} T={c[6]}" + (f" ratio={c[7]}" if sparse else "")
                     for c in CASES)


def _problem(seed: int, Hq: int, Hkv: int, D: int, page_size: int, lens: Sequence[int], rows: Sequence[int], device):
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-L // page_size) for L in lens]
    perm = torch.randperm(sum(pages) + 1, generator=gen)  # one spare page nobody owns
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at:at + n].to(torch.int32)
        at += n
    slots = (sum(pages) + 1) * page_size
    q = torch.randn(sum(rows), Hq, D, generator=gen)
    k = torch.randn(slots, Hkv, D, generator=gen)
    v = torch.randn(slots, Hkv, D, generator=gen)
    qo = torch.tensor([0] + torch.tensor(rows).cumsum(0).tolist(), dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, table, torch.tensor(lens, dtype=torch.int32), qo)]


def _oracle(q, k, v, table, lens, rows, page_size: int, sm_scale: float, blocks: Optional[Sequence[Sequence[int]]],
            ratio: int):
    """FP64: per request, scores against every position, masked by causality (and the selected blocks)."""
    q, k, v, table = q.double().cpu(), k.double().cpu(), v.double().cpu(), table.cpu().long()
    G = q.shape[1] // k.shape[1]
    o = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    n0 = 0
    for b, (L, T) in enumerate(zip(lens, rows)):
        pos = torch.arange(L)
        slot = table[b, pos // page_size] * page_size + pos % page_size
        kb, vb = k[slot].repeat_interleave(G, 1), v[slot].repeat_interleave(G, 1)  # [L, Hq, D]
        n = torch.arange(n0, n0 + T)
        mask = pos.unsqueeze(0) <= (L - T + torch.arange(T)).unsqueeze(1)  # [T, L]
        if blocks is not None:
            chosen = torch.tensor([blocks[i] for i in n.tolist()])  # [T, NB]
            mask &= ((pos // ratio).view(1, L, 1) == chosen.unsqueeze(1)).any(-1)
        s = torch.einsum("thd,lhd->thl", q[n], kb) * sm_scale
        s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
        seen = mask.any(-1)
        lse[n] = torch.where(seen.unsqueeze(1), torch.logsumexp(s, -1), lse[n])
        o[n] = torch.where(seen.view(T, 1, 1), torch.einsum("thl,lhv->thv", torch.softmax(s, -1), vb), o[n])
        n0 += T
    return o, lse


def _gate(op: str, impl: str, device) -> _dispatch.GateResult:
    if impl not in ("triton", "torch"):
        raise ValueError(f"impl: no {op} implementation named {impl!r}")
    sparse = op == "qsa_sparse"
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, Hq, Hkv, D, ps, lens, rows, ratio, splits, blocks) in enumerate(CASES):
        q, k, v, table, kv, qo = _problem(700 + n, Hq, Hkv, D, ps, lens, rows, device)
        idx = torch.tensor(blocks, dtype=torch.int32, device=device) if sparse else None
        scale = D ** -0.5
        if impl == "torch":
            from sgl_hybrid_kernel.qsa.reference import qsa_attention_reference

            o, lse = qsa_attention_reference(q, k, v, table, kv, qo, scale, ps, idx, ratio)
        else:
            from sgl_hybrid_kernel.qsa.attention import default_tile, qsa_attention_triton

            o, lse = qsa_attention_triton(q, k, v, table, kv, qo, scale, max(rows), ps, idx, ratio, num_splits=splits,
                                          **default_tile(device_kind(q), sparse))
        want_o, want_lse = _oracle(q, k, v, table, lens, rows, ps, scale, blocks if sparse else None, ratio)
        empty = torch.isneginf(want_lse)
        got_lse = lse.double().cpu()
        pairs += [(o, want_o), (torch.isneginf(got_lse).double(), empty.double()),
                  (got_lse.masked_fill(empty, 0.0), want_lse.masked_fill(empty, 0.0))]
    return _dispatch.GateResult(op, impl, _dispatch.max_abs_error(pairs), TOLERANCE, _describe(sparse))


def gate_qsa_dense(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``qsa_dense``: ``impl`` (``triton`` / ``torch``) vs the FP64 causal oracle (ValueError for others)."""
    return _gate("qsa_dense", impl, device)


def gate_qsa_sparse(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``qsa_sparse``: ``impl`` vs the FP64 oracle masked to the selected blocks (ValueError for others)."""
    return _gate("qsa_sparse", impl, device)


def _plan(op: str, batch: int, max_kv_len: int, device) -> _dispatch.KernelChoice:
    from sgl_hybrid_kernel.qsa.dispatch import qsa_attention

    T, N = PLAN_T, batch * PLAN_T
    q = torch.zeros(N, PLAN_HQ, PLAN_DIM, dtype=torch.bfloat16, device=device)
    kv_cache = torch.zeros(T, PLAN_HKV, PLAN_DIM, dtype=torch.bfloat16, device=device)  # every request reads slots 0..T-1
    table = torch.arange(T, dtype=torch.int32, device=device).repeat(batch, 1)
    kv = torch.full((batch,), T, dtype=torch.int32, device=device)
    qo = torch.arange(0, N + 1, T, dtype=torch.int32, device=device)
    idx = torch.full((N, PLAN_BLOCKS), -1, dtype=torch.int32, device=device)
    idx[:, 0] = 0
    qsa_attention(q, kv_cache, kv_cache, table, kv, qo, idx, PLAN_DIM ** -0.5, max_kv_len, T, PLAN_RATIO)
    return next(c for c in _dispatch.chosen_paths() if c.op == op)


def plan_qsa_dense(device) -> _dispatch.KernelChoice:
    """What ``qsa.dispatch.qsa_attention`` picks on ``device`` for Qwen3.8 verify inside the budget (recorded)."""
    return _plan("qsa_dense", *PLAN_DENSE, device)


def plan_qsa_sparse(device) -> _dispatch.KernelChoice:
    """What ``qsa.dispatch.qsa_attention`` picks on ``device`` for Qwen3.8 verify at 32K positions (recorded)."""
    return _plan("qsa_sparse", *PLAN_SPARSE, device)


_dispatch.register_op("qsa_dense", plan_qsa_dense, gate_qsa_dense, "QSA attention, exact dense special case")
_dispatch.register_op("qsa_sparse", plan_qsa_sparse, gate_qsa_sparse, "QSA attention over the indexer's blocks")
