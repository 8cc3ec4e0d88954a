"""The tiny Qwen3.8-Flash-Next checkpoint: determinism, upstream schema, and the weight-loading round trip."""

from __future__ import annotations

import filecmp
import json
import os
import tempfile
import unittest

import torch
from safetensors.torch import load_file

from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.test.layer_ut_utils import init_single_process_dist
from sglang_hybrid.bench.server import free_port
from sglang_hybrid.tools.make_tiny_model import build, main, qwen38_tensor_specs

ARCH = "qwen3.8-flash-next"
FILES = ["config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
         "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


class TestQwen38TinyCheckpoint(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.a, cls.b = (os.path.join(cls.tmp.name, n) for n in "ab")
        build(ARCH, cls.a, seed=0)
        main(["--arch", ARCH, "--out", cls.b, "--seed", "0"])
        with open(os.path.join(cls.a, "config.json")) as f:
            cls.cfg = json.load(f)
        cls.tensors = load_file(os.path.join(cls.a, "model.safetensors"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_same_seed_byte_identical(self):
        for f in FILES:
            self.assertTrue(filecmp.cmp(os.path.join(self.a, f), os.path.join(self.b, f), shallow=False), f)

    def test_transformers_strict_config_and_sglang_config_accept_it(self):
        from transformers import AutoConfig

        from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig

        hf = AutoConfig.from_pretrained(self.a)  # transformers' @strict Qwen4ExpConfig validates the architecture
        self.assertEqual(hf.text_config.layer_types.count("linear_attention"), 6)
        ours = Qwen4ExpConfig.from_pretrained(self.a)
        t = ours.text_config
        self.assertEqual(ours.architectures, ["Qwen4ExpForConditionalGeneration"])
        self.assertEqual((t.hc_count, t.hc_lowrank, t.ple_layer_ids, t.num_nextn_predict_layers), (4, 16, [1, 5], 1))
        self.assertEqual(t.layers_block_type.count("attention"), 2)

    def test_tensor_names_and_shapes_match_the_specs(self):
        specs = qwen38_tensor_specs(self.cfg)
        self.assertEqual({k: tuple(v.shape) for k, v in self.tensors.items()}, {k: s[0] for k, s in specs.items()})
        t = self.cfg["text_config"]
        self.assertEqual(sum(1 for n in self.tensors if n.startswith("mtp.layers.0.mlp.experts.")), 3 * t["num_experts"])
        self.assertIn("model.language_model.layers.4.ple.ple_embedding.ngram_embedding.shard_1.weight", self.tensors)
        self.assertNotIn("model.language_model.layers.3.ple.key_proj.weight", self.tensors)  # PLE only on GDN layers
        self.assertEqual(self.tensors["model.language_model.layers.0.linear_attn.A_log"].dtype, torch.float32)

    def test_bf16_parameters_are_bf16_exact(self):
        """Upstream keeps hyper-connection weights and n-gram tables in BF16: our values load losslessly."""
        names = [n for n in self.tensors if "input_mix_weight" in n or "block_inject" in n or "ngram_embedding" in n]
        self.assertGreater(len(names), 20)
        for n in names:
            t = self.tensors[n]
            torch.testing.assert_close(t, t.to(torch.bfloat16).float(), rtol=0, atol=0, msg=n)


class TestQwen38WeightLoadingRoundTrip(unittest.TestCase):
    """SGLang's safetensors iterator -> our load_weights -> read back through the same map."""

    @classmethod
    def setUpClass(cls):
        init_single_process_dist(free_port())
        from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig
        from sglang_hybrid.models.qwen38 import Qwen38ReferenceForConditionalGeneration
        from sglang_hybrid.models.qwen38.mtp import Qwen38ReferenceMTP

        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "m")
        build(ARCH, cls.dir, seed=3)
        cls.cfg = Qwen4ExpConfig.from_pretrained(cls.dir)
        cls.model_cls, cls.mtp_cls = Qwen38ReferenceForConditionalGeneration, Qwen38ReferenceMTP
        cls.file = load_file(os.path.join(cls.dir, "model.safetensors"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _model(self):
        torch.set_default_dtype(torch.float32)
        return self.model_cls(self.cfg)

    def test_every_checkpoint_tensor_reads_back_bit_exact(self):
        model, mtp = self._model(), self.mtp_cls(self.cfg)
        model.load_weights(safetensors_weights_iterator([os.path.join(self.dir, "model.safetensors")]))
        mtp.load_weights(self.file.items())
        covered = set()
        for owner, ckpt_prefix_fix in ((model, lambda n: n.replace("model.language_model.", "model.")), (mtp, lambda n: n)):
            params = dict(owner.named_parameters())
            mapping = owner.checkpoint_mapping()
            for name, tensor in self.file.items():
                spec = mapping.get(ckpt_prefix_fix(name))
                if spec is None:
                    continue
                covered.add(name)
                p = params[spec.param_name].data
                got = p[spec.index] if spec.index else p[: tensor.shape[0]]  # vocab rows may be padded
                torch.testing.assert_close(got.reshape(tensor.shape), tensor, rtol=0, atol=0, msg=name)
        self.assertEqual(covered, set(self.file))

    def test_unknown_missing_and_misshapen_tensors_are_errors(self):
        items = list(self.file.items())
        with self.assertRaisesRegex(ValueError, "model.layers.0.bogus.weight"):
            self._model().load_weights(items + [("model.language_model.layers.0.bogus.weight", torch.zeros(1))])
        with self.assertRaisesRegex(ValueError, "missing"):
            self._model().load_weights([(k, v) for k, v in items if not k.endswith("layers.5.linear_attn.dt_bias")])
        bad = dict(self.file)
        bad["model.language_model.layers.3.self_attn.k_proj.weight"] = torch.zeros(3, 3)
        with self.assertRaisesRegex(ValueError, "k_proj"):
            self._model().load_weights(bad.items())


if __name__ == "__main__":
    unittest.main()
