"""DCP merge dispatch: Triton on CUDA / ROCm, plain torch on CPU or outside the contract.

Contract of the Triton kernel: ``o_parts [c, R, H, Dv]`` with a contiguous last
dim, ``Dv <= 1024``, ``lse_parts [c, R, H]`` FP32. There is no aiter merge we call
(aiter's reduce is internal to its decode), so ROCm uses the Triton kernel.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.dcp.merge import merge_partial_attention_triton
from sgl_hybrid_kernel.dcp.reference import merge_partial_attention_reference
from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice

logger = logging.getLogger(__name__)

MAX_DV = 1024


def _why_not_triton(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> Optional[str]:
    if o_parts.dim() != 4:
        return f"o_parts has {o_parts.dim()} dims (kernel takes [c, R, H, Dv])"
    if o_parts.shape[-1] > MAX_DV:
        return f"Dv={o_parts.shape[-1]} above {MAX_DV}"
    if o_parts.stride(-1) != 1:
        return "o_parts last dim not contiguous"
    if lse_parts.dtype != torch.float32:
        return f"lse dtype {lse_parts.dtype} (kernel reads FP32)"
    return None


def merge_partial_attention(
    o_parts: torch.Tensor,
    lse_parts: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact LSE merge of ``c`` partial attention results (DCP ranks or KV splits).

    Args:
        o_parts: ``[c, R, H, Dv]`` partial outputs; lse_parts: ``[c, R, H]`` natural-log LSE,
            ``-inf`` for an empty part.
        out, lse_out: optional destinations ``[R, H, Dv]`` / ``[R, H]`` (Triton path only writes in place).

    Returns:
        ``(out [R, H, Dv], lse [R, H] FP32)``; an all-empty row is ``(0, -inf)``.

    Raises:
        ValueError: mismatched shapes.
    """
    if lse_parts.shape != o_parts.shape[:-1]:
        raise ValueError(f"lse_parts shape {tuple(lse_parts.shape)} != o_parts.shape[:-1] {tuple(o_parts.shape[:-1])}")
    kind = device_kind(o_parts)
    why = "CPU tensors: plain-torch reference" if kind == "cpu" else _why_not_triton(o_parts, lse_parts)
    if why is None:
        record_choice("dcp_merge", "triton", f"{kind}: merge_partials_kernel", log=logger)
        return merge_partial_attention_triton(o_parts, lse_parts, out, lse_out)
    record_choice("dcp_merge", "torch", why if kind == "cpu" else f"outside the Triton contract: {why}", log=logger)
    o, lse = merge_partial_attention_reference(o_parts, lse_parts)
    if out is not None:
        out.copy_(o)
        o = out
    if lse_out is not None:
        lse_out.copy_(lse)
        lse = lse_out
    return o, lse
