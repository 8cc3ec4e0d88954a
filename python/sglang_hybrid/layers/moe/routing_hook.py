"""Our MoE routing kernel under upstream's routing functions (issue 5, Wiring).

Upstream's ``TopK`` (used by Kimi K3's ``KimiK3MoE`` and Qwen3.8's sparse MoE
blocks) routes through ``select_experts``, which calls the module-level names
``biased_grouped_topk`` (sigmoid + correction bias + groups: Kimi K3) and
``fused_topk`` (softmax: Qwen) of ``sglang.srt.layers.moe.topk``. AROUND hooks on
those two names send GPU/ROCm calls inside our Triton contract (``M <= 160`` rows,
``M * top_k <= 4096`` entries, no fused shared-expert slots, no packed output or
padding count) to ``sgl_hybrid_kernel.moe`` (:func:`route`); everything else —
CPU included — runs upstream's function unchanged.

Our kernel can also build an expert-sorted layout; upstream's MoE runner builds
its own, so the hook asks for the routing only (``layout=False``: one launch, no
layout buffers) and returns ``(weights, ids)``. Before, the layout launch ran with
no consumer: on the H100 profile of one GPU's K3 share our routing took 17 µs per
decode step for three MoE layers against upstream's 5 (docs/gpu.md).
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.moe.dispatch import MAX_ROWS, fused_moe_routing
from sgl_hybrid_kernel.moe.routing import MAX_ENTRIES, fused_moe_routing_triton
from sgl_hybrid_kernel.moe.routing_reference import route_tokens_reference
from sglang_hybrid.patches import register_patches

logger = logging.getLogger(__name__)


def route(gating_output: torch.Tensor, topk: int, renormalize: bool, scoring_func: str,
          correction_bias: Optional[torch.Tensor] = None, num_expert_group: Optional[int] = None,
          topk_group: Optional[int] = None, routed_scaling_factor: Optional[float] = None,
          apply_routed_scaling_factor_on_output: bool = False, impl: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Upstream's routing contract on our kernel: ``(topk_weights [M, topk] FP32, topk_ids [M, topk] int32)``.

    ``routed_scaling_factor`` multiplies the weights only when
    ``apply_routed_scaling_factor_on_output`` (upstream's convention).
    impl: ``"auto"`` (``moe.dispatch``), ``"triton"`` or ``"torch"`` (tests).
    """
    scale = float(routed_scaling_factor) if apply_routed_scaling_factor_on_output and routed_scaling_factor else 1.0
    args = (gating_output, topk, scoring_func, correction_bias, num_expert_group or 1, topk_group or 1, renormalize, scale)
    if impl == "torch":
        return route_tokens_reference(*args)
    # routing only: upstream's MoE runner builds its own expert-sorted layout (ours would have no consumer)
    r = fused_moe_routing_triton(*args, layout=False) if impl == "triton" else fused_moe_routing(*args, layout=False)
    return r.weights, r.ids


def _ours(gating_output: torch.Tensor, topk: int, correction_bias, shared: int, extra: bool) -> bool:
    if device_kind(gating_output) == "cpu":
        return False
    M, E = gating_output.shape
    why = None
    if shared or extra:
        why = "fused shared-expert slots / packed output / padding count"
    elif M > MAX_ROWS or M * topk > MAX_ENTRIES or E >= 65535:
        why = f"M={M}, top_k={topk}, E={E} outside the Triton contract"
    elif correction_bias is not None and correction_bias.dim() != 1:
        why = "per-token correction bias"
    if why:
        record_choice("moe_routing_hook", "upstream", why, log=logger)
        return False
    record_choice("moe_routing_hook", "sgl_hybrid", "upstream select_experts -> sgl_hybrid_kernel.moe", log=logger)
    return True


def _around_biased_grouped_topk(original, hidden_states, gating_output, correction_bias, topk, renormalize,
                                num_expert_group=None, topk_group=None, num_fused_shared_experts=0,
                                routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False, **kwargs):
    if kwargs or not _ours(gating_output, topk, correction_bias, num_fused_shared_experts, False):
        return original(hidden_states, gating_output, correction_bias, topk, renormalize, num_expert_group, topk_group,
                        num_fused_shared_experts=num_fused_shared_experts, routed_scaling_factor=routed_scaling_factor,
                        apply_routed_scaling_factor_on_output=apply_routed_scaling_factor_on_output, **kwargs)
    return route(gating_output, topk, renormalize, "sigmoid", correction_bias, num_expert_group, topk_group,
                 routed_scaling_factor, bool(apply_routed_scaling_factor_on_output))


def _around_fused_topk(original, hidden_states, gating_output, topk, renormalize, correction_bias=None,
                       scoring_func="softmax", routed_scaling_factor=None, apply_routed_scaling_factor_on_output=False,
                       num_fused_shared_experts=0, packed_out=None, num_token_non_padded=None, **kwargs):
    extra = bool(kwargs) or packed_out is not None or num_token_non_padded is not None or scoring_func not in ("softmax", "sigmoid")
    if not _ours(gating_output, topk, correction_bias, num_fused_shared_experts, extra):
        call = dict(correction_bias=correction_bias, scoring_func=scoring_func, routed_scaling_factor=routed_scaling_factor,
                    apply_routed_scaling_factor_on_output=apply_routed_scaling_factor_on_output,
                    num_fused_shared_experts=num_fused_shared_experts, **kwargs)
        if packed_out is not None or num_token_non_padded is not None:  # fused_topk_cpu lacks these two
            call.update(packed_out=packed_out, num_token_non_padded=num_token_non_padded)
        return original(hidden_states, gating_output, topk, renormalize, **call)
    return route(gating_output, topk, renormalize, scoring_func, correction_bias, None, None,
                 routed_scaling_factor, bool(apply_routed_scaling_factor_on_output))


def install() -> None:
    """AROUND hooks on upstream's ``biased_grouped_topk`` and ``fused_topk`` (GPU/ROCm only)."""
    register_patches(__name__)
