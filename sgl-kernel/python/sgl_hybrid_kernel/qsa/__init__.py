"""QSA (Qwen sparse attention): sparse path over selected compressed blocks and its exact dense special case."""

from sgl_hybrid_kernel.qsa.dispatch import choose_qsa_path, qsa_attention
from sgl_hybrid_kernel.qsa.reference import qsa_attention_reference

__all__ = ["qsa_attention", "qsa_attention_reference", "choose_qsa_path"]
