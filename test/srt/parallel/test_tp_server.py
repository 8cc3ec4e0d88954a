"""End-to-end: ``python -m sglang.launch_server --tp 2 --device cpu`` serving the tiny Kimi K3 (issue 8).

Two scheduler processes (TP ranks) on gloo groups, upstream's own
``VocabParallelEmbedding`` / ``ParallelLMHead`` / logits all-gather, our
reference model sharded by ``ParallelSpec.from_sglang`` (MLA heads, KDA heads
and their states, MoE intermediate), the hybrid radix cache on.

Oracles (both compute every request from scratch, i.e. cache off, TP = 1):

* the single-process (TP = 1) model-level run of the same checkpoint
  (``sglang_hybrid.parallel.runner``, the served model code with one rank);
* the FP64 architecture oracle (``test/srt/models/kimi_k3_oracle.py``).

Checked: every greedy token equals both oracles' argmax; every returned
log-prob is within ``1e-4`` of the FP64 oracle and of the TP = 1 run (FP32 model,
TP changes the summation order only; measured ~5e-6; a missing shard or a
wrong all-reduce is off by O(1)); requests that hit the radix cache
(``cached_tokens > 0``) return exactly what the cold request returned.
The prompts are few and short: two schedulers share a 2-core machine.
"""

from __future__ import annotations

import os
import random
import unittest

import requests
import torch

from kimi_k3_oracle import KimiK3Oracle
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_kimi_k3

NEW_TOKENS = 6
LOGPROB_TOL = 1e-4


def _ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(10, 900) for _ in range(n)]


def _generate(base_url, ids):
    payload = {
        "input_ids": ids,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True},
    }
    r = requests.post(base_url + "/generate", json=payload, timeout=300)
    r.raise_for_status()
    out = r.json()
    return {
        "ids": out["output_ids"],
        "logprobs": [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]],
        "cached": out["meta_info"]["cached_tokens"],
    }


def _thread_bind() -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for 2 ranks (upstream requires it when ranks exceed NUMA nodes)."""
    cores = sorted(os.sched_getaffinity(0))
    return f"{cores[0]}|{cores[1 % len(cores)]}"


def _single_process_run(model_dir, prompt):
    """TP = 1 model-level greedy run: (tokens, log-softmax rows of each generated token)."""
    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM
    from sglang_hybrid.parallel.runner import SequenceRunner
    from sglang_hybrid.parallel.spec import ParallelSpec

    model = KimiK3ReferenceForCausalLM(KimiLinearConfig.from_pretrained(model_dir), parallel=ParallelSpec())
    model.load_weights(safetensors_weights_iterator([os.path.join(model_dir, "model.safetensors")]))
    tokens, logits = SequenceRunner(model, max_len=len(prompt) + NEW_TOKENS + 1).greedy(prompt, NEW_TOKENS)
    return tokens, logits[:NEW_TOKENS].log_softmax(-1)


def serve_three_turns(model, turn1, next_turn_tail):
    """One ``--tp 2`` server: turn 1 cold, turn 1 again (radix hit), turn 1 + its output + tail (hit).

    Returns ``(log_path, prompts, outputs)``; ``outputs[i]`` is ``_generate``'s dict for ``prompts[i]``.
    """
    args = cpu_server_args(max_total_tokens=4096, max_mamba_cache_size=32) + ["--tp", "2"]
    server = LaunchedServer(model, args, env={"SGLANG_CPU_OMP_THREADS_BIND": _thread_bind()}, timeout=600)
    with server:  # LaunchedServer.stop kills the launcher's process group (both schedulers)
        first = _generate(server.base_url, turn1)
        prompts = [turn1, turn1, turn1 + first["ids"] + next_turn_tail]
        outputs = [first] + [_generate(server.base_url, p) for p in prompts[1:]]
    return server.log_path, prompts, outputs


class TwoRankServerChecks:
    """Checks shared by the ``--tp 2`` server tests (``setUpClass`` sets log_path, prompts, outputs)."""

    logprob_tol = LOGPROB_TOL

    def _distinct_requests(self):
        # The repeat equals the cold request (test_cache_hits_return_the_cold_result); check it once.
        return [(p, o) for i, (p, o) in enumerate(zip(self.prompts, self.outputs)) if i != 1]

    def test_log_shows_two_tp_ranks(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        self.assertIn("TP0]", log)
        self.assertIn("TP1]", log)

    def test_cache_hits_return_the_cold_result(self):
        self.assertEqual(self.outputs[0]["cached"], 0)
        repeat, next_turn = self.outputs[1], self.outputs[2]
        self.assertGreater(repeat["cached"], 0)
        self.assertGreater(next_turn["cached"], 0)
        self.assertEqual(repeat["ids"], self.outputs[0]["ids"])
        torch.testing.assert_close(torch.tensor(repeat["logprobs"]), torch.tensor(self.outputs[0]["logprobs"]),
                                   atol=self.logprob_tol, rtol=0)


class TestKimiK3TP2Server(TwoRankServerChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        # Resume points lie on the 64-token track grid (docs/hybrid-cache.md), so turn 1 passes 64.
        cls.log_path, cls.prompts, cls.outputs = serve_three_turns(cls.model, _ids(72, 41), _ids(5, 42))

    def test_each_rank_holds_half_the_recurrent_state(self):
        """The KDA checkpoint (conv window + recurrent state, FP32) per rank covers H / 2 heads."""
        import json
        import re

        with open(os.path.join(self.model, "config.json")) as f:
            la = json.load(f)["linear_attn_config"]
        heads, K, conv = la["num_heads"] // 2, la["head_dim"], la["short_conv_kernel_size"]
        per_layer = heads * K * K * 4 + 3 * heads * K * (conv - 1) * 4
        want = len(la["kda_layers"]) * per_layer  # 62,976 B here; TP 1 serves 125,952 B
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            got = {int(b) for b in re.findall(r"hybrid cache: HybridRadixCache \(KV \d+ B/token, checkpoint (\d+) B", f.read())}
        self.assertEqual(got, {want})

    def test_tp2_greedy_tokens_and_logprobs_equal_tp1(self):
        for prompt, out in self._distinct_requests():
            tokens, logp = _single_process_run(self.model, prompt)
            self.assertEqual(out["ids"], tokens, f"prompt of {len(prompt)} tokens")
            want = logp[torch.arange(NEW_TOKENS), torch.tensor(tokens)]
            torch.testing.assert_close(torch.tensor(out["logprobs"], dtype=torch.float64), want.double(),
                                       atol=LOGPROB_TOL, rtol=0)

    def test_tp2_matches_fp64_oracle(self):
        oracle = KimiK3Oracle(self.model)
        for prompt, out in self._distinct_requests():
            logp = oracle.logits(prompt + out["ids"]).log_softmax(-1)
            for j, (tok, lp) in enumerate(zip(out["ids"], out["logprobs"])):
                row = logp[len(prompt) - 1 + j]
                self.assertEqual(tok, int(row.argmax()), f"prompt of {len(prompt)} tokens, step {j}")
                self.assertAlmostEqual(lp, float(row[tok]), delta=LOGPROB_TOL)


if __name__ == "__main__":
    unittest.main()
