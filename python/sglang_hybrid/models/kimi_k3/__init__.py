"""Kimi K3 (text) reference model: MLA + KDA layers, MoE, attention residuals."""

from sglang_hybrid.models.kimi_k3.model import KimiK3ReferenceForCausalLM

ARCHITECTURE = "KimiK3LinearForCausalLM"

__all__ = ["KimiK3ReferenceForCausalLM", "ARCHITECTURE"]
