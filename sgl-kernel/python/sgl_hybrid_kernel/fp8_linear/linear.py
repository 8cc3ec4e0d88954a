"""Host wrapper of the FP8 W8A16 GEMM (``triton_fp8_linear.py``) and its tile choice."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.fp8_linear.reference import _check
from sgl_hybrid_kernel.fp8_linear.triton_fp8_linear import fp8_w8a16_linear_kernel


def default_tile(M: int, N: int, K: int) -> Tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` for an ``[M, K] x [K, N]`` product.

    Decode and verify rows (``M <= 16``: a few requests x up to 5 verify positions)
    take one 16-row tile with 4 warps, longer row counts (prefill) 64-row tiles
    with 8 warps. A long reduction (the 10,240 -> 320 down projection) steps K by
    128 over 32 output channels, a short one (320 -> 10,240) by 64 over 64.
    These are the tiles the cross-compile gate builds (``compile_gate.py``), all
    spill-free on gfx942 / gfx950 / sm_90; 64 rows with 4 warps spill.
    """
    block_m, warps = (16, 4) if M <= 16 else (64, 8)
    if K >= 1024:
        return block_m, 32, 128, warps
    return block_m, 64, 64, warps


def fp8_linear_triton(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, out: Optional[torch.Tensor] = None,
    tile: Optional[Tuple[int, int, int, int]] = None,
) -> torch.Tensor:
    """Triton version of :func:`fp8_linear_reference` (same arguments).

    ``x [..., K]`` with a unit last stride (BF16 / FP16 / FP32), ``codes [N, K]``
    contiguous e4m3, ``scale [N]`` FP32; returns ``[..., N]`` in ``x.dtype``
    (or writes ``out``). ``tile`` overrides :func:`default_tile`.

    Raises:
        ValueError: mismatched shapes or dtypes, non-unit last strides.
    """
    _check(x, codes, scale)
    if codes.stride(1) != 1 or x.stride(-1) != 1:
        raise ValueError("x and codes need a unit stride along K")
    if scale.dtype != torch.float32:
        raise ValueError(f"scale must be FP32, got {scale.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    M, K = x2.shape
    N = codes.shape[0]
    if out is None:
        out = torch.empty(*lead, N, dtype=x.dtype, device=x.device)
    o2 = out.view(-1, N)
    if M == 0:
        return out
    bm, bn, bk, warps = tile or default_tile(M, N, K)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    fp8_w8a16_linear_kernel[grid](
        x2, codes, scale, o2, M, N, K, x2.stride(0), codes.stride(0), o2.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0, num_warps=warps,
    )
    return out
