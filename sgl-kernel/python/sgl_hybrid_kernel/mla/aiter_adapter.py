"""Adapter from our paged MLA decode call to aiter's ``mla_decode_fwd`` (ROCm), with query-head padding.

aiter's assembly decode kernels take a fixed set of query-head counts (16 or 128
for BF16; Kimi K3 at TP8 has 12 heads per rank). The adapter pads the *query*
with zero heads up to the next supported count, calls aiter, and drops the
padded heads' outputs (seeds digest item 8). Each head's softmax is over its own
scores, so the real heads' results do not change; a zero query head only
produces a uniform average that is thrown away.

It also translates our page table (``[B, max_pages]`` + ``kv_lens``) into aiter's
CSR metadata (``kv_indptr`` over pages, ``kv_indices``, ``kv_last_page_lens``)
without a host sync, and gives requests with no cached position (possible on a
DCP rank) a one-position dummy range whose result is replaced by ``(0, -inf)``.

aiter's boundary as read from ROCm/aiter ``aiter/mla.py`` (not run here: no ROCm):
``mla_decode_fwd(q [T, H, 576], kv_buffer [pages, page_size, 1, 576], o [T, H, 512],
qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, page_size=,
nhead_kv=, sm_scale=, ..., q_scale=, kv_scale=, return_lse=)`` writes ``o`` in place
and returns ``(logits, final_lse)`` with ``final_lse [T, H]`` when ``return_lse``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

AITER_DECODE_HEAD_COUNTS: Tuple[int, ...] = (16, 128)


def padded_head_count(num_heads: int, supported: Sequence[int] = AITER_DECODE_HEAD_COUNTS) -> int:
    """Smallest supported head count ``>= num_heads``.

    Raises:
        ValueError: ``num_heads`` < 1 or above every supported count.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    for h in sorted(supported):
        if h >= num_heads:
            return h
    raise ValueError(f"num_heads={num_heads} exceeds the largest supported head count {max(supported)}")


def pad_query_heads(q: torch.Tensor, padded_heads: int) -> torch.Tensor:
    """``[N, H, D] -> [N, padded_heads, D]`` with zero extra heads (a copy only when padding is needed)."""
    N, H, D = q.shape
    if padded_heads == H:
        return q.contiguous()
    q_pad = q.new_zeros(N, padded_heads, D)
    q_pad[:, :H] = q
    return q_pad


def aiter_paged_metadata(
    page_table: torch.Tensor, kv_lens: torch.Tensor, page_size: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """aiter's CSR page metadata from a page table, without a host sync.

    Returns:
        ``(qo_indptr [B+1], kv_indptr [B+1] (pages), kv_indices [B * max_pages],
        kv_last_page_lens [B], empty [B] bool)``, int32. An empty request
        (``kv_lens == 0``) is given one page holding one position (its first page
        id, clamped to >= 0) and flagged in ``empty``; entries of ``kv_indices`` past
        ``kv_indptr[-1]`` are 0 and unused.
    """
    B, max_pages = page_table.shape
    device = page_table.device
    lens = kv_lens.to(torch.int64)
    empty = lens <= 0
    n_pages = torch.where(empty, torch.ones_like(lens), (lens + page_size - 1) // page_size)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int64, device=device)
    kv_indptr[1:] = torch.cumsum(n_pages, 0)
    j = torch.arange(max_pages, device=device)
    valid = j.unsqueeze(0) < n_pages.unsqueeze(1)
    dest = torch.where(valid, kv_indptr[:-1].unsqueeze(1) + j, torch.full_like(valid, B * max_pages, dtype=torch.int64))
    kv_indices = torch.zeros(B * max_pages + 1, dtype=torch.int32, device=device)
    kv_indices.scatter_(0, dest.reshape(-1), page_table.to(torch.int32).clamp_min(0).reshape(-1))
    last = torch.where(empty, torch.ones_like(lens), lens - (n_pages - 1) * page_size)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=device)
    return qo_indptr, kv_indptr.to(torch.int32), kv_indices[:-1], last.to(torch.int32), empty


def mla_decode_aiter(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float,
    page_size: int = 1,
    kv_lora_rank: int = 512,
    kv_scale: Optional[float] = None,
    supported_heads: Sequence[int] = AITER_DECODE_HEAD_COUNTS,
    decode_fn: Optional[Callable] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MLA decode (one query row per request) through aiter with query-head padding.

    Args:
        q: ``[B, H, R + P]``, any ``H`` in ``1..max(supported_heads)``.
        kv_cache: ``[pages, page_size, R + P]`` or ``[pages, page_size, 1, R + P]``.
        page_table, kv_lens, sm_scale, page_size, kv_lora_rank: as
            ``mla_attention_paged_reference``.
        kv_scale: per-tensor dequantisation scale of an FP8 cache (passed to aiter
            as a one-element FP32 tensor).
        decode_fn: aiter's ``mla_decode_fwd`` (default: imported from ``aiter.mla``).

    Returns:
        ``(o [B, H, R] in q.dtype, lse [B, H] FP32)`` (natural log), ``(0, -inf)``
        for requests with no cached position.

    Raises:
        ValueError: head count not coverable, or a cache row width other than ``q``'s.
        ImportError: aiter missing and no ``decode_fn`` given.
    """
    if decode_fn is None:
        from aiter.mla import mla_decode_fwd as decode_fn  # noqa: N813  (ROCm only)
    B, H, D = q.shape
    if kv_cache.shape[-1] != D:
        raise ValueError(f"q head dim {D} != cache row dim {kv_cache.shape[-1]}")
    hp = padded_head_count(H, supported_heads)
    q_pad = pad_query_heads(q, hp)
    kv_buffer = kv_cache.reshape(-1, page_size, 1, D)
    qo_indptr, kv_indptr, kv_indices, last, empty = aiter_paged_metadata(page_table, kv_lens, page_size)
    o_pad = q.new_empty(B, hp, kv_lora_rank)
    extra = {}
    if kv_scale is not None:
        extra["kv_scale"] = torch.tensor([float(kv_scale)], dtype=torch.float32, device=q.device)
    _, lse_pad = decode_fn(
        q_pad, kv_buffer, o_pad, qo_indptr, kv_indptr, kv_indices, last, 1,
        page_size=page_size, nhead_kv=1, sm_scale=float(sm_scale), return_lse=True, **extra,
    )
    if lse_pad is None or tuple(lse_pad.shape[:2]) != (B, hp):
        raise RuntimeError(f"aiter mla_decode_fwd returned LSE of shape {None if lse_pad is None else tuple(lse_pad.shape)}, expected ({B}, {hp})")
    o = o_pad[:, :H]
    lse = lse_pad.reshape(B, hp)[:, :H].float()
    o = torch.where(empty[:, None, None], torch.zeros((), dtype=o.dtype, device=o.device), o)
    lse = torch.where(empty[:, None], torch.full((), float("-inf"), device=lse.device), lse)
    return o, lse
