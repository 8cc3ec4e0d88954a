"""The workload-shape trace generator (issue 42) and the cache's never-below-upstream slice."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import unittest

from sglang_hybrid.bench.trace_gen import BLOCK, TraceShape, describe, generate, load_shapes, main, write_jsonl
from sglang_hybrid.mem_cache.trace_replay import ModelBytes, ReplayConfig, load_trace, perfect_reuse_tokens, replay

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHAPES = os.path.join(REPO, "benchmark", "cache", "shapes.json")
GB = 1_000_000_000


class TestTraceGenerator(unittest.TestCase):
    def test_mooncake_format_and_block_count(self):
        recs = generate(TraceShape("t", sessions=20, turns=(1, 3), seed=3))
        self.assertTrue(recs)
        for r in recs:
            self.assertEqual(set(r), {"timestamp", "input_length", "output_length", "hash_ids"})
            self.assertEqual(len(r["hash_ids"]), -(-r["input_length"] // BLOCK))
            self.assertGreaterEqual(r["output_length"], 1)
        ts = [r["timestamp"] for r in recs]
        self.assertEqual(ts, sorted(ts))

    def test_deterministic_in_the_seed(self):
        s = TraceShape("t", sessions=15, turns=(2, 4), branch_prob=0.5, seed=7)
        self.assertEqual(generate(s), generate(s))
        self.assertNotEqual(generate(s), generate(dataclasses.replace(s, seed=8)))

    def test_exact_lengths_with_zero_sigma(self):
        s = TraceShape("t", sessions=3, turns=(3, 3), system_prompts=1, system_len=(1024, 0), first_len=(512, 0),
                       growth=(1024, 0), output_len=(10, 0), think_ms=0, seed=1)
        recs = generate(s)
        self.assertEqual(sorted(r["input_length"] for r in recs), [1536] * 3 + [2560] * 3 + [3584] * 3)
        by_session = {}
        for r in recs:
            by_session.setdefault(r["hash_ids"][2], []).append(r)  # block 2 = the session's first message
        self.assertEqual(len(by_session), 3)
        heads = {tuple(r["hash_ids"][:2]) for r in recs}
        self.assertEqual(len(heads), 1)  # one shared system prompt: identical first two blocks
        for turns in by_session.values():
            turns.sort(key=lambda r: r["input_length"])
            for a, b in zip(turns, turns[1:]):
                self.assertEqual(b["hash_ids"][: len(a["hash_ids"])], a["hash_ids"])  # each turn extends the last

    def test_chained_ids_same_content_other_prefix_differs(self):
        s = TraceShape("t", sessions=40, turns=(1, 1), system_prompts=2, system_len=(1024, 0), first_len=(512, 0), seed=2)
        recs = generate(s)
        firsts = {r["hash_ids"][0] for r in recs}
        self.assertEqual(len(firsts), 2)
        third = [r["hash_ids"][2] for r in recs]
        self.assertEqual(len(set(third)), len(third))  # every session's message is its own block

    def test_branches_share_the_fork_prefix(self):
        s = TraceShape("t", sessions=1, turns=(6, 6), system_prompts=0, first_len=(1024, 0), growth=(512, 0),
                       branch_prob=1.0, branch_factor=3, think_ms=0, seed=4)
        recs = generate(s)
        self.assertEqual(len(recs), 1 + 5 * 3)
        # siblings of one fork have equal lengths and share every block but their last
        from collections import Counter

        groups = Counter((r["input_length"], tuple(r["hash_ids"][:-1])) for r in recs[1:])
        self.assertTrue(any(c >= 3 for c in groups.values()), groups)

    def test_perfect_reuse_tracks_the_shape(self):
        agentic = describe(generate(TraceShape("a", sessions=5, turns=(20, 20), first_len=(2000, 0.3),
                                               growth=(300, 0.3), seed=1)))
        unique = describe(generate(TraceShape("u", sessions=60, turns=(1, 1), system_prompts=0,
                                              first_len=(4000, 0.3), seed=1)))
        self.assertGreater(agentic["perfect_reuse_pct"], 90.0)
        self.assertEqual(unique["perfect_reuse_pct"], 0.0)

    def test_bad_shapes_raise(self):
        with self.assertRaisesRegex(ValueError, "turns"):
            TraceShape("x", turns=(3, 1)).validate()
        with self.assertRaisesRegex(ValueError, "branch_prob"):
            TraceShape("x", branch_prob=1.5).validate()
        with self.assertRaisesRegex(ValueError, "arrival"):
            TraceShape("x", arrival="weekly").validate()
        with self.assertRaisesRegex(ValueError, "growth"):
            TraceShape("x", growth=(0, 1)).validate()
        with self.assertRaisesRegex(ValueError, "unknown trace-shape field"):
            TraceShape.from_dict({"name": "x", "sesions": 3})

    def test_committed_matrix(self):
        shapes = load_shapes(SHAPES)
        self.assertGreaterEqual(len(shapes), 12)
        self.assertEqual(len({s.name for s in shapes}), len(shapes))
        self.assertTrue(any(s.branch_prob > 0 for s in shapes))
        self.assertTrue(any(s.arrival == "burst" for s in shapes))

    def test_cli_writes_a_replayable_trace(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.jsonl")
            self.assertEqual(main(["--shape", f"{SHAPES}:few-shot-single-turn", "--out", out]), 0)
            recs = load_trace(out)
            self.assertEqual(recs, json.loads(json.dumps(generate(load_shapes(SHAPES)[3]))))
            with self.assertRaisesRegex(ValueError, "no shape named"):
                main(["--shape", f"{SHAPES}:nope"])


class TestNeverBelowUpstream(unittest.TestCase):
    """Issue 42's fast slice: ours >= upstream on three contrasting generated shapes (long shared
    prefixes seen a few times each; chat with short prefixes; agentic tree search), TP8 and DCP8,
    budgets scaled to the slice so the caches are under pressure. Before eviction by value per
    byte, ours lost on 8 of these 12 cells (down to 0.34x)."""

    CASES = (("many-long-prefixes", 150), ("chat-short-prefix", 250), ("agentic-branchy", 10))

    def test_ours_at_least_upstream(self):
        shapes = {s.name: s for s in load_shapes(SHAPES)}
        for name, sessions in self.CASES:
            recs = generate(dataclasses.replace(shapes[name], sessions=sessions))
            perfect, total = perfect_reuse_tokens(recs)
            for layout in ("tp8", "dcp8"):
                model = ModelBytes() if layout == "tp8" else ModelBytes().dcp(8)
                for gb in (3, 8):
                    with self.subTest(shape=name, layout=layout, gb=gb):
                        up = replay(ReplayConfig("upstream", gb * GB, model=model, stride=512), recs)
                        ours = replay(ReplayConfig("hybrid", gb * GB, model=model, stride=512), recs)
                        self.assertGreaterEqual(ours.reused_tokens, up.reused_tokens)
                        self.assertLessEqual(ours.reused_tokens, perfect)
                        self.assertGreater(up.reused_tokens, 0)


class TestMatrixCommand(unittest.TestCase):
    """``benchmark/cache/replay_cache.py --matrix`` on a one-shape matrix file: cells, ratios, summary."""

    def test_matrix_cli(self):
        import importlib.util

        spec = importlib.util.spec_from_file_location("replay_cache", os.path.join(REPO, "benchmark", "cache", "replay_cache.py"))
        mod = importlib.util.module_from_spec(spec)
        import sys

        sys.modules["replay_cache"] = mod  # its worker processes look the cell function up by module name
        spec.loader.exec_module(mod)
        with tempfile.TemporaryDirectory() as d:
            shapes = os.path.join(d, "shapes.json")
            with open(shapes, "w") as f:
                json.dump({"shapes": [{"name": "tiny", "sessions": 40, "turns": [1, 3], "system_len": [3000, 0],
                                       "first_len": [600, 0.5], "seed": 5}]}, f)
            out = os.path.join(d, "m.json")
            rc = mod.main(["--matrix", "--shapes", shapes, "--only", "tiny", "--device-gb", "0.5,inf",
                           "--layouts", "tp8,dcp8", "--out", out])
            self.assertEqual(rc, 0)
            with open(out) as f:
                res = json.load(f)
        cells = res["cells"]
        self.assertEqual([(c["layout"], c["device_budget_gb"]) for c in cells],
                         [("tp8", 0.5), ("tp8", None), ("dcp8", 0.5)])
        for c in cells:
            self.assertAlmostEqual(c["ratio"], c["hybrid"]["reuse_pct"] / c["upstream"]["reuse_pct"], places=3)
        worst = min(cells, key=lambda c: c["ratio"])
        self.assertEqual(res["summary"]["worst_cell"]["ratio"], worst["ratio"])
        self.assertAlmostEqual(res["summary"]["mean_ratio"], sum(c["ratio"] for c in cells) / 3, places=3)
        unb = cells[1]
        self.assertAlmostEqual(res["summary"]["max_unbounded_gap_pct"],
                               unb["perfect_reuse_pct"] - unb["hybrid"]["reuse_pct"], places=3)
        self.assertLessEqual(res["summary"]["max_unbounded_gap_pct"], 0.1)
        with self.assertRaises(SystemExit):
            mod.main(["--matrix", "--shapes", SHAPES, "--only", "no-such-shape"])
