"""MoE routing (sigmoid / softmax, correction bias, grouped top-k, shared slot, sorted layout) and expert compute."""

from sgl_hybrid_kernel.moe.dispatch import fused_moe_routing
from sgl_hybrid_kernel.moe.reference import biased_grouped_topk, moe_experts
from sgl_hybrid_kernel.moe.routing_reference import expert_sorted_layout_reference, route_tokens_reference

__all__ = ["biased_grouped_topk", "moe_experts", "fused_moe_routing", "route_tokens_reference", "expert_sorted_layout_reference"]
