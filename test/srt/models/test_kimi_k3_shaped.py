"""The K3-shaped tiny Kimi K3 (``make_tiny_model --arch kimi-k3-shaped``) on CPU.

The tiny Kimi K3 (``kv_lora_rank`` 64, rope 16, KDA 4 heads of 32) cannot run upstream's
GPU kernels compiled for K3's geometry: its Triton MLA decode failed to compile, and its
fused KDA decode was skipped ("K3 fused KDA decode disabled: unexpected conv/A_log/dt_bias
layout"). The K3-shaped variant keeps K3's per-TP8-rank attention shapes. Here:

* upstream's config class reads K3's MLA and KDA geometry and a layer pattern with two KDA,
  two MLA and MoE layers;
* upstream's ``KimiK3LinearForCausalLM``, built on CPU as in ``test_kimi_k3_upstream_parity.py``,
  loads the checkpoint through its own ``load_weights`` into exactly our reference model's values;
* upstream's ``_prepare_fused_decode`` check accepts every KDA layer of it (and, for contrast,
  none of the tiny Kimi K3: the check wants 12 heads of 128 per rank, not another layout);
* our CPU reference model generates the FP64 oracle's greedy tokens (``kimi_k3_oracle.py``).
"""

from __future__ import annotations

import unittest
from unittest import mock

import torch

import sglang.srt.models.kimi_k3 as upstream_k3
import test_kimi_k3_upstream_parity as parity
from kimi_k3_oracle import KimiK3Oracle
from sglang.srt.configs.kimi_linear import KimiLinearConfig
from sglang.test.layer_ut_utils import init_single_process_dist
from sglang_hybrid.bench.server import free_port
from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM
from sglang_hybrid.models.kimi_k3.moe import KimiK3MoE
from sglang_hybrid.parallel.runner import SequenceRunner
from sglang_hybrid.parallel.spec import ParallelSpec
from tiny_model import tiny_kimi_k3, tiny_kimi_k3_shaped


def _upstream(model_dir, cfg):
    with mock.patch.object(torch.cuda, "Stream", parity._NoStream):
        model = upstream_k3.KimiK3LinearForCausalLM(cfg)
    with mock.patch.object(upstream_k3.KimiK3LinearForCausalLM, "post_load_weights"):
        loaded = model.load_weights(parity._weights(model_dir))
    return model, loaded


def _fused_decode_ready(model, cfg):
    """``{layer id: ready}`` after upstream's own check of each KDA layer (CPU: its CUDA branch, no kernel call)."""
    ready = {}
    for i in cfg.linear_layer_ids:
        attn = model.model.layers[i].self_attn
        attn._prepare_fused_decode()
        ready[i] = attn._kda_fused_decode_ready
    return ready


class TestKimiK3Shaped(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        init_single_process_dist(free_port())
        torch.set_default_dtype(torch.float32)
        cls.model_dir = tiny_kimi_k3_shaped()
        cls.cfg = KimiLinearConfig.from_pretrained(cls.model_dir)
        cls.upstream, cls.upstream_loaded = _upstream(cls.model_dir, cls.cfg)
        cls.ours = KimiK3ReferenceForCausalLM(cls.cfg)  # as served (upstream's padded vocabulary tables)
        cls.ours.load_weights(parity._weights(cls.model_dir))
        cls.up = dict(cls.upstream.named_parameters())
        cls.me = dict(cls.ours.named_parameters())

    def test_config_has_kimi_k3_attention_geometry_and_a_tiny_rest(self):
        c = self.cfg
        self.assertEqual((c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim), (512, 64, 128, 128))
        self.assertEqual(c.num_attention_heads, 12)
        la = c.linear_attn_config
        self.assertEqual((la["num_heads"], la["head_dim"]), (12, 128))
        self.assertEqual(c.linear_layer_ids, [0, 2])
        self.assertEqual(c.full_attention_layer_ids, [1, 3])
        self.assertTrue(c.is_mla and c.is_moe and c.is_linear_attn)
        moe = [i for i in range(c.num_hidden_layers) if isinstance(self.ours.model.layers[i].mlp, KimiK3MoE)]
        self.assertEqual(moe, [1, 2, 3])
        self.assertEqual((c.hidden_size, c.num_experts, c.vocab_size), (128, 8, 965))
        self.assertEqual(c.mamba2_cache_params.shape.temporal, (12, 128, 128))

    def test_upstream_class_loads_every_parameter_to_our_values(self):
        self.assertEqual(set(self.up), set(self.upstream_loaded))
        n = 0
        for name, up, ours in parity.TestKimiK3UpstreamParity._pairs(self):
            self.assertEqual(tuple(up.shape), tuple(ours.shape), name)
            torch.testing.assert_close(up.data, ours.data, rtol=0, atol=0, msg=name)
            n += 1
        self.assertEqual(n, len(self.up))
        kv_b = self.up["model.layers.1.self_attn.kv_b_proj.weight"]
        self.assertEqual(tuple(kv_b.shape), (12 * (128 + 128), 512))

    def test_upstream_fused_kda_decode_takes_the_kda_layers(self):
        self.assertEqual(_fused_decode_ready(self.upstream, self.cfg), {0: True, 2: True})
        attn = self.upstream.model.layers[0].self_attn.attn
        conv_q, conv_k, conv_v, bias, a_log, norm_w, _ = attn._k3_fused_decode_args
        self.assertEqual([tuple(t.shape) for t in (conv_q, conv_k, conv_v, bias, a_log, norm_w)],
                         [(4, 1536), (4, 1536), (4, 1536), (4608,), (12,), (128,)])
        # our A_log [H] (K3's 1-D form) reaches the kernel unchanged
        torch.testing.assert_close(a_log, self.me["model.layers.0.self_attn.A_log"], rtol=0, atol=0)

    def test_tiny_kimi_k3_is_refused_by_the_fused_decode_for_its_head_shapes(self):
        """Contrast: the same upstream check with the tiny Kimi K3 (4 heads of 32): conv [384, 4], A_log of 4,
        dt_bias of 128 against the compiled 12 x 128. The layout (names, ranks, FP32) is the same."""
        model_dir = tiny_kimi_k3()
        cfg = KimiLinearConfig.from_pretrained(model_dir)
        model, _ = _upstream(model_dir, cfg)
        ready = _fused_decode_ready(model, cfg)
        self.assertEqual(set(ready.values()), {False})
        attn = model.model.layers[0].self_attn.attn
        self.assertEqual((tuple(attn.conv_weights.shape), attn.A_log.numel(), tuple(attn.dt_bias.shape)),
                         ((3 * 4 * 32, 4), 4, (4 * 32,)))
        self.assertEqual({attn.conv_weights.dtype, attn.A_log.dtype, attn.dt_bias.dtype}, {torch.float32})

    def test_reference_generates_the_fp64_oracles_tokens(self):
        prompt = [5, 77, 300, 12, 964, 41, 8]
        model = KimiK3ReferenceForCausalLM(self.cfg, parallel=ParallelSpec())  # model-level run, no server
        model.load_weights(parity._weights(self.model_dir))
        tokens, logits = SequenceRunner(model, max_len=32).greedy(prompt, 4)
        oracle = KimiK3Oracle(self.model_dir)
        self.assertEqual(tokens, oracle.greedy(prompt, 4))
        want = oracle.logits(prompt + tokens)[len(prompt) - 1:].float()
        self.assertGreater(float(want.std()), 0.1)  # logits that tell tokens apart
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)  # seen: 7e-6; top-2 margins >= 6e-3


if __name__ == "__main__":
    unittest.main()
