"""The tiny checkpoint builder: determinism, schema, errors, and the weight-loading round trip."""

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
from sglang_hybrid.tools.make_tiny_model import build, kimi_k3_tensor_specs, main

FILES = ["config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
         "tokenizer.json", "tokenizer_config.json"]


class TestMakeTinyModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.a, cls.b, cls.c = (os.path.join(cls.tmp.name, n) for n in "abc")
        build("kimi-k3", cls.a, seed=0)
        main(["--arch", "kimi-k3", "--out", cls.b, "--seed", "0"])
        build("kimi-k3", cls.c, seed=1)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_same_seed_byte_identical(self):
        for f in FILES:
            self.assertTrue(filecmp.cmp(os.path.join(self.a, f), os.path.join(self.b, f), shallow=False), f)

    def test_other_seed_other_weights_same_schema(self):
        self.assertFalse(filecmp.cmp(os.path.join(self.a, "model.safetensors"), os.path.join(self.c, "model.safetensors"), shallow=False))
        self.assertTrue(filecmp.cmp(os.path.join(self.a, "config.json"), os.path.join(self.c, "config.json"), shallow=False))

    def test_config_is_upstream_kimi_linear_schema(self):
        with open(os.path.join(self.a, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["model_type"], "kimi_linear")
        self.assertEqual(cfg["architectures"], ["KimiK3LinearForCausalLM"])
        for key in ("kv_lora_rank", "qk_rope_head_dim", "linear_attn_config", "num_experts",
                    "num_experts_per_token", "num_shared_experts", "attn_res_block_size"):
            self.assertIn(key, cfg)
        self.assertIn("short_conv_kernel_size", cfg["linear_attn_config"])
        tensors = load_file(os.path.join(self.a, "model.safetensors"))
        specs = kimi_k3_tensor_specs(cfg)
        self.assertEqual(set(tensors), set(specs))
        self.assertEqual({k: tuple(v.shape) for k, v in tensors.items()}, {k: s[0] for k, s in specs.items()})
        self.assertEqual(tensors["model.layers.1.self_attn.A_log"].dtype, torch.float32)

    def test_tokenizer_round_trip_and_chat_template(self):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.a)
        text = "Q: What is the capital of France?\nA: Paris."
        self.assertEqual(tok.decode(tok.encode(text)), text)
        with open(os.path.join(self.a, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(len(tok), cfg["vocab_size"])
        self.assertEqual(tok.eos_token_id, cfg["eos_token_id"])
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
        self.assertEqual(chat, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

    def test_bad_arguments_raise_naming_the_argument(self):
        with self.assertRaisesRegex(ValueError, "--arch"):
            build("kimi-k9", os.path.join(self.tmp.name, "x"))
        with self.assertRaisesRegex(ValueError, "--dtype"):
            build("kimi-k3", os.path.join(self.tmp.name, "x"), dtype="int8")
        with self.assertRaisesRegex(ValueError, "--num-layers"):
            build("kimi-k3", os.path.join(self.tmp.name, "x"), num_layers=0)


class TestKimiK3ShapedVariant(unittest.TestCase):
    """``--arch kimi-k3-shaped``: Kimi K3's per-rank MLA / KDA geometry, four layers, the tiny rest."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.a, cls.b = (os.path.join(cls.tmp.name, n) for n in "ab")
        build("kimi-k3-shaped", cls.a, seed=0)
        main(["--arch", "kimi-k3-shaped", "--out", cls.b, "--seed", "0"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_cli_and_build_agree_byte_for_byte(self):
        for f in FILES:
            self.assertTrue(filecmp.cmp(os.path.join(self.a, f), os.path.join(self.b, f), shallow=False), f)

    def test_k3_attention_shapes_and_layout(self):
        with open(os.path.join(self.a, "config.json")) as f:
            cfg = json.load(f)
        la = cfg["linear_attn_config"]
        self.assertEqual((cfg["num_hidden_layers"], la["kda_layers"], la["full_attn_layers"]), (4, [1, 3], [2, 4]))
        tensors = load_file(os.path.join(self.a, "model.safetensors"))
        self.assertEqual({k: tuple(v.shape) for k, v in tensors.items()},
                         {k: s[0] for k, s in kimi_k3_tensor_specs(cfg).items()})
        mla, kda = "model.layers.1.self_attn", "model.layers.0.self_attn"
        self.assertEqual(tuple(tensors[f"{mla}.kv_a_proj_with_mqa.weight"].shape), (512 + 64, 128))
        self.assertEqual(tuple(tensors[f"{mla}.kv_b_proj.weight"].shape), (12 * (128 + 128), 512))
        self.assertEqual(tuple(tensors[f"{mla}.q_proj.weight"].shape), (12 * (128 + 64), 128))
        # upstream's layouts (q/k/v_conv1d [P, 1, C], A_log [H] in K3's 1-D form, dt_bias [P] in FP32)
        self.assertEqual(tuple(tensors[f"{kda}.q_conv1d.weight"].shape), (12 * 128, 1, 4))
        self.assertEqual((tuple(tensors[f"{kda}.A_log"].shape), tensors[f"{kda}.A_log"].dtype), ((12,), torch.float32))
        self.assertEqual((tuple(tensors[f"{kda}.dt_bias"].shape), tensors[f"{kda}.dt_bias"].dtype), ((1536,), torch.float32))
        self.assertIn("model.layers.3.mlp.experts.7.w2.weight", tensors)


class TestWeightLoadingRoundTrip(unittest.TestCase):
    """SGLang's safetensors iterator -> our load_weights -> read back through the same map."""

    @classmethod
    def setUpClass(cls):
        init_single_process_dist(free_port())
        from sglang.srt.configs.kimi_linear import KimiLinearConfig
        from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM

        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "m")
        build("kimi-k3", cls.dir, seed=3)
        cls.cfg = KimiLinearConfig.from_pretrained(cls.dir)
        cls.model_cls = KimiK3ReferenceForCausalLM

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _model(self):
        torch.set_default_dtype(torch.float32)
        return self.model_cls(self.cfg)

    def _iter(self):
        return safetensors_weights_iterator([os.path.join(self.dir, "model.safetensors")])

    def test_every_checkpoint_tensor_reads_back_bit_exact(self):
        model = self._model()
        model.load_weights(self._iter())
        params = dict(model.named_parameters())
        file = load_file(os.path.join(self.dir, "model.safetensors"))
        mapping = model.checkpoint_mapping()
        self.assertEqual(set(mapping), set(file))
        for name, spec in mapping.items():
            p = params[spec.param_name].data
            got = p[spec.index] if spec.index else p[: file[name].shape[0]]  # vocab rows may be padded
            torch.testing.assert_close(got, file[name], rtol=0, atol=0, msg=name)

    def test_unknown_missing_and_misshapen_tensors_are_errors(self):
        file = load_file(os.path.join(self.dir, "model.safetensors"))
        with self.assertRaisesRegex(ValueError, "model.layers.0.bogus.weight"):
            self._model().load_weights(list(file.items()) + [("model.layers.0.bogus.weight", torch.zeros(1))])
        with self.assertRaisesRegex(ValueError, "missing"):
            self._model().load_weights([(k, v) for k, v in file.items() if k != "model.norm.weight"])
        bad = dict(file)
        bad["model.layers.3.self_attn.kv_b_proj.weight"] = torch.zeros(3, 3)
        with self.assertRaisesRegex(ValueError, "kv_b_proj"):
            self._model().load_weights(bad.items())


if __name__ == "__main__":
    unittest.main()
