"""Plain-torch references for Gated DeltaNet (GDN) as used by Qwen3-Next / Qwen3.8.

Decay per value head ``g = -exp(A_log) * softplus(a + dt_bias)`` (natural log,
<= 0), ``beta = sigmoid(b)``; the recurrence is
:func:`sgl_hybrid_kernel.delta_rule.reference.gated_delta_recurrent` with a
scalar decay.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.delta_rule.reference import gated_delta_recurrent


def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """``[..., HV]`` raw gate -> ``[..., HV]`` FP32 log decay ``-exp(A_log) * softplus(a + dt_bias)``."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())


def gdn_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    acc_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GDN over one sequence: ``q, k`` ``[T, H, K]``, ``v`` ``[T, HV, V]``, ``g, beta`` ``[T, HV]``.

    Returns ``(o [T, HV, V], final_state [HV, K, V])``.
    """
    o, S, _ = gated_delta_recurrent(q, k, v, g, beta, scale, initial_state, acc_dtype)
    return o, S
