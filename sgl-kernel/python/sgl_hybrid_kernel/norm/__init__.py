"""Normalisation ops: RMSNorm (also after a residual add), gated RMSNorm, L2 norm.

``reference`` holds the plain-torch oracles (exported here); ``dispatch`` chooses
aiter (ROCm, ``aiter_adapter``), the Triton row kernel (``rms_norm``) or torch for
RMSNorm; ``ops`` registers ``rms_norm`` / ``fused_add_rms_norm`` for the start-up
table and boot gates.
"""

from sgl_hybrid_kernel.norm.reference import fused_add_rms_norm, gated_rms_norm, l2_norm, rms_norm

__all__ = ["rms_norm", "fused_add_rms_norm", "gated_rms_norm", "l2_norm"]
