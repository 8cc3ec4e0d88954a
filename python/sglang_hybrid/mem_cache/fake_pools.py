"""Byte-accounted stand-ins for the KV allocator and the recurrent-state pool.

They let upstream's real radix-cache classes (and ours) run over a whole
production trace on a CPU: no KV or state tensor is ever allocated, only the
slot bookkeeping the caches call into. Used by ``benchmark/cache/replay_cache.py``
and by the cache's unit tests.

* :class:`FakeKVAllocator` hands out monotonically increasing int64 token ids
  (ids are never reused, so a double free or a lost id shows up in
  ``free_tokens + cached + held != capacity``).
* :func:`build_state_pool` builds upstream's ``HybridReqToTokenPool`` with a
  one-layer, one-element state: the slot allocator is upstream's own, the
  tensors are bytes, not gigabytes.
"""

from __future__ import annotations

from typing import Optional

import torch


class FakeKVAllocator:
    """Token-granular KV allocator with ``capacity`` slots and no storage.

    Only the methods upstream's ``UnifiedRadixCache`` calls on the FULL
    component's allocator are provided. ``alloc(n)`` returns an int64 tensor of
    ``n`` fresh ids or ``None`` when fewer than ``n`` are free.
    """

    def __init__(self, capacity: int, page_size: int = 1, device: str = "cpu"):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.size = capacity
        self.size_full = capacity
        self.page_size = page_size
        self.device = device
        self._free = capacity
        self._next_id = 1  # id 0 is the padding slot in upstream's pools
        self.freed_total = 0
        self._group_depth = 0

    # -- accounting -------------------------------------------------------
    def available_size(self) -> int:
        return self._free

    full_available_size = available_size

    def schedulable_available_size(self) -> int:
        return self._free

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size < 0:
            raise ValueError(f"need_size must be >= 0, got {need_size}")
        if need_size > self._free:
            return None
        out = torch.arange(self._next_id, self._next_id + need_size, dtype=torch.int64)
        self._next_id += need_size
        self._free -= need_size
        return out

    def free(self, free_index: torch.Tensor) -> None:
        n = int(free_index.numel())
        self._free += n
        self.freed_total += n
        if self._free > self.size:
            raise AssertionError(f"KV double free: {self._free} free > capacity {self.size}")

    def free_segment(self, free_index: torch.Tensor, *args, **kwargs) -> None:
        self.free(free_index)

    free_full_segment = free_segment

    def free_group_begin(self) -> None:
        self._group_depth += 1

    def free_group_end(self) -> None:
        self._group_depth -= 1

    def get_kvcache(self):  # pragma: no cover - only HiCache asks
        raise NotImplementedError("FakeKVAllocator has no KV storage")


def build_state_pool(num_slots: int, max_num_reqs: int = 4, max_context_len: int = 1 << 20):
    """Upstream's ``HybridReqToTokenPool`` with ``num_slots`` recurrent-state slots.

    The state is one layer of a 1-head, 1-dim Mamba2 shape (a few bytes per
    slot): the radix cache only needs the slot allocator. ``max_context_len``
    sizes the request-to-token table of ``max_num_reqs`` rows (int32).
    """
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=2, n_groups=1, num_heads=1, head_dim=2, state_size=1, conv_kernel=2
    )
    params = Mamba2CacheParams(shape=shape, layers=[0])
    return HybridReqToTokenPool(
        size=max_num_reqs,
        mamba_size=num_slots,
        mamba_spec_state_size=max_num_reqs,
        max_context_len=max_context_len,
        device="cpu",
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=True,
        speculative_num_draft_tokens=3,
    )


def build_cache(
    policy: str,
    kv_capacity: int,
    state_slots: int,
    page_size: int = 64,
    grid: int = 64,
    **hybrid_kwargs,
):
    """(cache, kv_allocator, state_pool) over fake pools.

    ``policy`` is ``"upstream"`` (sglang's ``UnifiedRadixCache``, FULL + MAMBA,
    extra_buffer) or ``"hybrid"`` (ours; ``hybrid_kwargs`` go to
    :class:`~sglang_hybrid.mem_cache.hybrid_radix_cache.HybridRadixCache`).
    ``grid`` is the checkpoint grid (upstream's mamba cache chunk size).
    Sets upstream's global server args for the scheduler process (page size,
    chunk) as a scheduler would.
    """
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache

    sa = ServerArgs(model_path="dummy", page_size=page_size)
    sa._mamba_cache_chunk_size = grid
    set_global_server_args_for_scheduler(sa)
    alloc = FakeKVAllocator(kv_capacity, page_size=page_size)
    pool = build_state_pool(state_slots)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA),
        enable_mamba_extra_buffer=True,
        tree_core_backend="python",
    )
    if policy == "upstream":
        cache = UnifiedRadixCache(params=params)
    elif policy == "hybrid":
        cache = HybridRadixCache(params, **hybrid_kwargs)
    else:
        raise ValueError(f"policy must be 'upstream' or 'hybrid', got {policy!r}")
    return cache, alloc, pool
