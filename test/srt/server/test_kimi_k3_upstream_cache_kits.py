"""Upstream's multi-turn cache kit against our hybrid radix cache, on a vocabulary-padded tiny Kimi K3.

``sglang.test.kits.unified_radix_cache_kit.UnifiedRadixTreeTestMixin`` sends
random token ids up to 30,000, so the server serves the tiny Kimi K3 with its
vocabulary padded to 32,000 (``make_tiny_model --vocab-size``; embedding and
LM-head rows, the 965-token tokenizer unchanged). Default flags, i.e. our
``HybridRadixCache`` on upstream's ``extra_buffer`` strategy: a prefill hit
resumes on the chunk grid (64), what ``make_mamba_prefill_assert(64)`` allows.
Each kit test checks, besides its cache hits, that the decode logprobs of the
last turn match a cold-cache prefill replay (KL < 0.003).

``radix_cache_server_kit.run_radix_attention_test`` is not run here: its 400
requests (~280k prompt tokens, up to 256 new tokens each) take far beyond this
file's time budget on a CPU (docs/upstream-test-kits.md).
"""

from __future__ import annotations

import os
import random
import unittest

import requests

from sglang.test.kits.unified_radix_cache_kit import UnifiedRadixTreeTestMixin
from sglang.test.kl_multiturn_utils import make_mamba_decode_assert, make_mamba_prefill_assert
from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_kimi_k3_padded

VOCAB = 32000
CHUNK = 64  # our cache's checkpoint grid (docs/hybrid-cache.md)
NOT_APPLICABLE = "not applicable to a random-weight model; see docs/upstream-test-kits.md"
KITS_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs", "upstream-test-kits.md")


class TestKimiK3UnifiedRadixTreeKit(CustomTestCase, UnifiedRadixTreeTestMixin):
    """The kit's three multi-turn logprob tests, scaled to a CPU (16 new tokens, 2 x 2 branches)."""

    max_new_tokens = 16
    num_groups = 2
    branches_per_group = 2
    prefix_len = 128
    prefill_cache_assert = staticmethod(make_mamba_prefill_assert(CHUNK))
    decode_cache_assert = staticmethod(make_mamba_decode_assert(track_interval=CHUNK))

    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3_padded(VOCAB)
        rng = random.Random(0)
        # One prompt per group; test_multiturn_logprobs_match takes the first 4, i.e. these 2.
        cls.input_ids = [[rng.randint(1, VOCAB - 1) for _ in range(cls.prefix_len)] for _ in range(cls.num_groups)]
        cls.server = LaunchedServer(cls.model, cpu_server_args()).start()
        cls.base_url = cls.server.base_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_gsm8k(self):
        with open(KITS_DOC) as f:
            listed = "`UnifiedRadixTreeTestMixin.test_gsm8k`" in f.read()
        self.assertTrue(listed, "test_gsm8k is skipped but not listed in docs/upstream-test-kits.md")
        self.skipTest(NOT_APPLICABLE)

    def test_padded_vocabulary_bounds_input_ids(self):
        """Our HTTP-400 guard follows the model's (padded) vocabulary, not the tokenizer's."""
        ok = requests.post(
            self.base_url + "/generate",
            json={"input_ids": [5, 964, 965, VOCAB - 1], "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
            timeout=300,
        )
        self.assertEqual(ok.status_code, 200, ok.text)
        self.assertEqual(len(ok.json()["output_ids"]), 2)
        bad = requests.post(
            self.base_url + "/generate",
            json={"input_ids": [5, VOCAB], "sampling_params": {"max_new_tokens": 2}},
            timeout=300,
        )
        self.assertEqual(bad.status_code, 400, bad.text)
        self.assertIn(f"outside the vocabulary [0, {VOCAB})", bad.text)


if __name__ == "__main__":
    unittest.main()
