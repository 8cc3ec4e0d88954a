"""Multi-turn prefix reuse, with upstream's own cache-hit kit, on the ``no_buffer`` strategy.

Upstream's ``no_buffer`` strategy keeps a recurrent state where a request ended,
so a multi-turn continuation resumes at ``previous prompt + output - 1``: what
``sglang.test.kits.cache_hit_kit.run_multiturn_cache_hit_test`` demands (page
size 1). The default ``extra_buffer`` strategy checkpoints on the chunk grid
instead and is covered by test_kimi_k3_server.py.
"""

from __future__ import annotations

import json
import os
import tempfile
import unittest

from sglang.test.kits.cache_hit_kit import run_multiturn_cache_hit_test
from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from sglang_hybrid.tools.tokenizer import corpus_text
from tiny_model import tiny_kimi_k3


def sharegpt_file(path: str) -> str:
    """A ShareGPT-format dataset built from the repository's tokenizer corpus (no download)."""
    paras = [p for p in corpus_text().split("\n") if len(p) > 200]
    convs = [
        {"conversations": [{"from": "human", "value": a}, {"from": "gpt", "value": b}]}
        for a, b in zip(paras, paras[1:] + paras[:1])
    ]
    with open(path, "w") as f:
        json.dump(convs * 4, f)
    return path


class TestKimiK3MultiTurnCacheNoBuffer(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dataset = sharegpt_file(os.path.join(cls.tmp.name, "sharegpt.json"))
        args = cpu_server_args() + ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"]
        cls.server = LaunchedServer(cls.model, args).start()
        cls.base_url = cls.server.base_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def test_upstream_multiturn_cache_hit_kit(self):
        result = run_multiturn_cache_hit_test(
            self.base_url,
            self.model,
            num_clients=4,
            num_rounds=3,
            request_length=96,
            output_length=16,
            dataset_path=self.dataset,
            max_parallel=4,
        )
        # The kit asserts every request's cached_tokens >= its previous prompt + output - 1.
        self.assertEqual(result["rounds"]["round_0"]["total_cached_tokens"], 0)
        self.assertGreater(result["rounds"]["round_2"]["cache_hit_rate"], 0.5)


if __name__ == "__main__":
    unittest.main()
