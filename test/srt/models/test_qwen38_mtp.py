"""The reference MTP head (``sglang_hybrid.models.qwen38.mtp``) against the FP64 oracle's MTP.

Both read the same ``mtp.*`` tensors; the draft for row ``t`` (token ``t + 2``)
comes from the target's streams at ``t`` and the embedding of token ``t + 1``.
The oracle computes the target's streams in FP64; the head gets them in FP32.
"""

from __future__ import annotations

import random
import unittest

import torch
from safetensors.torch import load_file

from qwen38_oracle import Qwen38Oracle
from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig
from sglang_hybrid.models.qwen38.mtp import Qwen38ReferenceMTP
from tiny_model import tiny_qwen38

EOS = 0


class TestQwen38MTP(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        cls.model_dir = tiny_qwen38()
        cls.oracle = Qwen38Oracle(cls.model_dir)
        cls.cfg = Qwen4ExpConfig.from_pretrained(cls.model_dir)
        tensors = load_file(f"{cls.model_dir}/model.safetensors")
        torch.set_default_dtype(torch.float32)
        cls.mtp = Qwen38ReferenceMTP(cls.cfg)
        cls.mtp.load_weights(tensors.items())
        cls.embed, cls.head = tensors["model.language_model.embed_tokens.weight"], tensors["lm_head.weight"]
        cls.mtp.set_embed_and_head(cls.embed, cls.head)
        rng = random.Random(7)
        cls.ids = [rng.randrange(1, 900) for _ in range(48)]
        cls.ids[20] = EOS
        cls.streams = cls.oracle.streams(cls.ids)

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls.threads)

    def test_draft_logits_equal_fp64_oracle(self):
        ref = self.oracle.mtp_logits(self.ids)  # [T - 1, V]
        logits, streams = self.mtp.draft_logits(torch.tensor(self.ids[1:]), self.streams[:-1].float())
        self.assertEqual(tuple(streams.shape), (len(self.ids) - 1, self.cfg.text_config.hc_count * self.cfg.text_config.hidden_size))
        torch.testing.assert_close(logits.double(), ref, rtol=0, atol=2e-4)
        self.assertEqual(logits.argmax(-1).tolist(), ref.argmax(-1).tolist())

    def test_draft_reads_the_next_token(self):
        """Feeding token t instead of t + 1 must change the drafts (the shift is part of the contract)."""
        right, _ = self.mtp.draft_logits(torch.tensor(self.ids[1:]), self.streams[:-1].float())
        wrong, _ = self.mtp.draft_logits(torch.tensor(self.ids[:-1]), self.streams[:-1].float())
        self.assertGreater(float((right - wrong).abs().max()), 1e-2)

    def test_bad_inputs_raise_value_error(self):
        W = self.cfg.text_config.hc_count * self.cfg.text_config.hidden_size
        bare = Qwen38ReferenceMTP(self.cfg)
        with self.assertRaisesRegex(ValueError, "set_embed_and_head"):
            bare.draft_logits(torch.tensor([1, 2]), torch.zeros(2, W))
        with self.assertRaisesRegex(ValueError, "target_streams"):
            self.mtp.draft_logits(torch.tensor([1, 2]), torch.zeros(3, W))


if __name__ == "__main__":
    unittest.main()
