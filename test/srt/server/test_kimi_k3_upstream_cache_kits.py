"""Upstream's multi-turn cache kit against our hybrid radix cache, on a vocabulary-padded tiny Kimi K3.

``sglang.test.kits.unified_radix_cache_kit.UnifiedRadixTreeTestMixin`` sends
random token ids up to 30,000, so the server serves the tiny Kimi K3 with its
vocabulary padded to 32,000 (``make_tiny_model --vocab-size``; embedding and
LM-head rows, the 965-token tokenizer unchanged). Default flags, i.e. our
``HybridRadixCache`` on upstream's ``extra_buffer`` strategy: a prefill hit
resumes on the chunk grid (64), what ``make_mamba_prefill_assert(64)`` allows.
Each kit test checks, besides its cache hits, that the decode logprobs of the
last turn match a cold-cache prefill replay (KL < 0.003).

``radix_cache_server_kit.run_radix_attention_test`` runs here on a tree scaled
from 400 to 48 nodes (its own generator with ``num_nodes=48``; 400 requests take
~25 min on this CPU: run once by hand, docs/upstream-test-kits.md), with a
512-token prefill chunk so that prefill batches chunk requests, against our cache
and, as the control, against upstream's (``--radix-cache-backend upstream``).
``prefix_cache_branching_kit`` runs on the padded model with "hi", "this",
"here", "that" added to the tokenizer as single tokens, as the kit assumes.
"""

from __future__ import annotations

import functools
import os
import random
import unittest
from unittest import mock

import requests

from sglang.test.kits import radix_cache_server_kit
from sglang.test.kits.prefix_cache_branching_kit import PrefixCacheBranchingMixin
from sglang.test.kits.unified_radix_cache_kit import UnifiedRadixTreeTestMixin
from sglang.test.kl_multiturn_utils import make_mamba_decode_assert, make_mamba_prefill_assert
from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_kimi_k3_padded, tiny_kimi_k3_with_words

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


class TestKimiK3PrefixCacheBranchingKit(CustomTestCase, PrefixCacheBranchingMixin):
    """Upstream's branching kit: request 2 misses (KV matches 257 tokens, no checkpoint there) and
    stores the branch point; request 3 resumes at 257 // 64 * 64 = 256."""

    cache_chunk_size = CHUNK
    words = ("hi", "this", "here", "that")

    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3_with_words(cls.words, VOCAB)
        cls.server = LaunchedServer(cls.model, cpu_server_args()).start()
        cls.base_url = cls.server.base_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    @classmethod
    def flush_cache(cls):
        requests.post(cls.base_url + "/flush_cache", timeout=60).raise_for_status()

    def test_kit_tokenization_assumption_holds(self):
        """The kit's expected values assume one token per "hi" and per suffix word."""
        r = requests.post(self.base_url + "/tokenize", json={"prompt": "hi" * 257 + "this" * 4 * CHUNK}, timeout=60)
        r.raise_for_status()
        tokens = r.json()["tokens"]
        self.assertEqual(len(tokens), 257 + 4 * CHUNK)
        self.assertEqual(tokens[256:258], [965, 966])


class RadixCacheServerKitScaled:
    """``radix_cache_server_kit.run_radix_attention_test`` with its tree scaled to 48 nodes."""

    num_nodes = 48
    backend_args: tuple = ()

    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3_padded(VOCAB)
        args = cpu_server_args() + ["--chunked-prefill-size", "512", *cls.backend_args]
        cls.server = LaunchedServer(cls.model, args).start()
        cls.base_url = cls.server.base_url
        random.seed(0)
        scaled = functools.partial(radix_cache_server_kit.gen_radix_tree, num_nodes=cls.num_nodes)
        with mock.patch.object(radix_cache_server_kit, "gen_radix_tree", scaled):
            radix_cache_server_kit.run_radix_attention_test(cls.base_url)  # asserts HTTP 200
        cls.healthy = requests.get(cls.base_url + "/health", timeout=60).status_code == 200
        with open(cls.server.log_path, errors="replace") as f:
            cls.log = f.read()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_kit_passed_and_server_healthy(self):
        self.assertTrue(self.healthy)
        self.assertNotIn("Traceback", self.log)


class TestRadixCacheServerKitHybridCache(RadixCacheServerKitScaled, CustomTestCase):
    def test_branch_split_met_a_chunked_neighbour(self):
        """The tree makes a branch-split request share a prefill batch with one the chunk budget
        cuts; the second is deferred (before that fix it replaced the first as the batch's chunked
        request, and the full kit ended the server on upstream's committed-length check)."""
        self.assertIn("would be a second chunked request in this batch", self.log)
        self.assertIn("hybrid cache: HybridRadixCache (", self.log)


class TestRadixCacheServerKitUpstreamCache(RadixCacheServerKitScaled, CustomTestCase):
    """Control: the same kit on upstream's own cache, selected with ``--radix-cache-backend upstream``."""

    backend_args = ("--radix-cache-backend", "upstream")

    def test_upstream_cache_selected(self):
        self.assertIn("radix cache: upstream's UnifiedRadixCache (--radix-cache-backend upstream)", self.log)
        self.assertNotIn("hybrid cache: HybridRadixCache (", self.log)


if __name__ == "__main__":
    unittest.main()
