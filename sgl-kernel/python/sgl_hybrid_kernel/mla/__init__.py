"""Multi-head latent attention (MLA) in the absorbed form: references, split-KV Triton kernel, aiter adapter, dispatch."""

from sgl_hybrid_kernel.mla.dispatch import mla_decode, mla_extend
from sgl_hybrid_kernel.mla.reference import latent_cache_rows, mla_attention_absorbed, mla_attention_paged_reference

__all__ = ["mla_attention_absorbed", "mla_attention_paged_reference", "latent_cache_rows", "mla_decode", "mla_extend"]
