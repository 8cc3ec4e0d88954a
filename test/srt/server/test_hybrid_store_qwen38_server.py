"""The host and store tiers with the tiny Qwen3.8-Flash-Next (issue 45): its KV pool is upstream's QSA
pool, full K / V rows per token slot plus compressed indexer keys at one row per ``ratio`` slots. The
host tier copies both with each page (before, its host copy went through upstream's ``get_cpu_copy``,
whose per-layer K / V pairs the tier could not split into pages, and the tiers were turned off): a
prompt pushed out of the device by a flood resumes from the host with the cold tokens, and a second
instance on the same store resumes it from the store with the same tokens."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from test_hybrid_store_server import gen, ids, store_args
from tiny_model import tiny_qwen38

ARGS = cpu_server_args(max_total_tokens=2048, max_mamba_cache_size=16) + [
    "--chunked-prefill-size", "256", "--hybrid-host-cache-gb", "0.05"]
PROMPT = ids(16, 330)
FLOODS = [ids(60 + i, 300) for i in range(8)]


class TestHybridTiersQwen38(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_qwen38()
        cls.tmp = tempfile.mkdtemp(prefix="sglang-hybrid-store-qwen-")
        store = os.path.join(cls.tmp, "store")
        with LaunchedServer(cls.model, ARGS + store_args(cls.tmp, store)) as a:
            cls.cold = gen(a.base_url, PROMPT)
            cls.floods = [gen(a.base_url, p, n=2) for p in FLOODS]
            cls.again = gen(a.base_url, PROMPT)
            with open(a.log_path, errors="replace") as f:
                cls.log_a = f.read()
        with LaunchedServer(cls.model, ARGS + store_args(cls.tmp, store)) as b:
            cls.from_store = gen(b.base_url, PROMPT)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_host_tier_restore_equals_cold(self):
        self.assertNotIn("host tier turned off", self.log_a)
        self.assertNotIn("Scheduler hit an exception", self.log_a)
        self.assertEqual(self.cold[1], 0)
        out, cached, details = self.again
        self.assertGreater(int(details.get("host", 0)), 0, f"not restored from the host tier: {details}")
        self.assertEqual(out, self.cold[0])

    def test_second_instance_resumes_from_the_store(self):
        out, cached, details = self.from_store
        self.assertGreater(int(details.get("storage", 0)), 0, f"not resumed from the store: {details}")
        self.assertEqual(out, self.cold[0])


if __name__ == "__main__":
    unittest.main()
