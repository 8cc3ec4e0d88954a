"""Gated hyper-connection residual streams of Qwen3.8-Flash-Next (upstream ``GatedResidual``).

The residual is ``hc`` streams of width ``D`` kept side by side, ``[N, hc * D]``
(article 002: four streams of 2,560, branch width 10,240, low rank 320). The
layer stack starts from ``hc`` copies of the token embedding. Every read
(attention input, FFN input, the final read before the LM head) and every
write-back goes through one :class:`GatedStreams` site::

    xn    = GroupNorm_D(streams) * (1 + w_norm)             per-stream RMSNorm (groups of D)
    gates = sigmoid(W_up silu(W_down xn / hc))               [N, hc * D], low rank r
    x     = mean_over_streams(gates * xn)                    [N, D]        (the read)
    s'_j  = s_j + 2 sigmoid((W_inject xn)_j / hc) * out      j = 1..hc     (the write-back)

Source: upstream SGLang 0.5.23 ``layers/hyperconnection.py`` (``GatedResidual``
with ``hc_per_branch_norm=True``) and ``layers/layer_boundary/residual/gated.py``.
Upstream rounds the read and the written streams to BF16 (its parameters are
BF16); this reference keeps the model dtype (FP32 on CPU).
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang_hybrid.models.kimi_k3.weights import ShardSpec


def _param(*shape, dtype=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def grouped_rms_norm(x: torch.Tensor, weight: torch.Tensor, group: int, eps: float, offset: float = 1.0) -> torch.Tensor:
    """RMSNorm over consecutive groups of ``group`` channels, scaled by ``weight + offset``.

    Args:
        x: ``[..., C]`` with ``C % group == 0``.
        weight: ``[C]``.
        group: channels per normalisation group (``C`` for an ordinary RMSNorm).
        eps: added to each group's mean square.
        offset: ``1.0`` for Gemma-style weights (upstream ``GroupedGemmaRMSNorm``,
            ``GemmaRMSNorm``, ``Qwen4ExpPLEGroupedNorm``), ``0.0`` for plain ones.

    Returns:
        ``x``'s shape and dtype (computed in FP32).

    Raises:
        ValueError: ``C`` not divisible by ``group``.
    """
    C = x.shape[-1]
    if C % group != 0:
        raise ValueError(f"channels {C} are not divisible by group={group}")
    xf = x.float().unflatten(-1, (C // group, group))
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf.flatten(-2) * (weight.float() + offset)).to(x.dtype)


class GatedStreams(nn.Module):
    """One read/write site on the ``hc`` residual streams (module docstring).

    Parameter names are upstream's (``hc_norm``, ``input_mix_weight_down``,
    ``input_mix_weight_up``, ``block_inject_weight``); the final read before the
    LM head has no write-back (``combine=False``).
    """

    def __init__(self, hc_count: int, hidden_size: int, lowrank: int, eps: float, combine: bool = True):
        super().__init__()
        self.hc, self.D, self.eps = hc_count, hidden_size, eps
        W = hc_count * hidden_size
        self.hc_norm = _param(W)
        self.input_mix_weight_down = _param(lowrank, W)
        self.input_mix_weight_up = _param(W, lowrank)
        self.block_inject_weight = _param(hc_count, W) if combine else None

    def checkpoint_mapping(self, ckpt_prefix: str, prefix: str) -> Dict[str, ShardSpec]:
        names = ["hc_norm", "input_mix_weight_down", "input_mix_weight_up"]
        if self.block_inject_weight is not None:
            names.append("block_inject_weight")
        return {f"{ckpt_prefix}.{n}.weight": ShardSpec(f"{prefix}.{n}") for n in names}

    def mix(self, streams: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``streams`` ``[N, hc * D]`` -> ``(x [N, D], normalised streams [N, hc * D])``."""
        if streams.shape[-1] != self.hc * self.D:
            raise ValueError(f"streams must have {self.hc * self.D} channels, got {streams.shape[-1]}")
        xn = grouped_rms_norm(streams, self.hc_norm, self.D, self.eps)
        fp8 = getattr(self, "fp8_lowrank", None)  # --qwen38-fp8-residual-proj (models/qwen38/precision.py)
        down = (xn @ self.input_mix_weight_down.t()) if fp8 is None else fp8(xn, self.input_mix_weight_down)
        gates = F.silu(down / self.hc)
        gates = torch.sigmoid((gates @ self.input_mix_weight_up.t()) if fp8 is None else fp8(gates, self.input_mix_weight_up))
        x = (gates * xn).unflatten(-1, (self.hc, self.D)).mean(dim=-2)
        return x, xn

    def combine(self, block_output: torch.Tensor, streams: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        """Write ``block_output`` ``[N, D]`` back: each stream gets it scaled by its injection gate in (0, 2)."""
        inject = 2.0 * torch.sigmoid((normed @ self.block_inject_weight.t()) / self.hc)  # [N, hc]
        out = streams.unflatten(-1, (self.hc, self.D)) + block_output.unsqueeze(-2) * inject.unsqueeze(-1)
        return out.flatten(-2)


def widen(hidden: torch.Tensor, hc_count: int) -> torch.Tensor:
    """The layer stack's input: ``hc`` copies of ``hidden`` ``[N, D]`` -> ``[N, hc * D]``."""
    return hidden.repeat(1, hc_count)
