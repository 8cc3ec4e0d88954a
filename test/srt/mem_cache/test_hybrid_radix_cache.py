"""Unit and stateful property tests of HybridRadixCache over fake pools (issue #3).

The cache under test is upstream's UnifiedRadixCache tree with our MAMBA / FULL
components, joint budget and host tier; the pools are byte-accounted fakes
(``sglang_hybrid.mem_cache.fake_pools``) whose ids are never reused, so a lost
or doubly freed slot shows up in the capacity invariant.
"""

from __future__ import annotations

import unittest
from array import array

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from sglang_hybrid.mem_cache.fake_pools import build_cache
from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache
from sglang_hybrid.mem_cache.placement import checkpoint_grid, checkpoint_positions

PAGE = 16
GRID = 64
KVB = 100  # bytes per token
STB = 6400  # bytes per checkpoint (= 64 tokens of KV)


def toks(seed: int, n: int, base=None) -> array:
    out = array("q", base or [])
    out.extend(((seed * 7919 + i * 104729) % 50000) + 1 for i in range(n))
    return out


def hybrid(kv=100_000, slots=200, budget=None, host=0):
    return build_cache(
        "hybrid", kv, slots, page_size=PAGE, grid=GRID,
        kv_bytes_per_token=KVB, state_bytes=STB, device_budget_bytes=budget, host_budget_bytes=host,
    )


def cache_for(policy: str):
    """Ours (:func:`hybrid`) or upstream's class over the same fake pools."""
    if policy == "hybrid":
        return hybrid()
    return build_cache("upstream", 100_000, 200, page_size=PAGE, grid=GRID)


def run_request(cache, alloc, pool, key: array, out_len: int = 5, upstream_finish: bool = False):
    """One request as the scheduler would: match, lock, allocate, store checkpoints where
    the cache places them, unlock; returns the resume length. A request the cache cannot make
    room for (the locked entries fill the budget or a pool) is not admitted: lock released, nothing inserted."""
    hm = cache.match_with_host(key) if isinstance(cache, HybridRadixCache) else None
    if hm is not None:
        resume, kv_hit, node = hm.resume_len, hm.kv_hit_len, hm.last_node
    else:
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(key)))
        resume, kv_hit, node = m.device_prefix_len, m.full_kv_hit_length, m.last_device_node
    if isinstance(cache, HybridRadixCache) and resume > 0:
        cache.note_resume(node)  # what the serving match does
    lock = cache.inc_lock_ref(node)
    need = len(key) + out_len - resume
    if isinstance(cache, HybridRadixCache) and not cache._make_room(need, 1):
        # Legitimate only when the locked entries leave no room (the scheduler would not admit the request);
        # a refusal with room to make is a cache bug.
        locked = cache.protected_size() * KVB + cache.mamba_protected_size() * STB
        no_room = (cache.device_budget_bytes is not None and locked + need * KVB + STB > cache.device_budget_bytes) \
            or cache.protected_size() + need > alloc.size or cache.mamba_protected_size() + 1 > pool.mamba_allocator.size
        assert no_room, (locked, need, cache.device_budget_bytes)
        cache.dec_lock_ref(node, lock.to_dec_params())
        return resume
    req_kv = alloc.alloc(need)
    assert req_kv is not None
    adopted = resume
    if isinstance(cache, HybridRadixCache):
        positions = [p for p, _ in cache.placement(len(key), resume, kv_hit, GRID)]
    else:
        positions = [(len(key) // GRID) * GRID] if len(key) // GRID * GRID > resume else []
    for pos in positions:
        slot = pool.mamba_allocator.alloc(1)
        if slot is None:
            cache.evict(EvictParams(num_tokens=0, mamba_num=1))
            slot = pool.mamba_allocator.alloc(1)
        value = torch.cat([torch.full((resume,), -1, dtype=torch.int64), req_kv[: pos - resume]])
        ins = cache.insert(InsertParams(key=RadixKey(key[:pos]), value=value, mamba_value=slot, prev_prefix_len=adopted))
        if ins.mamba_exist:
            pool.mamba_allocator.free(slot)
        elif isinstance(cache, HybridRadixCache):
            cache.note_checkpoint(ins.last_device_node, "end")
        adopted = pos
    if adopted - resume < need:
        alloc.free(req_kv[adopted - resume :])
    cache.dec_lock_ref(node, lock.to_dec_params())
    if isinstance(cache, HybridRadixCache):
        cache.enforce_budget()
    return resume


def checkpoint_depths(cache):
    """{node: depth} of every device checkpoint, depth counted from the root."""
    out = {}
    for node in cache.tree_core.lru_lists[ComponentType.MAMBA].cache.values():
        d, x = 0, node
        while x is not cache.tree_core.root_node:
            d += len(x.key)
            x = x.parent
        out[node] = d
    return out


def assert_pool_invariants(tc, cache, alloc, pool):
    # free + evictable + locked == capacity, per pool
    tc.assertEqual(alloc.available_size() + cache.full_evictable_size() + cache.protected_size(), alloc.size)
    ma = pool.mamba_allocator
    tc.assertEqual(ma.available_size() + cache.mamba_evictable_size() + cache.mamba_protected_size(), ma.size)
    # checkpoint depth == node depth and on the grid; no resume point without KV
    for node, depth in checkpoint_depths(cache).items():
        tc.assertEqual(depth % GRID, 0)
        tc.assertIsNotNone(node.component_data[ComponentType.FULL].value)


class TestPlacement(unittest.TestCase):
    def test_positions(self):
        # prompt end aligned down; branch point inside the KV match
        self.assertEqual(checkpoint_positions(200, 0, 0, 64), [192])
        self.assertEqual(checkpoint_positions(310, 0, 150, 64), [128, 256])
        self.assertEqual(checkpoint_positions(310, 128, 150, 64), [256])  # resume already at the branch
        self.assertEqual(checkpoint_positions(63, 0, 0, 64), [])
        self.assertEqual(checkpoint_positions(128, 128, 128, 64), [])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "grid"):
            checkpoint_positions(10, 0, 0, 0)
        with self.assertRaisesRegex(ValueError, "resume_len"):
            checkpoint_positions(10, 64, 0, 64)
        with self.assertRaisesRegex(ValueError, "grid sizes"):
            checkpoint_grid(64, 0)

    def test_grid_is_lcm_of_chunk_page_and_dcp_page(self):
        self.assertEqual(checkpoint_grid(64, 16), 64)
        self.assertEqual(checkpoint_grid(64, 64 * 8), 512)  # DCP8 widens page 64 to 512 (case K8)
        self.assertEqual(checkpoint_grid(64, 48), 192)


class TestHybridRadixCache(unittest.TestCase):
    def test_second_turn_resumes_at_first_prompt_end(self):
        """The one-turn-behind case: upstream stores the branch point, so turn 3 resumes at
        turn 1's end; ours stores turn 2's prompt end too."""
        results = {}
        for policy in ("upstream", "hybrid"):
            cache, alloc, pool = cache_for(policy)
            t1 = toks(1, 300)
            t2 = toks(2, 200, base=t1)  # 500 tokens, extends turn 1
            t3 = toks(3, 100, base=t2)
            r1 = run_request(cache, alloc, pool, t1)
            r2 = run_request(cache, alloc, pool, t2)
            r3 = run_request(cache, alloc, pool, t3)
            results[policy] = (r1, r2, r3)
            if policy == "hybrid":
                assert_pool_invariants(self, cache, alloc, pool)
        self.assertEqual(results["hybrid"], (0, 256, 448))  # 300 -> 256, 500 -> 448
        self.assertEqual(results["upstream"][:2], (0, 256))

    def test_branch_point_and_deepest_resume(self):
        cache, alloc, pool = hybrid()
        a = toks(1, 200)
        run_request(cache, alloc, pool, a)  # checkpoint at 192
        b = toks(9, 100, base=a[:150])  # diverges at 150: KV match 144 (page 16), no state there
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(b)))
        self.assertEqual((m.device_prefix_len, m.full_kv_hit_length), (0, 144))
        run_request(cache, alloc, pool, b)  # stores the branch point 128 and its own end 192
        c = toks(11, 70, base=a[:150])
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(c)))
        self.assertEqual(m.device_prefix_len, 128)
        depths = sorted(checkpoint_depths(cache).values())
        self.assertEqual(depths, [128, 192, 192])
        assert_pool_invariants(self, cache, alloc, pool)

    def test_shared_prefix_checkpoint_outlives_lru(self):
        """Eviction by value per byte (issue 42): the checkpoint at a shared prefix that four
        requests resumed from stays; upstream's LRU order drops it after five evictions and the
        next request over that prefix recomputes it."""
        results = {}
        for policy in ("hybrid", "upstream"):
            cache, alloc, pool = cache_for(policy)
            shared = toks(1, 256)
            resumes = [run_request(cache, alloc, pool, shared + toks(10 + i, 64)) for i in range(5)]
            for i in range(4):  # unrelated, more recent
                run_request(cache, alloc, pool, toks(50 + i, 128))
            res = cache.evict(EvictParams(num_tokens=0, mamba_num=5))
            self.assertEqual(res.mamba_num_evicted, 5)
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(shared + toks(99, 64))))
            results[policy] = (resumes, m.device_prefix_len, m.full_kv_hit_length)
            if policy == "hybrid":
                # the five turn ends (64 tokens saved each, a leaf's state + KV freed) went first
                self.assertEqual(sorted(checkpoint_depths(cache).values()), [128, 128, 128, 128, 256])
                assert_pool_invariants(self, cache, alloc, pool)
        # request 1 stores its end (320 -> 320), 2 finds the KV and stores the branch point 256, 3..5 resume there
        self.assertEqual(results["hybrid"], ([0, 0, 256, 256, 256], 256, 256))
        self.assertEqual(results["upstream"][1:], (0, 256))  # KV kept, state gone: recomputed

    def test_priority_is_hits_times_saved_tokens_per_freed_byte(self):
        cache, alloc, pool = hybrid()
        shared = toks(1, 256)
        run_request(cache, alloc, pool, shared + toks(2, 64))
        run_request(cache, alloc, pool, shared + toks(3, 64))  # branch point 256 + its own end 320
        nodes = {d: n for n, d in checkpoint_depths(cache).items()}
        inner, leaf = nodes[256], [n for n, d in checkpoint_depths(cache).items() if d == 320][0]
        self.assertEqual(cache.value_clock, 0.0)
        self.assertAlmostEqual(cache.checkpoint_priority(inner), 256.0)  # inner: 1 hit x 256 tokens, frees one state
        self.assertAlmostEqual(cache.checkpoint_priority(leaf), 64 * STB / (STB + 64 * KVB))  # leaf: frees its KV too
        cache.note_resume(inner)
        cache.note_resume(inner)
        self.assertAlmostEqual(cache.checkpoint_priority(inner), 3 * 256.0)
        # evicting the leaf advances the clock to its priority; entries used from then on start from it
        cache.evict(EvictParams(num_tokens=0, mamba_num=1))
        self.assertAlmostEqual(cache.value_clock, 64 * STB / (STB + 64 * KVB))
        other = toks(7, 128)
        run_request(cache, alloc, pool, other)
        onode = [n for n, d in checkpoint_depths(cache).items() if d == 128][0]
        self.assertAlmostEqual(cache.checkpoint_priority(onode), cache.value_clock + 128 * STB / (STB + 128 * KVB))
        # a checkpoint whose store this cache never saw (upstream's insert, a host restore) counts the
        # store at its first resume: hits 2, as for one stored here and resumed once
        for attr in ("_hyb_hits", "_hyb_t"):
            delattr(onode, attr)
        cache.note_resume(onode)
        self.assertAlmostEqual(cache.checkpoint_priority(onode), cache.value_clock + 2 * 128 * STB / (STB + 128 * KVB))

    def test_unused_checkpoint_ages_out(self):
        """GDSF's clock: a checkpoint used often long ago loses to fresh ones once evictions
        have raised the clock past its priority."""
        cache, alloc, pool = hybrid()
        old = toks(1, 128)
        run_request(cache, alloc, pool, old + toks(2, 64))  # end 192; then the branch point 128
        run_request(cache, alloc, pool, old + toks(3, 64))
        old_node = [n for n, d in checkpoint_depths(cache).items() if d == 128][0]
        cache.note_resume(old_node)  # 2 hits x 128 tokens = 256
        for i in range(40):  # fresh 256-token leaves; each eviction raises the clock
            run_request(cache, alloc, pool, toks(100 + i, 256 + 64))
            cache.evict(EvictParams(num_tokens=0, mamba_num=1))
        self.assertNotIn(old_node, checkpoint_depths(cache))
        assert_pool_invariants(self, cache, alloc, pool)

    def test_placement_includes_upstreams_chunk_checkpoints(self):
        cache, _, _ = hybrid()
        got = cache.placement(20_000, 0, 0, GRID, coarse=512, stride=0, chunk=8192)
        self.assertEqual(got, [(8192, "chunk"), (16384, "chunk"), (19968, "end")])
        # counted from the resume point, as upstream's chunked prefill does
        got = cache.placement(20_000, 1024, 1024, GRID, chunk=8192)
        self.assertEqual(got, [(9216, "chunk"), (17408, "chunk"), (19968, "end")])

    def test_joint_budget_holds_after_every_request(self):
        budget = 40_000 + 3 * STB  # 400 tokens of KV + 3 checkpoints
        cache, alloc, pool = hybrid(budget=budget)
        for i in range(12):
            run_request(cache, alloc, pool, toks(i, 150 + 10 * i))
            self.assertLessEqual(cache.device_used_bytes(), budget)
            assert_pool_invariants(self, cache, alloc, pool)

    def test_host_tier_restores_kv_and_checkpoint_together(self):
        budget = 30_000 + 2 * STB
        cache, alloc, pool = hybrid(budget=budget, host=10**9)
        sentinel = toks(42, 260)
        run_request(cache, alloc, pool, sentinel)  # checkpoint 256
        for i in range(6):  # push it out of the device budget
            run_request(cache, alloc, pool, toks(100 + i, 250))
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(sentinel)))
        self.assertEqual(m.full_kv_hit_length, 0, "sentinel still on device; test needs more pressure")
        hm = cache.match_with_host(sentinel)
        self.assertEqual((hm.resume_len, hm.device_resume_len, hm.host_hit_len), (256, 0, 256))
        self.assertEqual(hm.loaded_bytes, 256 * KVB + STB)
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(sentinel)))
        self.assertEqual(m.device_prefix_len, 256)  # now a device resume point
        self.assertLessEqual(cache.device_used_bytes(), budget)
        assert_pool_invariants(self, cache, alloc, pool)

    def test_host_tier_off_recomputes(self):
        cache, alloc, pool = hybrid(budget=30_000 + 2 * STB, host=0)
        sentinel = toks(42, 260)
        run_request(cache, alloc, pool, sentinel)
        for i in range(6):
            run_request(cache, alloc, pool, toks(100 + i, 250))
        self.assertEqual(cache.match_with_host(sentinel).resume_len, 0)

    def _host_filled(self):
        """A cache whose host tier holds an evicted 260-token prompt (checkpoint at 256)."""
        cache, alloc, pool = hybrid(budget=30_000 + 2 * STB, host=10**9)
        run_request(cache, alloc, pool, toks(42, 260))
        for i in range(6):
            run_request(cache, alloc, pool, toks(100 + i, 250))
        self.assertGreater(cache.host.num_checkpoints, 0)
        return cache, alloc, pool

    def test_host_match_hashes_only_the_pages_it_finds(self):
        """A match with a non-empty host tier hashes from the device resume point on and stops at the
        first page the host lacks: repeated matches of a long prompt cost a page or two, not the prompt
        (the whole-prompt hash chain cost ~40 ms a request at 12k tokens on the serving path)."""
        import sglang_hybrid.mem_cache.hybrid_radix_cache as mod

        cache, alloc, pool = self._host_filled()
        base = toks(7, 256)
        run_request(cache, alloc, pool, base)  # device resume point at 256
        prompt = toks(8, 2000, base=list(base))
        calls = []
        real = mod.page_hash
        mod.page_hash = lambda prev, t: calls.append(1) or real(prev, t)
        try:
            first = cache.match_with_host(prompt, load=False)
            n_first = len(calls)
            calls.clear()
            again = cache.match_with_host(prompt, load=False)
        finally:
            mod.page_hash = real
        self.assertEqual(first.resume_len, 256)
        self.assertEqual(again, first)
        self.assertLessEqual(n_first, 256 // PAGE + 1)  # the resume node's chain once, then one page
        self.assertEqual(len(calls), 1)  # the chain is cached on the node: one page past the resume point

    def test_host_match_equals_whole_prompt_scan(self):
        """Oracle: the deepest host resume point found by scanning the whole prompt's page hashes
        (every page up to it on the device or the host, a host checkpoint at it) and the KV hit."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams as MP

        rng = __import__("random").Random(5)
        cache, alloc, pool = self._host_filled()
        prompts = [toks(42, 260)] + [toks(100 + i, 250) for i in range(6)]
        host_found = 0
        for step in range(40):
            if rng.random() < 0.5:
                p = array("q", prompts[rng.randrange(len(prompts))][: rng.randrange(64, 250)])
                p.extend(toks(1000 + step, rng.randrange(1, 200)))
                prompts.append(p)
                run_request(cache, alloc, pool, p)
            probe = prompts[rng.randrange(len(prompts))]
            probe = array("q", probe[: rng.randrange(16, len(probe) + 1)])
            m = cache.match_prefix(MP(key=RadixKey(probe)))
            dev, kv_dev = m.device_prefix_len, m.full_kv_hit_length
            kv_hit, resume = kv_dev, dev
            for i, h in enumerate(cache.prefix_hashes(probe, len(probe))):
                pos = (i + 1) * PAGE
                if pos > kv_dev and not cache.host.has_page(h):
                    break
                kv_hit = max(kv_hit, pos)
                if pos > dev and cache.host.has_checkpoint(h):
                    resume = pos
            hm = cache.match_with_host(probe, load=False)
            self.assertEqual((hm.resume_len, hm.device_resume_len, hm.kv_hit_len), (resume, dev, kv_hit), step)
            host_found += resume > dev
        self.assertGreater(host_found, 0, "no probe reached a host resume point: the oracle compared nothing")

    def test_dcp_widened_page_keeps_checkpoint_depth_equal_node_depth(self):
        """Case K8 at the tree level: page 64 x DCP 8 = tree page 512, state grid 64 -> checkpoint grid 512."""
        grid = checkpoint_grid(64, 64 * 8)
        cache, alloc, pool = build_cache(
            "hybrid", 200_000, 50, page_size=512, grid=grid, kv_bytes_per_token=KVB, state_bytes=STB
        )
        prompt = toks(7, 20_450)  # not a multiple of 512
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(prompt)))
        positions = [p for p, _ in cache.placement(len(prompt), m.device_prefix_len, m.full_kv_hit_length, grid)]
        self.assertEqual(positions, [19_968])  # 39 * 512; the 64-grid point 20,416 is off the page
        lock = cache.inc_lock_ref(m.last_device_node)
        kv = alloc.alloc(len(prompt))
        slot = pool.mamba_allocator.alloc(1)
        cache.insert(InsertParams(key=RadixKey(prompt[:19_968]), value=kv[:19_968], mamba_value=slot))
        alloc.free(kv[19_968:])
        cache.dec_lock_ref(m.last_device_node, lock.to_dec_params())
        self.assertEqual(list(checkpoint_depths(cache).values()), [19_968])
        # resent with a continuation: resumes exactly at the checkpoint, on the widened page
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(prompt + toks(8, 300))))
        self.assertEqual(m.device_prefix_len, 19_968)
        self.assertEqual(m.device_prefix_len % 512, 0)

    def test_bad_arguments(self):
        cache, alloc, pool = hybrid()
        with self.assertRaisesRegex(ValueError, "page_size"):
            cache.insert_checkpoint(toks(1, 100), 100)
        with self.assertRaisesRegex(ValueError, "kv_bytes_per_token"):
            hybrid_bad = build_cache("hybrid", 10, 2, page_size=PAGE, grid=GRID, kv_bytes_per_token=0)


class TestPerPathCap(unittest.TestCase):
    """A per-path checkpoint budget (issue #3, placement rule 3): upstream's path cap, defaulted by our cache."""

    def _path_checkpoints(self, cache, key):
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(key)))
        node, n = cache.tree_core.node_by_id(m.last_device_node), 0
        while node is not None and node is not cache.tree_core.root_node:
            n += node.component_data[ComponentType.MAMBA].value is not None
            node = node.parent
        return n

    def test_checkpoints_along_one_path_are_capped(self):
        key = toks(7, 640)
        for cap, want in ((3, 3), (None, 10)):
            cache, _, _ = build_cache("hybrid", 100_000, 40, page_size=PAGE, grid=GRID, max_checkpoints_per_path=cap)
            for pos in range(64, 641, 64):  # ten checkpoints, each one deeper on the same path
                self.assertTrue(cache.insert_checkpoint(key, pos))
            self.assertEqual(self._path_checkpoints(cache, key), want, f"cap={cap}")
            # the KV of the whole path stays (only states were evicted)
            self.assertEqual(cache.match_prefix(MatchPrefixParams(key=RadixKey(key))).full_kv_hit_length, 640)

    def test_bad_cap(self):
        with self.assertRaises(ValueError):
            build_cache("hybrid", 1000, 4, page_size=PAGE, grid=GRID, max_checkpoints_per_path=0)


class TestDecodeEndGate(unittest.TestCase):
    """Serving path: a finished request's decode-time state is donated only while the
    'end' placement kind's hit rate predicts reuse (issue #3, placement rule 3)."""

    def test_decode_end_state_donated_only_while_predicted_reused(self):
        from types import SimpleNamespace
        from unittest import mock

        from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

        cache, _, _ = build_cache("hybrid", 100_000, 20, page_size=PAGE, grid=GRID, serving=True,
                                  placement_warmup=4, min_hit_rate=0.25)
        comp = cache._mamba_component()
        req = SimpleNamespace(origin_input_ids=list(range(100)))
        upstream_choice = {"sel": (320, 1)}  # upstream would donate the state tracked at 320 (decode)
        with mock.patch.object(MambaComponent, "_select_finished_checkpoint", lambda self, r, n: upstream_choice["sel"]):
            self.assertEqual(comp._select_finished_checkpoint(req, 400), (320, 1))  # warm-up: donated
            self.assertEqual(cache._pending_end_positions, [320])  # recorded as kind 'end' after the insert
            cache._pending_end_positions.clear()
            cache.kind_stored["end"], cache.kind_hits["end"] = 8, 1  # 12.5 % < 25 %
            self.assertIsNone(comp._select_finished_checkpoint(req, 400))
            self.assertEqual(cache.metrics.decode_end_skipped, 1)
            cache.kind_hits["end"] = 2  # 25 %
            self.assertEqual(comp._select_finished_checkpoint(req, 400), (320, 1))
            cache.kind_hits["end"] = 0
            upstream_choice["sel"] = (64, 0)  # a state inside the prompt is never gated
            self.assertEqual(comp._select_finished_checkpoint(req, 400), (64, 0))
            upstream_choice["sel"] = None  # upstream donates nothing: unchanged
            self.assertIsNone(comp._select_finished_checkpoint(req, 400))
        self.assertEqual(cache.metrics.decode_end_skipped, 1)


class TestServingMatchCost(unittest.TestCase):
    def test_one_device_match_while_the_host_tier_is_empty(self):
        """The scheduler's match (serving mode, host tier configured): with nothing below the device it is
        upstream's device match alone, once; with host entries, the host-aware match runs first."""
        from types import SimpleNamespace
        from unittest import mock

        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        cache, alloc, pool = build_cache("hybrid", 30_000 // KVB + 2_000, 20, page_size=PAGE, grid=GRID,
                                         serving=True, kv_bytes_per_token=KVB, state_bytes=STB,
                                         device_budget_bytes=30_000 + 2 * STB, host_budget_bytes=10**9)
        key = toks(3, 300)
        calls = []
        real = UnifiedRadixCache.match_prefix

        def counting(self, params):
            calls.append(1)
            return real(self, params)

        def serve_match():
            calls.clear()
            with mock.patch.object(UnifiedRadixCache, "match_prefix", counting):
                cache.match_prefix(MatchPrefixParams(key=RadixKey(key), req=SimpleNamespace(rid="r", session=None)))
            return len(calls)

        self.assertEqual(serve_match(), 1)
        run_request(cache, alloc, pool, toks(42, 260))
        for i in range(6):  # evict to the host
            run_request(cache, alloc, pool, toks(100 + i, 250))
        self.assertGreater(cache.host.num_pages, 0)
        self.assertGreater(serve_match(), 1)


class CacheMachine(RuleBasedStateMachine):
    """Random insert / match / lock / unlock / evict / offload / restore / abort sequences."""

    @initialize(host=st.sampled_from([0, 10**9]))
    def setup(self, host):
        self.cache, self.alloc, self.pool = hybrid(kv=5_000, slots=40, budget=60_000 + 6 * STB, host=host)
        self.locks = []
        self.prompts = [toks(s, 100 + 37 * s) for s in range(6)]
        self.tc = unittest.TestCase()

    @rule(i=st.integers(0, 5), extra=st.integers(0, 200))
    def request(self, i, extra):
        key = toks(50 + extra, extra, base=self.prompts[i])
        run_request(self.cache, self.alloc, self.pool, key)

    @rule(i=st.integers(0, 5))
    def match_and_lock(self, i):
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(self.prompts[i])))
        self.locks.append((m.last_device_node, self.cache.inc_lock_ref(m.last_device_node)))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        node, lock = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.dec_lock_ref(node, lock.to_dec_params())

    @rule(n=st.integers(1, 600), states=st.integers(0, 3))
    def evict(self, n, states):
        self.cache.evict(EvictParams(num_tokens=n, mamba_num=states))

    @rule(i=st.integers(0, 5))
    def restore_from_host(self, i):
        hm = self.cache.match_with_host(self.prompts[i])
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(self.prompts[i])))
        self.tc.assertEqual(m.device_prefix_len, hm.resume_len)

    @rule(i=st.integers(0, 5))
    def abort_after_match(self, i):
        # admission fails right after the match: lock and release without inserting
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(self.prompts[i])))
        lock = self.cache.inc_lock_ref(m.last_device_node)
        kv = self.alloc.alloc(min(64, self.alloc.available_size()))
        if kv is not None:
            self.alloc.free(kv)
        self.cache.dec_lock_ref(m.last_device_node, lock.to_dec_params())

    @invariant()
    def pools_balance(self):
        if not hasattr(self, "cache"):
            return
        held = len(self.locks)
        if held == 0:
            self.tc.assertEqual(self.cache.protected_size(), 0)
            self.tc.assertEqual(self.cache.mamba_protected_size(), 0)
        assert_pool_invariants(self.tc, self.cache, self.alloc, self.pool)

    def teardown(self):
        while getattr(self, "locks", None):
            node, lock = self.locks.pop()
            self.cache.dec_lock_ref(node, lock.to_dec_params())
        if hasattr(self, "cache"):
            self.tc.assertEqual(self.cache.protected_size(), 0)
            self.tc.assertEqual(self.cache.mamba_protected_size(), 0)


CacheMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestCacheStateMachine = CacheMachine.TestCase


class TestLockedEntriesFillTheBudget(unittest.TestCase):
    def test_room_is_refused_while_locked_entries_fill_the_budget_and_made_after_unlock(self):
        """The state machine's second find (a 2,500-example run on 2026-12-01; the harness asserted every
        request fits): with prefixes locked, 51,200 of the 98,400 budget bytes are locked and a 409-token
        request (+ one checkpoint) needs 47,300 more, so the cache must refuse rather than evict a locked
        entry; once the locks go, the same room is made."""
        m = CacheMachine()
        m.setup(host=0)
        for _ in range(4):
            m.match_and_lock(i=0)
        m.request(extra=0, i=1)
        m.match_and_lock(i=1)
        m.request(extra=0, i=5)
        m.match_and_lock(i=5)
        cache = m.cache
        locked = cache.protected_size() * KVB + cache.mamba_protected_size() * STB
        self.assertEqual((locked, cache.device_budget_bytes), (51_200, 98_400))
        self.assertFalse(cache._make_room(409, 1))
        m.pools_balance()
        self.assertEqual(cache.protected_size() * KVB + cache.mamba_protected_size() * STB, locked)  # nothing locked evicted
        m.teardown()
        self.assertTrue(cache._make_room(409, 1))
        m.pools_balance()


class TestHostRestoreReplan(unittest.TestCase):
    def test_restore_plans_again_when_making_room_evicts_the_device_kv_it_keeps(self):
        """Found by the state machine (fresh-clone run of 2026-12-01): a host restore locks only the resume
        node (here the root), so making room for the restored KV can evict device KV below the host resume
        point that the plan kept on the device; the restore then inserted that range as index -1 (tokens
        counted as cached that no pool held). The restore now plans again from the new device match and
        brings the whole prefix back from the host.

        Built directly: P's KV and checkpoint at 192 are on the host; on the device, X shares P's first 128
        tokens (no checkpoint there) and has its own at 192; Y is a small checkpoint resumed four times.
        Restoring P needs 64 tokens + one state: the cheapest entry is X's leaf, after which P's 128
        device tokens are KV with no checkpoint and go next -- the first plan's device part is gone."""
        cache, alloc, pool = hybrid(budget=10**6, host=10**9)
        P = toks(1, 200)
        run_request(cache, alloc, pool, P)  # its end checkpoint at 192
        cache.evict(EvictParams(num_tokens=10**6, mamba_num=10))  # everything to the host
        self.assertEqual(cache.match_prefix(MatchPrefixParams(key=RadixKey(P))).full_kv_hit_length, 0)
        X = array("q", P[:128]) + toks(2, 100)
        self.assertTrue(cache.insert_checkpoint(X, 192))
        Y = toks(3, 64)
        self.assertTrue(cache.insert_checkpoint(Y, 64))
        ynode = cache.match_prefix(MatchPrefixParams(key=RadixKey(Y))).last_device_node
        for _ in range(3):
            cache.note_resume(ynode)
        self.assertEqual(cache.device_used_bytes(), 192 * KVB + STB + 64 * KVB + STB)
        cache.device_budget_bytes = cache.device_used_bytes() - 100
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(P)))
        self.assertEqual((m.device_prefix_len, m.full_kv_hit_length), (0, 128))  # the first plan: 128 on device
        loaded_before = cache.metrics.host_to_device_bytes
        hm = cache.match_with_host(P)
        self.assertEqual((hm.resume_len, hm.device_resume_len, hm.host_hit_len), (192, 0, 192))
        self.assertEqual(hm.loaded_bytes, 192 * KVB + STB)  # all of [0, 192) from the host, and its checkpoint
        self.assertEqual(cache.metrics.host_to_device_bytes - loaded_before, hm.loaded_bytes)
        self.assertEqual(cache.metrics.host_restore_replans, 1)
        self.assertEqual(cache.match_prefix(MatchPrefixParams(key=RadixKey(P))).device_prefix_len, 192)
        self.assertLessEqual(cache.device_used_bytes(), cache.device_budget_bytes)
        assert_pool_invariants(self, cache, alloc, pool)


if __name__ == "__main__":
    unittest.main()
