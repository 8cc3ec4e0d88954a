"""The hybrid radix cache's tree components: upstream's FULL (KV) and MAMBA (checkpoint) components
with eviction by measured value per byte and host capture of what leaves the device.

:class:`ValueAwareMambaComponent` evicts checkpoints lowest priority first
(:meth:`HybridRadixCache.checkpoint_priority`, issue 42) and hands each to the host tier;
:class:`HostCapturingFullComponent` does the same for KV leaves. Upstream evicts both in plain
LRU order. Both call back into their cache (``self.cache``); see
:mod:`sglang_hybrid.mem_cache.hybrid_radix_cache`.
"""

from __future__ import annotations

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

MAMBA = ComponentType.MAMBA
FULL = ComponentType.FULL


class ValueAwareMambaComponent(MambaComponent):
    """Upstream's MAMBA component, evicting the lowest value per byte first.

    Before each eviction walk the component's LRU list is reordered by
    :meth:`HybridRadixCache.checkpoint_priority` (lowest at the tail, where the
    walk starts). The walk itself, locks and cascades are upstream's.
    """

    def _reorder_for_value(self) -> None:
        lru = self.tree_core.lru_lists[MAMBA]
        if self.tree_core.enable_session_radix_cache or not lru.cache:
            return
        order = []  # LRU -> MRU
        pt = lru._pt
        x = lru.tail.lru_prev[pt]
        while x is not lru.head:
            order.append(x)
            x = x.lru_prev[pt]
        # highest priority ends at the MRU head, lowest at the tail; the stable sort keeps LRU order on ties
        for node in sorted(order, key=self.cache.checkpoint_priority):
            lru.reset_node_mru(node)

    def _evict_device_start(self, request_cnt: int) -> None:
        self._reorder_for_value()
        super()._evict_device_start(request_cnt)

    def evict_component(self, node, device_frees, host_frees, cache_actions, target=None, **kw):
        from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer

        target = EvictLayer.DEVICE if target is None else target
        if EvictLayer.DEVICE in target and node.component_data[MAMBA].value is not None:
            self.cache._advance_clock(node)
            self.cache._on_device_evict(node, MAMBA)
        return super().evict_component(node, device_frees, host_frees, cache_actions, target=target, **kw)

    def prepare_for_caching_req(self, req, insert_params, token_ids_len: int, is_finished: bool):
        """Upstream's; also records the position of a donated state (checked against its node's depth)."""
        cache_len = super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)
        if cache_len and getattr(insert_params, "mamba_value", None) is not None:
            self.cache._donated_positions.append(int(cache_len))
        return cache_len

    def _select_finished_checkpoint(self, req, token_ids_len: int):
        """Upstream's choice of the state a finished request donates, gated for decode-end states.

        A state tracked during decode (position beyond the prompt) is donated only
        while :meth:`HybridRadixCache._end_is_valuable` predicts reuse (issue #3,
        placement: "decode-end states only where the policy predicts reuse"). ``None``
        makes the finish insert nothing new: the prompt (KV + prompt-end state) was
        inserted when its prefill ended, and the decoded tokens' KV is freed (no state
        at its end, so no resume point; upstream refuses a FULL + MAMBA insert without
        one). Returns upstream's ``(position, slot)`` or ``None`` (donate nothing).
        """
        sel = super()._select_finished_checkpoint(req, token_ids_len)
        cache = self.cache
        if sel is None or not getattr(cache, "serving", False):
            return sel
        prompt_len = len(getattr(req, "origin_input_ids", None) or ())
        if sel[0] <= prompt_len:
            return sel
        if not cache._end_is_valuable():
            cache.metrics.decode_end_skipped += 1
            return None
        cache._pending_end_positions.append(sel[0])
        return sel


class HostCapturingFullComponent(FullComponent):
    """Upstream's FULL component; leaves are evicted lowest value per byte first
    (:meth:`HybridRadixCache.leaf_eviction_key`: KV with no checkpoint at its end
    first), and a KV segment leaving the device is offered to the host tier first."""

    def _evict_device_start(self, request_cnt: int) -> None:
        self.session_ref_eviction_strategy = self.cache.leaf_eviction_key
        super()._evict_device_start(request_cnt)

    def evict_component(self, node, device_frees, host_frees, cache_actions, target=None, **kw):
        from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer

        target = EvictLayer.DEVICE if target is None else target
        if EvictLayer.DEVICE in target and node.component_data[FULL].value is not None:
            self.cache._on_device_evict(node, FULL)
        return super().evict_component(node, device_frees, host_frees, cache_actions, target=target, **kw)
