"""The replay client against the real server on the tiny Kimi K3 (CPU)."""

from __future__ import annotations

import json
import os
import tempfile
import unittest

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench import replay
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from sglang_hybrid.bench.trace import DEFAULT_TRACE_PATH, load_trace
from tiny_model import tiny_kimi_k3

N, SCALE, OUT = 12, 0.05, 6


class TestReplayAgainstServer(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.json_path = os.path.join(cls.tmp.name, "replay.json")
        with LaunchedServer(cls.model, cpu_server_args()) as server:
            cls.summary = replay.main([
                "--base-url", server.base_url, "--model-path", cls.model, "--num-requests", str(N),
                "--length-scale", str(SCALE), "--max-output-len", str(OUT), "--concurrency", "1", "--no-progress",
                "--output-json", cls.json_path,
            ])
        with open(cls.json_path) as f:
            cls.result = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_request_served_with_requested_length(self):
        rows = self.result["requests"]
        self.assertEqual(len(rows), N)
        self.assertEqual(self.summary["num_errors"], 0)
        for row in rows:
            self.assertTrue(row["success"], row.get("error"))
            self.assertEqual(row["output_tokens"], row["output_len"])
            self.assertEqual(row["prompt_tokens"], row["input_len"])
            self.assertGreater(row["ttft"], 0)

    def test_cached_tokens_never_exceed_what_the_trace_shares(self):
        """Per request, a cache can reuse at most the blocks earlier requests sent (concurrency 1)."""
        block = max(1, round(512 * SCALE))
        seen = set()
        for rec, row in zip(load_trace(DEFAULT_TRACE_PATH, N), self.result["requests"]):
            L = row["input_len"]
            ids = rec.hash_ids[: -(-L // block)]
            k = 0
            while k < len(ids) and ids[k] in seen:
                k += 1
            self.assertLessEqual(row["cached_tokens"], min(k * block, L - 1), row)
            seen.update(ids)
        self.assertLessEqual(self.summary["achieved_reuse"], self.summary["theoretical_reuse"])

    def test_manifest_records_the_server(self):
        manifest = self.result["manifest"]
        self.assertEqual(manifest["server_info"]["model_path"], self.model)
        self.assertIsNotNone(manifest["model_config_sha256"])


if __name__ == "__main__":
    unittest.main()
