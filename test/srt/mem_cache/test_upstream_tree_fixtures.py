"""Upstream's tree-level cache fixtures run against our HybridRadixCache (issue #3, "Tests").

The sglang wheel ships the helper steps its own UnifiedRadixCache unit tests mix in
(``sglang.test.kits.unified_radix_cache``: ``build_fixture``, the cache ``CONFIGS``,
``UnifiedRadixCacheFixtures`` and the Mamba / segment-lock fixture families). Here
``build_fixture`` builds *our* class: the module-level name ``UnifiedRadixCache`` that it
calls is patched with a factory building
:class:`~sglang_hybrid.mem_cache.hybrid_radix_cache.HybridRadixCache` from the same
``CacheInitParams`` (our extra constructor arguments keep their defaults: no joint budget,
no host tier, not serving). The pools and allocators are upstream's real CPU ones.

Configs: only the FULL + MAMBA entries of upstream's ``CONFIGS`` (page sizes 1, 4, 64,
128; 4/64/128 with the Mamba extra buffer) -- our cache serves hybrid linear-attention
models. Requirements per test use upstream's ``requires`` / ``config_attrs`` (a test that
does not apply to a config is removed from that config's class, not skipped).

What is asserted (each value would be wrong if the cache were wrong):

* insert / match on page-aligned sequences: hit lengths, shared KV indices, the resume
  point (``device_prefix_len``) only where a checkpoint sits;
* eviction: free + evictable + locked == capacity before and after, evicted == evictable;
* ``MambaCheckpointGridFixtures._branching_seqlen`` with a DCP-widened tree page (our
  case K8): the branching seqlen is on the joint grid lcm(kernel chunk 64, tree page), so
  a checkpoint stored there ends on a tree node;
* ``MambaFinishedOvershootCheckpointFixtures``: which ping-pong state a finished request
  whose latest state ran past the key donates (the older one, or none);
* Mamba LRU refresh on match, and where our documented policy differs (eviction by value
  per freed byte, docs/hybrid-cache.md) OUR value, contrasted with upstream's class;
* the segment lock protocol on FULL + MAMBA: every lock taken is released, a receipt
  released on the wrong node is refused without changing any count.
* ``UnifiedRadixAllocationEvictionRealComponentsFixtures`` (FULL + MAMBA): evict_for_alloc
  stops after the first checkpoint drain that meets the shortfall.

Not run here (docs/upstream-test-kits.md, "Tree-level fixtures", gives the same list):

* SWA families (``SegmentLockProtocolFixtures._leaf_with_lock_path`` /
  ``_locked_path_state``, ``SegmentLockFuzzFixtures`` -- it calls ``allocator.free_swa``,
  which only SWA allocators have --, ``ResumableInsertWalkSWAFixtures``, the SWA
  helpers of ``UnifiedRadixCacheFixtures`` / ``UnifiedRadixCacheCoreFixtures``, SWA draft /
  bigram / bounded-replay fixtures): our models (Kimi K3, Qwen3.8-Flash-Next) have no
  sliding-window layers.
* ``kv_events.py``: KV-event publishing (disaggregation / router feeds) is not part of
  our cache.
* ``hicache.py``, ``load_back.py``, ``storage.py`` and the HiCache helpers of
  ``mixins.py``: upstream's HiCache host pool and L3 storage backends; our host tier is
  our own (``HostTier`` / ``HostPayloadStore``), tested in test_hybrid_radix_cache.py.
* ``UnifiedRadixCacheInt8MambaCheckpointFixtures``: int8 Mamba checkpoints are not used
  (our recurrent states are stored as computed).
* ``rust_unified_tree_core_inspector.py`` and the Rust re-run: our class pins the Python
  tree core (its components are Python subclasses).
* ``DisabledUnifiedRadixCacheFixtures``, ``UnifiedLRUListBoundedRefreshFixtures``,
  ``StreamingSessionLockLifecycleFixtures``, ``UnifiedTreeCoreLoadBackPendingFixtures``:
  they build fake components, bare LRU lists, streaming sessions or mocked tree cores,
  not a cache of our class.
"""

from __future__ import annotations

import unittest
from unittest import mock

from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import restore_context, snapshot_context
from sglang.test.kits.unified_radix_cache import fixtures as upstream_fixtures
from sglang.test.kits.unified_radix_cache.config import CONFIGS, config_attrs, requires
from sglang.test.kits.unified_radix_cache.core import (
    MambaCheckpointGridFixtures,
    MambaFinishedOvershootCheckpointFixtures,
    UnifiedMambaLRUMatchRefreshFixtures,
    UnifiedRadixAllocationEvictionRealComponentsFixtures,
    UnifiedRadixCacheCoreFixtures,
    session_radix_cache_test_values,
)
from sglang.test.kits.unified_radix_cache.fixtures import (
    build_fixture,
    match_prefix,
    node_device_lock_ref,
    node_device_value,
)
from sglang.test.kits.unified_radix_cache.insert_walk import SegmentLockProtocolFixtures
from sglang.test.mem_cache_utils import finish_req

from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache

FULL = ComponentType.FULL
MAMBA = ComponentType.MAMBA

# FULL + MAMBA (no SWA) entries of upstream's CONFIGS.
MAMBA_CONFIGS = [c for c in CONFIGS if c.has_mamba and not c.has_swa]

requires_extra_buffer = requires(
    lambda cfg: cfg.enable_mamba_extra_buffer,
    "a tree page other than 1 and ping-pong track slots need the Mamba extra buffer",
)
# The overshoot fixture's request has 12 tokens; the key must keep whole pages.
requires_overshoot_fits = requires(
    lambda cfg: cfg.enable_mamba_extra_buffer and 12 % cfg.page_size == 0 and cfg.page_size < 12,
    "the overshoot fixture's 12-token request must span more than one page",
)

# (tree page = page x DCP, full KV hit length, expected mamba_branching_seqlen) per page
# size; expected = largest multiple of lcm(64, tree page) within the hit, None if that is
# not beyond the resume point (one tree page). Kernel chunk 64 = the fixture's
# mamba_cache_chunk_size.
BRANCHING_CASES = {
    4: [
        (4, 200, 192),  # DCP 1: lcm(64, 4) = 64 -> 192
        (24, 216, 192),  # DCP 6: lcm = 192 -> 192 (a tree-page grid would give 216)
        (40, 200, None),  # DCP 10: lcm = 320 > 200 (a chunk grid would give 192)
        (48, 192, 192),  # DCP 12: lcm = 192
    ],
    64: [(128, 384, 384)],  # DCP 2: lcm(64, 128) = 128
    128: [(256, 768, 768)],  # DCP 2: lcm(64, 256) = 256
}


def _our_cache(params):
    """What build_fixture constructs in this module: our class, default extra arguments."""
    return HybridRadixCache(params)


class _OurCacheInFixtures:
    """Per test: build_fixture builds our class; upstream's global server args restored."""

    def setUp(self):
        # build_fixture publishes upstream's process-wide server args (page size, chunk);
        # put back what was there so later tests in this process see their own.
        saved = snapshot_context()
        self.addCleanup(restore_context, saved)
        patcher = mock.patch.object(upstream_fixtures, "UnifiedRadixCache", _our_cache)
        patcher.start()
        self.addCleanup(patcher.stop)


class OurTreeFixtures(
    _OurCacheInFixtures,
    UnifiedRadixCacheCoreFixtures,
    MambaCheckpointGridFixtures,
    MambaFinishedOvershootCheckpointFixtures,
    SegmentLockProtocolFixtures,
):
    """Upstream's fixture steps over our cache; bound to one config per generated class."""

    def _build(self, **kwargs):
        cache, allocator, pool = build_fixture(self.cfg, **kwargs)
        self.assertIsInstance(cache, HybridRadixCache)
        return cache, allocator, pool

    def _assert_kv_balance(self, cache, allocator):
        self.assertEqual(
            allocator.available_size() + cache.full_evictable_size() + cache.full_protected_size(),
            allocator.size,
        )

    # ------------------------------------------------------------ insert / match
    def test_insert_match_page_aligned(self):
        ps = self.cfg.page_size
        cache, allocator, pool = self._build()
        a = self._make_seq(1, 3)
        b = a[: 2 * ps] + self._make_seq(5000, 2)
        self._insert(cache, allocator, pool, a)
        self._insert(cache, allocator, pool, b)

        ma, mb = match_prefix(cache, a), match_prefix(cache, b)
        self.assertEqual((ma.device_prefix_len, ma.full_kv_hit_length), (3 * ps, 3 * ps))
        self.assertEqual((mb.device_prefix_len, mb.full_kv_hit_length), (4 * ps, 4 * ps))
        # The shared two pages are one copy of KV.
        ia = cache.path_device_indices(ma.last_device_node).tolist()
        ib = cache.path_device_indices(mb.last_device_node).tolist()
        self.assertEqual((len(ia), len(ib)), (3 * ps, 4 * ps))
        self.assertEqual(ia[: 2 * ps], ib[: 2 * ps])
        self.assertFalse(set(ia[2 * ps :]) & set(ib[2 * ps :]))

        # Diverging inside the third page: KV matches whole pages only, and no checkpoint
        # sits at the split point (2 pages), so the resume point is the root.
        c = a[: 2 * ps + ps // 2] + self._make_seq(9000, 2)
        mc = match_prefix(cache, c)
        self.assertEqual(mc.full_kv_hit_length, 2 * ps)
        self.assertEqual(mc.device_prefix_len, 0)
        # A query ending mid-page matches its whole pages only.
        md = match_prefix(cache, a[: 3 * ps - 1])
        self.assertEqual(md.full_kv_hit_length, 2 * ps if ps > 1 else 2)
        self._assert_kv_balance(cache, allocator)
        cache.sanity_check()

    # ------------------------------------------------------------ eviction
    def test_evict_keeps_free_evictable_locked_equal_capacity(self):
        ps = self.cfg.page_size
        cache, allocator, pool = self._build()
        a = self._make_seq(1, 2)
        ab = a + self._make_seq(3000, 2)
        other = self._make_seq(7000, 3)
        for seq in (a, ab, other):
            self._insert(cache, allocator, pool, seq)
        self._assert_kv_balance(cache, allocator)
        self.assertEqual(cache.full_evictable_size(), 7 * ps)
        self.assertEqual(cache.mamba_evictable_size(), 3)

        leaf = match_prefix(cache, ab).last_device_node
        receipt = cache.inc_lock_ref(leaf)
        self.assertEqual(cache.full_protected_size(), 4 * ps)
        self.assertEqual(cache.full_evictable_size(), 3 * ps)
        self._assert_kv_balance(cache, allocator)

        mamba_free = pool.mamba_allocator.available_size()
        result = cache.evict(EvictParams(num_tokens=allocator.size))
        # Only the unlocked sequence can go; the locked path keeps its KV and its checkpoints.
        self.assertEqual(result.num_tokens_evicted, 3 * ps)
        self.assertEqual(cache.full_evictable_size(), 0)
        self.assertEqual(pool.mamba_allocator.available_size(), mamba_free + result.mamba_num_evicted)
        self._assert_kv_balance(cache, allocator)
        self.assertEqual(match_prefix(cache, ab).device_prefix_len, 4 * ps)
        self.assertEqual(match_prefix(cache, other).full_kv_hit_length, 0)

        cache.dec_lock_ref(leaf, receipt.to_dec_params())
        self.assertEqual(cache.full_protected_size(), 0)
        self.assertEqual(cache.full_evictable_size(), 4 * ps)
        self._assert_kv_balance(cache, allocator)
        cache.evict(EvictParams(num_tokens=allocator.size))
        self.assertEqual(allocator.available_size(), allocator.size)
        self.assertEqual(cache.mamba_evictable_size(), 0)
        cache.sanity_check()

    # ------------------------------------------------------------ checkpoint grid (K8)
    @requires_extra_buffer
    def test_branching_seqlen_on_joint_grid_with_widened_tree_page(self):
        """Case K8: with tree page = page x DCP the branching seqlen (where the next prefill
        stores a checkpoint) is a multiple of lcm(kernel chunk, tree page), i.e. it ends on a
        tree node; same value as upstream's class (our placement uses the same grid,
        ``checkpoint_grid``)."""
        for tree_page, hit, expected in BRANCHING_CASES[self.cfg.page_size]:
            with self.subTest(tree_page=tree_page, hit=hit):
                got = self._branching_seqlen(tree_page_size=tree_page, full_hit_length=hit)
                self.assertEqual(got, expected)
                if got is not None:
                    self.assertEqual(got % tree_page, 0)
                    self.assertEqual(got % 64, 0)

    # ------------------------------------------------------------ finished overshoot
    @requires_overshoot_fits
    def test_finished_overshoot_donates_previous_state_or_none(self):
        """A finished request whose latest tracked state (12) ran past the cached key (8):
        the older ping-pong state is donated when it lies within the key, else nothing (and
        then no KV either: a FULL + MAMBA insert needs a state). Outside serving mode our
        component keeps upstream's choice."""
        for previous, resume, kv_hit in ((8, 8, 8), (None, 0, 0), (12, 0, 0)):
            with self.subTest(previous_track_seqlen=previous):
                cache, allocator, pool = self._build()
                req, tokens = self._build_req(allocator, pool, previous)
                req.last_node = cache.root_node_handle()
                req.lock = None
                other_slot = int(req.kv.mamba_ping_pong_track_buffer[req.kv.mamba_next_track_idx])
                finish_req(cache, req, 8)
                # The request still owns its 4 tokens past the key; release them as the
                # scheduler does, so the balance below covers every slot.
                allocator.free(pool.req_to_token[req.kv.req_pool_idx, 8:12])
                m = match_prefix(cache, tokens)
                self.assertEqual((m.device_prefix_len, m.full_kv_hit_length), (resume, kv_hit))
                if resume:
                    value = node_device_value(cache, m.last_device_node, MAMBA)
                    self.assertEqual(value.tolist(), [other_slot])
                    self.assertEqual(cache.mamba_evictable_size(), 1)
                else:
                    self.assertEqual(cache.mamba_evictable_size(), 0)
                    self.assertEqual(allocator.available_size(), allocator.size)
                self._assert_kv_balance(cache, allocator)
                cache.sanity_check()

    # ------------------------------------------------------------ Mamba LRU refresh
    def test_mamba_lru_refresh_on_match(self):
        """A match moves the matched checkpoint to the MRU end; the next checkpoint
        eviction takes the other one (no interior checkpoints here, so our order is LRU)."""
        cache, allocator, pool = self._build()
        a, b = self._make_seq(1, 2), self._make_seq(5000, 2)
        self._insert(cache, allocator, pool, a)
        self._insert(cache, allocator, pool, b)
        node_a = match_prefix(cache, a).last_device_node
        node_b = match_prefix(cache, b).last_device_node
        lru = UnifiedMambaLRUMatchRefreshFixtures._mamba_lru_mru_to_lru
        self.assertEqual(lru(self, cache), [node_b, node_a])
        match_prefix(cache, a)
        self.assertEqual(lru(self, cache), [node_a, node_b])
        result = cache.evict(EvictParams(num_tokens=0, mamba_num=1))
        self.assertEqual(result.mamba_num_evicted, 1)
        self.assertEqual(match_prefix(cache, a).device_prefix_len, len(a))
        self.assertEqual(match_prefix(cache, b).full_kv_hit_length, 0)
        self._assert_kv_balance(cache, allocator)
        cache.sanity_check()

    def test_value_per_byte_differs_from_lru(self):
        """OUR documented policy (docs/hybrid-cache.md: lowest value per freed byte first, issue 42),
        which deliberately differs from upstream's plain LRU. After a match refreshes the leaf ``ab``,
        upstream's class evicts the least recently used checkpoint, the inner one at ``a`` (its KV
        stays). Ours keeps ``a`` -- it spares 2 pages of prefill for one state's bytes (the fixture's
        defaults: one byte per state, one per KV token) -- and drops ``ab``, which spares as much but
        frees its 2 pages of KV as well."""
        ps = self.cfg.page_size
        a = self._make_seq(1, 2)
        ab = a + self._make_seq(3000, 2)

        def run():
            cache, allocator, pool = build_fixture(self.cfg)
            self._insert(cache, allocator, pool, a)
            self._insert(cache, allocator, pool, ab)
            match_prefix(cache, ab)  # ab's checkpoint becomes the most recently used
            self.assertEqual(cache.evict(EvictParams(num_tokens=0, mamba_num=1)).mamba_num_evicted, 1)
            ma, mab = match_prefix(cache, a), match_prefix(cache, ab)
            cache.sanity_check()
            return type(cache), (ma.device_prefix_len, ma.full_kv_hit_length), (
                mab.device_prefix_len,
                mab.full_kv_hit_length,
            )

        ours = run()
        self.assertEqual(ours, (HybridRadixCache, (2 * ps, 2 * ps), (2 * ps, 2 * ps)))
        with mock.patch.object(upstream_fixtures, "UnifiedRadixCache", UnifiedRadixCache):
            upstream = run()
        self.assertEqual(upstream, (UnifiedRadixCache, (0, 2 * ps), (4 * ps, 4 * ps)))

    # ------------------------------------------------------------ segment lock protocol
    def test_segment_lock_protocol_releases_every_lock(self):
        """FULL + MAMBA part of the segment lock protocol: a lock pins FULL on every node of
        the path and MAMBA on the locked node only; a receipt released on another node is
        refused before any count changes; the right release returns every count to 0."""
        ps = self.cfg.page_size
        cache, allocator, pool = self._build()
        a = self._make_seq(1, 2)
        ab = a + self._make_seq(3000, 2)
        self._insert(cache, allocator, pool, a)
        self._insert(cache, allocator, pool, ab)
        leaf = self._match_leaf(cache, ab)
        path = self._full_path(cache, leaf)
        self.assertEqual(len(path), 2)

        def refs():
            return [(node_device_lock_ref(cache, n, FULL), node_device_lock_ref(cache, n, MAMBA)) for n in path]

        receipt = cache.inc_lock_ref(leaf)
        self.assertEqual(refs(), [(1, 1), (1, 0)])
        self.assertEqual((cache.full_protected_size(), cache.mamba_protected_size()), (4 * ps, 1))

        wrong = self._match_leaf(cache, a)
        self.assertNotEqual(wrong, leaf)
        before = (refs(), allocator.available_size(), pool.mamba_allocator.available_size())
        self._assert_protocol_violation(
            lambda: cache.dec_lock_ref(wrong, receipt.to_dec_params()), "lock receipt anchored on node"
        )
        self.assertEqual((refs(), allocator.available_size(), pool.mamba_allocator.available_size()), before)

        # Locked entries survive a full eviction request.
        cache.evict(EvictParams(num_tokens=allocator.size, mamba_num=10))
        self.assertEqual(match_prefix(cache, ab).device_prefix_len, 4 * ps)

        cache.dec_lock_ref(leaf, receipt.to_dec_params())
        self.assertEqual(refs(), [(0, 0), (0, 0)])
        self.assertEqual((cache.full_protected_size(), cache.mamba_protected_size()), (0, 0))
        self._assert_kv_balance(cache, allocator)
        cache.sanity_check()


for _cfg in MAMBA_CONFIGS:
    _name = f"Test_{_cfg.label}"
    _cls = type(_name, (OurTreeFixtures, unittest.TestCase), config_attrs(OurTreeFixtures, _cfg))
    _cls.__module__ = __name__
    globals()[_name] = _cls
del _cfg, _name, _cls


class TestAllocationEvictionRealComponents(
    _OurCacheInFixtures, UnifiedRadixAllocationEvictionRealComponentsFixtures, unittest.TestCase
):
    """Upstream's FULL + MAMBA chain of three checkpoints (2, 4, 6 tokens, page 1) on our
    cache; evict_for_alloc must stop as soon as the first checkpoint drain meets the
    shortfall. Each spares 2 tokens of prefill; the leaf's eviction also frees its 2 tokens
    of KV, so by value per byte ours drains the leaf (state and KV, one drain) where
    upstream's LRU tombstones the first inner one. With session radix caching on, our
    reordering is off and the order is upstream's."""

    _SHORTFALL = 1

    def test_evict_for_alloc_stops_after_first_mamba_drain(self):
        for session in session_radix_cache_test_values():
            with self.subTest(enable_session_radix_cache=session):
                cache, first, second, leaf = self._build_internal_chain(MAMBA, session)
                self.assertIsInstance(cache, HybridRadixCache)
                mamba_free = cache.req_to_token_pool.mamba_allocator.available_size()
                result, drains = self._evict_for_alloc_after_first_drain(cache, MAMBA)
                self.assertEqual(drains, 1)
                self.assertEqual(cache.req_to_token_pool.mamba_allocator.available_size(), mamba_free + 1)
                if session:
                    self.assertEqual((result.mamba_num_evicted, result.num_tokens_evicted), (1, 0))
                    has_state = [node_device_value(cache, n, MAMBA) is not None for n in (first, second, leaf)]
                    has_kv = [node_device_value(cache, n, FULL) is not None for n in (first, second, leaf)]
                    self.assertEqual(has_state, [False, True, True])
                    self.assertEqual(has_kv, [True, True, True])
                else:
                    self.assertEqual((result.mamba_num_evicted, result.num_tokens_evicted), (1, 2))
                    has_state = [node_device_value(cache, n, MAMBA) is not None for n in (first, second)]
                    self.assertEqual(has_state, [True, True])
                    self.assertNotIn(leaf, cache.tree_core._node_arena)
                cache.sanity_check()


class TestConfigSelection(unittest.TestCase):
    def test_all_full_mamba_page_sizes_covered(self):
        self.assertEqual(sorted(c.page_size for c in MAMBA_CONFIGS), [1, 4, 64, 128])

    def test_fixture_tests_leave_global_server_args_unchanged(self):
        """build_fixture publishes its own server args; after a test the process-wide
        context (and the patched class name) is what it was before."""
        from sglang.srt.runtime_context import get_context

        before = get_context()._server_args
        case = globals()["Test_FULL_MAMBA_ps64"]("test_insert_match_page_aligned")
        result = unittest.TestResult()
        case.run(result)
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertIs(get_context()._server_args, before)
        self.assertIs(upstream_fixtures.UnifiedRadixCache, UnifiedRadixCache)


if __name__ == "__main__":
    unittest.main()
