"""FP8 W8A16 linear dispatch: Triton on CUDA / ROCm, plain torch on CPU or outside the contract.

Contract of the Triton kernel: activations BF16 / FP16 / FP32 with a unit last
stride, codes ``[N, K]`` contiguous in the platform's e4m3 flavour
(``fp8_dtype_for``: FNUZ on gfx942), FP32 scales on the same device. aiter's
FP8 GEMMs want per-token activation scales (A8W8), not our A16 path, so ROCm
uses the Triton kernel too.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.fp8_linear.linear import fp8_linear_triton
from sgl_hybrid_kernel.fp8_linear.reference import _check, fp8_dtype_for, fp8_linear_reference
from sgl_hybrid_kernel.platform import device_platform

logger = logging.getLogger(__name__)

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _why_not_triton(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> Optional[str]:
    if x.dtype not in ACTIVATION_DTYPES:
        return f"activation dtype {x.dtype}"
    want = fp8_dtype_for(device_platform(x.device))
    if codes.dtype != want:
        return f"codes are {codes.dtype}, this GPU's matrix cores read {want}"
    if x.stride(-1) != 1 or not codes.is_contiguous():
        return "x last dim or codes not contiguous"
    if scale.dtype != torch.float32 or scale.device != x.device or codes.device != x.device:
        return "scale not FP32 or operands on different devices"
    return None


def fp8_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(x @ codes^T) * scale``: FP8 W8A16 linear layer with per-output-channel scales (issue 6).

    Args:
        x: ``[..., K]`` activations (serving dtype).
        codes: ``[N, K]`` e4m3 weights (``quantize_fp8_per_channel``).
        scale: ``[N]`` FP32 scales.

    Returns:
        ``[..., N]`` in ``x.dtype``.

    Raises:
        ValueError: mismatched shapes or dtypes.
    """
    _check(x, codes, scale)
    if x.device.type != "cuda":
        record_choice("fp8_linear", "torch", "CPU tensors: plain-torch reference (codes widened to FP32)", log=logger)
        return fp8_linear_reference(x, codes, scale)
    why = _why_not_triton(x, codes, scale)
    if why is not None:
        record_choice("fp8_linear", "torch", f"outside the Triton contract: {why}", log=logger)
        return fp8_linear_reference(x, codes, scale)
    record_choice("fp8_linear", "triton", "fp8_w8a16_linear_kernel (codes widened in-kernel, FP32 accumulator)", log=logger)
    return fp8_linear_triton(x, codes, scale)
