"""DCP (decode context parallel) for MLA: round-robin KV ownership and per-shard partial attention.

Rank ``r`` of a DCP group of ``c`` ranks stores the MLA KV row (``[c | k_pe]``)
of position ``p`` only when ``p mod c == r`` (issue 8; vLLM/SGLang's interleaved
DCP layout with interleave size 1). KV locations are upstream SGLang's *widened*
ones (the allocator hands out pages of ``page x c`` locations, page-aligned, so
``loc mod c == p mod c``); the owner keeps location ``loc`` at its pool row
``loc // c`` (:func:`dcp_rows`, upstream's ``localize_dcp_indices``). At every forward the group exchanges its
query heads (all-gather), each rank attends all of the group's heads over its
own shard and returns ``(o_lat, LSE)``; a second all-gather brings every
shard's pair to every rank and ``sgl_hybrid_kernel.dcp.merge_partial_attention``
merges them exactly. An empty shard contributes ``(0, -inf)``.
"""

from __future__ import annotations

from typing import Tuple

import torch


def dcp_owned(positions: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Bool mask ``[N]``: which of ``positions`` (int, ``[N]``) rank ``rank`` of ``size`` stores.

    Raises:
        ValueError: ``rank`` outside ``[0, size)``.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size={size}), got {rank}")
    return positions % size == rank


def dcp_rows(loc: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's KV pool rows for widened KV locations ``loc`` (int, any shape); ``-1`` where not owned.

    Upstream SGLang 0.5.23's owner rule (``sglang.srt.layers.dcp.layout.localize_dcp_indices``,
    interleave 1): location ``loc`` lives on DCP rank ``loc mod size`` at row ``loc // size``.

    Raises:
        ValueError: ``rank`` outside ``[0, size)``.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size={size}), got {rank}")
    from sglang.srt.layers.dcp.layout import localize_dcp_indices

    return localize_dcp_indices(loc, size, rank)


def dcp_partial_attention(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    k_pe: torch.Tensor,
    key_pos: torch.Tensor,
    query_pos: torch.Tensor,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Absorbed-MLA attention of ``T`` queries over one rank's KV shard.

    Args:
        q_lat: ``[T, H, R]`` absorbed queries; q_pe: ``[T, H, P]``.
        latent: ``[S, R]``, k_pe: ``[S, P]``: the shard's cache rows.
        key_pos: ``[S]`` int positions of those rows; query_pos: ``[T]`` int positions.
        scale: softmax scale.

    Returns:
        ``(o_lat [T, H, R] in q_lat.dtype, lse [T, H] FP32)`` over keys with
        ``key_pos <= query_pos`` (causal); a query that sees no key of the shard
        gets ``(0, -inf)``, the merge's empty-part convention.

    Raises:
        ValueError: row counts of ``latent``, ``k_pe``, ``key_pos`` disagree.
    """
    S = latent.shape[0]
    if k_pe.shape[0] != S or key_pos.shape[0] != S:
        raise ValueError(f"latent has {S} rows, k_pe {k_pe.shape[0]}, key_pos {key_pos.shape[0]}")
    acc = torch.promote_types(q_lat.dtype, torch.float32)
    scores = torch.einsum("thr,sr->ths", q_lat.to(acc), latent.to(acc))
    scores = (scores + torch.einsum("thp,sp->ths", q_pe.to(acc), k_pe.to(acc))) * scale
    hidden = key_pos.unsqueeze(0) > query_pos.unsqueeze(1)  # [T, S]
    scores = scores.masked_fill(hidden.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [T, H]; -inf where nothing is visible
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(scores - safe.unsqueeze(-1))  # exp(-inf) = 0 for hidden keys
    o = torch.einsum("ths,sr->thr", p, latent.to(acc))
    return o.to(q_lat.dtype), lse


def mla_kv_bytes_per_rank(seq_len: int, kv_row_elems: int, num_mla_layers: int, dcp_size: int, bytes_per_elem: int) -> int:
    """Bytes of MLA KV cache one rank holds for a ``seq_len``-token sequence.

    The largest shard (rank 0) holds ``ceil(seq_len / dcp_size)`` rows of
    ``kv_row_elems`` values (``kv_lora_rank + qk_rope_head_dim``) per MLA layer.

    Raises:
        ValueError: a negative length or a width below 1.
    """
    if seq_len < 0 or dcp_size < 1 or kv_row_elems < 1:
        raise ValueError(f"bad sizes: seq_len={seq_len}, dcp_size={dcp_size}, kv_row_elems={kv_row_elems}")
    rows = -(-seq_len // dcp_size)
    return rows * kv_row_elems * num_mla_layers * bytes_per_elem
