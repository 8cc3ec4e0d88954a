"""The FP64 Qwen3.8-Flash-Next oracle against an outside implementation.

Hugging Face transformers ships its own ``Qwen4ExpForCausalLM`` (plain-torch GDN,
QSA indexer, PLE, hyper-connections). Run in FP64 on our tiny checkpoint, with its
reference torch paths (not fla's Triton kernels), it must give the oracle's logits —
for a short sequence with EOS tokens inside (n-grams restart) and for one past the
QSA budget, where the token selection is sparse.
"""

from __future__ import annotations

import random
import unittest

import torch

from qwen38_oracle import Qwen38Oracle
from tiny_model import tiny_qwen38

EOS = 0


def _transformers_model(model_dir):
    import transformers.models.qwen4_exp.modeling_qwen4_exp as hf

    # transformers picks fla's Triton kernels when fla is importable; use its torch references.
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"):
        fn = getattr(hf, name)
        setattr(hf, name, getattr(fn, "__wrapped__", fn))
    model = hf.Qwen4ExpForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
    )
    return model.eval()


class TestQwen38OracleAgainstTransformers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # many small FP64 ops: one thread is far faster on a busy 2-core machine
        cls.model_dir = tiny_qwen38()
        cls.oracle = Qwen38Oracle(cls.model_dir)
        cls.hf = _transformers_model(cls.model_dir)

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls.threads)

    def _assert_matches_oracle(self, ids, atol):
        with torch.no_grad():
            ref = self.hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        got = self.oracle.logits(ids)
        self.assertEqual(got.shape, ref.shape)
        torch.testing.assert_close(got, ref, rtol=0, atol=atol)
        return got

    def test_short_sequence_with_eos(self):
        rng = random.Random(0)
        ids = [rng.randrange(1, 900) for _ in range(40)]
        for i in (6, 7, 20, 33):
            ids[i] = EOS
        got = self._assert_matches_oracle(ids, atol=2e-6)
        self.assertGreater(float(got.std()), 0.1)  # not a degenerate output

    def test_sparse_qsa_past_the_budget(self):
        """1,040 tokens: queries from position 1,025 on see more than 512 complete blocks."""
        rng = random.Random(1)
        ids = [rng.randrange(10, 900) for _ in range(1040)]
        # transformers computes its RoPE angles in FP32: a few 1e-7 at position ~1,000
        self._assert_matches_oracle(ids, atol=2e-6)


if __name__ == "__main__":
    unittest.main()
