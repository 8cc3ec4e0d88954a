"""Tests of the benchmark suite's metric definitions (CPU only, no model server).

Hand-computed answers on synthetic request results, and a fake server with
scripted stream timings (``bench_fake_server.ScriptedServer``) for the
closed-loop window semantics, token counting and the sweep plumbing.
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_fake_server import ScriptedServer  # noqa: E402

from sglang_hybrid.bench import abbench, aiperf_check, manifest, report, sweep  # noqa: E402
from sglang_hybrid.bench.client import OpenAITokenCounter, RequestResult  # noqa: E402
from sglang_hybrid.bench.metrics import (  # noqa: E402
    burst_normalised_itl,
    chunk_gaps,
    decode_rate,
    interpolate_at_interactivity,
    summarize_window,
    tokens_per_dollar,
)
from sglang_hybrid.bench.resultfile import dumps, load_json, write_json  # noqa: E402


def _res(ttft, itl, chunks, success=True, error=None):
    """A request result with e2e = TTFT + Σ ITL and output = Σ chunk tokens."""
    return RequestResult(index=0, timestamp=0.0, input_len=10, output_len=sum(chunks), output_tokens=sum(chunks),
                         ttft=ttft, itl=list(itl), chunk_tokens=list(chunks), e2e_latency=ttft + sum(itl),
                         start_time=0.0, success=success, error=error)


# r0: bursts of 2 and 3 tokens; r1: steady 2-token chunks; r2 failed (must be ignored); r3 one 4-token burst
R0 = _res(0.2, [0.1, 0.3, 0.05], [1, 2, 3, 1])
R1 = _res(0.5, [0.2, 0.2], [2, 2, 2])
R2 = _res(0.1, [0.01], [1, 2], success=False, error="HTTP 500: x")
R3 = _res(1.0, [0.6], [1, 4])


class TestWindowMetrics(unittest.TestCase):
    def test_burst_normalised_itl_divides_each_gap_by_the_tokens_of_its_chunk(self):
        self.assertEqual(burst_normalised_itl([R0]), [0.1 / 2, 0.3 / 3, 0.05 / 1])
        # failed requests are left out; pooled in request order
        got = burst_normalised_itl([R0, R1, R2, R3])
        for a, b in zip(got, [0.05, 0.1, 0.05, 0.1, 0.1, 0.15]):
            self.assertAlmostEqual(a, b)
        self.assertEqual(len(got), 6)
        self.assertEqual(chunk_gaps([R2, R3]), [0.6])

    def test_decode_rate_uses_the_requests_own_decode_time(self):
        # (2 + 3 + 1) tokens after the first chunk over 0.1 + 0.3 + 0.05 s
        self.assertAlmostEqual(decode_rate(R0), 6 / 0.45)
        self.assertAlmostEqual(decode_rate(R3), 4 / 0.6)
        self.assertIsNone(decode_rate(_res(0.1, [], [5])))  # one chunk: no decode interval

    def test_summarize_window_hand_computed(self):
        s = summarize_window([R0, R1, R2, R3], concurrency=2, window_s=1.0, wall_time_s=2.5)
        # Successful tokens 7 + 6 + 5 = 18 over the wall time incl. the tail (not the 1 s window,
        # and not counting the failed request's 3 tokens).
        self.assertEqual(s["output_tokens"], 18)
        self.assertAlmostEqual(s["output_token_throughput"], 18 / 2.5)
        self.assertAlmostEqual(s["tail_s"], 1.5)
        self.assertEqual((s["num_requests"], s["num_success"], s["num_errors"]), (4, 3, 1))
        # median of 13.33, 10, 6.67 tok/s
        self.assertAlmostEqual(s["decode_rate_p50_tok_s"], 10.0)
        # TTFT 0.2, 0.5, 1.0: P99 by linear interpolation at rank 1.98 -> 0.5 + 0.98 * 0.5
        self.assertAlmostEqual(s["ttft_p50_s"], 0.5)
        self.assertAlmostEqual(s["ttft_p99_s"], 0.99)
        self.assertAlmostEqual(s["ttft_max_s"], 1.0)
        # burst-normalised sorted [.05 .05 .1 .1 .1 .15]: P99 at rank 4.95 -> 0.1 + 0.95 * 0.05
        self.assertAlmostEqual(s["itl_burst_norm_p99_s"], 0.1475)
        self.assertAlmostEqual(s["itl_burst_norm_p50_s"], 0.1)
        # true chunk gaps sorted [.05 .1 .2 .2 .3 .6]: P99 at rank 4.95 -> 0.3 + 0.95 * 0.3
        self.assertAlmostEqual(s["chunk_gap_p99_s"], 0.585)
        self.assertAlmostEqual(s["chunk_gap_p50_s"], 0.2)
        self.assertAlmostEqual(s["chunk_gap_max_s"], 0.6)
        # TPOT (e2e - ttft) / (out - 1): 0.45/6 = .075, 0.4/5 = .08, 0.6/4 = .15
        self.assertAlmostEqual(s["tpot_p50_s"], 0.08)
        self.assertAlmostEqual(s["mean_tokens_per_chunk"], 18 / 9)


class TestInteractivityAndCost(unittest.TestCase):
    # (interactivity tok/s/user, throughput tok/s/GPU) for C1, C2, C4, C8
    POINTS = [(60.0, 100.0), (40.0, 180.0), (25.0, 300.0), (10.0, 420.0)]

    def test_interpolation_hand_computed(self):
        # between (40, 180) and (60, 100): 180 + (100 - 180) * (50 - 40) / (60 - 40) = 140
        self.assertAlmostEqual(interpolate_at_interactivity(self.POINTS, 50.0), 140.0)
        # between (25, 300) and (40, 180): 300 - 120 * 5 / 15 = 260
        self.assertAlmostEqual(interpolate_at_interactivity(self.POINTS, 30.0), 260.0)
        self.assertAlmostEqual(interpolate_at_interactivity(self.POINTS, 40.0), 180.0)  # a measured point
        self.assertIsNone(interpolate_at_interactivity(self.POINTS, 70.0))  # no extrapolation
        self.assertIsNone(interpolate_at_interactivity(self.POINTS, 5.0))
        # Non-monotonic curve: (45, 200) adds segments; at 42 the segment (40,180)-(45,200)
        # gives 188 and (45,200)-(60,100) does not hold 42 -> 188; at 50 the best of
        # (45,200)-(60,100) = 200 - 100 * 5 / 15 = 166.67 wins.
        pts = self.POINTS + [(45.0, 200.0)]
        self.assertAlmostEqual(interpolate_at_interactivity(pts, 42.0), 188.0)
        self.assertAlmostEqual(interpolate_at_interactivity(pts, 50.0), 200 - 100 * 5 / 15)

    def test_tokens_per_dollar(self):
        # 140 tok/s/GPU * 3600 s/h / $2 per GPU-hour
        self.assertAlmostEqual(tokens_per_dollar(140.0, 2.0), 252000.0)
        self.assertIsNone(tokens_per_dollar(None, 2.0))
        self.assertIsNone(tokens_per_dollar(140.0, 0.0))

    def test_sweep_point_per_gpu_and_target(self):
        d = sweep.derive_point({"total_token_throughput": 1120.0, "output_token_throughput": 160.0,
                                "interactivity_p90_tok_s_user": 50.0}, num_gpus=8, usd_per_gpu_hour=2.0)
        self.assertAlmostEqual(d["total_tok_s_per_gpu"], 140.0)
        self.assertAlmostEqual(d["output_tok_s_per_gpu"], 20.0)
        self.assertAlmostEqual(d["total_tokens_per_usd"], 252000.0)
        points = [{"derived": {"interactivity_p90_tok_s_user": x, "total_tok_s_per_gpu": y}} for x, y in self.POINTS]
        t = sweep.at_target(points, 50.0, 4.0)
        self.assertAlmostEqual(t["total_tok_s_per_gpu"], 140.0)
        self.assertAlmostEqual(t["total_tokens_per_usd"], 140.0 * 3600 / 4.0)
        self.assertEqual(t["measured_interactivity_range"], [10.0, 60.0])
        self.assertIsNone(sweep.at_target(points, 99.0, 4.0)["total_tok_s_per_gpu"])


class TestTokenCounting(unittest.TestCase):
    def test_openai_counter_counts_token_ids_not_events(self):
        c = OpenAITokenCounter()
        chunks = [
            {"choices": [{"text": "a", "token_ids": [5]}]},
            {"choices": [{"text": "", "token_ids": [6, 7, 8]}]},  # burst with empty text
            {"choices": [{"text": "b", "token_ids": [9]}]},
            {"choices": [], "usage": {"completion_tokens": 5}},  # final usage-only chunk
        ]
        self.assertEqual([c.update(x) for x in chunks], [1, 3, 1, 0])
        self.assertEqual((c.total, c.source, c.usage_total), (5, "token_ids", 5))
        u = OpenAITokenCounter()
        chunks = [{"choices": [{"text": "a"}], "usage": {"completion_tokens": k}} for k in (1, 4, 4, 6)]
        self.assertEqual([u.update(x) for x in chunks], [1, 3, 0, 2])
        self.assertEqual(u.source, "usage")
        e = OpenAITokenCounter()
        self.assertEqual([e.update({"choices": [{"text": t}]}) for t in ("ab", "", "c")], [1, 0, 1])
        self.assertEqual(e.source, "events")

    def test_every_token_source_against_the_scripted_server(self):
        # chunk 1 is a 3-token burst with empty text
        script = [(0.005, 1), (0.005, 3), (0.005, 1), (0.005, 2), (0.005, 1)]
        cases = [("openai", "token_ids", [1, 3, 1, 2, 1]), ("openai", "usage", [1, 3, 1, 2, 1]),
                 ("openai", "logprobs", [1, 3, 1, 2, 1]), ("sglang", "token_ids", [1, 3, 1, 2, 1]),
                 # counting events loses the empty-text burst and counts every chunk as one token
                 ("openai", "events", [1, 1, 1, 1])]
        for api, src, want in cases:
            with self.subTest(api=api, source=src), ScriptedServer(script, token_source=src,
                                                                    empty_text_chunks={1}, spec_verify_ct=4) as srv:
                doc = _run_abbench(srv, api=api, concurrency="1", window=0.01, output_len=8,
                                   extra=["--logprobs"] if src == "logprobs" else [])
            rows = doc["windows"][0]["requests"]
            self.assertEqual(len(rows), 1)
            self.assertEqual(rows[0]["chunk_tokens"], want)
            self.assertEqual(rows[0]["output_tokens"], sum(want))
            self.assertEqual(rows[0]["token_count_source"],
                             "completion_tokens" if api == "sglang" else src)
            # spec_verify_ct 4 for 8 tokens -> 2 tokens per verify step (events: 4 counted / 4)
            da = doc["manifest"]["request_stats"]["draft_acceptance"]
            self.assertAlmostEqual(da["accept_length"], sum(want) / 4)
            self.assertEqual(doc["windows"][0]["request_stats"]["burst_sizes"],
                             {str(k): want[1:].count(k) for k in sorted(set(want[1:]))})


def _run_abbench(srv, api="openai", concurrency="1", window=1.0, output_len=8, extra=(), tmp=None):
    argv = ["--base-url", srv.base_url, "--api", api, "--concurrency", concurrency, "--window", str(window),
            "--output-len", str(output_len), "--input-len", "5", "--warmup", "0", "--vocab-size", "5000",
            *extra]
    args = abbench.build_parser().parse_args(argv)
    return abbench.run(args, ["abbench", *argv])


class TestClosedLoopWindow(unittest.TestCase):
    def test_requests_started_before_the_end_finish_and_count_none_start_after(self):
        window = 1.0
        # each request: 4 chunks of 2 tokens, 0.1 s apart -> ~0.4 s; streams start at ~0, 0.4, 0.8
        with ScriptedServer([(0.1, 2)] * 4) as srv:
            doc = _run_abbench(srv, concurrency="2", window=window, output_len=8)
            n_arrivals = len(srv.arrivals)
            max_inflight = srv.max_inflight
        w = doc["windows"][0]
        rows, s = w["requests"], w["summary"]
        self.assertEqual(n_arrivals, len(rows))  # the server saw nothing the client did not count
        self.assertEqual(max_inflight, 2)
        self.assertGreaterEqual(len(rows), 4)
        ends = [r["start_time"] + r["e2e_latency"] for r in rows]
        self.assertTrue(all(r["start_time"] < window for r in rows), [r["start_time"] for r in rows])
        for stream in (0, 1):
            mine = sorted((r for r in rows if r["stream"] == stream), key=lambda r: r["seq"])
            last = mine[-1]
            # the last request was started inside the window and finished after it (the tail) ...
            self.assertGreater(last["start_time"] + last["e2e_latency"], window)
            self.assertTrue(last["success"])
            # ... and every earlier one ended inside the window (else the next would not have started)
            self.assertTrue(all(r["start_time"] + r["e2e_latency"] < window for r in mine[:-1]))
            self.assertEqual([r["seq"] for r in mine], list(range(len(mine))))
        self.assertTrue(all(r["chunk_tokens"] == [2, 2, 2, 2] for r in rows))
        # throughput: every successful token over the wall time incl. the tail
        self.assertEqual(s["output_tokens"], 8 * len(rows))
        self.assertGreaterEqual(s["wall_time_s"], max(ends))
        self.assertLess(s["wall_time_s"], max(ends) + 0.1)
        self.assertAlmostEqual(s["output_token_throughput"], 8 * len(rows) / s["wall_time_s"])
        self.assertGreater(s["tail_s"], 0.0)
        # scripted gaps: 0.1 s per 2-token chunk -> burst-normalised ~0.05 s/token
        self.assertAlmostEqual(s["chunk_gap_p50_s"], 0.1, delta=0.04)
        self.assertAlmostEqual(s["itl_burst_norm_p50_s"], s["chunk_gap_p50_s"] / 2, delta=1e-3)
        self.assertAlmostEqual(s["mean_tokens_per_chunk"], 2.0)

    def test_errors_are_counted_and_excluded_from_throughput(self):
        with ScriptedServer([(0.01, 4)], fail_requests={1}) as srv:
            doc = _run_abbench(srv, concurrency="1", window=0.15, output_len=8)
        w = doc["windows"][0]
        rows = w["requests"]
        self.assertFalse(rows[1]["success"])
        self.assertTrue(rows[1]["error"].startswith("HTTP 500"))
        s = w["summary"]
        self.assertEqual(s["num_errors"], 1)
        self.assertEqual(s["output_tokens"], 8 * (len(rows) - 1))
        errs = doc["manifest"]["request_stats"]["errors"]
        self.assertEqual(errs["count"], 1)
        self.assertIn("scripted failure of request 1", next(iter(errs["messages"])))

    def test_prompts_repeat_from_the_seed(self):
        tr = abbench.resolve_token_range(vocab_size=5000)
        a = abbench.ClosedLoopPrompts(64, tr, seed=3)
        b = abbench.ClosedLoopPrompts(64, tr, seed=3)
        self.assertEqual(a.prompt(8, 2, 5), b.prompt(8, 2, 5))
        self.assertNotEqual(a.prompt(8, 2, 5), a.prompt(8, 2, 6))
        self.assertNotEqual(a.prompt(8, 2, 5), abbench.ClosedLoopPrompts(64, tr, seed=4).prompt(8, 2, 5))
        self.assertEqual(len(a.prompt(1, 0, 0)), 64)
        self.assertTrue(all(1000 <= t < 5000 for t in a.prompt(1, 0, 0)))  # documented default lower bound


class TestSweep(unittest.TestCase):
    def test_sweep_against_scripted_server(self):
        trace_rows = [{"timestamp": i, "input_length": 40, "output_length": 6, "hash_ids": [i + 1]}
                      for i in range(6)]
        # chunk delay grows with the number of requests in flight: C2 has ~2x the ITL of C1
        with tempfile.TemporaryDirectory() as d, ScriptedServer([(0.01, 1)], delay_scale_by_inflight=True) as srv:
            trace = os.path.join(d, "t.jsonl")
            with open(trace, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in trace_rows)
            argv = ["--base-url", srv.base_url, "--trace", trace, "--concurrency", "1,2", "--num-gpus", "2",
                    "--usd-per-gpu-hour", "3", "--target-interactivity", "60", "--api", "openai",
                    "--no-progress"]
            args = sweep.build_parser().parse_args(argv)
            doc = sweep.run(args, ["sweep", *argv])
            prompts = [a[2]["prompt"] for a in srv.arrivals]
        pts = doc["points"]
        self.assertEqual([p["concurrency"] for p in pts], [1, 2])
        self.assertEqual([p["seed"] for p in pts], [0, 1])
        # point 2 uses another seed: its first prompt differs from point 1's
        self.assertNotEqual(prompts[0], prompts[6])
        self.assertEqual(len(prompts[0]), 40)
        for p in pts:
            s, dv = p["summary"], p["derived"]
            self.assertEqual(s["num_errors"], 0)
            self.assertAlmostEqual(dv["total_tok_s_per_gpu"], s["total_token_throughput"] / 2)
            self.assertAlmostEqual(dv["interactivity_p90_tok_s_user"], 1 / s["itl_p90_s"])
            self.assertAlmostEqual(dv["total_tokens_per_usd"], dv["total_tok_s_per_gpu"] * 3600 / 3)
        self.assertGreater(pts[1]["summary"]["itl_p50_s"], 1.5 * pts[0]["summary"]["itl_p50_s"])
        pairs = [(p["derived"]["interactivity_p90_tok_s_user"], p["derived"]["total_tok_s_per_gpu"]) for p in pts]
        self.assertEqual(doc["target"]["total_tok_s_per_gpu"], interpolate_at_interactivity(pairs, 60.0))
        self.assertEqual(doc["manifest"]["options"]["concurrency"], [1, 2])


class TestManifestAndReport(unittest.TestCase):
    def test_kernel_paths_from_server_log(self):
        log = "\n".join([
            "[2026-11-29 13:41:15] kernel path: kda_decode       -> torch      (CPU platform: plain-torch reference)",
            "[2026-11-29 13:41:15] unrelated line",
            "[2026-11-29 13:41:16 TP0] kernel path: causal_conv1d -> triton:bs64 (autotuned)",
            "[2026-11-29 13:41:17] kernel path: kda_decode -> aiter (forced)",
        ])
        self.assertEqual(manifest.parse_kernel_paths(log), [
            {"op": "causal_conv1d", "impl": "triton:bs64", "reason": "autotuned"},
            {"op": "kda_decode", "impl": "aiter", "reason": "forced"},
        ])
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "server.log")
            with open(p, "w") as f:
                f.write(log)
            kp = manifest.kernel_paths({"model_path": "x"}, p)
            self.assertEqual(len(kp["table"]), 2)
            self.assertIn("server.log", kp["source"])
        self.assertIsNone(manifest.kernel_paths({"model_path": "x"}, None))
        self.assertEqual(manifest.kernel_paths({"kernel_paths": [{"op": "a"}]})["source"], "server_info")

    def test_manifest_fields_and_report(self):
        with tempfile.TemporaryDirectory() as d:
            model = os.path.join(d, "model")
            os.makedirs(model)
            with open(os.path.join(model, "config.json"), "w") as f:
                json.dump({"vocab_size": 3000}, f)
            log = os.path.join(d, "server.log")
            with open(log, "w") as f:
                f.write("kernel path: kda_prefill -> torch (CPU)\n")
            with ScriptedServer([(0.005, 1), (0.005, 2)]) as srv:
                doc = _run_abbench(srv, concurrency="1,2", window=0.05, output_len=5,
                                   extra=["--model-path", model, "--server-log", log, "--seed", "11",
                                          "--warmup", "1"])
                warm = srv.arrivals[0][2]
            m = doc["manifest"]
            self.assertEqual(warm["max_tokens"], abbench.WARMUP_OUTPUT_LEN)
            self.assertEqual(len(warm["prompt"]), 5)  # warm-up on the measured prompt length (--input-len 5)
            self.assertEqual(m["prompt_seed"], 11)
            self.assertEqual(m["warmup_requests"], 1)
            self.assertEqual(m["server_info"]["model_path"], "scripted-model")
            self.assertEqual(m["served_models"][0]["id"], "scripted-model")
            self.assertEqual(m["options"]["model"], "scripted-model")
            self.assertEqual(m["kernel_paths"]["table"], [{"op": "kda_prefill", "impl": "torch", "reason": "CPU"}])
            self.assertEqual(m["model_config_sha256"], manifest.sha256_file(os.path.join(model, "config.json")))
            self.assertEqual(m["versions"]["sglang_hybrid"], "0.1.0")
            self.assertIsNone(m["request_stats"]["draft_acceptance"])
            self.assertEqual(m["request_stats"]["prompt_len"]["mean"], 5.0)
            self.assertEqual(m["request_stats"]["output_len"]["max"], 5.0)
            # chunks of 1, 2, 2: decode chunks are two 2-token bursts per request
            n = sum(len(w["requests"]) for w in doc["windows"])
            self.assertEqual(m["request_stats"]["burst_sizes"], {"2": 2 * n})
            self.assertEqual([w["summary"]["concurrency"] for w in doc["windows"]], [1, 2])
            self.assertEqual(json.loads(dumps(doc)), json.loads(json.dumps(doc, default=str)))

            ab_path = os.path.join(d, "abbench.json")
            write_json(ab_path, doc)
            xc = {"kind": "aiperf_crosscheck", "manifest": m,
                  "ours": {"num_requests": 4, "output_token_throughput": 10.0, "itl_p90_s": 0.02},
                  "aiperf": None, "aiperf_ours_definitions": None,
                  "aiperf_error": "aiperf executable not found (x)", "aiperf_command": None}
            xc_path = os.path.join(d, "xc.json")
            write_json(xc_path, xc)
            out = report.write_report([ab_path, xc_path], os.path.join(d, "rep", "r.md"), "T")
            md = open(out).read()
            self.assertIn("aggregate output tok/s", md)
            self.assertIn("aiperf executable not found", md)
            self.assertIn("kda_prefill", md)
            self.assertEqual(load_json(ab_path)["kind"], "abbench")
            for name in ("throughput", "ttft", "itl"):
                png = os.path.join(d, "rep", f"r-{name}.png")
                self.assertGreater(os.path.getsize(png), 2000, png)
                self.assertIn(f"(r-{name}.png)", md)
            self.assertFalse(os.path.exists(os.path.join(d, "rep", "r-interactivity.png")))  # no sweep given


class TestAIPerfParsing(unittest.TestCase):
    def test_summary_units(self):
        s = aiperf_check.parse_aiperf_summary({
            "request_count": {"avg": 4.0}, "benchmark_duration": {"unit": "sec", "avg": 8.0},
            "output_token_throughput": {"avg": 12.5}, "time_to_first_token": {"unit": "ms", "p50": 250.0},
            "inter_token_latency": {"unit": "ms", "p90": 40.0}, "inter_chunk_latency": {"unit": "ms", "p99": 90.0},
            "error_summary": [],
        })
        self.assertEqual((s["num_requests"], s["duration_s"], s["output_token_throughput"]), (4.0, 8.0, 12.5))
        self.assertAlmostEqual(s["ttft_p50_s"], 0.25)
        self.assertAlmostEqual(s["itl_aiperf_p90_s"], 0.04)
        self.assertAlmostEqual(s["inter_chunk_p99_s"], 0.09)
        self.assertEqual(s["num_errors"], 0)

    def test_records_resummarised_with_our_definitions(self):
        def rec(ttft, lat, osl, icl):
            return {"metrics": {"time_to_first_token": {"value": ttft}, "request_latency": {"value": lat},
                                "output_sequence_length": {"value": osl}, "inter_chunk_latency": {"value": icl}}}
        # B: 6 tokens but 5 content chunks (one empty-text chunk merged into the next gap)
        r = aiperf_check.resummarize_aiperf_records([rec(100, 400, 4, [50, 100, 150]),
                                                     rec(200, 1200, 6, [200, 250, 300, 450])])
        self.assertEqual(r["num_records"], 2)
        self.assertAlmostEqual(r["ttft_p50_s"], 0.15)
        # pooled gaps sorted [.05 .1 .15 .2 .25 .3 .45]: P50 = .2; P90 at rank 5.4 -> .3 + .4 * .15
        self.assertAlmostEqual(r["itl_p50_s"], 0.2)
        self.assertAlmostEqual(r["itl_p90_s"], 0.36)
        self.assertAlmostEqual(r["interactivity_p90_tok_s_user"], 1 / 0.36)
        # TPOT (latency - TTFT) / (tokens - 1): 0.3/3 = .1 and 1.0/5 = .2 -> P50 .15
        self.assertAlmostEqual(r["tpot_p50_s"], 0.15)
        self.assertAlmostEqual(r["chunks_per_request_mean"], 4.5)
        self.assertAlmostEqual(r["output_tokens_per_request_mean"], 5.0)

    def test_cache_flush_and_missing_aiperf_are_recorded(self):
        with tempfile.TemporaryDirectory() as d, ScriptedServer([(0.002, 2)]) as srv:
            trace = os.path.join(d, "t.jsonl")
            with open(trace, "w") as f:
                f.writelines(json.dumps({"timestamp": i, "input_length": 8, "output_length": 4,
                                         "hash_ids": [i]}) + "\n" for i in range(3))
            argv = ["--base-url", srv.base_url, "--trace", trace, "--concurrency", "2",
                    "--aiperf-bin", os.path.join(d, "no-such-aiperf"), "--work-dir", d]
            doc = aiperf_check.run(aiperf_check.build_parser().parse_args(argv), ["x", *argv])
            flushes = srv.flushes
            paths = [a[1] for a in srv.arrivals]
        self.assertEqual(flushes, 1)  # before our phase; AIPerf never ran
        self.assertEqual(doc["cache_flush"], ["/flush_cache"])
        self.assertEqual(paths, ["/v1/completions"] * 3)  # our phase uses the OpenAI API, like AIPerf
        self.assertEqual(doc["ours"]["num_requests"], 3)
        self.assertEqual(doc["ours"]["output_tokens"], 12)
        self.assertIsNone(doc["aiperf"])
        self.assertIn("not found", doc["aiperf_error"])

    def test_server_log_phase_stats(self):
        import time

        lines = [
            "[2026-11-29 14:00:00] Decode batch, #running-req: 4, gen throughput (token/s): 100.00, #queue-req: 0",
            "[2026-11-29 14:00:05] Prefill batch, #new-seq: 1, #new-token: 30, #cached-token: 10, full token usage: 0",
            "[2026-11-29 14:00:06] Decode batch, #running-req: 4, gen throughput (token/s): 20.00, #queue-req: 0",
            "[2026-11-29 14:00:07] Decode batch, #running-req: 4, gen throughput (token/s): 40.00, #queue-req: 0",
            "[2026-11-29 14:00:30] Decode batch, #running-req: 4, gen throughput (token/s): 999.00, #queue-req: 0",
        ]
        t = time.mktime(time.strptime("2026-11-29 14:00:04", "%Y-%m-%d %H:%M:%S"))
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "s.log")
            with open(p, "w") as f:
                f.write("\n".join(lines))
            st = aiperf_check.server_log_phase_stats(p, t, t + 10)
        # only the lines from 14:00:04 to 14:00:14: median of 20 and 40
        self.assertEqual(st, {"decode_gen_throughput_p50_tok_s": 30.0, "decode_log_lines": 2,
                              "prefill_new_tokens": 30, "prefill_cached_tokens": 10})
        self.assertIsNone(aiperf_check.server_log_phase_stats(None, t, t + 10))

    def test_mooncake_slice_and_command(self):
        rows = [{"timestamp": 1500, "input_length": 1000, "output_length": 300, "hash_ids": [1, 2]},
                {"timestamp": 2500, "input_length": 600, "output_length": 10, "hash_ids": [1, 3]}]
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.jsonl")
            with open(trace, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            args = aiperf_check.build_parser().parse_args(
                ["--trace", trace, "--length-scale", "0.5", "--max-output-len", "64", "--concurrency", "3"])
            out = os.path.join(d, "slice.jsonl")
            b = aiperf_check.write_mooncake_slice(args, out)
            got = [json.loads(x) for x in open(out)]
            model = os.path.join(d, "tiny")
            os.makedirs(model)
            with open(os.path.join(model, "tokenizer.json"), "w") as f:
                f.write("{}")
            tok = aiperf_check.local_tokenizer_cache(model, os.path.join(d, "hf"))
            snap = os.path.join(d, "hf", "hub", "models--local--tiny", "snapshots", "0" * 40, "tokenizer.json")
            self.assertTrue(os.path.isfile(snap))
        self.assertEqual(b, 256)
        # L = round(1000 * .5) = 500 in blocks of 256 -> both ids; outputs (scale 1): 300 -> 64 (cap), 10
        self.assertEqual(got, [
            {"timestamp": 1500, "input_length": 500, "output_length": 64, "hash_ids": [1, 2]},
            {"timestamp": 2500, "input_length": 300, "output_length": 10, "hash_ids": [1, 3]},
        ])
        self.assertEqual(tok, "local/tiny")
        cmd = aiperf_check.aiperf_command("aiperf", args, "m", tok, "s.jsonl", b, 2, "art")
        for flag, val in (("--isl-block-size", "256"), ("--concurrency", "3"), ("--request-count", "2"),
                          ("--custom-dataset-type", "mooncake_trace"), ("--endpoint-type", "completions")):
            self.assertEqual(cmd[cmd.index(flag) + 1], val)
        self.assertIn("--no-fixed-schedule", cmd)
        self.assertIn("ignore_eos:true", cmd)
        self.assertNotIn("--request-rate", cmd)  # pure closed loop unless asked
        args.aiperf_request_rate = 50.0
        cmd = aiperf_check.aiperf_command("aiperf", args, "m", tok, "s.jsonl", b, 2, "art", ["--foo"])
        self.assertEqual(cmd[cmd.index("--request-rate") + 1], "50")
        self.assertEqual(cmd[cmd.index("--arrival-pattern") + 1], "constant")
        self.assertEqual(cmd[-1], "--foo")


if __name__ == "__main__":
    unittest.main()


class TestSuitePresetOverrides(unittest.TestCase):
    def test_a_given_setting_replaces_the_presets_value(self):
        """``make bench BENCH_ARGS="--ab-window 5 --sweep-concurrency 1,4"`` shortens the preset: the given
        values win, every other one stays the preset's."""
        from sglang_hybrid.bench import suite

        args = suite.build_parser().parse_args(["--model-path", "m", "--ab-window", "5",
                                                "--sweep-concurrency", "1,4", "--num-requests", "8"])
        got = suite.settings(args)
        want = dict(suite.PRESETS["cpu-short"], ab_window=5.0, sweep_concurrency="1,4", num_requests=8)
        self.assertEqual(got, want)
        full = suite.settings(suite.build_parser().parse_args(["--model-path", "m", "--preset", "full",
                                                               "--aiperf-request-rate", "2.5"]))
        self.assertEqual(full, dict(suite.PRESETS["full"], aiperf_request_rate=2.5))


class TestCachePlots(unittest.TestCase):
    def test_reuse_hand_computed_and_both_plots_written(self):
        """Reuse = cached / prompt tokens of successful rows (a failed row does not count); the report
        draws the cache-hit and reuse-over-time plots for sweep points and links them."""
        rows = [
            {"success": True, "input_len": 100, "prompt_tokens": 100, "cached_tokens": 0, "start_time": 0.0},
            {"success": True, "input_len": 100, "prompt_tokens": 100, "cached_tokens": 60, "start_time": 1.0},
            {"success": False, "input_len": 100, "prompt_tokens": None, "cached_tokens": 0, "start_time": 2.0},
            {"success": True, "input_len": 200, "prompt_tokens": 200, "cached_tokens": 140, "start_time": 3.0},
        ]
        self.assertAlmostEqual(report._reuse(rows), 200 / 400)
        self.assertIsNone(report._reuse([rows[2]]))
        sweep_doc = {"kind": "sweep", "points": [{"concurrency": 1, "requests": rows}]}
        with tempfile.TemporaryDirectory() as d:
            hits = report.plot_cache_hits([sweep_doc], [], os.path.join(d, "hits.png"))
            over = report.plot_reuse_over_time([sweep_doc], [], os.path.join(d, "over.png"))
            for p in (hits, over):
                self.assertTrue(p and os.path.getsize(p) > 1000, p)
            self.assertIsNone(report.plot_cache_hits([], [], os.path.join(d, "none.png")))
            self.assertFalse(os.path.exists(os.path.join(d, "none.png")))
