"""Plain-torch short causal convolution with an explicit conv state.

Layout follows SGLang's KDA state pool: the conv state of one sequence is the
last ``K - 1`` *raw* (pre-convolution) input rows, ``[K - 1, D]``, oldest first.
Weights are depthwise, ``[D, K]``; output row ``t`` is
``act(sum_j w[:, j] * xx[t + j])`` with ``xx = cat(state, x)``, i.e. the
causal convolution of Dao & Gu's ``causal-conv1d``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def _activate(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over one sequence (prefill / extend).

    Args:
        x: ``[T, D]`` new input rows (T >= 1).
        weight: ``[D, K]`` depthwise filter.
        state: ``[K - 1, D]`` previous raw rows (``None`` = zeros, a fresh sequence).
        activation: ``"silu"`` (default) or ``None``.

    Returns:
        ``(y, new_state)``: ``y`` ``[T, D]`` in ``x.dtype`` (FP32 accumulation),
        ``new_state`` ``[K - 1, D]`` = the last ``K - 1`` raw rows of ``cat(state, x)``.

    Raises:
        ValueError: shape mismatch.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[0]:
        raise ValueError(f"x must be [T, D] and weight [D, K]; got {tuple(x.shape)}, {tuple(weight.shape)}")
    T, D = x.shape
    K = weight.shape[1]
    if state is None:
        state = x.new_zeros(K - 1, D)
    elif tuple(state.shape) != (K - 1, D):
        raise ValueError(f"state must be [{K - 1}, {D}], got {tuple(state.shape)}")
    xx = torch.cat([state.to(x.dtype), x], dim=0).float()  # [T + K - 1, D]
    windows = xx.unfold(0, K, 1)  # [T, D, K]
    y = (windows * weight.float()).sum(-1)
    new_state = xx[-(K - 1):].to(x.dtype) if K > 1 else x.new_zeros(0, D)
    return _activate(y, activation).to(x.dtype), new_state


def causal_conv1d_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
    activation: Optional[str] = "silu",
) -> torch.Tensor:
    """One decode step for a batch, updating the pooled conv state in place.

    Args:
        x: ``[B, D]`` one new raw row per sequence.
        weight: ``[D, K]``.
        conv_state: pool ``[num_slots, K - 1, D]``; rows ``state_indices`` are
            read and overwritten in place (shifted left by one, ``x`` appended).
        state_indices: ``[B]`` int slot index per sequence.
        activation: ``"silu"`` or ``None``.

    Returns:
        ``y`` ``[B, D]`` in ``x.dtype``.
    """
    idx = state_indices.long()
    window = torch.cat([conv_state[idx].to(x.dtype), x.unsqueeze(1)], dim=1)  # [B, K, D]
    y = (window.float() * weight.float().t().unsqueeze(0)).sum(1)
    conv_state[idx] = window[:, 1:].to(conv_state.dtype)
    return _activate(y, activation).to(x.dtype)
