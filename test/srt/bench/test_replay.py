"""Tests of the trace-replay benchmark client (CPU only, no model)."""

import hashlib
import json
import math
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from replay_fake_server import SERVER_INFO, FakeServer, common_prefix_len  # noqa: E402

from sglang_hybrid.bench import replay  # noqa: E402
from sglang_hybrid.bench.client import RequestResult, chunks_from_upstream_itl  # noqa: E402
from sglang_hybrid.bench.metrics import sglang_serving_metrics, summarize  # noqa: E402
from sglang_hybrid.bench.trace import (  # noqa: E402
    DEFAULT_TRACE_PATH,
    PromptSynthesizer,
    TokenRange,
    TraceRecord,
    load_trace,
    resolve_token_range,
    scale_request,
    scale_trace,
    scaled_block_size,
    theoretical_reuse,
)


def _rec(index, input_length, hash_ids, output_length=10, ts=0):
    return TraceRecord(index, ts, input_length, output_length, tuple(hash_ids))


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


class TestTokenSynthesis(unittest.TestCase):
    def test_shared_prefix_blocks_give_equal_tokens(self):
        a = scale_request(_rec(0, 3 * 512, [1, 2, 3]))
        b = scale_request(_rec(1, 3 * 512, [1, 2, 4]))
        synth = PromptSynthesizer(512, seed=5)
        ta, tb = np.array(synth.input_ids(a)), np.array(synth.input_ids(b))
        self.assertEqual(len(ta), 1536)
        np.testing.assert_array_equal(ta[:1024], tb[:1024])
        # Third block differs (random 512-token blocks: nearly every position).
        self.assertGreater(int(np.sum(ta[1024:] != tb[1024:])), 500)
        self.assertNotEqual(ta[1024], tb[1024])
        lo, hi = 1000, 30000  # documented default range
        self.assertTrue(((ta >= lo) & (ta < hi)).all())

    def test_seed_determinism(self):
        req = scale_request(_rec(0, 700, [9, 10]))
        p1 = PromptSynthesizer(512, seed=3).input_ids(req)
        p2 = PromptSynthesizer(512, seed=3).input_ids(req)
        p3 = PromptSynthesizer(512, seed=4).input_ids(req)
        self.assertEqual(p1, p2)
        self.assertNotEqual(p1, p3)
        self.assertEqual(len(p1), 700)

    def test_length_scaling(self):
        self.assertEqual(scaled_block_size(0.25), 128)
        self.assertEqual(scaled_block_size(0.001), 1)
        r = scale_request(_rec(0, 1000, [1, 2, 3, 4, 5, 6, 7, 8]), length_scale=0.25)
        self.assertEqual((r.input_len, r.block_size, r.hash_ids), (250, 128, (1, 2)))
        # Fewer ids than needed: L clamps to len(hash_ids) * b.
        r = scale_request(_rec(0, 2000, [1, 2]), length_scale=0.25)
        self.assertEqual((r.input_len, r.hash_ids), (256, (1, 2)))
        r = scale_request(_rec(0, 6758, list(range(14))), length_scale=0.001)
        self.assertEqual((r.input_len, r.block_size, len(r.hash_ids)), (7, 1, 7))
        # Output: round(503 * 0.1) = 50, capped by --max-output-len.
        r = scale_request(_rec(0, 10, [1], output_length=503), output_scale=0.1)
        self.assertEqual(r.output_len, 50)
        r = scale_request(_rec(0, 10, [1], output_length=503), output_scale=0.1, max_output_len=32)
        self.assertEqual(r.output_len, 32)
        r = scale_request(_rec(0, 10, [1], output_length=3), output_scale=0.01)
        self.assertEqual(r.output_len, 1)

    def test_token_range_from_model_dir(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"vocab_size": 5000}, f)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                dec = {str(i): {"content": f"<s{i}>", "special": True} for i in (0, 1, 2, 4000)}
                dec["3"] = {"content": "plain", "special": False}
                json.dump({"added_tokens_decoder": dec}, f)
            tr = resolve_token_range(d)
            self.assertEqual((tr.lo, tr.hi, tr.excluded), (3, 5000, (4000,)))
            allowed = tr.allowed_ids()
            self.assertEqual(allowed.size, 5000 - 3 - 1)
            self.assertNotIn(4000, allowed)
            self.assertEqual(resolve_token_range(d, vocab_size=3500).hi, 3500)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"vocab_size": 128}, f)
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                json.dump({
                    "added_tokens": [{"id": 100, "special": True}, {"id": 101, "special": True}],
                    "model": {"vocab": {f"t{i}": i for i in range(100)}},
                }, f)
            tr = resolve_token_range(d)
            # Padded rows 102..127 are not real tokens; specials 100, 101 excluded.
            self.assertEqual((tr.lo, tr.hi, tr.excluded), (0, 102, (100, 101)))
        self.assertEqual(resolve_token_range(), TokenRange(1000, 30000))
        self.assertEqual(resolve_token_range(vocab_size=1500), TokenRange(750, 1500))


class TestTheoreticalReuse(unittest.TestCase):
    def test_hand_computed(self):
        rows = [
            {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 1, "input_length": 1500, "output_length": 4, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 2, "input_length": 600, "output_length": 4, "hash_ids": [0, 1, 5]},
            {"timestamp": 3, "input_length": 800, "output_length": 4, "hash_ids": [7, 1, 2, 3]},
            {"timestamp": 4, "input_length": 2048, "output_length": 4, "hash_ids": [0, 1, 2, 3]},
        ]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jsonl")
            _write_jsonl(path, rows)
            reqs = scale_trace(load_trace(path), length_scale=0.5)  # b = 256
        # L = 512, 750, 300, 400, 1024; blocks used: [0,1] [0,1,2] [0,1] [7,1] [0,1,2,3]
        # matched: 0; 2*256=512; min(512, 299)=299; 0 (7 unseen); 3*256=768
        # (id 3 was never used before: request 0 was truncated to 2 blocks).
        self.assertEqual(theoretical_reuse(reqs), (0 + 512 + 299 + 0 + 768, 512 + 750 + 300 + 400 + 1024))
        self.assertEqual(theoretical_reuse(reqs[:1]), (0, 512))


class TestMetrics(unittest.TestCase):
    def test_percentiles_and_summary(self):
        itl = [round(0.01 * k, 2) for k in range(1, 11)]  # 0.01 .. 0.10
        r0 = RequestResult(0, 0.0, 100, 6, output_tokens=6, cached_tokens=50, ttft=0.1,
                           itl=itl[:5], chunk_tokens=[1] * 6, e2e_latency=0.25, success=True)
        r1 = RequestResult(1, 0.0, 200, 6, output_tokens=6, cached_tokens=0, ttft=0.3,
                           itl=itl[5:], chunk_tokens=[2, 1, 1, 1, 1, 0], e2e_latency=0.7, success=True)
        bad = RequestResult(2, 0.0, 1000, 6, cached_tokens=900, success=False, error="HTTP 400: x")
        s = summarize([r0, r1, bad], wall_time_s=2.0, theoretical=(100, 300))
        # numpy linear interpolation: P90 of 0.01..0.10 sits at rank 8.1 -> 0.091.
        self.assertAlmostEqual(s["itl_p90_s"], 0.091)
        self.assertAlmostEqual(s["itl_p50_s"], 0.055)
        self.assertAlmostEqual(s["interactivity_p90_tok_s_user"], 1 / 0.091)
        self.assertAlmostEqual(s["ttft_p50_s"], 0.2)
        self.assertAlmostEqual(s["ttft_p90_s"], 0.28)
        self.assertEqual((s["num_success"], s["num_errors"]), (2, 1))
        self.assertAlmostEqual(s["achieved_reuse"], 50 / 300)
        self.assertAlmostEqual(s["theoretical_reuse"], 1 / 3)
        self.assertAlmostEqual(s["reuse_ratio"], 0.5)
        self.assertAlmostEqual(s["total_token_throughput"], (300 + 12) / 2.0)
        self.assertAlmostEqual(s["output_token_throughput"], 6.0)
        self.assertAlmostEqual(s["request_throughput"], 1.0)
        # TPOT = (e2e - ttft) / (out - 1): 0.03 and 0.08 -> P50 0.055
        self.assertAlmostEqual(s["tpot_p50_s"], 0.055)

    def test_upstream_bench_serving_metrics_on_our_requests(self):
        # chunks of 1, 2 and 1 tokens: upstream's client records each gap / tokens once per token
        r0 = RequestResult(0, 0.0, 100, 4, output_tokens=4, ttft=0.2, itl=[0.1, 0.04],
                           chunk_tokens=[1, 2, 1], e2e_latency=0.34, start_time=0.0, success=True)
        r1 = RequestResult(1, 0.0, 50, 2, output_tokens=2, ttft=0.4, itl=[0.02], chunk_tokens=[1, 1],
                           e2e_latency=0.42, start_time=0.1, success=True)
        bad = RequestResult(2, 0.0, 999, 4, success=False, error="HTTP 400: x")
        up = sglang_serving_metrics([r0, r1, bad], wall_time_s=1.0)
        self.assertEqual(up["completed"], 2)
        self.assertEqual(up["total_input"], 150)  # the failed request's input is not counted
        self.assertEqual(up["total_output"], 6)
        # token ITLs: 0.05, 0.05 (r0's 2-token chunk), 0.04 (r0), 0.02 (r1) -> median 0.045 s
        self.assertAlmostEqual(up["median_itl_ms"], 45.0)
        self.assertAlmostEqual(up["max_itl_ms"], 50.0)
        # TPOT per request: (0.34 - 0.2) / 3 and (0.42 - 0.4) / 1 -> mean 0.0567 s
        self.assertAlmostEqual(up["mean_tpot_ms"], 1000 * ((0.14 / 3) + 0.02) / 2)
        s = summarize([r0, r1, bad], wall_time_s=1.0, theoretical=(0, 150))
        self.assertAlmostEqual(s["itl_token_p50_s"], 0.045)
        self.assertAlmostEqual(s["ttft_p50_s"], 0.3)
        self.assertAlmostEqual(s["e2e_p50_s"], 0.38)
        self.assertAlmostEqual(s["itl_p50_s"], 0.04)  # ours: per chunk gap (0.1, 0.04, 0.02)
        self.assertIsNone(sglang_serving_metrics([bad], wall_time_s=1.0))

    def test_chunks_from_upstream_itl(self):
        """Upstream's client stores gap / n, n times, per chunk of n tokens after the first."""
        gaps, tokens = chunks_from_upstream_itl([0.01, 0.02, 0.02, 0.02, 0.005], 7)
        self.assertEqual(tokens, [2, 1, 3, 1])  # the first chunk: 7 - 5 later tokens
        self.assertEqual(len(gaps), 3)
        for g, want in zip(gaps, (0.01, 0.06, 0.005)):
            self.assertAlmostEqual(g, want)
        self.assertEqual(chunks_from_upstream_itl([], 1), ([], [1]))


class TestEndToEnd(unittest.TestCase):
    def test_replay_real_trace_against_fake_server(self):
        n, scale, out_scale, seed = 20, 0.02, 0.1, 7
        server = FakeServer(chunk_size=3).start()
        try:
            with tempfile.TemporaryDirectory() as d:
                model_dir = os.path.join(d, "model")
                os.makedirs(model_dir)
                with open(os.path.join(model_dir, "config.json"), "w") as f:
                    json.dump({"vocab_size": 5000}, f)
                out = os.path.join(d, "out", "r.json")
                summary = replay.main([
                    "--base-url", server.base_url, "--num-requests", str(n),
                    "--length-scale", str(scale), "--output-scale", str(out_scale),
                    "--concurrency", "2", "--seed", str(seed), "--warmup", "1",
                    "--model-path", model_dir, "--output-json", out, "--no-progress",
                ])
                with open(out) as f:
                    result = json.load(f)
                with open(os.path.join(model_dir, "config.json"), "rb") as f:
                    cfg_sha = hashlib.sha256(f.read()).hexdigest()
        finally:
            server.stop()

        rows = result["requests"]
        self.assertEqual(len(rows), n)
        self.assertTrue(all(r["success"] for r in rows), [r["error"] for r in rows])
        self.assertEqual([r["index"] for r in rows], list(range(n)))

        # Independent synthesis of the prompts the client must have sent.
        with open(DEFAULT_TRACE_PATH) as f:
            raw = [json.loads(next(f)) for _ in range(n)]
        b = round(512 * scale)
        synth = PromptSynthesizer(b, TokenRange(1000, 5000), seed)  # no tokenizer: lo = 1000
        prompts = []
        for i, r in enumerate(raw):
            L = min(max(1, round(r["input_length"] * scale)), len(r["hash_ids"]) * b)
            ids = np.concatenate([synth.block_tokens(h) for h in r["hash_ids"][: math.ceil(L / b)]])
            prompts.append(ids[:L].tolist())
        self.assertEqual([r["input_len"] for r in rows], [len(p) for p in prompts])

        # The server saw the warm-up prompt first, then exactly our prompts.
        self.assertEqual(len(server.arrivals), n + 1)
        self.assertEqual(len(server.arrivals[0]), 16)
        by_prompt = {tuple(p): i for i, p in enumerate(prompts)}
        order = [by_prompt[tuple(a)] for a in server.arrivals[1:]]
        self.assertEqual(sorted(order), list(range(n)))

        # cached_tokens = longest prefix shared with an earlier arrival.
        expected = {}
        for k, i in enumerate(order):
            earlier = server.arrivals[: k + 1]
            expected[i] = max(common_prefix_len(prompts[i], e) for e in earlier)
        self.assertEqual([r["cached_tokens"] for r in rows], [expected[i] for i in range(n)])
        # Mooncake's first 20 requests share their first block (a system prompt).
        self.assertGreaterEqual(sum(expected.values()), (n - 1) * b)
        total_in = sum(len(p) for p in prompts)
        self.assertAlmostEqual(summary["achieved_reuse"], sum(expected.values()) / total_in)
        self.assertGreater(summary["achieved_reuse"], 0)
        self.assertAlmostEqual(summary["theoretical_reuse"], (n - 1) * b / total_in)

        want_out = [max(1, round(r["output_length"] * out_scale)) for r in raw]
        self.assertEqual([r["output_len"] for r in rows], want_out)
        self.assertEqual([r["output_tokens"] for r in rows], want_out)
        for r in rows:
            self.assertEqual(sum(r["chunk_tokens"]), r["output_tokens"])
            self.assertEqual(len(r["itl"]), len(r["chunk_tokens"]) - 1)
            self.assertTrue(all(c <= 3 for c in r["chunk_tokens"]))
            self.assertEqual(r["prompt_tokens"], r["input_len"])
            self.assertGreater(r["ttft"], 0)
        self.assertEqual(summary["output_tokens"], sum(want_out))
        self.assertEqual(summary["num_errors"], 0)
        self.assertEqual(result["summary"], json.loads(json.dumps(summary)))

        m = result["manifest"]
        for key in ("command", "options", "start_time_utc", "hostname", "git_commit", "versions"):
            self.assertIn(key, m)
        self.assertEqual(m["server_info"], SERVER_INFO)
        self.assertEqual(m["model_config_sha256"], cfg_sha)
        self.assertEqual(m["options"]["concurrency"], 2)
        self.assertEqual(m["command"][:3], ["python", "-m", "sglang_hybrid.bench.replay"])
        self.assertEqual(m["versions"]["sglang_hybrid"], "0.1.0")
        self.assertEqual((m["token_range"]["lo"], m["token_range"]["hi"]), (1000, 5000))

    def test_http_error_is_recorded_and_run_continues(self):
        rows_in = [
            {"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [0]},
            {"timestamp": 100, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 200, "input_length": 30, "output_length": 5, "hash_ids": [0]},
        ]
        server = FakeServer(chunk_size=2, max_input_len=50).start()
        try:
            with tempfile.TemporaryDirectory() as d:
                trace = os.path.join(d, "t.jsonl")
                _write_jsonl(trace, rows_in)
                out = os.path.join(d, "r.json")
                summary = replay.main([
                    "--base-url", server.base_url, "--trace", trace, "--pace", "timestamp",
                    "--speedup", "100", "--output-json", out, "--no-progress",
                ])
                with open(out) as f:
                    rows = json.load(f)["requests"]
        finally:
            server.stop()
        self.assertEqual([r["success"] for r in rows], [True, False, True])
        self.assertIn("exceeds max 50", rows[1]["error"])  # the server's message (upstream's client: "reason: body")
        self.assertEqual([rows[0]["output_tokens"], rows[2]["output_tokens"]], [5, 5])
        self.assertEqual(rows[0]["chunk_tokens"], [2, 2, 1])
        # Request 2 is paced to 200 ms / 100 = 2 ms after the start.
        self.assertGreaterEqual(rows[2]["start_time"], 0.002)
        self.assertEqual((summary["num_success"], summary["num_errors"]), (2, 1))
        # Request 2 shares 20 tokens (block 0 of request 0, truncated) with request 0.
        self.assertEqual(rows[2]["cached_tokens"], 20)
        self.assertAlmostEqual(summary["achieved_reuse"], 20 / 50)


if __name__ == "__main__":
    unittest.main()
