"""Plain-torch reference of QSA (Qwen sparse attention) over a paged GQA KV cache.

QSA's indexer picks, per query row, ``budget / compress_ratio`` compressed blocks
(block ``c`` covers positions ``[c * ratio, (c + 1) * ratio)``); the row attends
over the causally visible positions of those blocks (budget 2,048 tokens; seeds
digest item 13). The index set is shared by all heads (one indexer KV head).

Exact dense special case: when a row's visible positions all fit in the budget,
the indexer selects every visible block, so the sparse result equals dense
causal attention over the whole prefix (``block_indices=None`` here).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch


def qsa_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    sm_scale: float,
    page_size: int = 1,
    block_indices: Optional[torch.Tensor] = None,
    compress_ratio: int = 4,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """QSA attention of new query rows (decode / verify) over a paged cache.

    Args:
        q: ``[N, Hq, D]``; k_cache: ``[slots, Hkv, D]``; v_cache: ``[slots, Hkv, Dv]``
            (slot = ``page * page_size + offset``; ``Hq`` a multiple of ``Hkv``).
        page_table: ``[B, max_pages]`` int; kv_lens: ``[B]`` positions incl. the new rows;
        qo_indptr: ``[B + 1]`` query row offsets; row ``t`` of request ``b`` sees
            positions ``<= kv_lens[b] - T_b + t``.
        block_indices: ``[N, NB]`` int compressed block ids per row (``-1`` = none;
            ids must be distinct), or ``None`` for the dense causal prefix.
        compress_ratio: positions per compressed block.

    Returns:
        ``(o [N, Hq, Dv] in q.dtype, lse [N, Hq] FP32)``, ``(0, -inf)`` for a row that sees nothing.

    Raises:
        ValueError: ``Hq`` not a multiple of ``Hkv``, or ``qo_indptr`` of the wrong length.
    """
    N, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} not a multiple of KV heads {Hkv}")
    B = kv_lens.shape[0]
    if qo_indptr.shape[0] != B + 1:
        raise ValueError(f"qo_indptr must have {B + 1} entries, got {qo_indptr.shape[0]}")
    acc = torch.promote_types(q.dtype, torch.float32)
    o = torch.zeros(N, Hq, v_cache.shape[-1], dtype=acc, device=q.device)
    lse = torch.full((N, Hq), float("-inf"), dtype=torch.float32, device=q.device)
    qo = qo_indptr.tolist()
    for b in range(B):
        L, t0, t1 = int(kv_lens[b]), qo[b], qo[b + 1]
        T = t1 - t0
        for t in range(T):
            n = t0 + t
            limit = L - T + t
            pos = torch.arange(max(limit + 1, 0), device=q.device)
            if block_indices is not None:
                chosen = block_indices[n][block_indices[n] >= 0].long()
                pos = pos[torch.isin(pos // compress_ratio, chosen)]
            if pos.numel() == 0:
                continue
            slots = page_table[b, pos // page_size].long() * page_size + pos % page_size
            k = k_cache[slots].to(acc).repeat_interleave(Hq // Hkv, dim=1)  # [S, Hq, D]
            v = v_cache[slots].to(acc).repeat_interleave(Hq // Hkv, dim=1)
            s = torch.einsum("hd,shd->hs", q[n].to(acc), k) * sm_scale
            lse[n] = torch.logsumexp(s, -1).float()
            o[n] = torch.einsum("hs,shv->hv", torch.softmax(s, -1), v)
    return o.to(q.dtype), lse
