"""MoE routing (sigmoid + correction bias, grouped top-k) and expert compute."""

from sgl_hybrid_kernel.moe.reference import biased_grouped_topk, moe_experts

__all__ = ["biased_grouped_topk", "moe_experts"]
