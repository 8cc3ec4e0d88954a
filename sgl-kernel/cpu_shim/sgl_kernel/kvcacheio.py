"""``sgl_kernel.kvcacheio`` (host <-> device KV transfer for hierarchical caching): placeholders only.

Upstream's host KV pools import these at module load on CUDA and call them only
when a host cache tier is enabled (``--enable-hierarchical-cache`` and friends).
``get_device_accessible_ptr`` and ``transfer_embedding_ranges_direct`` are
importable too; upstream uses them only when ``torch.ops.sgl_kernel`` also has an
op of that name, which the stand-in never registers, so upstream keeps its own
fallbacks (raw host addresses, no direct embedding transfer).
"""

from sgl_kernel._unprovided import define

define(
    globals(),
    "sgl_kernel.kvcacheio",
    (
        "get_device_accessible_ptr",
        "transfer_embedding_ranges_direct",
        "transfer_kv_all_layer",
        "transfer_kv_all_layer_direct_lf_pf",
        "transfer_kv_all_layer_lf_pf",
        "transfer_kv_all_layer_lf_ph",
        "transfer_kv_all_layer_mla",
        "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct",
        "transfer_kv_per_layer",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla",
        "transfer_kv_per_layer_mla_pf_lf",
        "transfer_kv_per_layer_pf_lf",
        "transfer_kv_per_layer_ph_lf",
    ),
    "hierarchical-cache KV transfer: run without a host cache tier",
)
