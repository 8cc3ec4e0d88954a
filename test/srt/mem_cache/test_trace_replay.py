"""The cache benchmark's replay driver (benchmark/cache/replay_cache.py) on a slice of the trace."""

from __future__ import annotations

import unittest

from sglang_hybrid.mem_cache.trace_replay import (
    ModelBytes,
    ReplayConfig,
    load_trace,
    perfect_reuse_tokens,
    prompt_tokens,
    replay,
    upstream_positions,
)

from sglang_hybrid.bench.trace import DEFAULT_TRACE_PATH

GB = 1_000_000_000


class TestTraceReplay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.all = load_trace(DEFAULT_TRACE_PATH)

    def test_perfect_reuse_matches_the_issue(self):
        reuse, total = perfect_reuse_tokens(self.all)
        self.assertEqual(len(self.all), 12031)
        self.assertEqual(total, 144_793_823)
        self.assertAlmostEqual(100 * reuse / total, 37.36, places=2)  # "the 37.4% a perfect cache reuses"

    def test_synthetic_tokens_keep_the_prefix_pattern(self):
        a = {"input_length": 1100, "hash_ids": [7, 8, 9]}
        b = {"input_length": 700, "hash_ids": [7, 8]}
        c = {"input_length": 600, "hash_ids": [7, 5]}
        ta, tb, tc = prompt_tokens(a), prompt_tokens(b), prompt_tokens(c)
        self.assertEqual(len(ta), 1100)
        self.assertEqual(tb.tolist(), ta[:700].tolist())  # partial block = prefix of the full one
        self.assertEqual(tc[:512].tolist(), ta[:512].tolist())
        self.assertNotEqual(tc[512], ta[512])

    def test_upstream_placement(self):
        # one chunk: the prompt end's grid point, or the branch point inside it
        self.assertEqual(upstream_positions(1000, 1, 0, None, 64, 8192, 256), ([], 960))
        self.assertEqual(upstream_positions(1000, 1, 0, 512, 64, 8192, 256), ([], 512))
        # decode tracks every 256 tokens of the sequence: 1000 + 300 - 1 -> 1280
        self.assertEqual(upstream_positions(1000, 300, 0, None, 64, 8192, 256), ([], 1280))
        # chunked prefill stores every chunk but the last
        self.assertEqual(upstream_positions(20000, 1, 0, None, 64, 8192, 256), ([8192, 16384], 19968))

    def test_ours_reuses_more_than_upstream_on_a_slice(self):
        recs = self.all[:400]
        out = {}
        for policy, host in (("upstream", 0), ("hybrid", 0), ("hybrid", 250 * GB)):
            cfg = ReplayConfig(policy, 20 * GB, host, stride=512)
            out[(policy, host)] = replay(cfg, recs)
        up, ours, ours_host = out[("upstream", 0)], out[("hybrid", 0)], out[("hybrid", 250 * GB)]
        for r in out.values():
            self.assertEqual(r.input_tokens, sum(x["input_length"] for x in recs))
            self.assertEqual(r.reused_tokens + r.recomputed_tokens, r.input_tokens)
            self.assertEqual(r.requests_not_cached, 0)
        self.assertGreater(ours.reused_tokens, up.reused_tokens)
        self.assertGreater(ours_host.reused_tokens, ours.reused_tokens)
        self.assertGreater(ours_host.host_hit_tokens, 0)
        self.assertEqual(ours.host_hit_tokens, 0)
        # every host byte moved belongs to a host hit: KV of the restored pages + one state each
        m = ModelBytes()
        self.assertLessEqual(ours_host.host_to_device_bytes, ours_host.host_hit_tokens * m.kv_bytes_per_token + ours_host.requests * m.state_bytes)

    def test_dcp_divides_kv_bytes_only(self):
        m = ModelBytes().dcp(8)
        self.assertEqual(m.kv_bytes_per_token, 13_824 // 8)
        self.assertEqual(m.state_bytes, ModelBytes().state_bytes)
        with self.assertRaisesRegex(ValueError, "dcp"):
            ModelBytes().dcp(0)


class TestReplayOverInstances(unittest.TestCase):
    """Issue 45's benchmark harness on a slice: four instances with small tiers; a shared store only
    adds resume points (the instances' own tiers are unchanged), so reuse with it is at least reuse
    without, for both routings, and the store's hits are counted in tokens and bytes."""

    def test_shared_store_adds_reuse_under_both_routings(self):
        from sglang_hybrid.mem_cache.trace_replay import ROUTINGS, ReplayConfig, replay_instances

        recs = load_trace(DEFAULT_TRACE_PATH, 300)
        cfg = ReplayConfig("hybrid", 20 * 10**9, host_budget_bytes=40 * 10**9)
        for routing in ROUTINGS:
            off = replay_instances(cfg, recs, 4, routing, False)
            on = replay_instances(cfg, recs, 4, routing, True)
            self.assertEqual(sum(on["per_instance_requests"]), 300)
            if routing == "round-robin":
                self.assertEqual(on["per_instance_requests"], [75] * 4)
            self.assertEqual(off["store_hit_tokens"], 0)
            self.assertGreater(on["store_hit_tokens"], 0)
            self.assertGreater(on["store_published"], 0)
            self.assertGreater(on["reuse_pct"], off["reuse_pct"])
            # every store hit moved at least one checkpoint: bytes per reused token are positive
            self.assertGreater(on["store_bytes_per_reused_token"], 0)
        with self.assertRaises(ValueError):
            replay_instances(ReplayConfig("hybrid", 20 * 10**9), recs, 2, "round-robin", True)  # no host tier


if __name__ == "__main__":
    unittest.main()
