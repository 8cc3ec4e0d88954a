"""AttnRes + RMSNorm dispatch: the fused Triton kernel (CUDA / ROCm) or the unfused plain-torch sequence.

Triton contract (else torch, reason logged once): hidden size ``D <= 16384`` (the
row lives in registers: 16 warps at D = 7168), at most 16 banked rows, BF16 /
FP16 / FP32 activations with contiguous rows.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.attn_res.fused import attn_res_rmsnorm_triton
from sgl_hybrid_kernel.attn_res.fused_reference import attn_res_rmsnorm_reference
from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice

logger = logging.getLogger(__name__)

MAX_HIDDEN = 16384
MAX_BANKED = 16


def _why_not_triton(addend: torch.Tensor, bank: torch.Tensor) -> Optional[str]:
    if addend.shape[-1] > MAX_HIDDEN:
        return f"hidden size {addend.shape[-1]} above {MAX_HIDDEN}"
    if bank.shape[1] > MAX_BANKED:
        return f"{bank.shape[1]} bank rows above {MAX_BANKED}"
    if addend.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {addend.dtype}"
    if addend.stride(-1) != 1 or bank.stride(-1) != 1:
        return "rows not contiguous"
    return None


def attn_res_rmsnorm(
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
    """One AttnRes read with its RMSNorm: ``(normed [T, D], head [T, D])``.

    See ``attn_res.fused_reference.attn_res_rmsnorm_reference`` for the arguments.
    ``head`` (the persisted running residual) is bit-exact on every path;
    ``normed`` matches the unfused sequence within BF16 rounding on the Triton path.

    Raises:
        ValueError: ``num_banked`` outside the bank.
    """
    kind = device_kind(addend)
    why = "CPU tensors: unfused plain-torch sequence" if kind == "cpu" else _why_not_triton(addend, bank)
    if why is None:
        record_choice("attn_res_rmsnorm", "triton", f"{kind}: attn_res_rmsnorm_kernel (one launch per read)", log=logger)
        return attn_res_rmsnorm_triton(prefix, addend, bank, num_banked, score_norm_weight, score_proj_weight,
                                       out_norm_weight, eps, write_bank)
    record_choice("attn_res_rmsnorm", "torch", why if kind == "cpu" else f"outside the Triton contract: {why}", log=logger)
    return attn_res_rmsnorm_reference(prefix, addend, bank, num_banked, score_norm_weight, score_proj_weight,
                                      out_norm_weight, eps, write_bank)
