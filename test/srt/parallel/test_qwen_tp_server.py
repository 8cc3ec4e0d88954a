"""End-to-end: ``python -m sglang.launch_server --tp 2 --device cpu`` serving the tiny Qwen3.8-Flash-Next (issue 8).

Two scheduler processes (TP ranks) on gloo groups, upstream's own
``VocabParallelEmbedding`` / ``ParallelLMHead`` / logits all-gather, our
reference model cut by ``shard_qwen38_text_model(model, ParallelSpec.from_sglang())``
after loading (GDN key/value heads and their conv / recurrent states, QSA query
heads, MoE intermediate; hyper-connections, PLE and the QSA indexer replicated),
upstream's GDN state pool sized per rank (value heads / TP), the hybrid radix
cache on.

Oracles (both compute every request from scratch, i.e. cache off, TP = 1):

* the FP64 architecture oracle (``test/srt/models/qwen38_oracle.py``), with the
  Qwen server test's log-prob tolerance ``2e-4`` (``test/srt/server/test_qwen38_server.py``);
* the single-process (TP = 1) model-level run of the same checkpoint
  (``sglang_hybrid.parallel.qwen38_runner``, the served model code with one
  rank), same tolerance (FP32 model; TP changes the summation order only; a
  missing shard or a wrong all-reduce is off by O(1)).

Checked: every greedy token equals both oracles' argmax; log-probs within the
tolerance; requests that hit the radix cache (``cached_tokens > 0``) return what
the cold request returned; each rank's GDN checkpoint holds half the value heads.
The prompts are few and short (an EOS inside, so the PLE n-gram context restarts):
two schedulers share a 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import unittest

import torch

from qwen38_oracle import Qwen38Oracle
from test_qwen38_server import EOS, random_ids, with_eos
from test_tp_server import NEW_TOKENS, TwoRankServerChecks, serve_three_turns
from tiny_model import tiny_qwen38

LOGPROB_TOL = 2e-4  # the Qwen server test's tolerance against the FP64 oracle


def _single_process_run(model_dir, prompt):
    """TP = 1 model-level greedy run: (tokens, log-softmax rows of each generated token)."""
    from sglang_hybrid.parallel.qwen38_runner import Qwen38SequenceRunner
    from sglang_hybrid.models.qwen38.loader import load_qwen38_text_model

    model, head = load_qwen38_text_model(model_dir)
    runner = Qwen38SequenceRunner(model, head, max_len=len(prompt) + NEW_TOKENS + 1)
    tokens, logits = runner.greedy(prompt, NEW_TOKENS)
    return tokens, logits[:NEW_TOKENS].double().log_softmax(-1)


class TestQwen38TP2Server(TwoRankServerChecks, unittest.TestCase):
    logprob_tol = LOGPROB_TOL

    @classmethod
    def setUpClass(cls):
        cls.model = tiny_qwen38()
        # Resume points lie on the 64-token track grid (extra_buffer), so turn 1 passes 64.
        turn1 = with_eos(random_ids(72, 51), 29)
        cls.log_path, cls.prompts, cls.outputs = serve_three_turns(cls.model, turn1, random_ids(5, 52))

    def test_prompt_has_an_eos_inside(self):
        self.assertIn(EOS, self.prompts[0][:-1])

    def test_each_rank_holds_half_the_gdn_state(self):
        """The GDN checkpoint (conv window + recurrent state, FP32) per rank covers H_k / 2 key and
        H_v / 2 value heads: upstream sizes the state pool from the config's heads / TP."""
        with open(os.path.join(self.model, "config.json")) as f:
            c = json.load(f)
        t = c.get("text_config", c)
        n_gdn = sum(k == "linear_attention" for k in t["layer_types"])
        hk, hv, dk, dv, conv = (t["linear_num_key_heads"] // 2, t["linear_num_value_heads"] // 2,
                                t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"])
        want = n_gdn * (hv * dv * dk + (2 * hk * dk + hv * dv) * (conv - 1)) * 4  # TP 1 serves twice this
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            got = {int(b) for b in re.findall(r"hybrid cache: HybridRadixCache \(KV \d+ B/token, checkpoint (\d+) B",
                                              f.read())}
        self.assertEqual(got, {want})

    def test_each_rank_cut_its_blocks(self):
        """Each rank logs its cut: half the GDN key / value heads, half the QSA query heads with the
        single KV head replicated, half the MoE intermediate (the checkpoint's, not upstream's padded size)."""
        with open(os.path.join(self.model, "config.json")) as f:
            c = json.load(f)
        t = c.get("text_config", c)
        self.assertEqual(t["num_key_value_heads"], 1)
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        for rank in range(2):
            self.assertIn(
                f"qwen3.8 TP rank {rank}/2: GDN key/value heads {t['linear_num_key_heads'] // 2}/"
                f"{t['linear_num_value_heads'] // 2}, QSA query/KV heads {t['num_attention_heads'] // 2}/1, "
                f"MoE intermediate {t['moe_intermediate_size'] // 2} per rank", log)

    def test_tp2_greedy_tokens_and_logprobs_equal_tp1(self):
        for prompt, out in self._distinct_requests():
            tokens, logp = _single_process_run(self.model, prompt)
            self.assertEqual(out["ids"], tokens, f"prompt of {len(prompt)} tokens")
            want = logp[torch.arange(NEW_TOKENS), torch.tensor(tokens)]
            torch.testing.assert_close(torch.tensor(out["logprobs"], dtype=torch.float64), want,
                                       atol=LOGPROB_TOL, rtol=0)

    def test_tp2_matches_fp64_oracle(self):
        oracle = Qwen38Oracle(self.model)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the oracle's many small FP64 ops run faster on one thread
        try:
            for prompt, out in self._distinct_requests():
                logp = oracle.logits(prompt + out["ids"][:-1]).log_softmax(-1)
                for j, (tok, lp) in enumerate(zip(out["ids"], out["logprobs"])):
                    row = logp[len(prompt) - 1 + j]
                    self.assertEqual(tok, int(row.argmax()), f"prompt of {len(prompt)} tokens, step {j}")
                    self.assertAlmostEqual(lp, float(row[tok]), delta=LOGPROB_TOL)
        finally:
            torch.set_num_threads(threads)


if __name__ == "__main__":
    unittest.main()
