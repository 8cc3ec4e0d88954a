"""Kimi Delta Attention (KDA): gate, recurrent and chunked forms."""

from sgl_hybrid_kernel.kda.reference import kda_chunk, kda_gate, kda_recurrent

__all__ = ["kda_gate", "kda_recurrent", "kda_chunk"]
