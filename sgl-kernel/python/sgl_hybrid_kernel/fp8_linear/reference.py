"""Plain-torch FP8 W8A16 linear layer with per-output-channel scales: quantiser, oracle, error bound.

The weight ``W [N, K]`` (``N`` output channels) is stored as FP8 e4m3 codes
``Q [N, K]`` and one FP32 scale per output channel (seeds digest item 15: the
Qwen3.8-Flash-Next residual projections 10,240 <-> 320; MXFP4 there gave large
logit deviations)::

    s_n    = max_k |W[n, k]| / FP8_MAX            (1 for an all-zero row)
    Q[n,k] = round_to_fp8(W[n, k] / s_n)           round to nearest even, |Q| <= FP8_MAX
    y[m,n] = s_n * sum_k x[m, k] * float(Q[n, k])  FP32 accumulator, scaled once per channel

Activations stay in the serving dtype (BF16; "A16"). Widening an e4m3 code to
BF16 or FP32 is exact, so the kernel and this reference differ only in the
order of the FP32 sums.

FP8 flavour per platform (``fp8_dtype_for``): OCP e4m3 (``torch.float8_e4m3fn``,
Triton ``fp8e4nv``, max 448) on CUDA, CPU and gfx950 (MI355X); the FNUZ variant
(``torch.float8_e4m3fnuz``, Triton ``fp8e4b8``, max 240) on gfx942 (MI300X),
whose matrix cores read only that encoding.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.platform import DevicePlatform

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_TRITON_NAMES = {torch.float8_e4m3fn: "fp8e4nv", torch.float8_e4m3fnuz: "fp8e4b8"}


def fp8_dtype_for(platform: DevicePlatform) -> torch.dtype:
    """``torch.float8_e4m3fnuz`` on gfx942 (MI300X), else ``torch.float8_e4m3fn`` (CUDA, CPU, gfx950)."""
    if platform.device == "rocm" and platform.arch == "gfx942":
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def triton_fp8_type(dtype: torch.dtype) -> str:
    """Triton's name of an e4m3 torch dtype: ``"fp8e4nv"`` or ``"fp8e4b8"``.

    Raises:
        ValueError: ``dtype`` is not one of :data:`FP8_DTYPES`.
    """
    if dtype not in _TRITON_NAMES:
        raise ValueError(f"dtype must be one of {FP8_DTYPES}, got {dtype}")
    return _TRITON_NAMES[dtype]


def quantize_fp8_per_channel(
    weight: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel (per-row) amax quantisation of ``weight`` to FP8 e4m3.

    Args:
        weight: ``[N, K]`` floating point, finite (``N`` output channels).
        fp8_dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e4m3fnuz``.

    Returns:
        ``(codes [N, K] fp8_dtype, scale [N] FP32)`` with
        ``weight ~= codes.float() * scale[:, None]``; an all-zero row gets scale 1.

    Raises:
        ValueError: ``weight`` not 2-D floating point or not finite; ``fp8_dtype`` not e4m3.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D floating-point tensor, got {tuple(weight.shape)} {weight.dtype}")
    if fp8_dtype not in FP8_DTYPES:
        raise ValueError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("weight holds NaN or inf values")
    fmax = torch.finfo(fp8_dtype).max
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    codes = (w / scale[:, None]).clamp(-fmax, fmax).to(fp8_dtype)
    return codes, scale.contiguous()


def fp8_weight_error_bound(weight: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Elementwise bound on ``|weight - codes * scale|`` for :func:`quantize_fp8_per_channel`.

    Round to nearest in e4m3 (3 mantissa bits, ``eps = 2^-3``) errs by at most half
    a unit in the last place: ``eps/2 * |u|`` for a normal ``u = w / s``, and half
    the subnormal step ``smallest_normal * eps / 2`` below the normal range. So
    ``|dW[n, k]| <= max(eps/2 * |W[n, k]|, s_n * smallest_normal * eps / 2)``.

    Returns:
        ``[N, K]`` FP64 bound (the amax element is exact: it maps to ``FP8_MAX``).
    """
    fi = torch.finfo(fp8_dtype)
    w = weight.detach().double().abs()
    s = scale.detach().double()[:, None]
    return torch.maximum(w * (fi.eps / 2), s * (fi.smallest_normal * fi.eps / 2))


def fp8_linear_reference(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, out_dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """``y = (x @ codes^T) * scale`` with the FP8 codes widened exactly (the kernel's oracle).

    Args:
        x: ``[..., K]`` activations (BF16 / FP16 / FP32; FP64 keeps FP64 arithmetic).
        codes: ``[N, K]`` FP8 e4m3 weights from :func:`quantize_fp8_per_channel`.
        scale: ``[N]`` FP32 per-output-channel scales.
        out_dtype: result dtype (default ``x.dtype``).

    Returns:
        ``[..., N]`` in ``out_dtype``; the product is summed in FP32 (FP64 for FP64 ``x``)
        and scaled once per output channel.

    Raises:
        ValueError: shapes or dtypes do not match.
    """
    _check(x, codes, scale)
    acc = torch.promote_types(x.dtype, torch.float32)
    y = (x.to(acc) @ codes.to(acc).t()) * scale.to(acc)
    return y.to(out_dtype or x.dtype)


def _check(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> None:
    if codes.dim() != 2 or codes.dtype not in FP8_DTYPES:
        raise ValueError(f"codes must be a 2-D e4m3 tensor, got {tuple(codes.shape)} {codes.dtype}")
    if x.shape[-1] != codes.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} input channels, codes expect {codes.shape[1]}")
    if scale.shape != (codes.shape[0],):
        raise ValueError(f"scale must have shape ({codes.shape[0]},), got {tuple(scale.shape)}")
