"""Gated DeltaNet (GDN): scalar per-head decay, grouped value heads."""

from sgl_hybrid_kernel.gdn.reference import gdn_gate, gdn_recurrent

__all__ = ["gdn_gate", "gdn_recurrent"]
