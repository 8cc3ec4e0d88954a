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

``--dcp-size > 1``: ``initialize_model_parallel`` refuses DCP unless the
platform is HIP / CUDA / NPU / XPU, although the DCP group it then builds is an
ordinary ``GroupCoordinator`` (gloo on CPU) and the CPU reference model does its
own DCP attention over it (``models/kimi_k3/mla.py``). The second hook lets
that one guard pass on the CPU: for the duration of the call, the module's
``is_cuda`` answers True; the install checks that the guard is the module's
only ``is_cuda()`` call, so nothing else in ``parallel_state`` sees the
override (``is_cuda_alike``, which picks the group device, is a different
function). Anchor: ``initialize_model_parallel``.

Issue 8; docs/parallelism.md ("Serving with --tp 2 on CPU", "DCP on the server").
"""

from __future__ import annotations

import logging

from sglang_hybrid.patches import find_patch

logger = logging.getLogger(__name__)

_DCP_PATCH = find_patch(f"{__name__}:_initialize_with_cpu_dcp")  # AROUND initialize_model_parallel
_DCP_GUARD = _DCP_PATCH.snippet  # the guard text, anchored in the declaration (patches.py)

# CUDA-only communicators that a CPU group must not build.
_CUDA_ONLY = ("use_pynccl", "use_custom_allreduce", "use_mscclpp", "use_torch_symm_mem_allreduce")


def _init_group_without_cuda_communicators(original_fn, *args, **kwargs):
    for name in _CUDA_ONLY:
        kwargs[name] = False
    return original_fn(*args, **kwargs)


def _initialize_with_cpu_dcp(original_fn, *args, **kwargs):
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_parallel

    if get_parallel().attn_dcp_size <= 1:
        return original_fn(*args, **kwargs)
    saved = ps.is_cuda
    ps.is_cuda = lambda: True  # read only by the DCP platform guard (checked in _check_dcp_guard)
    try:
        return original_fn(*args, **kwargs)
    finally:
        ps.is_cuda = saved


def _check_dcp_guard() -> None:
    """Fail loudly unless the DCP platform guard is ``parallel_state``'s only ``is_cuda()`` call."""
    import inspect

    from sglang.srt.distributed import parallel_state as ps

    from sglang_hybrid.anchors import AnchorError

    source = inspect.getsource(ps)
    if _DCP_GUARD not in inspect.getsource(ps.initialize_model_parallel) or source.count("is_cuda()") != 1:
        raise AnchorError(
            f"{_DCP_PATCH.target}: expected the DCP platform guard {_DCP_GUARD!r} to be the module's only "
            "is_cuda() call — needed for --dcp-size > 1 on CPU (sglang_hybrid.parallel.cpu_tp)"
        )


def install() -> None:
    """Register the AROUND hooks on upstream's ``init_model_parallel_group`` and
    ``initialize_model_parallel`` (CPU platform only).

    Raises:
        AnchorError: the DCP platform guard changed (see the module docstring).
    """
    from sglang_hybrid.patches import register_patches

    _check_dcp_guard()
    register_patches(__name__)
    logger.debug("sglang-hybrid: CPU model-parallel groups built without CUDA communicators")
