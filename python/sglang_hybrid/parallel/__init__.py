"""Parallelism helpers for the CPU reference models (issue 8): TP shard specs, DCP ownership, MoE output ownership.

See docs/parallelism.md. Communication is torch.distributed on explicit process
groups (gloo on CPU); no home-made communication layer.
"""

from sglang_hybrid.parallel.dcp import dcp_owned, dcp_partial_attention, mla_kv_bytes_per_rank
from sglang_hybrid.parallel.moe_ownership import owned_output_rows, owned_weight_bytes_saved
from sglang_hybrid.parallel.spec import ParallelSpec, shard_range

__all__ = [
    "ParallelSpec",
    "shard_range",
    "dcp_owned",
    "dcp_partial_attention",
    "mla_kv_bytes_per_rank",
    "owned_output_rows",
    "owned_weight_bytes_saved",
]
