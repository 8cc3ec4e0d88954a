"""Host wrapper of the fused AttnRes + RMSNorm kernel (``triton_attn_res.py``)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.attn_res.triton_attn_res import attn_res_rmsnorm_kernel


def attn_res_rmsnorm_triton(
    prefix: Optional[torch.Tensor],
    addend: torch.Tensor,
    bank: torch.Tensor,
    num_banked: int,
    score_norm_weight: torch.Tensor,
    score_proj_weight: torch.Tensor,
    out_norm_weight: torch.Tensor,
    eps: float,
    write_bank: bool = False,
    out: Optional[torch.Tensor] = None,
    head_out: Optional[torch.Tensor] = None,
    score_weight: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``attn_res_rmsnorm_reference`` (same arguments and results).

    Extra arguments: ``out`` / ``head_out`` ``[T, D]`` destinations; ``score_weight``
    the precomputed FP32 ``score_norm_weight * score_proj_weight`` (``[D]``; a caller
    caches it per layer instead of recomputing it each step).

    Raises:
        ValueError: ``num_banked`` outside the bank, or rows without a contiguous last dim.
    """
    T, D = addend.shape
    NB = bank.shape[1]
    if not 0 <= num_banked <= NB or (write_bank and num_banked >= NB):
        raise ValueError(f"num_banked={num_banked} invalid for a bank of {NB} rows (write_bank={write_bank})")
    for name, t in (("addend", addend), ("prefix", prefix), ("bank", bank)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension")
    if score_weight is None:
        score_weight = (score_norm_weight.float() * score_proj_weight.reshape(-1).float()).contiguous()
    out = torch.empty_like(addend) if out is None else out
    head_out = torch.empty_like(addend) if head_out is None else head_out
    if T == 0:
        return out, head_out
    block_d = triton.next_power_of_2(D)
    attn_res_rmsnorm_kernel[(T,)](
        prefix if prefix is not None else addend, addend, bank, score_weight, out_norm_weight, out, head_out,
        num_banked, float(eps),
        prefix.stride(0) if prefix is not None else 0, addend.stride(0), bank.stride(0), bank.stride(1),
        out.stride(0), head_out.stride(0),
        D=D, BLOCK_D=block_d, HAS_PREFIX=prefix is not None, WRITE_BANK=write_bank,
        num_warps=16 if block_d >= 8192 else (8 if block_d >= 2048 else 4),
    )
    return out, head_out
