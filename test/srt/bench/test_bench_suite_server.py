"""abbench against the real server on the tiny Kimi K3 (CPU), both APIs, short windows."""

from __future__ import annotations

import os
import tempfile
import unittest

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench import abbench
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_kimi_k3

OUT = 12  # tokens per request


class TestAbbenchAgainstServer(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.log = os.path.join(cls.tmp.name, "server.log")
        cls.docs = {}
        with LaunchedServer(cls.model, cpu_server_args(), log_path=cls.log) as server:
            for api in ("openai", "sglang"):
                argv = ["--base-url", server.base_url, "--api", api, "--model-path", cls.model,
                        "--concurrency", "1,2", "--window", "1.5", "--output-len", str(OUT),
                        "--input-len", "24", "--warmup", "1", "--server-log", cls.log]
                cls.docs[api] = abbench.run(abbench.build_parser().parse_args(argv), ["abbench", *argv])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_request_returns_exactly_the_requested_tokens(self):
        for api, source in (("openai", "token_ids"), ("sglang", "completion_tokens")):
            doc = self.docs[api]
            for w in doc["windows"]:
                rows = w["requests"]
                self.assertGreaterEqual(len(rows), w["summary"]["concurrency"])
                for r in rows:
                    self.assertTrue(r["success"], r["error"])
                    self.assertEqual(r["output_tokens"], OUT)
                    self.assertEqual(sum(r["chunk_tokens"]), OUT)
                    self.assertEqual(r["token_count_source"], source)
                    self.assertEqual(r["prompt_tokens"], 24)
                    self.assertLess(r["start_time"], 1.5)
                s = w["summary"]
                self.assertAlmostEqual(s["output_token_throughput"], OUT * len(rows) / s["wall_time_s"])
            if api == "openai":
                self.assertEqual({r["usage_completion_tokens"] for w in doc["windows"] for r in w["requests"]}, {OUT})

    def test_manifest_has_server_flags_and_kernel_paths(self):
        m = self.docs["openai"]["manifest"]
        self.assertEqual(m["server_info"]["model_path"], self.model)
        self.assertEqual(m["server_info"]["device"], "cpu")
        self.assertIsNotNone(m["model_config_sha256"])
        ops = {row["op"]: row["impl"] for row in m["kernel_paths"]["table"]}
        self.assertEqual(ops.get("kda_decode"), "torch")
        self.assertIsNone(m["request_stats"]["draft_acceptance"])  # no speculative decoding here


if __name__ == "__main__":
    unittest.main()
