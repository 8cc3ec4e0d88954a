"""Host wrapper of the Triton RMSNorm (``triton_rms_norm.py``)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import triton

from sgl_hybrid_kernel.norm.triton_rms_norm import rms_norm_kernel

MAX_D = 8192  # one row in registers; 7168 (Kimi K3 hidden) -> BLOCK_D 8192 is the widest compiled config


def rms_norm_num_warps(block_d: int) -> int:
    """Warps per row program: 4 up to 2048 columns, then one per 512 columns, at most 16."""
    return max(4, min(16, block_d // 512))


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """RMSNorm of the last dimension on the Triton kernel, optionally after ``x + residual``.

    Args:
        x: ``[..., D]`` FP32 / BF16 / FP16 with ``D <= MAX_D``; rows may be strided,
            the last dimension must be contiguous (a copy is made otherwise).
        weight: ``[D]`` (any float dtype; multiplied in FP32).
        eps: added to the mean square.
        residual: optional ``[..., D]`` of ``x``'s shape.

    Returns:
        ``out`` of ``x``'s shape and dtype, or ``(out, residual_out)`` with a residual
        (``residual_out = x + residual`` in ``x.dtype``); as ``norm.reference``.

    Raises:
        ValueError: ``D`` above ``MAX_D``, a weight of another length, or a residual of another shape.
    """
    D = x.shape[-1]
    if D > MAX_D or D < 1:
        raise ValueError(f"x: last dimension {D} outside 1..{MAX_D}")
    if weight.shape != (D,):
        raise ValueError(f"weight: shape {tuple(weight.shape)}, expected ({D},)")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual: shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    shape = x.shape
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, D)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    else:
        r2, res_out = x2, out  # unused by the kernel (HAS_RESIDUAL=False)
    rows = x2.shape[0]
    if rows:
        block_d = triton.next_power_of_2(D)
        rms_norm_kernel[(rows,)](
            x2, r2, weight.contiguous(), out, res_out, x2.stride(0), r2.stride(0), D, float(eps),
            BLOCK_D=block_d, HAS_RESIDUAL=residual is not None, num_warps=rms_norm_num_warps(block_d),
        )
    if residual is None:
        return out.reshape(shape)
    return out.reshape(shape), res_out.reshape(shape)
