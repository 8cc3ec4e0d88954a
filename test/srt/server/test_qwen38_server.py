"""End-to-end: the real ``python -m sglang.launch_server`` serving the tiny Qwen3.8-Flash-Next on CPU.

Served greedy tokens and log-probs are checked against the independent FP64
oracle (``test/srt/models/qwen38_oracle.py``, itself checked against Hugging Face
transformers' ``Qwen4ExpForCausalLM``), including a prompt long enough for QSA to
select a sparse subset (more than ``indexer_budget`` = 1,024 visible tokens),
prompts with EOS inside (the n-gram embeddings restart there), and a request that
resumes from a radix-cache checkpoint (GDN state, PLE short-conv windows and
n-gram context restored together). Then a second server with
``--disable-radix-cache`` must give the same tokens for prefix-sharing prompts.

Both servers run one after the other inside ``setUpClass`` (two at once would
share 2 cores); the tests only assert on what was collected. Default flags:
upstream's ``auto`` radix strategy resolves to ``extra_buffer`` (checkpoints on
the 64-token grid).
"""

from __future__ import annotations

import random
import unittest

import requests
import torch

from qwen38_oracle import Qwen38Oracle
from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_qwen38

EOS = 0  # <|endoftext|> of the tiny tokenizer (asserted in setUpClass)


def generate(base_url, input_ids, max_new_tokens=8, **extra):
    payload = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                                            "ignore_eos": True}, **extra}
    r = requests.post(base_url + "/generate", json=payload, timeout=600)
    r.raise_for_status()
    return r.json()


def random_ids(n, seed, lo=10, hi=900):
    rng = random.Random(seed)
    return [rng.randrange(lo, hi) for _ in range(n)]


def with_eos(ids, every):
    return [EOS if (i + 1) % every == 0 else t for i, t in enumerate(ids)]


class TestQwen38Server(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_qwen38()
        cls.oracle = Qwen38Oracle(cls.model)
        assert cls.oracle.c["eos_token_id"] == EOS
        cls.threads = torch.get_num_threads()
        # The oracle's many small FP64 ops run ~10x faster on one thread on a busy 2-core machine.
        torch.set_num_threads(1)
        cls.got = {}
        with LaunchedServer(cls.model, cpu_server_args()) as on:
            url = on.base_url
            # EOS every 7 tokens: n-grams must not cross it. 1,100 tokens: QSA keeps 512 of up to 550 blocks.
            cls.oracle_cases = [(with_eos(random_ids(37, 1), 7), 10), (random_ids(1100, 2), 3)]
            cls.got["oracle"] = [generate(url, p, max_new_tokens=n, return_logprob=True) for p, n in cls.oracle_cases]
            # A 130-token prefill snapshots the state at 128 (inside the extend, off its end); turn 2 resumes there.
            prompt = with_eos(random_ids(130, 3), 61)
            first = generate(url, prompt, max_new_tokens=5)
            cls.resume_prompt = prompt + first["output_ids"] + random_ids(9, 4)
            cls.got["resume"] = generate(url, cls.resume_prompt, max_new_tokens=5, return_logprob=True)
            # Concurrent batch vs single requests.
            cls.batch_prompts = [with_eos(random_ids(20 + 23 * i, 10 + i), 11) for i in range(3)]
            cls.got["singles"] = [generate(url, p, max_new_tokens=5)["output_ids"] for p in cls.batch_prompts]
            cls.got["batched"] = requests.post(url + "/generate", json={
                "input_ids": cls.batch_prompts,
                "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}}, timeout=600).json()
            cls.got["completion"] = requests.post(url + "/v1/completions", json={
                "model": cls.model, "prompt": "Q: Name a colour.\nA:", "max_tokens": 6, "temperature": 0}, timeout=300)
            # Prefix-sharing prompts for cache on == cache off (the first and last are exact repeats).
            system = with_eos(random_ids(150, 20), 50)
            turn1 = system + random_ids(30, 21)
            first = generate(url, turn1, max_new_tokens=6)
            turn2 = turn1 + first["output_ids"] + random_ids(20, 22)
            cls.shared = [turn1, system + random_ids(25, 23), turn2, turn2[:129], system[:65], turn1]
            cls.got["on"] = [generate(url, p, max_new_tokens=6) for p in cls.shared]
        with LaunchedServer(cls.model, cpu_server_args() + ["--disable-radix-cache"]) as off:
            cls.got["off"] = [generate(off.base_url, p, max_new_tokens=6) for p in cls.shared]

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls.threads)

    def assert_matches_oracle(self, prompt, out, tol=2e-4):
        """Each served token is the FP64 argmax given the served prefix; log-probs agree."""
        logp = self.oracle.logits(prompt + out["output_ids"][:-1]).log_softmax(-1)
        for j, (lp, tok, _) in enumerate(out["meta_info"]["output_token_logprobs"]):
            row = logp[len(prompt) - 1 + j]
            self.assertEqual(tok, int(row.argmax()), f"position {j} of a {len(prompt)}-token prompt")
            self.assertAlmostEqual(lp, float(row[tok]), delta=tol)

    def test_greedy_matches_fp64_oracle_with_eos_and_sparse_qsa(self):
        for (prompt, n), out in zip(self.oracle_cases, self.got["oracle"]):
            self.assertEqual(len(out["output_ids"]), n)
            self.assert_matches_oracle(prompt, out)

    def test_resume_from_checkpoint_matches_oracle(self):
        self.assertEqual(self.got["resume"]["meta_info"]["cached_tokens"], 128)
        self.assert_matches_oracle(self.resume_prompt, self.got["resume"])

    def test_concurrent_batch_equals_single_requests(self):
        self.assertEqual([b["output_ids"] for b in self.got["batched"]], self.got["singles"])

    def test_text_completion_round_trip(self):
        r = self.got["completion"]
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["usage"]["completion_tokens"], 6)

    def test_prefix_sharing_outputs_equal_cache_off(self):
        hits = 0
        for p, on, off in zip(self.shared, self.got["on"], self.got["off"]):
            self.assertEqual(on["output_ids"], off["output_ids"], f"prompt of {len(p)} tokens")
            self.assertEqual(off["meta_info"]["cached_tokens"], 0)
            hits += on["meta_info"]["cached_tokens"]
        self.assertGreater(hits, 0)
        self.assertGreater(self.got["on"][-1]["meta_info"]["cached_tokens"], 0)  # the exact repeat resumed


if __name__ == "__main__":
    unittest.main()
