"""Machinery shared by KDA and GDN: the gated delta rule with a per-channel or per-head decay."""

from sgl_hybrid_kernel.delta_rule.reference import gated_delta_recurrent

__all__ = ["gated_delta_recurrent"]
