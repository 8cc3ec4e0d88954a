"""The GPU system benchmark's arithmetic (benchmark/gpu/system_bench.py; CPU only, no server):
reuse over time, ratios against upstream at equal concurrency and equal interactivity, the
K3 TP8 share's config, and the variant list."""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "gpu"))

import k3_share  # noqa: E402
import system_bench  # noqa: E402


def _point(c, interactivity, tok_s):
    return {"concurrency": c, "derived": {"interactivity_p90_tok_s_user": interactivity, "total_tok_s_per_gpu": tok_s}}


def _variant(ab, curve):
    return {"abbench": {"windows": [{"summary": {"concurrency": c, "output_token_throughput": t}} for c, t in ab]},
            "sweeps": {"mooncake": {"points": [_point(*p) for p in curve]}}}


class TestReuseOverTime(unittest.TestCase):
    def test_bins_count_successful_requests_by_start_time(self):
        rows = [
            {"success": True, "start_time": 0.1, "cached_tokens": 0, "input_len": 100},
            {"success": True, "start_time": 1.9, "cached_tokens": 50, "input_len": 100},
            {"success": True, "start_time": 2.0, "cached_tokens": 90, "input_len": 100},
            {"success": False, "start_time": 2.5, "cached_tokens": 0, "input_len": 1000},  # failed: not counted
            {"success": True, "start_time": 7.0, "cached_tokens": 30, "input_len": 40},
        ]
        bins = system_bench.reuse_over_time(rows, 2.0)
        self.assertEqual([b["t_s"] for b in bins], [0.0, 2.0, 6.0])
        self.assertEqual([b["requests"] for b in bins], [2, 1, 1])
        self.assertAlmostEqual(bins[0]["reuse"], 50 / 200)
        self.assertAlmostEqual(bins[1]["reuse"], 0.9)
        self.assertAlmostEqual(bins[2]["reuse"], 0.75)


class TestCompare(unittest.TestCase):
    def test_ratios_at_equal_concurrency_and_interactivity(self):
        base = _variant([(1, 100.0), (8, 400.0)], [(8, 100.0, 1000.0), (32, 40.0, 2200.0)])
        ours = _variant([(1, 130.0), (8, 400.0)], [(8, 120.0, 1100.0), (32, 60.0, 2600.0)])
        r = system_bench.compare(base, ours, target=50.0)
        self.assertEqual(r["abbench_output_tok_s"], {"1": 1.3, "8": 1.0})
        m = r["sweeps"]["mooncake"]
        self.assertEqual(m["tok_s_per_gpu_by_concurrency"], {"8": 1.1, "32": round(2600 / 2200, 3)})
        at50, loaded = m["at_equal_interactivity"]
        # base at 50 tok/s/user: between (40, 2200) and (100, 1000) -> 2200 - 1200 * 10/60 = 2000
        self.assertAlmostEqual(at50["base_tok_s_per_gpu"], 2000.0)
        # ours at 50: below its lowest measured interactivity (60) -> no extrapolation
        self.assertIsNone(at50["tok_s_per_gpu"])
        self.assertIsNone(at50["ratio"])
        # upstream's most loaded point (40 tok/s/user) is outside ours too
        self.assertEqual(loaded["interactivity_tok_s_user"], 40.0)
        self.assertIsNone(loaded["ratio"])

    def test_interpolated_ratio_when_both_curves_reach_the_target(self):
        base = _variant([], [(8, 100.0, 1000.0), (32, 40.0, 2200.0)])
        ours = _variant([], [(8, 110.0, 1200.0), (32, 30.0, 3000.0)])
        at50 = system_bench.compare(base, ours, target=50.0)["sweeps"]["mooncake"]["at_equal_interactivity"][0]
        # ours at 50: between (30, 3000) and (110, 1200) -> 3000 - 1800 * 20/80 = 2550
        self.assertAlmostEqual(at50["tok_s_per_gpu"], 2550.0)
        self.assertAlmostEqual(at50["ratio"], round(2550 / 2000, 3))


class TestShareAndVariants(unittest.TestCase):
    def test_k3_tp8_share_config(self):
        cfg = k3_share.k3_share_config(1000, 1, 2, experts=112, top_k=2, moe_inter=2048, layers=8)
        self.assertEqual(cfg["hidden_size"], 7168)
        self.assertEqual(cfg["intermediate_size"], 18432 // 8)
        self.assertEqual((cfg["num_experts"], cfg["num_experts_per_token"]), (112, 2))
        self.assertEqual(cfg["linear_attn_config"]["full_attn_layers"], [4, 8])
        self.assertEqual(cfg["linear_attn_config"]["kda_layers"], [1, 2, 3, 5, 6, 7])

    def test_variants_differ_only_in_kernels_and_cache(self):
        up_flags, up_env, _ = system_bench.VARIANTS["upstream"]
        self.assertIn("--radix-cache-backend", up_flags)
        self.assertEqual(up_env["SGLANG_HYBRID_UPSTREAM_OPS"], system_bench.ALL_UPSTREAM)
        ours_flags, ours_env, _ = system_bench.VARIANTS["ours"]
        self.assertNotIn("--radix-cache-backend", ours_flags)
        self.assertEqual(ours_env, {})
        self.assertEqual(system_bench.VARIANTS["ours_kernels"][0][:4], system_bench.OUR_KERNELS)
        self.assertEqual(system_bench.VARIANTS["ours_cache"][1], up_env)

    def test_unknown_variant_is_refused(self):
        with self.assertRaises(SystemExit) as cm:
            system_bench.main(["--out", os.devnull, "--variants", "ours,fastest"])
        self.assertIn("fastest", str(cm.exception))


if __name__ == "__main__":
    unittest.main()


class TestServingCompiles(unittest.TestCase):
    def test_compile_lines_are_attributed_to_the_phase_they_fell_in(self):
        import tempfile
        import time as _t

        def stamp(t):
            return _t.strftime("%Y-%m-%d %H:%M:%S", _t.localtime(t))

        t0 = 1_800_000_000.0  # whole seconds, local time in the log as upstream writes it
        lines = [
            f"[{stamp(t0 - 30)}] Triton kernel 'a' took 5.13 s to compile after serving started. Serving-time ...",
            f"[{stamp(t0 + 5)}] some other line",
            f"[{stamp(t0 + 12)}] Triton kernel 'chunk_state_kernel' took 1.29 s to compile after serving started. x",
            f"\0\0[{stamp(t0 + 40)}] Triton kernel 'b' took 7.59 s to compile after serving started. x",
            f"[{stamp(t0 + 70)}] Triton kernel 'c' took 2.00 s to compile after serving started. x",
        ]
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write("\n".join(lines))
        phases = [("prime", t0, t0 + 20), ("abbench", t0 + 30, t0 + 50), ("sweep-mooncake", t0 + 60, t0 + 65)]
        got = system_bench.serving_compiles(f.name, phases)
        os.unlink(f.name)
        self.assertEqual([(c["kernel"], c["s"], c["phase"]) for c in got],
                         [("a", 5.13, "boot"), ("chunk_state_kernel", 1.29, "prime"), ("b", 7.59, "abbench"),
                          ("c", 2.0, "between")])

    def test_missing_log_gives_no_compiles(self):
        self.assertEqual(system_bench.serving_compiles("/nonexistent/server.log", []), [])


class TestRequestsPerStream(unittest.TestCase):
    def test_points_replay_at_least_n_requests_per_stream(self):
        from sglang_hybrid.bench.sweep import requests_at

        self.assertEqual(requests_at(96, 8, 64), 512)
        self.assertEqual(requests_at(96, 8, 8), 96)  # the fixed count is the floor
        self.assertEqual(requests_at(96, 0, 64), 96)  # off
        self.assertIsNone(requests_at(None, 8, 64))  # the whole trace already
        with self.assertRaises(ValueError):
            requests_at(96, -1, 8)


class TestRepeatedVariants(unittest.TestCase):
    def test_repeats_get_numbered_keys(self):
        self.assertEqual(system_bench.run_keys(["upstream", "ours", "upstream"], {}), ["upstream", "ours", "upstream#2"])
        # a merged result already holds upstream and ours: this run's are repeats
        self.assertEqual(system_bench.run_keys(["ours", "upstream"], {"upstream": {}, "ours": {}}),
                         ["ours#2", "upstream#2"])

    def test_baseline_repeat_is_its_drift(self):
        base = _variant([(1, 100.0)], [(8, 60.0, 1000.0), (64, 40.0, 3000.0)])
        again = _variant([(1, 90.0)], [(8, 60.0, 1000.0), (64, 40.0, 2700.0)])
        r = system_bench.compare(base, again, 50.0)
        self.assertEqual(r["abbench_output_tok_s"], {"1": 0.9})
        self.assertEqual(r["sweeps"]["mooncake"]["tok_s_per_gpu_by_concurrency"], {"8": 1.0, "64": 0.9})


class TestServerArgs(unittest.TestCase):
    def test_every_variant_gets_the_same_pools(self):
        args = system_bench.build_parser().parse_args(["--out", "x.json"])
        shared = None
        for name, (flags, _, _) in system_bench.VARIANTS.items():
            out = system_bench.server_args_for(args, flags, 64)
            i, j = out.index("--max-total-tokens"), out.index("--max-mamba-cache-size")
            self.assertEqual((out[i + 1], out[j + 1]), ("131072", "512"), name)
            common = out[: len(out) - len(flags)]
            shared = shared or common
            self.assertEqual(common, shared, name)  # only the variant's own flags differ
            self.assertEqual(out[len(out) - len(flags):], list(flags))
        args = system_bench.build_parser().parse_args(["--out", "x.json", "--max-total-tokens", "0",
                                                       "--max-mamba-cache-size", "0"])
        out = system_bench.server_args_for(args, [], 64)
        self.assertNotIn("--max-total-tokens", out)
        self.assertNotIn("--max-mamba-cache-size", out)
