"""Attention residuals (AttnRes): softmax mixing of banked residual snapshots."""

from sgl_hybrid_kernel.attn_res.reference import attn_res_mix

__all__ = ["attn_res_mix"]
