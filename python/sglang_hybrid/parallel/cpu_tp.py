"""Serving with ``--tp > 1`` on a CPU: upstream's model-parallel groups on gloo, no NCCL communicator.

Upstream SGLang 0.5.23 builds each model-parallel ``GroupCoordinator`` with a
gloo ``cpu_group`` and, for ``--device cpu``, a gloo ``device_group``; its CPU
collectives are ``torch.distributed`` on that group, or ``sgl_kernel``'s
shared-memory ``shm_allreduce`` / ``shm_allgather`` where
``is_shm_available`` holds (Intel AMX or arm64 hosts; our CPU ``sgl_kernel``
shim provides those ops over ``torch.distributed``, see
``sgl-kernel/cpu_shim/sgl_kernel/distributed.py``).

One thing in that path assumes a CPU-only torch build: ``init_model_parallel_group``
asks for a PyNccl communicator (``use_pynccl``) unless the platform is NPU/XPU,
and the communicator only disables itself when ``libnccl`` cannot be loaded. With a
CUDA build of torch on a machine without a GPU (our CI), ``libnccl`` loads and
``PyNcclCommunicator`` stops in ``torch.cuda.device(cpu)``. The hook below
passes ``use_pynccl=False`` (and no custom / mscclpp / symmetric-memory
all-reduce, all CUDA-only) when the serving device is the CPU, which is what an
out-of-tree platform without ``supports_pynccl`` gets from upstream.
Anchor: ``sglang_hybrid.anchors`` (``init_model_parallel_group``).

Issue 8; docs/parallelism.md ("Serving with --tp 2 on CPU").
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

INIT_GROUP = "sglang.srt.distributed.parallel_state.init_model_parallel_group"

# CUDA-only communicators that a CPU group must not build.
_CUDA_ONLY = ("use_pynccl", "use_custom_allreduce", "use_mscclpp", "use_torch_symm_mem_allreduce")


def _init_group_without_cuda_communicators(original_fn, *args, **kwargs):
    for name in _CUDA_ONLY:
        kwargs[name] = False
    return original_fn(*args, **kwargs)


def install() -> None:
    """Register the AROUND hook on upstream's ``init_model_parallel_group`` (CPU platform only)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(INIT_GROUP, _init_group_without_cuda_communicators, HookType.AROUND)
    logger.debug("sglang-hybrid: CPU model-parallel groups built without CUDA communicators")
