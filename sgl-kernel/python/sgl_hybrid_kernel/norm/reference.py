"""Plain-torch normalisation references.

All of them compute in FP32 and return the input dtype, matching the rounding of
SGLang's ``RMSNorm.forward_native`` (normalise in FP32, multiply by the weight
in FP32, round once) and fla's gated RMSNorm.
"""

from __future__ import annotations

from typing import Tuple

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension.

    Args:
        x: ``[..., D]`` any float dtype.
        weight: ``[D]``.
        eps: added to the mean square before the reciprocal square root.

    Returns:
        ``x * rsqrt(mean(x^2) + eps) * weight``, computed in FP32, in ``x.dtype``.

    Source: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019).
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm, as SGLang's ``RMSNorm.forward_native(x, residual)``.

    Args:
        x: ``[..., D]`` sub-layer output; residual: same shape and dtype.
        weight: ``[D]``; eps: as :func:`rms_norm`.

    Returns:
        ``(normed, residual_out)``, both in ``x.dtype``: ``s = x + residual`` in FP32,
        ``residual_out = s`` rounded once, ``normed = rms_norm(s)`` from the FP32 sum.

    Raises:
        ValueError: ``residual`` of another shape than ``x``.
    """
    if residual.shape != x.shape:
        raise ValueError(f"residual: shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    s = x.float() + residual.float()
    normed = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return normed.to(x.dtype), s.to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    activation: str = "sigmoid",
) -> torch.Tensor:
    """Output norm of KDA/GDN: ``rms_norm(x) * weight * act(gate)``.

    Args:
        x: ``[..., D]`` attention output per head.
        gate: same shape as ``x``.
        weight: ``[D]``.
        eps: RMSNorm epsilon.
        activation: ``"sigmoid"`` (Kimi K3 KDA) or ``"silu"``/``"swish"`` (GDN).

    Returns:
        Tensor of ``x``'s shape and dtype (computed in FP32).

    Raises:
        ValueError: unknown ``activation``.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    gf = gate.float()
    if activation == "sigmoid":
        act = torch.sigmoid(gf)
    elif activation in ("silu", "swish"):
        act = gf * torch.sigmoid(gf)
    else:
        raise ValueError(f"activation must be 'sigmoid', 'silu' or 'swish', got {activation!r}")
    return (xf * act).to(x.dtype)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """L2-normalise the last dimension: ``x / sqrt(sum(x^2) + eps)`` (FP32 math).

    Used for the Q/K normalisation of KDA and GDN (``use_qk_l2norm_in_kernel``).
    """
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)
