"""Normalisation ops: RMSNorm, gated RMSNorm, L2 norm."""

from sgl_hybrid_kernel.norm.reference import gated_rms_norm, l2_norm, rms_norm

__all__ = ["rms_norm", "gated_rms_norm", "l2_norm"]
