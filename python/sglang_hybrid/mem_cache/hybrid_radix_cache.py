"""Hybrid radix cache: aligned resume points, value-aware eviction, host tier.

A *resume point* is a position ``p`` at which both the attention KV of tokens
``[0, p)`` and a recurrent checkpoint (conv window + recurrent state of every
KDA/GDN layer) at exactly ``p`` are cached. Upstream's ``UnifiedRadixCache``
with its FULL + MAMBA components already returns the deepest node that holds
both (``device_prefix_len``) and reports the longer KV-only match
(``full_kv_hit_length``); this class keeps its tree, node layout, locks and
allocators and changes what the issue on the hybrid radix cache (#3) asks:

* **What to evict: measured value per byte** (:meth:`HybridRadixCache.checkpoint_priority`,
  issue 42). Every resume point gets the GreedyDual-Size-Frequency priority
  (Cherkasova, "Improving WWW proxies performance with Greedy-Dual-Size-Frequency
  caching policy", HP Labs TR 98-69): ``clock + hits x saved / bytes``, where
  ``saved`` is the prefill it spares a request that resumes there (its depth
  minus the depth of the next checkpoint above it: without it a match resumes
  there), ``bytes`` what evicting it frees (the state, plus the KV of its node
  when it is a leaf: the leaf goes with it), ``hits`` one plus the requests that
  resumed exactly there, and ``clock`` the priority of the last entry evicted
  when it was last used (so unused entries age out). The checkpoint walk
  (:class:`ValueAwareMambaComponent`) and the KV leaf walk
  (:class:`HostCapturingFullComponent`) both take the lowest priority first;
  upstream evicts both in plain LRU order. A checkpoint at a shared prefix that
  many requests resume from keeps a high priority although deeper checkpoints
  exist below it; one passed over by a conversation that went on ages out.
* **One device budget** (``device_budget_bytes``): KV pages and checkpoints are
  accounted in bytes against one budget instead of two fixed pools;
  :meth:`HybridRadixCache.enforce_budget` evicts the lowest-priority entries
  (a leaf with its KV, or an inner checkpoint alone) until it fits, so no KV is
  kept that no resume point can reach.
* **Host tier** (:class:`HostTier`): what leaves the device is remembered in a
  host-memory index of page-prefix hashes and checkpoint hashes with its own byte
  budget (LRU); :meth:`HybridRadixCache.match_with_host` resumes from the deepest
  host resume point beyond the device one, loads KV pages and the checkpoint back
  together and reports a host hit.
* **Honest metrics** (:class:`CacheMetrics`): device / host / recomputed tokens,
  KV matches discarded for lack of a checkpoint, checkpoint count and bytes per
  tier.

Where checkpoints are *placed* (prompt end, branch points, aligned positions) is
decided by :func:`checkpoint_positions`.

The host tier here is an index with byte accounting, which is what the trace
replay (``benchmark/cache/replay_cache.py``) needs; moving the tensors is the
serving path's job (docs/hybrid-cache.md says what is wired where).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

logger = logging.getLogger(__name__)

_MAMBA = ComponentType.MAMBA
_FULL = ComponentType.FULL


# --------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------
def checkpoint_positions(
    prompt_len: int,
    resume_len: int,
    kv_hit_len: int,
    grid: int,
) -> List[int]:
    """Positions (tokens) at which a prefill should store a checkpoint.

    Few and valuable (issue #3, "Where checkpoints go"):

    * the **branch point**: the last ``grid``-aligned position inside the KV
      match when the KV match runs deeper than the resume point (a new request
      diverged from a cached path there, e.g. after a shared system prompt);
    * the **prompt end**, aligned down to ``grid``, so the next turn of a
      conversation resumes here and not one turn behind.

    Args:
        prompt_len: prompt length in tokens (>= 0).
        resume_len: where this request resumes (a resume point, ``grid``-aligned).
        kv_hit_len: length of the attention-KV match (>= ``resume_len``).
        grid: checkpoint grid = lcm(kernel chunk, page, DCP-widened page) (> 0).
    Returns:
        Sorted distinct positions in ``(resume_len, prompt_len]``.
    Raises:
        ValueError: on a non-positive grid or inconsistent lengths.
    """
    if grid <= 0:
        raise ValueError(f"grid must be > 0, got {grid}")
    if prompt_len < 0 or resume_len < 0 or kv_hit_len < 0:
        raise ValueError(f"lengths must be >= 0, got prompt_len={prompt_len} resume_len={resume_len} kv_hit_len={kv_hit_len}")
    if resume_len > prompt_len:
        raise ValueError(f"resume_len={resume_len} > prompt_len={prompt_len}")
    out = set()
    branch = (min(kv_hit_len, prompt_len) // grid) * grid
    if branch > resume_len:
        out.add(branch)
    end = (prompt_len // grid) * grid
    if end > resume_len:
        out.add(end)
    return sorted(out)


def checkpoint_grid(*sizes: int) -> int:
    """lcm of the kernel chunk, the page size and the DCP-widened page (all > 0)."""
    for s in sizes:
        if s <= 0:
            raise ValueError(f"grid sizes must be > 0, got {sizes}")
    g = 1
    for s in sizes:
        g = g * s // math.gcd(g, s)
    return g


# --------------------------------------------------------------------------
# Eviction order of checkpoints
# --------------------------------------------------------------------------
class ValueAwareMambaComponent(MambaComponent):
    """Upstream's MAMBA component, evicting the lowest value per byte first.

    Before each eviction walk the component's LRU list is reordered by
    :meth:`HybridRadixCache.checkpoint_priority` (lowest at the tail, where the
    walk starts). The walk itself, locks and cascades are upstream's.
    """

    def _reorder_for_value(self) -> None:
        lru = self.tree_core.lru_lists[_MAMBA]
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
        if EvictLayer.DEVICE in target and node.component_data[_MAMBA].value is not None:
            self.cache._advance_clock(node)
            self.cache._on_device_evict(node, _MAMBA)
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
        if EvictLayer.DEVICE in target and node.component_data[_FULL].value is not None:
            self.cache._on_device_evict(node, _FULL)
        return super().evict_component(node, device_frees, host_frees, cache_actions, target=target, **kw)


# --------------------------------------------------------------------------
# Host tier
# --------------------------------------------------------------------------
def _page_hash(prev: bytes, tokens) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(memoryview(tokens).cast("B") if hasattr(tokens, "typecode") else bytes(tokens))
    return h.digest()


ROOT_HASH = b"\0" * 16


class UnsupportedHostCopy(RuntimeError):
    """The KV pool's host copy has a layout the host tier cannot page."""


class HostTier:
    """Host-memory (CPU DRAM) tier of KV pages and checkpoints, LRU, byte-budgeted.

    Entries are keyed by the hash of the whole token prefix they end at (a page
    ending at position ``p`` under ``hash(tokens[0:p])``, a checkpoint at ``p``
    under the same hash), so a lookup needs no tree: a chain of page hashes from
    the root finds how far the host copy reaches.

    Args:
        budget_bytes: host capacity in bytes (0 disables the tier).
        page_bytes: bytes of one KV page (page tokens x KV bytes per token).
        state_bytes: bytes of one checkpoint (all recurrent layers).
    """

    def __init__(self, budget_bytes: int, page_bytes: int, state_bytes: int, on_drop=None):
        if budget_bytes < 0 or page_bytes <= 0 or state_bytes <= 0:
            raise ValueError(
                f"budget_bytes must be >= 0 and page/state bytes > 0, got {budget_bytes}, {page_bytes}, {state_bytes}"
            )
        self.budget_bytes = int(budget_bytes)
        self.page_bytes = int(page_bytes)
        self.state_bytes = int(state_bytes)
        self._lru: "OrderedDict[Tuple[str, bytes], int]" = OrderedDict()
        self.used_bytes = 0
        self.num_checkpoints = 0
        self.num_pages = 0
        self._on_drop = on_drop

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def _put(self, kind: str, h: bytes, nbytes: int) -> None:
        k = (kind, h)
        if k in self._lru:
            self._lru.move_to_end(k)
            return
        if nbytes > self.budget_bytes:
            return
        while self.used_bytes + nbytes > self.budget_bytes and self._lru:
            (okind, oh), ob = self._lru.popitem(last=False)
            self.used_bytes -= ob
            if self._on_drop is not None:
                self._on_drop(okind, oh)
            if okind == "s":
                self.num_checkpoints -= 1
            else:
                self.num_pages -= 1
        self._lru[k] = nbytes
        self.used_bytes += nbytes
        if kind == "s":
            self.num_checkpoints += 1
        else:
            self.num_pages += 1

    def put_pages(self, hashes: Sequence[bytes]) -> None:
        if self.enabled:
            for h in hashes:
                self._put("p", h, self.page_bytes)

    def put_checkpoint(self, h: bytes) -> None:
        if self.enabled:
            self._put("s", h, self.state_bytes)

    def has_page(self, h: bytes) -> bool:
        return ("p", h) in self._lru

    def has_checkpoint(self, h: bytes) -> bool:
        return ("s", h) in self._lru

    def clear(self) -> None:
        """Drop every entry (``on_drop`` is called for each, so payloads are freed)."""
        while self._lru:
            (kind, h), _ = self._lru.popitem(last=False)
            if self._on_drop is not None:
                self._on_drop(kind, h)
        self.used_bytes = self.num_checkpoints = self.num_pages = 0

    def touch(self, kind: str, h: bytes) -> None:
        k = (kind, h)
        if k in self._lru:
            self._lru.move_to_end(k)


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------
@dataclass
class CacheMetrics:
    """Counters in tokens / bytes since start (issue #3, "Honest metrics")."""

    requests: int = 0
    input_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    recomputed_tokens: int = 0
    kv_match_discarded_tokens: int = 0  # KV matched beyond the resume point, no checkpoint there
    cut_back_requests: int = 0
    host_to_device_bytes: int = 0
    checkpoints_stored: int = 0
    budget_evictions: int = 0  # inserts after which the joint device budget made the cache evict
    decode_end_skipped: int = 0  # decode-time states not donated (the policy predicted no reuse)
    host_restore_replans: int = 0  # host restores planned again: making room evicted device KV the plan kept
    store_hit_tokens: int = 0  # prompt tokens resumed from resume points read from the store tier
    store_pages_written: int = 0
    store_states_written: int = 0
    store_to_host_bytes: int = 0  # KV pages + checkpoints read from the store tier
    per_request: List[Dict[str, int]] = field(default_factory=list, repr=False)

    def as_dict(self) -> Dict[str, int]:
        d = {k: v for k, v in self.__dict__.items() if k != "per_request"}
        return d


@dataclass
class HostMatch:
    """Result of :meth:`HybridRadixCache.match_with_host`. Lengths in tokens."""

    resume_len: int  # where the request resumes (device or host resume point)
    device_resume_len: int
    host_hit_len: int  # tokens restored from the host tier (resume_len - device_resume_len)
    kv_hit_len: int  # longest KV match on device or host
    last_node: object
    loaded_bytes: int
    store_hit_len: int = 0  # part of host_hit_len read from the store tier first


class HybridRadixCache(UnifiedRadixCache):
    """``UnifiedRadixCache`` (FULL + MAMBA) with our eviction, budget and host tier.

    Construct like upstream's class; the extra keyword arguments are

    Args:
        kv_bytes_per_token: attention KV bytes per token on this rank (all
            full-attention layers), used for the joint budget and the metrics.
        state_bytes: bytes of one checkpoint (all recurrent layers).
        device_budget_bytes: joint device budget for cached KV + checkpoints;
            ``None`` keeps upstream's two separately sized pools.
        host_budget_bytes: host tier capacity (0 = off).
        placement_warmup, min_hit_rate: the decode-end gate on the server (a state
            tracked during decode is donated while the ``end`` kind is warming up,
            fewer than ``placement_warmup`` stored, or its hit rate is at least
            ``min_hit_rate``; :meth:`ValueAwareMambaComponent._select_finished_checkpoint`).
        host_payload: copy the KV rows and state tensors to host memory (the
            serving path); False keeps only the byte-accounted index (replay).
        serving: called by the scheduler: ``match_prefix`` restores host
            resume points and records metrics.
        chunked_prefill_size: the server's prefill chunk (tokens), informational.
        max_checkpoints_per_path: per-path checkpoint cap applied when upstream's
            ``--mamba-max-states-per-path`` is left unlimited (an explicit value there
            wins); beyond it upstream's MAMBA component evicts the shallowest
            single-child checkpoints of the path (interior ones: their KV stays).
            ``None`` keeps upstream's setting. Raises ValueError if < 1.
    """

    def __init__(
        self,
        params,
        *,
        kv_bytes_per_token: int = 1,
        state_bytes: int = 1,
        device_budget_bytes: Optional[int] = None,
        host_budget_bytes: int = 0,
        placement_warmup: int = 64,
        min_hit_rate: float = 0.05,
        host_payload: bool = False,
        serving: bool = False,
        chunked_prefill_size: Optional[int] = None,
        max_checkpoints_per_path: Optional[int] = None,
        store=None,
        **kwargs,
    ):
        overrides = dict(params.component_registry_override or {})
        overrides.setdefault(_MAMBA, ValueAwareMambaComponent)
        overrides.setdefault(_FULL, HostCapturingFullComponent)
        params.component_registry_override = overrides
        params.tree_core_backend = params.tree_core_backend or "python"
        super().__init__(params=params, **kwargs)
        if kv_bytes_per_token <= 0 or state_bytes <= 0:
            raise ValueError(f"kv_bytes_per_token and state_bytes must be > 0, got {kv_bytes_per_token}, {state_bytes}")
        self.kv_bytes_per_token = int(kv_bytes_per_token)
        self.state_bytes = int(state_bytes)
        if max_checkpoints_per_path is not None:
            if max_checkpoints_per_path < 1:
                raise ValueError(f"max_checkpoints_per_path must be >= 1, got {max_checkpoints_per_path}")
            comp = self._mamba_component()
            if comp.mamba_max_states_per_path < 0:  # upstream's --mamba-max-states-per-path left at "unlimited"
                comp.mamba_max_states_per_path = int(max_checkpoints_per_path)
        self.device_budget_bytes = device_budget_bytes
        self.host_payload = HostPayloadStore(self) if host_payload and host_budget_bytes > 0 else None
        self.host = HostTier(
            host_budget_bytes,
            self.page_size * self.kv_bytes_per_token,
            self.state_bytes,
            on_drop=self.host_payload.drop if self.host_payload is not None else None,
        )
        self.serving = serving
        if store is not None and self.host_payload is None:
            raise ValueError("the store tier needs the host tier with payloads (--hybrid-host-cache-gb > 0)")
        self.store = store  # StoreTier (mem_cache/store.py) or None
        self._store_pending: "OrderedDict[bytes, List[bytes]]" = OrderedDict()  # state hash -> its pages
        self._prom = None
        if serving and getattr(params, "enable_metrics", False):
            collector = getattr(self, "metrics_collector", None)
            labels = getattr(collector, "labels", None)
            if labels is None:
                labels = {"cache_type": type(self).__name__}
            self._prom = HybridCacheMetrics(labels)
            self._prom.refresh(self)
        self.chunked_prefill_size = chunked_prefill_size
        self.metrics = CacheMetrics()
        self._hash_cache: Dict[int, Tuple[int, bytes]] = {}
        self.kind_stored: Dict[str, int] = {}
        self.kind_hits: Dict[str, int] = {}
        self._node_kind: Dict[object, str] = {}
        self.placement_warmup = placement_warmup
        self.min_hit_rate = min_hit_rate
        self._pending_end_positions: List[int] = []  # decode-end states donated by the current insert
        self.value_clock = 0.0  # GDSF clock: priority of the last entry evicted (see checkpoint_priority)
        self._donated_positions: List[int] = []  # positions of the states donated by the current insert
        logger.info(
            "HybridRadixCache: page=%d, joint device budget=%s, host tier=%.1f GB",
            self.page_size,
            "off (separate pools)" if device_budget_bytes is None else f"{device_budget_bytes / 1e9:.1f} GB",
            host_budget_bytes / 1e9,
        )

    # ---------------------------------------------------------------- bytes
    def _mamba_component(self):
        return self.tree_core.components_by_type[_MAMBA]

    def device_checkpoint_count(self) -> int:
        return len(self.tree_core.lru_lists[_MAMBA].cache)

    def reset(self) -> None:
        """Upstream's reset (``/flush_cache``), then the host tier is emptied too (a flushed
        server serves the next request cold) and the gauges are refreshed."""
        super().reset()
        host = getattr(self, "host", None)  # upstream's __init__ resets before ours has run
        if host is not None:
            host.clear()
            self.value_clock = 0.0
        if getattr(self, "_prom", None) is not None:
            self._prom.refresh(self)

    def device_used_bytes(self) -> int:
        """KV tokens and state slots in use (cached + held by requests), in bytes."""
        alloc = self.token_to_kv_pool_allocator
        kv_used = alloc.size - alloc.available_size()
        ma = self.req_to_token_pool.mamba_allocator
        slots_used = ma.size - ma.available_size()
        return kv_used * self.kv_bytes_per_token + slots_used * self.state_bytes

    def enforce_budget(self, reserve_bytes: int = 0) -> bool:
        """Evict until used + ``reserve_bytes`` fits the joint device budget.

        Lowest :meth:`checkpoint_priority` first: a leaf goes with its KV, an
        inner checkpoint alone (its KV still leads to deeper ones). KV leaves
        without a checkpoint go first; then each round evicts half the
        checkpoints the overshoot would need at one state each (a leaf frees its
        KV too), and priorities are recomputed between rounds. Returns False when locked entries alone exceed the
        budget.
        """
        if self.device_budget_bytes is None:
            return True
        while self.device_used_bytes() + reserve_bytes > self.device_budget_bytes:
            over = self.device_used_bytes() + reserve_bytes - self.device_budget_bytes
            if self._has_dead_leaf():
                tokens = max(self.page_size, -(-over // self.kv_bytes_per_token))
                res = self.evict(EvictParams(num_tokens=tokens))
                if res.num_tokens_evicted > 0:
                    continue
            k = max(1, -(-over // self.state_bytes) // 2)
            res = self.evict(EvictParams(num_tokens=0, mamba_num=k))
            if res.mamba_num_evicted > 0 or res.num_tokens_evicted > 0:
                continue
            tokens = max(self.page_size, -(-over // self.kv_bytes_per_token))
            res = self.evict(EvictParams(num_tokens=tokens))
            if res.num_tokens_evicted == 0 and res.mamba_num_evicted == 0:
                return False
        return True

    # ------------------------------------------------------ value per byte
    def _depth(self, node) -> int:
        """Tokens from the root to the end of ``node`` (cached: a split keeps a node's end)."""
        d = getattr(node, "_hyb_depth", None)
        if d is not None:
            return d
        chain = []
        x = node
        while x is not None and x is not self.tree_core.root_node and getattr(x, "_hyb_depth", None) is None:
            chain.append(x)
            x = x.parent
        d = 0 if (x is None or x is self.tree_core.root_node) else x._hyb_depth
        for n in reversed(chain):
            d += len(n.key)
            n._hyb_depth = d
        return d

    def _touch_value(self, node, hit: bool) -> None:
        if isinstance(node, int):  # a NodeId (upstream's match / insert results)
            try:
                node = self.tree_core.node_by_id(node)
            except KeyError:  # evicted since
                return
        if node is None or node is self.tree_core.root_node:
            return
        # A checkpoint counts its store as one use; one first seen at a resume (stored by upstream's
        # insert or restored from the host tier without passing note_checkpoint) was stored too.
        node._hyb_hits = getattr(node, "_hyb_hits", 1) + 1 if hit else max(1, getattr(node, "_hyb_hits", 1))
        node._hyb_t = self.value_clock

    def checkpoint_priority(self, node) -> float:
        """GreedyDual-Size-Frequency priority of the resume point at ``node`` (tokens).

        ``clock_at_last_use + hits * saved_tokens * state_bytes / freed_bytes``:
        ``saved_tokens`` = depth of ``node`` minus the depth of the nearest device
        checkpoint above it (0 at the root); ``freed_bytes`` = one state, plus the
        node's KV when it is a leaf. For an inner checkpoint used once this is
        ``clock + saved_tokens``. A node without a device checkpoint gets ``-inf``.
        """
        if node.component_data[_MAMBA].value is None:
            return float("-inf")
        if getattr(node, "_hyb_t", None) is None:
            self._touch_value(node, hit=False)
        root = self.tree_core.root_node
        anc = node.parent
        while anc is not None and anc is not root and anc.component_data[_MAMBA].value is None:
            anc = anc.parent
        saved = self._depth(node) - (0 if anc is None or anc is root else self._depth(anc))
        cost = self.state_bytes
        if not node.children:
            cost += len(node.key) * self.kv_bytes_per_token
        return node._hyb_t + node._hyb_hits * saved * (self.state_bytes / cost)

    def leaf_eviction_key(self, node):
        """Heap key of the KV-leaf walk: KV with no checkpoint first, then by priority, then LRU."""
        if node.component_data[_FULL].value is None:
            return (float("-inf"), node.last_access_time, node.id)
        return (self.checkpoint_priority(node), node.last_access_time, node.id)

    def _advance_clock(self, node) -> None:
        p = self.checkpoint_priority(node)
        if p != float("-inf") and p > self.value_clock:
            self.value_clock = p

    def _has_dead_leaf(self) -> bool:
        for n in self.tree_core.evictable_device_leaves:
            if n.component_data[_MAMBA].value is None and n.component_data[_FULL].value is not None:
                return True
        return False

    # ----------------------------------------------------------- hashing
    def _node_end_hash(self, node) -> Tuple[int, bytes]:
        """(depth, hash of tokens[0:depth]) at the end of ``node``."""
        root = self.tree_core.root_node
        chain = []
        x = node
        while x is not root and x is not None and id(x) not in self._hash_cache:
            chain.append(x)
            x = x.parent
        depth, h = (0, ROOT_HASH) if (x is root or x is None) else self._hash_cache[id(x)]
        for n in reversed(chain):
            toks = n.key.token_ids
            for s in range(0, len(toks), self.page_size):
                h = _page_hash(h, toks[s : s + self.page_size])
            depth += len(toks)
            self._hash_cache[id(n)] = (depth, h)
        return depth, h

    def _node_page_hashes(self, node) -> List[bytes]:
        """Hashes of every page that ends inside ``node``."""
        parent_depth, h = self._node_end_hash(node.parent) if node.parent is not self.tree_core.root_node else (0, ROOT_HASH)
        out = []
        toks = node.key.token_ids
        for s in range(0, len(toks), self.page_size):
            h = _page_hash(h, toks[s : s + self.page_size])
            out.append(h)
        return out

    def prefix_hashes(self, token_ids, upto: int) -> List[bytes]:
        """Hash of ``token_ids[0:(i+1)*page]`` for each whole page below ``upto``."""
        out, h = [], ROOT_HASH
        for s in range(0, (upto // self.page_size) * self.page_size, self.page_size):
            h = _page_hash(h, token_ids[s : s + self.page_size])
            out.append(h)
        return out

    # ------------------------------------------------------ eviction hooks
    def _on_device_evict(self, node, component) -> None:
        """Called by our components just before ``node`` loses its device KV or checkpoint. A KV pool
        whose host copies the tier cannot page (:class:`UnsupportedHostCopy`) turns the host tier (and
        the store tier) off for this server with one warning; the eviction itself goes on."""
        if not self.host.enabled or node is self.tree_core.root_node:
            return
        try:
            self._save_evicted(node, component)
        except UnsupportedHostCopy as exc:
            self._turn_host_tier_off(exc)

    def _turn_host_tier_off(self, exc: "UnsupportedHostCopy") -> None:
        """This KV pool's host copies cannot be paged: no host tier (nor store tier) for this server."""
        logger.warning("hybrid cache: host tier turned off: %s", exc)
        self.host.clear()
        self.host.budget_bytes = 0
        self.store = None

    def _save_evicted(self, node, component) -> None:
        if component == _FULL:
            hashes = self._node_page_hashes(node)
            if self.host_payload is not None:
                self.host_payload.save_kv(hashes, node.component_data[_FULL].value)
            self.host.put_pages(hashes)
            if self.store is not None:
                self._store_pages(hashes)
        else:
            _, h = self._node_end_hash(node)
            if self.host_payload is not None:
                self.host_payload.save_state(h, node.component_data[_MAMBA].value)
            self.host.put_checkpoint(h)
            if self.store is not None:
                self._store_path_pages(node)
                self._store_state(h, self._path_page_hashes(node))
        self._hash_cache.pop(id(node), None)

    # ------------------------------------------------------------- store tier
    STORE_PENDING_MAX = 4096  # checkpoints in the store waiting for their pages (oldest dropped first)

    def _path_page_hashes(self, node) -> List[bytes]:
        """Hashes of every page of ``[0, end of node)``, root first."""
        chain, x, root = [], node, self.tree_core.root_node
        while x is not None and x is not root:
            chain.append(x)
            x = x.parent
        out: List[bytes] = []
        for n in reversed(chain):
            out.extend(self._node_page_hashes(n))
        return out

    def _store_pages(self, hashes: List[bytes]) -> None:
        """Write the host copies of ``hashes`` not yet in the store, then publish the checkpoints that
        were waiting for them (write-back on device eviction)."""
        have = self.store.exists("kv", hashes)
        for h, stored in zip(hashes, have):
            if not stored:
                rows = self.host_payload.page_rows(h) if self.host_payload is not None else []  # [] accounting only
                if rows is not None and self.store.put_page(h, rows):
                    self.metrics.store_pages_written += 1
        new = set(hashes)
        for sh in [sh for sh, pages in self._store_pending.items() if any(p in new for p in pages)]:
            if self.store.publish(sh, self._store_pending[sh]):
                del self._store_pending[sh]

    def _store_path_pages(self, node) -> None:
        """Write the KV pages of ``[0, end of node)`` that the store lacks, from the host tier or straight
        from the device (a checkpoint leaving the device is published with its whole path, even when the
        path's KV stays hot on this instance)."""
        chain, x, root = [], node, self.tree_core.root_node
        while x is not None and x is not root:
            chain.append(x)
            x = x.parent
        for n in reversed(chain):
            hashes = self._node_page_hashes(n)
            missing = [i for i, ok in enumerate(self.store.exists("kv", hashes)) if not ok]
            if not missing:
                continue
            dev_rows = None
            value = n.component_data[_FULL].value
            page = self.page_size
            for i in missing:
                if self.host_payload is None:  # accounting only (trace replay over fake pools)
                    if self.store.put_page(hashes[i], []):
                        self.metrics.store_pages_written += 1
                    continue
                rows = self.host_payload.page_rows(hashes[i])
                if rows is None and value is not None and len(value) >= (i + 1) * page:
                    if dev_rows is None:
                        dev_rows = self.host_payload.device_rows(value)
                    rows = self.host_payload.slice_page(dev_rows, i)
                if rows is not None and self.store.put_page(hashes[i], rows):
                    self.metrics.store_pages_written += 1

    def _writes_through(self) -> bool:
        from sglang_hybrid.mem_cache.store import WRITE_THROUGH

        return (self.store is not None and self.host.enabled and self.host_payload is not None
                and self.store.write_policy == WRITE_THROUGH)

    def _write_through(self, node) -> None:
        """Write policy ``write_through`` (store config): publish the checkpoint at the end of ``node``
        with its path's KV now, copied from the device, so that another instance can resume it before
        this one evicts it. Synchronous on the scheduler thread (a device->host copy per checkpoint)."""
        if isinstance(node, int):  # a NodeId (upstream's match results)
            try:
                node = self.tree_core.node_by_id(node)
            except KeyError:
                return
        if node is None or node is self.tree_core.root_node or node.component_data[_MAMBA].value is None:
            return
        _, h = self._node_end_hash(node)
        if self.store.exists("rp", [h])[0]:
            return
        try:
            self._store_path_pages(node)
            tensors, dim = self.host_payload.device_state(node.component_data[_MAMBA].value)
        except UnsupportedHostCopy as exc:
            self._turn_host_tier_off(exc)
            return
        if not self.store.put_state(h, tensors, dim):
            return
        self.metrics.store_states_written += 1
        page_hashes = self._path_page_hashes(node)
        if not self.store.publish(h, page_hashes):
            self._store_pending[h] = page_hashes

    def _store_state(self, h: bytes, page_hashes: List[bytes]) -> None:
        """Write the checkpoint at ``h`` and publish it now if its pages are stored, else when they are."""
        state = self.host_payload.state_tensors(h) if self.host_payload is not None else ([], 0)
        if state is None or not self.store.put_state(h, *state):
            return
        self.metrics.store_states_written += 1
        if not self.store.publish(h, page_hashes):
            self._store_pending[h] = page_hashes
            while len(self._store_pending) > self.STORE_PENDING_MAX:
                self._store_pending.popitem(last=False)

    def _fetch_from_store(self, hashes: List[bytes], resume: int) -> bool:
        """Read the resume point at ``resume`` (its pages not in the host tier, and its state) into the
        host tier; False (nothing added) when any part cannot be read."""
        page = self.page_size
        need = [h for h in hashes[: resume // page] if not self.host.has_page(h)]
        state_hash = hashes[resume // page - 1]
        got = self.store.read(need, state_hash)
        if got is None:
            return False
        pages, state = got
        if self.host_payload is not None:
            for h, rows in zip(need, pages):
                self.host_payload.add_page(h, rows)
            self.host_payload.add_state(state_hash, state["tensors"], int(state["dim"]))
        self.metrics.store_to_host_bytes += len(need) * page * self.kv_bytes_per_token + self.state_bytes
        self.host.put_pages(need)
        self.host.put_checkpoint(state_hash)
        return True

    # ------------------------------------------------------------- match
    def match_with_host(self, token_ids, *, load: bool = True) -> HostMatch:
        """Deepest resume point on device or host; with ``load``, brings a host one back.

        A host resume point at ``p`` needs every KV page of ``[0, p)`` on the
        device or the host and a host checkpoint at ``p``. Loading allocates
        device KV for the pages not on the device and a state slot, copies the
        host payload in (serving path; synchronous, so the data is in place
        before the scheduler sees the match), inserts KV and checkpoint into the
        tree together and counts the bytes moved.
        """
        # Making room may evict device KV of the very prefix the plan keeps on the device (only the resume
        # node is locked, and the KV can reach deeper than it): the plan is then made again from the new
        # device match (the evicted pages went to the host). Three tries, then the device match alone.
        for _ in range(3):
            m = UnifiedRadixCache.match_prefix(self, MatchPrefixParams(key=RadixKey(token_ids)))
            dev = m.device_prefix_len
            kv_dev = m.full_kv_hit_length
            if not self.host.enabled:
                return HostMatch(dev, dev, 0, kv_dev, m.last_device_node, 0)
            hashes = self.prefix_hashes(token_ids, len(token_ids))
            k0 = kv_dev // self.page_size
            store_kv = store_rp = [False] * len(hashes)
            if self.store is not None and hashes:
                store_kv = [False] * k0 + self.store.exists("kv", hashes[k0:])
                store_rp = [False] * k0 + self.store.exists("rp", hashes[k0:])
            kv_hit, host_resume, from_store = kv_dev, dev, False
            for i, h in enumerate(hashes):
                pos = (i + 1) * self.page_size
                if pos > kv_dev and not self.host.has_page(h) and not store_kv[i]:
                    break
                kv_hit = max(kv_hit, pos)
                if pos > dev and self.host.has_checkpoint(h):
                    host_resume, from_store = pos, False
                elif pos > dev and store_rp[i]:
                    host_resume, from_store = pos, True
            if from_store and load and not self._fetch_from_store(hashes, host_resume):
                # a part could not be read (counted by the tier): the device / host match alone
                kv_hit, host_resume = kv_dev, dev
                for i, h in enumerate(hashes):
                    pos = (i + 1) * self.page_size
                    if pos > kv_dev and not self.host.has_page(h):
                        break
                    kv_hit = max(kv_hit, pos)
                    if pos > dev and self.host.has_checkpoint(h):
                        host_resume = pos
                from_store = False
            store_len = host_resume - dev if from_store else 0
            if host_resume <= dev:
                return HostMatch(dev, dev, 0, kv_hit, m.last_device_node, 0)
            if not load:
                return HostMatch(host_resume, dev, host_resume - dev, kv_hit, m.last_device_node, 0, store_len)
            new_kv = max(0, host_resume - kv_dev)
            loaded = new_kv * self.kv_bytes_per_token + self.state_bytes
            lock = self.inc_lock_ref(m.last_device_node)
            try:
                ok = self._make_room(new_kv, 1)
            finally:
                self.dec_lock_ref(m.last_device_node, lock.to_dec_params())
            if not ok:
                return HostMatch(dev, dev, 0, kv_hit, m.last_device_node, 0)
            after = UnifiedRadixCache.match_prefix(self, MatchPrefixParams(key=RadixKey(token_ids)))
            if after.full_kv_hit_length >= kv_dev and after.device_prefix_len >= dev:
                m = after  # the plan holds (room-making only evicts: the lengths are the plan's)
                break
            self.metrics.host_restore_replans += 1
        else:
            m = UnifiedRadixCache.match_prefix(self, MatchPrefixParams(key=RadixKey(token_ids)))
            dev = m.device_prefix_len
            return HostMatch(dev, dev, 0, m.full_kv_hit_length, m.last_device_node, 0)
        page_hashes = hashes[kv_dev // self.page_size : host_resume // self.page_size]
        state_hash = hashes[host_resume // self.page_size - 1]
        if self.host_payload is not None and not self.host_payload.has(page_hashes, state_hash):
            return HostMatch(dev, dev, 0, kv_hit, m.last_device_node, 0)
        for h in page_hashes:
            self.host.touch("p", h)
        self.host.touch("s", state_hash)
        kv = self.token_to_kv_pool_allocator.alloc(new_kv) if new_kv else None
        slot = self.req_to_token_pool.mamba_allocator.alloc(1)
        if (new_kv and kv is None) or slot is None:
            if kv is not None:
                self.token_to_kv_pool_allocator.free(kv)
            if slot is not None:
                self.req_to_token_pool.mamba_allocator.free(slot)
            return HostMatch(dev, dev, 0, kv_hit, m.last_device_node, 0)
        if self.host_payload is not None:
            self.host_payload.load(page_hashes, kv, state_hash, slot)
        import torch

        # the tree's KV ids live where upstream's do (the pool's device): a CPU tensor here reached the
        # request's prefix ids and upstream's KV-location kernels read host memory (illegal address, H100)
        device = kv.device if new_kv else getattr(self.token_to_kv_pool_allocator, "device", "cpu")
        value = torch.full((host_resume,), -1, dtype=torch.int64, device=device)
        if new_kv:
            value[kv_dev:] = kv.to(torch.int64)
        res = self.insert(
            InsertParams(key=RadixKey(token_ids[:host_resume]), value=value, mamba_value=slot, prev_prefix_len=kv_dev)
        )
        if res.mamba_exist:
            self.req_to_token_pool.mamba_allocator.free(slot)
        m2 = UnifiedRadixCache.match_prefix(self, MatchPrefixParams(key=RadixKey(token_ids)))
        if m2.device_prefix_len != host_resume:
            raise AssertionError(f"host restore landed at {m2.device_prefix_len}, expected {host_resume}")
        self.metrics.host_to_device_bytes += loaded
        return HostMatch(host_resume, dev, host_resume - dev, kv_hit, m2.last_device_node, loaded, store_len)

    def match_prefix(self, params):
        """Upstream's match; in serving mode it first restores a deeper host
        resume point and records per-request metrics (device / host /
        recomputed tokens, KV matched beyond the resume point)."""
        if not self.serving or params.key is None or params.req is None:
            return super().match_prefix(params)
        key = params.key
        toks = key.token_ids
        host_tokens = store_tokens = 0
        if self.host.enabled and len(toks) >= self.page_size:
            hm = self.match_with_host(toks)
            host_tokens = hm.host_hit_len
            store_tokens = hm.store_hit_len
        res = super().match_prefix(params)
        resume = res.device_prefix_len
        rid = getattr(params.req, "rid", None)
        mt = self.metrics
        mt.requests += 1
        mt.input_tokens += len(toks)
        mt.host_hit_tokens += host_tokens
        mt.store_hit_tokens += store_tokens
        mt.device_hit_tokens += resume - host_tokens
        mt.recomputed_tokens += len(toks) - resume
        if res.full_kv_hit_length > resume:
            mt.kv_match_discarded_tokens += res.full_kv_hit_length - resume
            mt.cut_back_requests += 1
        if self._prom is not None:
            self._prom.count_discarded(res.full_kv_hit_length - resume)
            self._prom.refresh(self)
        if not getattr(params.req, "_cache_breakdown_computed", True):
            # upstream splits the cached prefix by tier once, on the request's first extend, from its
            # own HiCache fields; our host tier restores pages inside this match, so those fields stay 0
            # and every restored token would be reported as a device hit. serving._report_host_hits
            # moves these tokens to the host share after that split.
            params.req._sglang_hybrid_host_hit_tokens = host_tokens - store_tokens
            params.req._sglang_hybrid_store_hit_tokens = store_tokens
        if resume > 0:
            self.note_resume(res.last_device_node)
        logger.debug(
            "hybrid-cache match rid=%s len=%d device=%d host=%d recomputed=%d kv_match_discarded=%d",
            rid, len(toks), resume - host_tokens, host_tokens, len(toks) - resume,
            max(0, res.full_kv_hit_length - resume),
        )
        return res

    def checkpoint(self, req, *, up_to: int, **kwargs) -> None:
        """Upstream's insert of ``req``'s tokens ``[.., up_to)``; with a joint device
        budget (``--hybrid-device-cache-gb``) the cache then evicts by value until
        the KV + checkpoint bytes in use fit it (entries locked by running requests
        are never evicted, so a budget below their needs only empties the cache)."""
        self._pending_end_positions.clear()
        self._donated_positions.clear()
        super().checkpoint(req, up_to=up_to, **kwargs)
        for pos in sorted(set(self._donated_positions) | set(self._pending_end_positions)):
            try:
                key = RadixKey(req.full_untruncated_fill_ids[:pos], extra_key=getattr(req, "extra_key", None))
                m = UnifiedRadixCache.match_prefix(self, MatchPrefixParams(key=key))
            except Exception as exc:  # bookkeeping only: the insert itself already happened
                logger.warning("hybrid cache: checkpoint at %d not looked up (%s)", pos, exc)
                continue
            if pos in self._donated_positions:
                # The state was computed at ``pos``; the node holding it must end there (case K8:
                # with a DCP-widened tree page a state off the page would sit on a shallower node).
                logger.debug(
                    "hybrid-cache checkpoint rid=%s state_pos=%d node_depth=%d tree_page=%d",
                    getattr(req, "rid", None), pos, m.device_prefix_len, self.page_size,
                )
            if pos in self._pending_end_positions and m.device_prefix_len == pos:
                self.note_checkpoint(m.last_device_node, "end")  # feeds the decode-end hit rate
            if m.device_prefix_len == pos and self._writes_through():
                self._write_through(m.last_device_node)
        self._pending_end_positions.clear()
        self._donated_positions.clear()
        if self._prom is not None:
            self._prom.refresh(self)
        if self.device_budget_bytes is None:
            return
        before = self.device_used_bytes()
        if before <= self.device_budget_bytes:
            return
        ckpts = self.device_checkpoint_count()
        fits = self.enforce_budget()
        self.metrics.budget_evictions += 1
        if self._prom is not None:
            self._prom.refresh(self)
        logger.debug(
            "hybrid-cache joint budget: used %d -> %d B (budget %d B), checkpoints %d -> %d%s",
            before, self.device_used_bytes(), self.device_budget_bytes, ckpts, self.device_checkpoint_count(),
            "" if fits else " (locked entries exceed the budget)",
        )

    def _make_room(self, kv_tokens: int, slots: int) -> bool:
        reserve = kv_tokens * self.kv_bytes_per_token + slots * self.state_bytes
        if not self.enforce_budget(reserve):
            return False
        alloc = self.token_to_kv_pool_allocator
        if alloc.available_size() < kv_tokens:
            self.evict(EvictParams(num_tokens=kv_tokens - alloc.available_size()))
        ma = self.req_to_token_pool.mamba_allocator
        if ma.available_size() < slots:
            self.evict(EvictParams(num_tokens=0, mamba_num=slots - ma.available_size()))
        return alloc.available_size() >= kv_tokens and ma.available_size() >= slots

    # --------------------------------------------------------- placement
    PLACEMENT_KINDS = ("branch", "end", "chunk", "coarse", "stride")

    def placement(
        self,
        prompt_len: int,
        resume_len: int,
        kv_hit_len: int,
        grid: int,
        coarse: int = 0,
        stride: int = 0,
        chunk: int = 0,
    ) -> List[Tuple[int, str]]:
        """(position, kind) pairs where a prefill should store checkpoints.

        * ``branch`` and ``end``: :func:`checkpoint_positions`;
        * ``chunk`` (``chunk`` > 0): the positions upstream's scheduler stores with
          a chunked prefill of ``chunk`` tokens (the last ``grid`` point of every
          chunk but the last, counted from the resume point), so every checkpoint
          upstream would place is a candidate here too and eviction by value
          decides which stay (issue 42);
        * ``coarse`` (``coarse`` > 0): the last ``coarse`` boundary of the prompt —
          the boundary a next turn that re-tokenises the tail still shares;
        * ``stride`` (``stride`` > 0): every ``stride`` tokens between the resume
          point and the prompt end, so a later request diverging inside this
          prompt finds a resume point nearby (each spares only ``stride`` tokens,
          so eviction by value thins them first).

        ``branch``, ``end``, ``chunk`` and ``coarse`` are always placed (eviction
        by value per byte then keeps the ones that earn their bytes); ``stride``
        is opportunistic: placed while the joint device budget has free room
        for it without evicting anything (always, when unbounded). Where two
        kinds give one position, the first in ``PLACEMENT_KINDS`` order names it.
        """
        cand: Dict[int, str] = {}
        base = checkpoint_positions(prompt_len, resume_len, kv_hit_len, grid)
        branch = (min(kv_hit_len, prompt_len) // grid) * grid
        for p in base:
            cand.setdefault(p, "branch" if p == branch else "end")
        if chunk > 0:
            s = resume_len
            while s + chunk < prompt_len:
                t = ((s + chunk) // grid) * grid
                if t > resume_len:
                    cand.setdefault(t, "chunk")
                s += chunk
        if coarse > 0:
            c = (prompt_len // coarse) * coarse
            if c > resume_len:
                cand.setdefault(c, "coarse")
        if stride > 0:
            first = (resume_len // stride + 1) * stride
            for p in range(first, prompt_len, stride):
                cand.setdefault(p, "stride")
        free = None
        if self.device_budget_bytes is not None:
            free = self.device_budget_bytes - self.device_used_bytes()
        out = []
        for p in sorted(cand):
            kind = cand[p]
            if kind != "stride":
                out.append((p, kind))
            elif free is None or free >= self.state_bytes:
                out.append((p, kind))
                if free is not None:
                    free -= self.state_bytes
        return out

    def _end_is_valuable(self) -> bool:
        stored = self.kind_stored.get("end", 0)
        if stored < self.placement_warmup:
            return True
        return self.kind_hits.get("end", 0) / stored >= self.min_hit_rate

    def note_checkpoint(self, node_id, kind: str) -> None:
        """Record that ``node_id`` now holds a checkpoint placed as ``kind`` (starts its value clock)."""
        self.kind_stored[kind] = self.kind_stored.get(kind, 0) + 1
        self._node_kind[node_id] = kind
        self.metrics.checkpoints_stored += 1
        self._touch_value(node_id, hit=False)

    def note_resume(self, node_id) -> None:
        """Record a resume at ``node_id``: one more hit for its priority and the per-kind hit rates."""
        kind = self._node_kind.get(node_id)
        if kind is not None:
            self.kind_hits[kind] = self.kind_hits.get(kind, 0) + 1
        self._touch_value(node_id, hit=True)

    # ------------------------------------------------------------ insert
    def insert_checkpoint(self, token_ids, pos: int) -> bool:
        """Insert KV of ``token_ids[0:pos]`` and a checkpoint at ``pos`` (aligned).

        Fresh KV ids are allocated for the whole prefix; the part already in the
        tree is returned to the allocator (as upstream's callers do). Returns
        False when no state slot or KV room could be made.
        """
        if pos % self.page_size:
            raise ValueError(f"pos={pos} is not a multiple of page_size={self.page_size}")
        alloc = self.token_to_kv_pool_allocator
        ma = self.req_to_token_pool.mamba_allocator
        if not self._make_room(pos, 1):
            return False
        kv = alloc.alloc(pos)
        slot = ma.alloc(1)
        # The tree frees the part of ``kv`` that duplicates what it holds.
        res = self.insert(InsertParams(key=RadixKey(token_ids[:pos]), value=kv, mamba_value=slot))
        if res.mamba_exist:
            ma.free(slot)
        else:
            self.note_checkpoint(res.last_device_node, "host")
        return True


class HostPayloadStore:
    """Host copies of KV rows and checkpoint tensors, keyed like :class:`HostTier`.

    KV is copied per evicted tree node (its rows of every full-attention layer)
    and addressed per page; a checkpoint is its slot's conv windows and
    recurrent state. Copies go through :class:`~sglang_hybrid.mem_cache.host_copy.HostCopier`:
    asynchronous write-back on a GPU (side stream, pinned memory, the compute
    stream waits on the device before reusing the freed slots) with an explicit
    synchronisation before a restored entry is used; synchronous on a CPU.

    KV pools copied directly are upstream's plain ones, by exact type (:data:`ROW_POOLS`): MLA
    (``kv_buffer``, one row per token slot), MHA (``k_buffer`` + ``v_buffer``), the hybrid
    linear-attention wrapper around either, and Qwen3.8's QSA pool, whose compressed indexer keys
    (``qsa_compressed_k_buffer_pool``) mirror the token slots 1:``ratio``: a page of ``P`` token
    rows owns compressed rows ``[slot0 / ratio, slot0 / ratio + P / ratio)`` (``P`` a multiple of
    ``ratio``, pages page-aligned), copied with it. QSA's per-request pending ring is not copied:
    resume points are page ends, where no group is pending. Other pools (DCP-interleaved KV,
    quantized variants) use upstream's synchronous ``get_cpu_copy`` / ``load_cpu_copy`` when it
    returns row tensors, else the host tier is turned off (:class:`UnsupportedHostCopy`). State
    pools with side slots likewise use upstream's copies.

    A page's rows, as :meth:`page_rows` returns them and the store tier keeps them, are a flat
    list: every buffer of group 0, then of group 1, ... (``P / divisor`` rows each).
    """

    ROW_POOLS = ("MLATokenToKVPool", "MHATokenToKVPool", "HybridLinearKVPool", "QSATokenToKVPool")

    def __init__(self, cache: "HybridRadixCache"):
        from sglang_hybrid.mem_cache.host_copy import HostCopier

        self.cache = cache
        # seg id -> [[HostCopy per group], live pages]
        self._segments: Dict[int, list] = {}
        self._page_loc: Dict[bytes, Tuple[int, int]] = {}
        self._states: Dict[bytes, object] = {}
        self._next = 0
        self._groups = self._row_groups()
        self._kv_direct = self._groups is not None
        mp, _ = self._mamba_pool()
        self._state_direct = not getattr(mp, "_slot_siblings", None)
        dev = self._groups[0][0][0].device if self._groups else torch_device_cpu()
        self.copier = HostCopier(dev)

    def _kv_pool(self):
        kv = self.cache.token_to_kv_pool_allocator.get_kvcache()
        return getattr(kv, "full_kv_pool", kv)

    def _row_groups(self):
        """``[(buffers, divisor)]`` of the pool's per-slot row buffers (class docstring), or None when the
        pool is not one this class copies directly."""
        outer = self.cache.token_to_kv_pool_allocator.get_kvcache()
        kv = getattr(outer, "full_kv_pool", outer)
        if type(outer).__name__ not in self.ROW_POOLS or type(kv).__name__ not in self.ROW_POOLS:
            return None
        if getattr(kv, "_write_loc_dcp_span", 1) not in (None, 1) or getattr(kv, "use_hnd", False):
            return None
        if getattr(kv, "kv_buffer", None):
            groups = [(list(kv.kv_buffer), 1)]
        elif getattr(kv, "k_buffer", None) and getattr(kv, "v_buffer", None):
            groups = [(list(kv.k_buffer) + list(kv.v_buffer), 1)]
        else:
            return None
        compressed = getattr(outer, "qsa_compressed_k_buffer_pool", None)
        if compressed:
            ratio = int(outer.qsa_compress_ratio)
            if ratio < 1 or self.cache.page_size % ratio:
                return None
            groups.append((list(compressed), ratio))
        return groups

    def _mamba_pool(self):
        pool = self.cache.req_to_token_pool
        return pool.mamba_pool, pool.translate_mamba_indices

    def _state_buffers(self):
        mc = self._mamba_pool()[0].mamba_cache
        return list(mc.conv) + [mc.temporal]

    @staticmethod
    def _group_indices(indices, divisor: int):
        flat = indices.view(-1)
        return flat if divisor == 1 else flat[::divisor] // divisor

    def _save_rows(self, indices) -> list:
        """One HostCopy per group of the rows at token slots ``indices`` (asynchronous on a GPU)."""
        return [self.copier.save(bufs, self._group_indices(indices, d), dim=0) for bufs, d in self._groups]

    def _upstream_rows(self, indices) -> list:
        import torch

        per_layer = self._kv_pool().get_cpu_copy(indices)
        if not all(isinstance(x, torch.Tensor) for c in per_layer for x in c):
            raise UnsupportedHostCopy(
                f"{type(self._kv_pool()).__name__}.get_cpu_copy returns per-layer parts that are not row "
                "tensors, which the host tier cannot split into pages (not supported for this model's KV pool)")
        return [torch.cat(c) if len(c) else None for c in per_layer]

    def _slice(self, rows, i: int) -> list:
        """Page ``i`` (views) of flat per-buffer rows covering a run of whole pages: ``page / divisor``
        rows of each buffer (class docstring)."""
        page = self.cache.page_size
        divisors = [d for bufs, d in self._groups for _ in bufs] if self._kv_direct else [1] * len(rows)
        return [None if t is None else t[i * (page // d) : (i + 1) * (page // d)] for t, d in zip(rows, divisors)]

    def save_kv(self, page_hashes: List[bytes], indices) -> None:
        from sglang_hybrid.mem_cache.host_copy import HostCopy

        todo = [i for i, h in enumerate(page_hashes) if h not in self._page_loc]
        if not todo:
            return
        copies = self._save_rows(indices) if self._kv_direct else [HostCopy(self._upstream_rows(indices), None, 0)]
        sid = self._next
        self._next += 1
        self._segments[sid] = [copies, len(todo)]
        for i in todo:
            self._page_loc[page_hashes[i]] = (sid, i)

    def save_state(self, h: bytes, slot) -> None:
        if h in self._states:
            return
        pool, translate = self._mamba_pool()
        idx = translate(slot.view(-1))
        if self._state_direct:
            self._states[h] = self.copier.save(self._state_buffers(), idx, dim=1)
        else:
            self._states[h] = pool.get_cpu_copy(idx)

    def drop(self, kind: str, h: bytes) -> None:
        if kind == "s":
            self._states.pop(h, None)
            return
        loc = self._page_loc.pop(h, None)
        if loc is None:
            return
        seg = self._segments[loc[0]]
        seg[1] -= 1
        if seg[1] <= 0:
            del self._segments[loc[0]]

    def _page_slices(self, copies, pi: int) -> list:
        for c in copies:
            c.wait()  # explicit synchronisation before first use
        return self._slice([t for c in copies for t in c.tensors], pi)

    def page_rows(self, h: bytes):
        """Every buffer's rows of the page ``h`` (CPU tensors, None for a layer without KV; the flat
        layout of the class docstring), waiting for the device->host copy; None when not held."""
        loc = self._page_loc.get(h)
        if loc is None:
            return None
        return [None if t is None else t.clone() for t in self._page_slices(self._segments[loc[0]][0], loc[1])]

    def device_rows(self, indices):
        """Every buffer's KV rows at the device token slots ``indices`` (CPU tensors, flat layout)."""
        if not self._kv_direct:
            return self._upstream_rows(indices)
        out = []
        for c in self._save_rows(indices):
            c.wait()
            out.extend(c.tensors)
        return out

    def slice_page(self, rows, i: int) -> list:
        """Page ``i`` (copies) of rows returned by :meth:`device_rows` for a run of whole pages."""
        return [None if t is None else t.clone() for t in self._slice(rows, i)]

    def device_state(self, slot):
        """``(tensors, dim)`` of the state slot ``slot`` copied now (not kept), in :meth:`state_tensors`' form."""
        pool, translate = self._mamba_pool()
        idx = translate(slot.view(-1))
        if not self._state_direct:
            return pool.get_cpu_copy(idx), -1
        copy = self.copier.save(self._state_buffers(), idx, dim=1)
        copy.wait()
        return list(copy.tensors), copy.dim

    def state_tensors(self, h: bytes):
        """``(tensors, dim)`` of the checkpoint ``h`` for the store, or None when not held. A state pool
        with side slots (upstream's ``get_cpu_copy`` tuple: conv, temporal, siblings) is stored as that
        tuple with ``dim = -1``."""
        state = self._states.get(h)
        if state is None:
            return None
        if not self._state_direct:
            return state, -1
        state.wait()
        return list(state.tensors), state.dim

    def add_page(self, h: bytes, rows) -> None:
        """Hold a page read from the store (rows as :meth:`page_rows` returns them).

        Raises:
            ValueError: ``rows`` does not have one entry per buffer of this pool.
        """
        from sglang_hybrid.mem_cache.host_copy import HostCopy

        if h in self._page_loc:
            return
        rows = list(rows)
        sizes = [len(bufs) for bufs, _ in self._groups] if self._kv_direct else [len(rows)]
        if sum(sizes) != len(rows):
            raise ValueError(f"page rows: {len(rows)} tensors for a pool of {sum(sizes)} buffers")
        copies, at = [], 0
        for n in sizes:
            copies.append(HostCopy(rows[at : at + n], None, 0))
            at += n
        sid = self._next
        self._next += 1
        self._segments[sid] = [copies, 1]
        self._page_loc[h] = (sid, 0)

    def add_state(self, h: bytes, tensors, dim: int) -> None:
        """Hold a checkpoint read from the store (``dim = -1``: the pool's own host-copy object)."""
        from sglang_hybrid.mem_cache.host_copy import HostCopy

        if h not in self._states:
            self._states[h] = tensors if dim < 0 else HostCopy(list(tensors), None, dim)

    def has(self, page_hashes: List[bytes], state_hash: bytes) -> bool:
        return state_hash in self._states and all(h in self._page_loc for h in page_hashes)

    def load(self, page_hashes: List[bytes], kv_indices, state_hash: bytes, slot) -> None:
        import torch

        from sglang_hybrid.mem_cache.host_copy import HostCopy

        if page_hashes:
            pages = [self._page_slices(self._segments[self._page_loc[h][0]][0], self._page_loc[h][1])
                     for h in page_hashes]
            rows = [None if any(p[b] is None for p in pages) else torch.cat([p[b] for p in pages])
                    for b in range(len(pages[0]))]
            if self._kv_direct:
                at = 0
                for bufs, d in self._groups:
                    self.copier.load(HostCopy(rows[at : at + len(bufs)], None, 0), bufs,
                                     self._group_indices(kv_indices, d))
                    at += len(bufs)
            else:
                pool = self._kv_pool()
                chunk = getattr(pool, "cpu_offloading_chunk_size", None)
                per_layer = []
                for r in rows:
                    if r is None:
                        per_layer.append([])
                        continue
                    c = chunk or len(r)
                    per_layer.append([r[i : i + c] for i in range(0, len(r), c)])
                pool.load_cpu_copy(per_layer, kv_indices)
        mpool, translate = self._mamba_pool()
        idx = translate(slot.view(-1))
        state = self._states[state_hash]
        if self._state_direct:
            self.copier.load(state, self._state_buffers(), idx)
        else:
            mpool.load_cpu_copy(state, idx)


def torch_device_cpu():
    import torch

    return torch.device("cpu")


class HybridCacheMetrics:
    """Prometheus series of the hybrid cache, beside upstream's radix-cache series.

    Scraped with upstream's ``/metrics`` when the server runs with ``--enable-metrics``
    (upstream's multiprocess collector reads series created in the scheduler process).
    Labels are upstream's radix-cache labels (``cache_type``, ``tp_rank``, ``pp_rank``,
    ``dp_rank`` and any ``--extra-metric-labels``) plus:

    * ``sglang:hybrid_cache_checkpoints{tier}``: recurrent-state checkpoints held, tier
      ``device`` or ``host``;
    * ``sglang:hybrid_cache_bytes{tier, kind}``: bytes held, kind ``kv`` (attention KV of
      cached tokens) or ``state`` (checkpoints);
    * ``sglang:hybrid_cache_kv_match_discarded_tokens_total``: prompt tokens whose KV was
      matched beyond the deepest checkpoint and recomputed anyway (a hybrid resume point
      needs both; issue #3, "Honest metrics").

    Hit tokens per tier are upstream's ``sglang:cached_tokens_total{cache_source}`` (our
    host restores are reported there as ``host``); recomputed tokens are upstream's
    ``sglang:uncached_prompt_tokens_histogram``. Gauges are refreshed on every prefix
    match, every insert and on ``/flush_cache``.
    """

    def __init__(self, labels: Dict[str, object]):
        from prometheus_client import Counter, Gauge

        self.labels = {k: str(v) for k, v in labels.items()}
        names = list(self.labels)
        self.checkpoints = Gauge("sglang:hybrid_cache_checkpoints", "Recurrent-state checkpoints held by the "
                                 "hybrid radix cache, by tier (device, host).", labelnames=names + ["tier"],
                                 multiprocess_mode="mostrecent")
        self.bytes = Gauge("sglang:hybrid_cache_bytes", "Bytes held by the hybrid radix cache, by tier (device, "
                           "host) and kind (kv: attention KV of cached tokens, state: checkpoints).",
                           labelnames=names + ["tier", "kind"], multiprocess_mode="mostrecent")
        self.discarded = Counter("sglang:hybrid_cache_kv_match_discarded_tokens", "Prompt tokens whose KV matched "
                                 "beyond the deepest checkpoint and were recomputed (no resume point there).",
                                 labelnames=names)
        self.store_failures = Counter("sglang:hybrid_cache_store_failures", "Store-tier operations that failed "
                                      "(unreachable at start, lookup, write, read): those requests recomputed.",
                                      labelnames=names)
        self._failures_seen = 0

    def count_discarded(self, tokens: int) -> None:
        if tokens > 0:
            self.discarded.labels(**self.labels).inc(tokens)

    def refresh(self, cache: "HybridRadixCache") -> None:
        """Set the gauges from the cache's current contents."""
        dev_ckpts = cache.device_checkpoint_count()
        dev_tokens = cache.full_evictable_size() + cache.full_protected_size()
        host = cache.host
        values = {
            ("device", "kv"): dev_tokens * cache.kv_bytes_per_token,
            ("device", "state"): dev_ckpts * cache.state_bytes,
            ("host", "kv"): host.num_pages * host.page_bytes,
            ("host", "state"): host.num_checkpoints * host.state_bytes,
        }
        import sys

        serving = sys.modules.get("sglang_hybrid.mem_cache.serving")
        failures = (cache.store.failures if getattr(cache, "store", None) is not None else 0) + (
            getattr(serving, "STORE_START_FAILURES", 0) if serving is not None else 0)
        if failures > self._failures_seen:
            self.store_failures.labels(**self.labels).inc(failures - self._failures_seen)
            self._failures_seen = failures
        self.checkpoints.labels(**self.labels, tier="device").set(dev_ckpts)

        self.checkpoints.labels(**self.labels, tier="host").set(host.num_checkpoints)
        for (tier, kind), v in values.items():
            self.bytes.labels(**self.labels, tier=tier, kind=kind).set(v)
