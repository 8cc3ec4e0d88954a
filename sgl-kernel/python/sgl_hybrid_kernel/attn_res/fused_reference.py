"""Plain-torch reference of one AttnRes read fused with its RMSNorm (the unfused sequence).

One read of Kimi K3's attention-residual stream (seeds digest item 6; the CPU model's
``_ResidualStream.read``):

    head   = prefix + addend                 (the running residual, rounded to its dtype)
    mixed  = attn_res_mix([bank_0 .. bank_{nvb-1}, head])
    normed = rms_norm(mixed, out_norm_weight)

and optionally ``bank[:, nvb] = head`` (a block-writing layer snapshots the head).
The fused kernel must reproduce ``head`` bit for bit; ``normed`` within a tolerance
(it keeps ``mixed`` and the scores in FP32 where this sequence rounds them).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.attn_res.reference import attn_res_mix
from sgl_hybrid_kernel.norm.reference import rms_norm


def attn_res_rmsnorm_reference(
    prefix: Optional[torch.Tensor],
    addend: torch.Tensor,
    bank: torch.Tensor,
    num_banked: int,
    score_norm_weight: torch.Tensor,
    score_proj_weight: torch.Tensor,
    out_norm_weight: torch.Tensor,
    eps: float,
    write_bank: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Unfused AttnRes read + RMSNorm.

    Args:
        prefix: ``[T, D]`` running partial sum of the current block, or ``None``
            (the addend starts a new block).
        addend: ``[T, D]`` the layer output to add (attention or MLP output).
        bank: ``[T, NB, D]`` snapshot bank; rows ``[0, num_banked)`` are valid.
        num_banked: valid snapshots ``nvb`` (0 = nothing banked: plain RMSNorm).
        score_norm_weight: ``[D]``; score_proj_weight: ``[D]`` or ``[1, D]``.
        out_norm_weight: ``[D]`` the read's RMSNorm weight; eps: both norms' epsilon.
        write_bank: also store ``head`` into ``bank[:, num_banked]`` (in place).

    Returns:
        ``(normed [T, D], head [T, D])`` in ``addend.dtype``.

    Raises:
        ValueError: ``num_banked`` outside ``[0, NB]`` (``< NB`` when writing).
    """
    NB = bank.shape[1]
    if not 0 <= num_banked <= NB or (write_bank and num_banked >= NB):
        raise ValueError(f"num_banked={num_banked} invalid for a bank of {NB} rows (write_bank={write_bank})")
    head = addend if prefix is None else prefix + addend
    rows = torch.cat([bank[:, :num_banked], head.unsqueeze(1)], dim=1)
    mixed = attn_res_mix(rows, score_norm_weight, score_proj_weight, eps)
    if write_bank:
        bank[:, num_banked] = head
    return rms_norm(mixed, out_norm_weight, eps), head
