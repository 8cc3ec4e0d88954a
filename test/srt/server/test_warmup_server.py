"""``--warmups sglang_hybrid`` through the real server (issue 40, item 6: the first request paid the
chunked-prefill kernels' compilation). The warm-up runs in upstream's start-up before the server is
healthy, sends a two-chunk prompt, its extension and a batch, then flushes the cache: the same
prompts afterwards start cold, and the cache works again from there."""

from __future__ import annotations

import re
import unittest

import requests

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from sglang_hybrid.entrypoints.warmup import warmup_lengths, warmup_prompts
from tiny_model import tiny_kimi_k3, tiny_qwen38_agreeing_mtp

CHUNK = 128
CONTEXT = 4096
TINY_VOCAB = 965  # tiny_kimi_k3's vocab_size: the warm-up draws its ids below it


def _cached(base_url, input_ids):
    r = requests.post(base_url + "/generate", json={"input_ids": input_ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": 2}}, timeout=300)
    r.raise_for_status()
    return r.json()["meta_info"]["cached_tokens"]


class TestHybridWarmupServer(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        args = cpu_server_args(max_total_tokens=8192) + [
            "--chunked-prefill-size", str(CHUNK), "--context-length", str(CONTEXT), "--warmups", "sglang_hybrid"]
        with LaunchedServer(cls.model, args) as s:
            with open(s.log_path, errors="replace") as f:
                cls.start_log = f.read()
            cls.prompts = warmup_prompts(CHUNK, CONTEXT, TINY_VOCAB)
            cls.first = _cached(s.base_url, cls.prompts[1])
            cls.again = _cached(s.base_url, cls.prompts[1])

    def test_warmup_ran_before_ready_and_flushed(self):
        long_len, resumed_len = warmup_lengths(CHUNK, CONTEXT)
        self.assertEqual((long_len, resumed_len), (2 * CHUNK + 37, 2 * CHUNK + 66))
        m = re.search(rf"sglang-hybrid warm-up: prompts of {long_len} \(chunk {CHUNK}\) and {resumed_len} tokens, "
                      r"a batch of 4, in [0-9.]+ s; cache flushed: True", self.start_log)
        self.assertIsNotNone(m, self.start_log[-3000:])
        self.assertIn("Running warmup sglang_hybrid", self.start_log)

    def test_warmup_prompts_start_cold_then_hit(self):
        self.assertEqual(self.first, 0)  # the warm-up's own prompt: flushed, nothing cached
        self.assertGreater(self.again, 0)  # the cache works after the flush


class TestHybridWarmupSmallPool(CustomTestCase):
    """The GPU suite's pool on Qwen3.8 (1,600 KV tokens, page 64 from compressed QSA): the warm-up
    once sized its prompt by the admissible prompt length alone (1,549 tokens), which upstream's
    admission never schedules, and the server never became healthy."""

    @classmethod
    def setUpClass(cls):
        args = cpu_server_args(max_total_tokens=1600, max_mamba_cache_size=16) + [
            "--context-length", str(CONTEXT), "--max-running-requests", "8", "--warmups", "sglang_hybrid"]
        with LaunchedServer(tiny_qwen38_agreeing_mtp(), args, timeout=300) as s:
            with open(s.log_path, errors="replace") as f:
                cls.start_log = f.read()
            cls.short = _cached(s.base_url, list(range(10, 40)))
            # the warm-up's old prompt length: upstream would queue it forever (pool 1,600, page 64)
            cls.too_long = requests.post(s.base_url + "/generate", json={
                "input_ids": [10 + i % 800 for i in range(1549)],
                "sampling_params": {"temperature": 0, "max_new_tokens": 4}}, timeout=60)
            longer = [10 + i % 700 for i in range(150)]  # over one 64-token page: cacheable
            cls.after = (_cached(s.base_url, longer), _cached(s.base_url, longer))

    def test_warmup_completed_within_the_pool(self):
        m = re.search(r"sglang-hybrid warm-up: prompts of (\d+) \(chunk \d+\) and (\d+) tokens, a batch of 4, "
                      r"in [0-9.]+ s; cache flushed: True$", self.start_log, re.M)
        self.assertIsNotNone(m, self.start_log[-3000:])
        # at most half the largest admissible prompt (1600 - 6 tokens)
        self.assertLessEqual(int(m.group(2)), (1600 - 6) // 2)
        self.assertEqual(self.short, 0)

    def test_request_the_pool_can_never_admit_is_refused(self):
        self.assertEqual(self.too_long.status_code, 400, self.too_long.text)
        self.assertIn("the KV pool holds 1600 tokens", self.too_long.text)
        self.assertEqual(self.after[0], 0)  # still serving, and the cache still works
        self.assertGreater(self.after[1], 0)


if __name__ == "__main__":
    unittest.main()
