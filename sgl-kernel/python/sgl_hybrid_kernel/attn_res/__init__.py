"""Attention residuals (AttnRes): softmax mixing of banked residual snapshots, and its fusion with RMSNorm."""

from sgl_hybrid_kernel.attn_res.dispatch import attn_res_rmsnorm
from sgl_hybrid_kernel.attn_res.fused_reference import attn_res_rmsnorm_reference
from sgl_hybrid_kernel.attn_res.reference import attn_res_mix

__all__ = ["attn_res_mix", "attn_res_rmsnorm", "attn_res_rmsnorm_reference"]
