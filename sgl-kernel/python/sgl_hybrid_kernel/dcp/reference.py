"""Plain-torch DCP (decode context parallel) merge and round-robin position ownership.

Under DCP with ``c`` ranks each rank keeps only the history positions it owns
(position ``p`` on rank ``p mod c``), attends the shared query over its shard and
returns a partial output with the log-sum-exp (LSE) of its scaled scores. The
exact full-history result is the LSE-weighted mix (seeds digest, item 3)::

    lse   = log(sum_i exp(lse_i))
    out   = sum_i exp(lse_i - lse) * out_i

A rank with no visible position returns ``(0, -inf)``; its weight is exactly 0 and
it never contributes a NaN, even if its partial output holds garbage.
"""

from __future__ import annotations

from typing import Tuple

import torch


def merge_partial_attention_reference(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge ``c`` partial attention results exactly.

    Args:
        o_parts: ``[c, ..., Dv]`` partial outputs (each normalised over its own keys).
        lse_parts: ``[c, ...]`` natural-log LSE of each part's scaled scores;
            ``-inf`` marks an empty part.

    Returns:
        ``(out [..., Dv] in o_parts.dtype, lse [...] FP32, FP64 for FP64 inputs)``:
        all-empty rows give ``(0, -inf)``.

    Raises:
        ValueError: ``lse_parts`` shape is not ``o_parts.shape[:-1]``.
    """
    if lse_parts.shape != o_parts.shape[:-1]:
        raise ValueError(f"lse_parts shape {tuple(lse_parts.shape)} != o_parts.shape[:-1] {tuple(o_parts.shape[:-1])}")
    acc = torch.promote_types(o_parts.dtype, torch.float32)
    lse = lse_parts.to(acc)
    m = lse.max(dim=0).values
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.where(torch.isneginf(lse), torch.zeros_like(lse), torch.exp(lse - m_safe))
    total = w.sum(0)
    contrib = torch.where(w.unsqueeze(-1) > 0, w.unsqueeze(-1) * o_parts.to(acc), torch.zeros((), dtype=acc))
    out = torch.where(total.unsqueeze(-1) > 0, contrib.sum(0) / total.clamp_min(1e-30).unsqueeze(-1), torch.zeros((), dtype=acc))
    lse_out = torch.where(total > 0, m_safe + torch.log(total.clamp_min(1e-30)), torch.full_like(total, float("-inf")))
    return out.to(o_parts.dtype), lse_out


def dcp_local_length(seq_lens: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Number of positions ``p < L`` with ``p mod world == rank`` (int, same shape as ``seq_lens``).

    Raises:
        ValueError: ``rank`` outside ``[0, world)``.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    return ((seq_lens - rank + world - 1) // world).clamp_min(0)


def dcp_local_positions(seq_len: int, rank: int, world: int) -> torch.Tensor:
    """Global positions owned by ``rank`` (round-robin), ascending: ``rank, rank + world, ...``.

    Raises:
        ValueError: ``rank`` outside ``[0, world)``.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    return torch.arange(rank, max(rank, seq_len), world)
