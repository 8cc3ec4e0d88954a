"""Multi-head latent attention (MLA) in the absorbed form."""

from sgl_hybrid_kernel.mla.reference import mla_attention_absorbed

__all__ = ["mla_attention_absorbed"]
