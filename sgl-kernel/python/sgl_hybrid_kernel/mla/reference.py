"""Plain-torch MLA attention over a latent KV history (absorbed form).

MLA (DeepSeek-V2, 2024) caches one latent vector ``c`` (``kv_lora_rank``) and a
decoupled positional key ``k_pe`` (``qk_rope_head_dim``) per token, shared by
all heads. With the key up-projection absorbed into the query
(``q_lat = W_kc^T q_nope``) every head attends directly over the latent cache::

    score[t, h, s] = scale * (q_lat[t, h] . c[s] + q_pe[t, h] . k_pe[s])
    o_lat[t, h]    = sum_s softmax_s(score) c[s]

and the caller applies the value up-projection ``W_vc`` to ``o_lat``.
"""

from __future__ import annotations

from typing import Tuple

import torch


def mla_attention_absorbed(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    k_pe: torch.Tensor,
    scale: float,
    prefix_len: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal MLA attention for one sequence's new tokens.

    Args:
        q_lat: ``[T, H, R]`` absorbed queries (R = kv_lora_rank).
        q_pe: ``[T, H, P]`` positional part of the queries (P = qk_rope_head_dim).
        latent: ``[S, R]`` latent cache of the whole sequence so far
            (``S = prefix_len + T``), new tokens included.
        k_pe: ``[S, P]`` positional keys.
        scale: softmax scale (``qk_head_dim ** -0.5``).
        prefix_len: tokens before the first query; query ``t`` sees cache rows
            ``[0, prefix_len + t]``.

    Returns:
        ``(o_lat, lse)``: ``o_lat`` ``[T, H, R]`` in ``q_lat.dtype`` (FP32 math),
        ``lse`` ``[T, H]`` (FP32, or FP64 for FP64 inputs), the natural-log log-sum-exp of the scaled scores.

    Raises:
        ValueError: inconsistent lengths.
    """
    T, H, R = q_lat.shape
    S = latent.shape[0]
    if S != prefix_len + T or k_pe.shape[0] != S:
        raise ValueError(
            f"cache holds {S} latent / {k_pe.shape[0]} rope rows, expected prefix_len + T = {prefix_len + T}"
        )
    acc = torch.promote_types(q_lat.dtype, torch.float32)  # FP32 math, FP64 stays FP64
    scores = torch.einsum("thr,sr->ths", q_lat.to(acc), latent.to(acc))
    scores = scores + torch.einsum("thp,sp->ths", q_pe.to(acc), k_pe.to(acc))
    scores = scores * scale
    pos_q = torch.arange(T, device=q_lat.device) + prefix_len
    mask = torch.arange(S, device=q_lat.device).unsqueeze(0) > pos_q.unsqueeze(1)  # [T, S]
    scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    o_lat = torch.einsum("ths,sr->thr", probs, latent.to(acc))
    return o_lat.to(q_lat.dtype), lse


def latent_cache_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """View a paged latent cache as ``[num_pages * page_size, D]`` token rows.

    Accepts ``[num_pages, page_size, D]``, ``[num_pages, page_size, 1, D]`` (aiter's
    layout) or SGLang's ``[slots, 1, D]`` / ``[slots, D]`` (page size 1).

    Raises:
        ValueError: any other rank, or a KV-head dim other than 1.
    """
    if kv_cache.dim() == 4:
        if kv_cache.shape[2] != 1:
            raise ValueError(f"kv_cache must have one latent KV head, got shape {tuple(kv_cache.shape)}")
        kv_cache = kv_cache.squeeze(2)
    if kv_cache.dim() == 3:
        return kv_cache.reshape(-1, kv_cache.shape[-1])
    if kv_cache.dim() == 2:
        return kv_cache
    raise ValueError(f"kv_cache must be 2-, 3- or 4-D, got shape {tuple(kv_cache.shape)}")


def mla_attention_paged_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float,
    page_size: int = 1,
    qo_indptr: torch.Tensor = None,
    kv_lora_rank: int = 512,
    kv_scale: float = 1.0,
    causal: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MLA attention (absorbed) of new query rows over a paged latent cache: decode, verify and extend.

    Request ``b`` has ``T_b = qo_indptr[b+1] - qo_indptr[b]`` query rows (decode:
    1) and ``L_b = kv_lens[b]`` cache positions, the new tokens' own rows already
    written; its query row ``t`` sees positions ``[0, L_b - T_b + t]`` (causal; a
    decode row sees the whole history). Position ``p`` lives in cache row
    ``page_table[b, p // page_size] * page_size + p % page_size``.

    Args:
        q: ``[N, H, R + P]``: absorbed latent query (first ``R = kv_lora_rank``
            columns) and rope query (last ``P``).
        kv_cache: paged latent cache, see ``latent_cache_rows``; each row is the
            latent ``c`` (first ``R``) then ``k_pe``. BF16/FP16/FP32, or FP8 with
            ``kv_scale`` (dequantised value = stored value * ``kv_scale``).
        page_table: ``[B, max_pages]`` int page ids.
        kv_lens: ``[B]`` int positions per request (0 allowed: its rows give ``(0, -inf)``).
        sm_scale: softmax scale (``qk_head_dim ** -0.5`` of the unabsorbed head).
        qo_indptr: ``[B + 1]`` query row offsets (default: one row per request).
        kv_lora_rank: ``R`` (512 for Kimi K3 / DeepSeek-V3).
        causal: ``False``: every row sees all ``L_b`` positions (an extend's
            prefix shard on one DCP rank, merged with the new rows by LSE).

    Returns:
        ``(o [N, H, R] in q.dtype, lse [N, H] FP32, FP64 for FP64 queries)``: LSE
        is the natural log of ``sum exp(sm_scale * score)``; ``-inf`` where a row
        sees no position.

    Raises:
        ValueError: inconsistent shapes.
    """
    rows = latent_cache_rows(kv_cache)
    N, H, D = q.shape
    if rows.shape[-1] != D:
        raise ValueError(f"q head dim {D} != cache row dim {rows.shape[-1]}")
    B = kv_lens.shape[0]
    if qo_indptr is None:
        if N != B:
            raise ValueError(f"q has {N} rows but kv_lens has {B} requests and no qo_indptr was given")
        qo_indptr = torch.arange(B + 1)
    if qo_indptr.shape[0] != B + 1:
        raise ValueError(f"qo_indptr must have {B + 1} entries, got {qo_indptr.shape[0]}")
    acc = torch.promote_types(q.dtype, torch.float32)
    o = torch.zeros(N, H, kv_lora_rank, dtype=acc, device=q.device)
    lse = torch.full((N, H), float("-inf"), dtype=acc, device=q.device)
    qo = qo_indptr.tolist()
    for b in range(B):
        L, t0, t1 = int(kv_lens[b]), qo[b], qo[b + 1]
        T = t1 - t0
        if T == 0 or L == 0:
            continue
        pos = torch.arange(L, device=q.device)
        slots = page_table[b, pos // page_size].long() * page_size + pos % page_size
        kv = rows[slots].to(acc) * kv_scale  # [L, D]
        scores = torch.einsum("thd,sd->ths", q[t0:t1].to(acc), kv) * sm_scale
        limit = L - T + torch.arange(T, device=q.device) if causal else torch.full((T,), L - 1, device=q.device)
        scores = scores.masked_fill((pos[None, :] > limit[:, None]).unsqueeze(1), float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [T, H]
        seen = ~torch.isneginf(row_lse)
        probs = torch.where(seen.unsqueeze(-1), torch.exp(scores - row_lse.unsqueeze(-1)), torch.zeros(()))
        o[t0:t1] = torch.einsum("ths,sr->thr", probs, kv[:, :kv_lora_rank])
        lse[t0:t1] = row_lse
    return o.to(q.dtype), lse
