"""The host and store tiers with the tiny Qwen3.8-Flash-Next (issue 45): its KV pool's host copy
(compressed QSA pages with index keys) is not a list of row tensors, which the host tier cannot split
into pages. Before this test the first eviction to the host tier killed the scheduler (TypeError in
``torch.cat``); now the tier turns itself off with one warning, the server keeps serving with
cold-equal tokens, and a second instance on the same store finds nothing to resume (no entry was
written). Supporting this pool in the tiers is not done."""

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

    def test_unsupported_kv_pool_turns_the_tiers_off_and_serving_goes_on(self):
        self.assertIn("hybrid cache: host tier turned off:", self.log_a)
        self.assertNotIn("Scheduler hit an exception", self.log_a)
        self.assertEqual(len(self.floods), len(FLOODS))
        self.assertEqual(self.again[0], self.cold[0])
        out, cached, details = self.from_store
        self.assertEqual(out, self.cold[0])
        self.assertEqual(int(details.get("storage", 0)), 0)


if __name__ == "__main__":
    unittest.main()
