"""``sgl_kernel.flash_attn`` (FlashAttention 3): placeholders only.

Upstream's ``fa3`` attention backend takes these kernels; with the stand-in
serve with ``--attention-backend triton`` (or flashinfer where installed).
"""

from sgl_kernel._unprovided import define

define(
    globals(),
    "sgl_kernel.flash_attn",
    ("flash_attn_varlen_func", "flash_attn_with_kvcache", "get_scheduler_metadata", "build_bidirectional_block_ids"),
    "FlashAttention 3: choose --attention-backend triton",
)
