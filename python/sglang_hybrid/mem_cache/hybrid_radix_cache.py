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

The package is split by concern: this module (the tree: matching, resume points, the
device budget, host / store restores), :mod:`.placement` (where checkpoints go),
:mod:`.components` (eviction order of checkpoints and KV leaves), :mod:`.host_tier`
(host index and payloads), :mod:`.store` (the store tier), :mod:`.metrics` (counters
and Prometheus series) and :mod:`.serving` (the glue into upstream's scheduler).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_hybrid.mem_cache.components import FULL as _FULL
from sglang_hybrid.mem_cache.components import MAMBA as _MAMBA
from sglang_hybrid.mem_cache.components import HostCapturingFullComponent, ValueAwareMambaComponent
from sglang_hybrid.mem_cache.host_tier import (ROOT_HASH, HostMatch, HostPayloadStore, HostTier, UnsupportedHostCopy,
                                               page_hash)
from sglang_hybrid.mem_cache.metrics import CacheMetrics, HybridCacheMetrics
from sglang_hybrid.mem_cache.placement import checkpoint_positions

logger = logging.getLogger(__name__)



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
        """(depth, hash of tokens[0:depth]) at the end of ``node``, cached on the node (a split keeps a
        node's end, so its cached hash stays right; a deleted node takes its cache with it)."""
        root = self.tree_core.root_node
        chain = []
        x = node
        while x is not root and x is not None and getattr(x, "_hyb_end_hash", None) is None:
            chain.append(x)
            x = x.parent
        depth, h = (0, ROOT_HASH) if (x is root or x is None) else x._hyb_end_hash
        for n in reversed(chain):
            toks = n.key.token_ids
            for s in range(0, len(toks), self.page_size):
                h = page_hash(h, toks[s : s + self.page_size])
            depth += len(toks)
            n._hyb_end_hash = (depth, h)
        return depth, h

    def _node_page_hashes(self, node) -> List[bytes]:
        """Hashes of every page that ends inside ``node``."""
        parent_depth, h = self._node_end_hash(node.parent) if node.parent is not self.tree_core.root_node else (0, ROOT_HASH)
        out = []
        toks = node.key.token_ids
        for s in range(0, len(toks), self.page_size):
            h = page_hash(h, toks[s : s + self.page_size])
            out.append(h)
        return out

    def prefix_hashes(self, token_ids, upto: int) -> List[bytes]:
        """Hash of ``token_ids[0:(i+1)*page]`` for each whole page below ``upto``."""
        out, h = [], ROOT_HASH
        for s in range(0, (upto // self.page_size) * self.page_size, self.page_size):
            h = page_hash(h, token_ids[s : s + self.page_size])
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
    def _beyond_device_possible(self) -> bool:
        """False when no tier below the device holds anything (an empty host tier, no store): a match
        is then upstream's device match alone."""
        return self.store is not None or self.host.num_pages > 0 or self.host.num_checkpoints > 0

    def _scan_host(self, token_ids, node, dev: int, kv_dev: int):
        """Host pages and checkpoints beyond the device match, no store tier: ``(kv_hit, host_resume,
        hashes, base)`` where ``hashes[i - base]`` is the hash of page ``i``.

        The hash chain starts at the resume node's end (cached on the tree nodes), and stops at the
        first page past the device KV that the host does not hold: a match costs the pages it finds,
        not the prompt length. Falls back to hashing from the root when the node does not end at ``dev``.
        """
        page = self.page_size
        if isinstance(node, int):  # a NodeId (upstream's match results)
            node = self.tree_core.node_by_id(node)
        depth, h = self._node_end_hash(node) if node is not None else (0, ROOT_HASH)
        if depth != dev or dev % page:
            depth, h = 0, ROOT_HASH
        base = depth // page
        hashes: List[bytes] = []
        kv_hit, host_resume = kv_dev, dev
        for i in range(base, len(token_ids) // page):
            h = page_hash(h, token_ids[i * page : (i + 1) * page])
            hashes.append(h)
            pos = (i + 1) * page
            if pos > kv_dev and not self.host.has_page(h):
                break
            kv_hit = max(kv_hit, pos)
            if pos > dev and self.host.has_checkpoint(h):
                host_resume = pos
        return kv_hit, host_resume, hashes, base

    def _scan_host_and_store(self, token_ids, dev: int, kv_dev: int, load: bool):
        """As :meth:`_scan_host` with the store tier too (whole-prompt hashes: the store is asked for
        every page past the device KV in one call): ``(kv_hit, host_resume, from_store, hashes)``;
        with ``load``, a store resume point is fetched into the host tier, and a failed fetch leaves
        the device / host match alone."""
        hashes = self.prefix_hashes(token_ids, len(token_ids))
        k0 = kv_dev // self.page_size
        store_kv = store_rp = [False] * len(hashes)
        if hashes:
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
            # a part could not be read (counted by the tier): the device / host match alone (hashes from the root)
            kv_hit, host_resume, hashes, _ = self._scan_host(token_ids, None, dev, kv_dev)
            from_store = False
        return kv_hit, host_resume, from_store, hashes

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
            if not self.host.enabled or not self._beyond_device_possible():
                # nothing beyond the device match to find, so no prompt hashing (about 1 us a page)
                return HostMatch(dev, dev, 0, kv_dev, m.last_device_node, 0)
            if self.store is None:
                kv_hit, host_resume, hashes, base = self._scan_host(token_ids, m.last_device_node, dev, kv_dev)
                from_store = False
            else:
                kv_hit, host_resume, from_store, hashes = self._scan_host_and_store(token_ids, dev, kv_dev, load)
                base = 0
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
        page_hashes = hashes[kv_dev // self.page_size - base : host_resume // self.page_size - base]
        state_hash = hashes[host_resume // self.page_size - 1 - base]
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
        if self.host.enabled and len(toks) >= self.page_size and self._beyond_device_possible():
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
