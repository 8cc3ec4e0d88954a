"""GEMM / quantisation ops of ``sgl_kernel``: ``int8_scaled_mm`` in plain torch, the rest placeholders.

``int8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype, bias=None)``:
``mat_a`` int8 ``[M, K]``, ``mat_b`` int8 ``[K, N]``, ``scales_a`` ``[M]`` or
``[M, 1]`` (per row), ``scales_b`` ``[N]`` or ``[N, 1]`` (per column)::

    out = (mat_a @ mat_b) * scales_a[:, None] * scales_b[None, :] (+ bias)  -> out_dtype

The product is accumulated in float32 (exact while ``K * 127 * 127 < 2**24``,
i.e. ``K <= 1040``; beyond that it is float32-rounded where the real kernel sums
int32).
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel._unprovided import define


def int8_scaled_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scales_a: torch.Tensor,
    scales_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    acc = mat_a.float() @ mat_b.float()
    out = acc * scales_a.float().reshape(-1, 1) * scales_b.float().reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


define(
    globals(),
    "sgl_kernel",
    (
        "fp8_scaled_mm",
        "dsv3_fused_a_gemm",
        "sgl_per_tensor_quant_fp8",
        "sgl_per_token_quant_fp8",
        "sgl_per_token_group_quant_8bit",
        "sgl_per_token_group_quant_fp8",
        "sgl_per_token_group_quant_int8",
        "awq_dequantize",
        "hadamard_transform",
    ),
    "GEMM / quantisation kernel",
)
