"""Decode context parallel (DCP): exact LSE merge of per-rank partial attention, round-robin ownership."""

from sgl_hybrid_kernel.dcp.dispatch import merge_partial_attention
from sgl_hybrid_kernel.dcp.reference import dcp_local_length, dcp_local_positions, merge_partial_attention_reference

__all__ = ["merge_partial_attention", "merge_partial_attention_reference", "dcp_local_length", "dcp_local_positions"]
