"""Parallelism helpers for the CPU reference models (issue 8): TP shard specs, DCP ownership, MoE output ownership.

Modules: ``spec`` (placement, collectives), ``dcp``, ``moe_ownership``, ``runner``
(Kimi K3 model-level runs), ``qwen38_tp`` / ``qwen38_runner`` (Qwen3.8 TP), ``cpu_tp``
(serving with ``--tp > 1`` on CPU). See docs/parallelism.md. Communication is
torch.distributed on explicit process groups (gloo on CPU); no home-made
communication layer.
"""

from sglang_hybrid.parallel.dcp import dcp_owned, dcp_partial_attention, dcp_rows, mla_kv_bytes_per_rank
from sglang_hybrid.parallel.moe_ownership import owned_output_rows, owned_weight_bytes_saved
from sglang_hybrid.parallel.spec import ParallelSpec, shard_range

__all__ = [
    "ParallelSpec",
    "shard_range",
    "dcp_owned",
    "dcp_partial_attention",
    "dcp_rows",
    "mla_kv_bytes_per_rank",
    "owned_output_rows",
    "owned_weight_bytes_saved",
]
