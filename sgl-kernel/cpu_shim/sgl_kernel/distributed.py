"""The CPU build's distributed ops (``torch.ops.sgl_kernel.*``) over ``torch.distributed``.

Upstream SGLang 0.5.23 calls four ops of the CPU ``sgl_kernel`` build when it
serves with ``--tp > 1`` on a host where ``is_shm_available`` holds (Intel AMX
with the real kernels, or any arm64 host):

=========================================  ==============================================
``initialize(int size, int rank)``          ``bootstrap._init_cpu_threads_env``: set up the
                                            shared-memory all-reduce for ``size`` TP ranks
``init_cpu_threads_env(int[] cpu_ids)``     same place: bind this rank's OpenMP threads
``shm_allreduce(Tensor(a!) data, int op)``  ``GroupCoordinator.all_reduce`` (``op`` =
                                            ``int(ReduceOp.SUM)``), in place
``shm_allgather(Tensor data, int dim)``     ``GroupCoordinator.all_gather``: concatenate
                                            along ``dim`` in rank order
=========================================  ==============================================

The real kernels use a ``/dev/shm`` segment shared by the ranks of one host.
Here they are ``torch.distributed.all_reduce`` / ``all_gather`` on the default
process group, which upstream creates with the gloo backend for
``--device cpu``. Upstream uses these ops only when the group spans every local
rank (``world_size == LOCAL_SIZE == tp_size``), so the default group is that
group; :func:`shm_allreduce` checks the width given to :func:`initialize` and
raises ``RuntimeError`` otherwise. Issue 8 (docs/parallelism.md).
"""

from __future__ import annotations

import os
from typing import List

import torch
import torch.distributed as dist

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
_STATE = {"size": None, "rank": None}


def _initialize(size: int, rank: int) -> None:
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size={size}), got {rank}")
    _STATE.update(size=size, rank=rank)


def _init_cpu_threads_env(cpu_ids: List[int]) -> str:
    ids = sorted(set(int(c) for c in cpu_ids))
    if not ids:
        raise ValueError("cpu_ids must name at least one core")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, ids)
    torch.set_num_threads(len(ids))
    return f"rank threads bound to cores {ids}"


def _check_group() -> None:
    if not dist.is_initialized():
        raise RuntimeError("sgl_kernel shm collectives need torch.distributed to be initialized")
    size = _STATE["size"]
    if size is not None and dist.get_world_size() != size:
        raise RuntimeError(
            f"sgl_kernel shm collectives were initialized for {size} ranks but the default "
            f"process group has {dist.get_world_size()}; the CPU shim serves a group of all local ranks only"
        )


def _shm_allreduce(data: torch.Tensor, reduce_op: int) -> None:
    if reduce_op != int(dist.ReduceOp.SUM):
        raise ValueError(f"reduce_op must be ReduceOp.SUM ({int(dist.ReduceOp.SUM)}), got {reduce_op}")
    _check_group()
    if data.is_contiguous():
        dist.all_reduce(data)
    else:
        buf = data.contiguous()
        dist.all_reduce(buf)
        data.copy_(buf)


def _shm_allgather(data: torch.Tensor, dim: int) -> torch.Tensor:
    _check_group()
    parts = [torch.empty_like(data, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, data.contiguous())
    return torch.cat(parts, dim=dim)


_LIB.define("initialize(int size, int rank) -> ()")
_LIB.impl("initialize", _initialize, "CompositeExplicitAutograd")
_LIB.define("init_cpu_threads_env(int[] cpu_ids) -> str")
_LIB.impl("init_cpu_threads_env", _init_cpu_threads_env, "CompositeExplicitAutograd")
_LIB.define("shm_allreduce(Tensor(a!) data, int reduce_op) -> ()")
_LIB.impl("shm_allreduce", _shm_allreduce, "CPU")
_LIB.define("shm_allgather(Tensor data, int dim) -> Tensor")
_LIB.impl("shm_allgather", _shm_allgather, "CPU")
