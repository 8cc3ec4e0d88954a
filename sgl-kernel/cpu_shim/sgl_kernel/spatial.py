"""``sgl_kernel.spatial`` (SM partitioning for PD multiplexing): placeholders only."""

from sgl_kernel._unprovided import define

define(globals(), "sgl_kernel.spatial", ("get_sm_available", "create_greenctx_stream_by_value"), "PD multiplexing")
