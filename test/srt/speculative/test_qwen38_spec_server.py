"""End-to-end: MTP speculative decoding of the tiny Qwen3.8-Flash-Next on CPU (issue 6, case K4).

One real ``python -m sglang.launch_server`` with
``--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1
--speculative-num-draft-tokens 4`` (upstream's EAGLE v2 worker; our reference
model as target and as MTP draft; verify over 4 rows per request in
``HybridGDNAttnBackend``), hybrid radix cache on (default), ``--enable-metrics``.

Checkpoint: the tiny model with two tensors changed so that the random MTP
head agrees with the target most of the time (``lm_head`` rows = a permutation
of the embedding rows, ``mtp.fc_embedding`` = identity; about 90 % first-draft
agreement), so verify both accepts and rejects drafts; the test asserts both
happened.

Oracle: the independent FP64 model (``test/srt/models/qwen38_oracle.py``,
checked against transformers): every served greedy token must be the FP64
argmax after the served prefix, i.e. speculation on gives the same tokens as
plain greedy decoding (which ``test/srt/server/test_qwen38_server.py`` checks
against the same oracle). Case K4: four concurrent requests sharing a system
prompt, shorter than two 64-token checkpoint blocks, then requests reusing their
prefixes (including the speculatively decoded outputs): cache hits must happen and
their outputs must still equal the oracle. A rejected draft's state in a request's slot
would change every later token, so oracle equality across rounds with both accepted
and rejected drafts checks the commit; the hybrid cache resumes from the prefill-time
64-token checkpoint here (it does not read decode-time track copies yet; the commit
into track slots is checked in ``test/srt/platforms/test_cpu_spec_hooks.py``).
Accept-length statistics: per request in ``meta_info``, in the decode log line and
as Prometheus gauges on ``/metrics``.
"""

from __future__ import annotations

import os
import re
import unittest
from concurrent.futures import ThreadPoolExecutor

import requests
import torch

from qwen38_oracle import Qwen38Oracle
from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from test_qwen38_server import random_ids, with_eos  # same prompt builders as the non-spec server test
from tiny_model import tiny_qwen38_agreeing_mtp

EOS = 0
NUM_DRAFT_TOKENS = 4
SPEC_ARGS = [
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", str(NUM_DRAFT_TOKENS),
    "--disable-cuda-graph",
    "--enable-metrics",
    "--decode-log-interval", "1",
]


def generate(base_url, input_ids, max_new_tokens):
    payload = {"input_ids": input_ids,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    r = requests.post(base_url + "/generate", json=payload, timeout=900)
    r.raise_for_status()
    return r.json()




class TestQwen38SpecServer(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_qwen38_agreeing_mtp()
        cls.oracle = Qwen38Oracle(cls.model)
        assert cls.oracle.c["eos_token_id"] == EOS
        cls.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the oracle's many small FP64 ops
        server = LaunchedServer(cls.model, cpu_server_args() + SPEC_ARGS, timeout=600)
        with server:
            url = server.base_url
            # K4: 4 concurrent requests sharing a 70-token system prompt, each between one and two
            # 64-token checkpoint blocks (the prefill checkpoints at 64).
            system = with_eos(random_ids(70, 2), 25)
            cls.k4_prompts = [system + random_ids(8 + 9 * i, 10 + i) for i in range(4)]
            with ThreadPoolExecutor(4) as pool:
                cls.k4_first = list(pool.map(lambda p: generate(url, p, 12), cls.k4_prompts))
            # Prefix-reusing requests: turn 2 over turn 1 + its speculatively decoded output; exact repeats.
            cls.k4_reuse = [p + o["output_ids"] + random_ids(5, 20 + i)
                            for i, (p, o) in enumerate(zip(cls.k4_prompts, cls.k4_first))]
            cls.k4_reuse += [cls.k4_prompts[0], system + random_ids(30, 30)]
            with ThreadPoolExecutor(4) as pool:
                cls.k4_second = list(pool.map(lambda p: generate(url, p, 8), cls.k4_reuse))
            # n > 1 with sampling: upstream's verify is greedy on CPU, so the server refuses it by name (issue 42);
            # n > 1 greedy is served; then the first prompt again (still serving, same tokens).
            sampled = {"n": 2, "temperature": 0.8, "max_new_tokens": 4, "ignore_eos": True}
            cls.sampled_n = requests.post(url + "/generate", json={"input_ids": cls.k4_prompts[0], "sampling_params": sampled},
                                          timeout=300)
            cls.greedy_n = requests.post(url + "/generate", json={"input_ids": cls.k4_prompts[0],
                                                                  "sampling_params": {**sampled, "temperature": 0.0}},
                                         timeout=300)
            cls.after_sampled_n = generate(url, cls.k4_prompts[0], 12)
            cls.metrics = requests.get(url + "/metrics", timeout=60).text
            cls.server_info = requests.get(url + "/get_server_info", timeout=60).json()
            cls.log = open(server.log_path, encoding="utf-8", errors="replace").read()

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls.threads)

    def assert_oracle_greedy(self, prompt, out, n):
        """Every served token is the FP64 argmax after the served prefix."""
        ids = out["output_ids"]
        self.assertEqual(len(ids), n)
        logits = self.oracle.logits(prompt + ids[:-1])
        want = logits[len(prompt) - 1 :].argmax(-1).tolist()
        self.assertEqual(ids, want, f"{len(prompt)}-token prompt")

    def test_verify_committed_by_deferred_replay(self):
        """GDN's deferred commit served the verify steps (layers/attention/gdn_deferred.py): the start-up choice
        says so and the commit replayed records, so the oracle checks above cover it."""
        sched = self.server_info["internal_states"][0]["sglang_hybrid"]
        self.assertEqual(sched["kernel_paths"].get("gdn_verify_commit"), "deferred")
        self.assertGreater(sched["kernel_calls"].get("gdn_verify_commit=deferred_replay_torch", 0), 0)

    def test_greedy_with_speculation_equals_fp64_greedy(self):
        for p, o in zip(self.k4_prompts, self.k4_first):
            self.assert_oracle_greedy(p, o, 12)

    def test_k4_cache_hits_after_speculation_equal_fp64_greedy(self):
        for p, o in zip(self.k4_reuse, self.k4_second):
            self.assert_oracle_greedy(p, o, 8)
        # Every reuse request resumed from a stored state (at least the 64-token checkpoint).
        cached = [o["meta_info"]["cached_tokens"] for o in self.k4_second]
        self.assertTrue(all(c >= 64 for c in cached), cached)

    def test_sampled_n_is_refused_and_greedy_n_served(self):
        self.assertEqual(self.sampled_n.status_code, 400, self.sampled_n.text)
        self.assertIn("n=2 with temperature=0.8: this server runs speculative decoding (NEXTN) on CPU, whose verify is "
                      "greedy", self.sampled_n.text)
        self.assertEqual(self.greedy_n.status_code, 200, self.greedy_n.text)
        self.assertEqual([o["output_ids"] for o in self.greedy_n.json()], [self.k4_first[0]["output_ids"][:4]] * 2)
        self.assertEqual(self.after_sampled_n["output_ids"], self.k4_first[0]["output_ids"])

    def test_accept_statistics_in_meta_info(self):
        outs = self.k4_first + self.k4_second
        correct_total = proposed_total = 0
        for o in outs:
            m = o["meta_info"]
            verify, correct, proposed = m["spec_verify_ct"], m["spec_num_correct_drafts"], m["spec_num_proposed_drafts"]
            self.assertGreater(verify, 0)
            self.assertEqual(proposed, verify * (NUM_DRAFT_TOKENS - 1))
            # The first token comes from the prefill; each verify commits its accepted drafts plus one
            # bonus token (the last verify may overshoot max_new_tokens).
            self.assertLessEqual(m["completion_tokens"], 1 + verify + correct)
            self.assertGreaterEqual(m["completion_tokens"], verify)
            self.assertAlmostEqual(m["spec_accept_length"], m["completion_tokens"] / verify, places=5)
            correct_total += correct
            proposed_total += proposed
        # Both paths ran: accepted drafts committed, rejected drafts rolled back.
        self.assertGreater(correct_total, 0)
        self.assertLess(correct_total, proposed_total)

    def test_accept_length_logged_and_exported(self):
        self.assertRegex(self.log, r"accept len: \d+\.\d+")
        for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate"):
            values = [float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", self.metrics, re.M)]
            self.assertTrue(values, f"{name} missing from /metrics")
        accept_len = [float(v) for v in re.findall(r"^sglang:spec_accept_length\{[^}]*\} (\S+)$", self.metrics, re.M)]
        self.assertTrue(all(1.0 <= v <= NUM_DRAFT_TOKENS for v in accept_len), accept_len)


if __name__ == "__main__":
    unittest.main()
