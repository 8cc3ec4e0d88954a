"""FP8 W8A16 linear layers with per-output-channel scales (Qwen3.8-Flash-Next residual projections, issue 6)."""

from sgl_hybrid_kernel.fp8_linear.dispatch import fp8_linear
from sgl_hybrid_kernel.fp8_linear.reference import (
    fp8_dtype_for,
    fp8_linear_reference,
    fp8_weight_error_bound,
    quantize_fp8_per_channel,
    triton_fp8_type,
)

__all__ = [
    "fp8_linear",
    "fp8_linear_reference",
    "fp8_dtype_for",
    "fp8_weight_error_bound",
    "quantize_fp8_per_channel",
    "triton_fp8_type",
]
