"""CPU conv1d / GDN entry points that upstream's linear-attention backends import.

``causal_conv1d_update_cpu`` and ``causal_conv1d_fn_cpu`` follow the
``causal-conv1d`` package's calling convention as SGLang uses it; they are
implemented with :mod:`sgl_hybrid_kernel.conv`. ``chunk_gated_delta_rule_cpu``
is looked up only by upstream's GDN Triton kernel class and raises if called.
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_hybrid_kernel.conv.reference import causal_conv1d_step


def causal_conv1d_update_cpu(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    **kwargs,
) -> torch.Tensor:
    """Decode step. ``x`` ``[B, D]``; ``conv_state`` ``[slots, D, K-1]`` (a view,
    updated in place); ``weight`` ``[D, K]``; returns ``[B, D]``."""
    if bias is not None:
        raise NotImplementedError("causal_conv1d_update_cpu: conv bias is not supported by the CPU shim")
    if kwargs:
        raise NotImplementedError(f"causal_conv1d_update_cpu: unsupported arguments {sorted(kwargs)}")
    if conv_state_indices is None:
        conv_state_indices = torch.arange(x.shape[0])
    state = conv_state.transpose(-1, -2)  # [slots, K-1, D] view of the same storage
    return causal_conv1d_step(x, weight, state, conv_state_indices, activation)


def causal_conv1d_fn_cpu(*args, **kwargs):
    raise NotImplementedError(
        "sgl_kernel.mamba.causal_conv1d_fn_cpu is not provided by the sglang-hybrid CPU shim; "
        "our KDA/GDN backends run their own conv (sgl_hybrid_kernel.conv)."
    )


def chunk_gated_delta_rule_cpu(*args, **kwargs):
    raise NotImplementedError(
        "sgl_kernel.mamba.chunk_gated_delta_rule_cpu is not provided by the sglang-hybrid CPU shim; "
        "our GDN backend uses sgl_hybrid_kernel."
    )
