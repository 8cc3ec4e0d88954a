"""``sgl_kernel.top_k`` (QSA / DSA fast top-k): placeholders only."""

from sgl_kernel._unprovided import define

define(globals(), "sgl_kernel.top_k", ("fast_topk_v2",), "fast top-k kernel")
