"""Qwen3.8-Flash-Next (upstream model type ``qwen4_exp``) reference model: GDN + QSA layers,
gated hyper-connection streams, per-layer n-gram embeddings, MoE with a gated shared expert, MTP head."""

from sglang_hybrid.models.qwen38.model import Qwen38ReferenceForConditionalGeneration

ARCHITECTURE = "Qwen4ExpForConditionalGeneration"

__all__ = ["Qwen38ReferenceForConditionalGeneration", "ARCHITECTURE"]
