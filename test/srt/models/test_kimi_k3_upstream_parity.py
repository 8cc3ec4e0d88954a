"""Our CPU reference model against upstream SGLang 0.5.23's own Kimi K3 class.

Upstream's ``KimiK3LinearForCausalLM`` cannot run a forward pass on CPU (CUDA
streams, Triton/CUDA KDA and FusedMoE kernels, GPU attention backends), so this
compares everything that *can* run here (docs/kimi-k3-reference.md lists the
rest):

* upstream's config class parses our ``config.json`` to the layer pattern and
  state-pool shapes our model and backend assume;
* upstream's class, built on CPU (a stub for ``torch.cuda.Stream``), loads our
  checkpoint through its own ``load_weights``: every upstream parameter is
  filled, and holds exactly the values our model holds;
* upstream layer code that runs on CPU gives our results: the dense SwiGLU MLP,
  RMSNorm, the FP32 MoE router with its biased grouped top-k, and AttnRes
  aggregation (``aggregate_stream_torch``);
* upstream blocks end to end where their CPU path is the CUDA path's math: the MoE
  block (``KimiK3MoE.forward``: MoEGate -> TopK/select_experts -> FusedMoE -> + shared
  experts), also with its routing through our routing hook as on a GPU; the
  attention-residual stream through upstream's ``AttnBank`` / ``AttnBankState`` /
  ``AttnBankOutputRead`` in the decoder layers' read order, through our AttnRes hook
  as on a GPU (every read, the final full-bank read included).
"""

from __future__ import annotations

import unittest
from unittest import mock

import contextlib
import functools

import torch

from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.test.layer_ut_utils import init_single_process_dist
from sglang_hybrid.bench.server import free_port
from tiny_model import tiny_kimi_k3

import sglang.srt.models.kimi_k3 as upstream_k3  # noqa: E402  (after sglang's own imports)
from sgl_hybrid_kernel.attn_res import attn_res_mix
from sgl_hybrid_kernel.moe import biased_grouped_topk
from sgl_hybrid_kernel.norm import rms_norm
from sglang.srt.configs.kimi_linear import KimiLinearConfig
from sglang.srt.layers.attn_residual import aggregate_stream_torch
from sglang.srt.layers.moe.topk import biased_grouped_topk_impl
from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM
from sglang_hybrid.models.kimi_k3.model import _ResidualStream


class _NoStream:
    """Stand-in for ``torch.cuda.Stream`` so upstream's class can be built on CPU."""


def _weights(model_dir):
    return safetensors_weights_iterator([f"{model_dir}/model.safetensors"])


class TestKimiK3UpstreamParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        init_single_process_dist(free_port())
        cls.model_dir = tiny_kimi_k3()
        cls.cfg = KimiLinearConfig.from_pretrained(cls.model_dir)
        torch.set_default_dtype(torch.float32)
        with mock.patch.object(torch.cuda, "Stream", _NoStream):
            cls.upstream = upstream_k3.KimiK3LinearForCausalLM(cls.cfg)
        # post_load_weights only fuses/precompiles for GPU kernels.
        with mock.patch.object(upstream_k3.KimiK3LinearForCausalLM, "post_load_weights"):
            cls.upstream_loaded = cls.upstream.load_weights(_weights(cls.model_dir))
        cls.ours = KimiK3ReferenceForCausalLM(cls.cfg)
        cls.ours.load_weights(_weights(cls.model_dir))
        cls.up = dict(cls.upstream.named_parameters())
        cls.me = dict(cls.ours.named_parameters())

    def test_upstream_config_parses_our_checkpoint(self):
        c = self.cfg
        self.assertEqual(c.model_type, "kimi_linear")
        self.assertTrue(c.is_mla and c.is_moe and c.is_linear_attn)
        self.assertEqual(c.full_attention_layer_ids, [3, 7])
        self.assertEqual(c.linear_layer_ids, [0, 1, 2, 4, 5, 6])
        params = c.mamba2_cache_params
        la = c.linear_attn_config
        proj = la["num_heads"] * la["head_dim"]
        # Pool layout our backend reads: conv [K-1, 3*P] (raw rows), state [H, V, K].
        self.assertEqual(params.shape.conv, [(la["short_conv_kernel_size"] - 1, 3 * proj)])
        self.assertEqual(params.shape.temporal, (la["num_heads"], la["head_dim"], la["head_dim"]))
        self.assertEqual(params.layers, c.linear_layer_ids)

    def test_upstream_class_loads_every_parameter(self):
        self.assertEqual(set(self.up), set(self.upstream_loaded))

    def _pairs(self):
        """(upstream param, our tensor) for every upstream parameter."""
        for name, p in self.up.items():
            ours = name
            for a, b in (
                ("self_attention_res_norm.weight", "attn_score.norm"),
                ("self_attention_res_proj.weight", "attn_score.proj"),
                ("mlp_res_norm.weight", "mlp_score.norm"),
                ("mlp_res_proj.weight", "mlp_score.proj"),
                ("model.output_attn_res_norm.weight", "model.output_score.norm"),
                ("model.output_attn_res_proj.weight", "model.output_score.proj"),
                ("experts.w13_weight", "w13"),
                ("experts.w2_weight", "w2"),
            ):
                ours = ours.replace(a, b)
            if name.endswith("fused_qkvg_proj.weight"):
                base = name[: -len("fused_qkvg_proj.weight")]
                yield name, p, torch.cat([self.me[base + "qkv_proj"], self.me[base + "g_proj"]])
                continue
            if name.endswith("qkv_conv1d.weight"):
                yield name, p, self.me[name[: -len(".weight")]].unsqueeze(1)
                continue
            if name not in self.me and ours.endswith(".weight") and ours[: -len(".weight")] in self.me:
                ours = ours[: -len(".weight")]
            target = self.me[ours]
            if name.endswith("A_log"):
                target = target.view(p.shape)
            yield name, p, target


    def test_parameters_equal_upstream_after_loading(self):
        n = 0
        for name, up, ours in self._pairs():
            self.assertEqual(tuple(up.shape), tuple(ours.shape), name)
            torch.testing.assert_close(up.data, ours.data, rtol=0, atol=0, msg=name)
            n += 1
        self.assertEqual(n, len(self.up))

    def test_dense_mlp_and_rmsnorm_forward(self):
        x = torch.randn(6, self.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
        up_layer = self.upstream.model.layers[0]
        my_layer = self.ours.model.layers[0]
        torch.testing.assert_close(my_layer.mlp(x), up_layer.mlp(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            rms_norm(x, my_layer.input_layernorm, self.cfg.rms_norm_eps),
            up_layer.input_layernorm.forward_native(x),
            rtol=1e-6,
            atol=1e-6,
        )

    def test_moe_router_and_topk(self):
        x = torch.randn(32, self.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
        up_moe, my_moe = self.upstream.model.layers[1].mlp, self.ours.model.layers[1].mlp
        logits = up_moe.gate(x)
        w_up, ids_up = biased_grouped_topk_impl(
            x, logits, up_moe.gate.e_score_correction_bias, self.cfg.num_experts_per_token, True,
            self.cfg.num_expert_group, self.cfg.topk_group,
            routed_scaling_factor=self.cfg.routed_scaling_factor, apply_routed_scaling_factor_on_output=True,
        )
        w_me, ids_me = my_moe.route(x)
        order_up, order_me = ids_up.long().sort(-1), ids_me.sort(-1)
        torch.testing.assert_close(order_me.values, order_up.values)
        torch.testing.assert_close(w_me.gather(1, order_me.indices), w_up.gather(1, order_up.indices), rtol=1e-5, atol=1e-6)

    def test_attn_res_aggregation(self):
        D = self.cfg.hidden_size
        gen = torch.Generator().manual_seed(2)
        prefix, bank = torch.randn(5, D, generator=gen), torch.randn(5, 3, D, generator=gen)
        layer_up, layer_me = self.upstream.model.layers[4], self.ours.model.layers[4]
        ref = aggregate_stream_torch(prefix, bank, 2, layer_up.self_attention_res_proj, layer_up.self_attention_res_norm)
        rows = torch.cat([bank[:, :2], prefix[:, None]], dim=1)
        ours = attn_res_mix(rows, layer_me.attn_score.norm, layer_me.attn_score.proj, self.cfg.rms_norm_eps)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)

    # ------------------------------------------------------------------ blocks end to end
    def _moe_pair(self, layer_id):
        return self.upstream.model.layers[layer_id].mlp, self.ours.model.layers[layer_id].mlp

    @staticmethod
    def _cuda_runner_scaling():
        """Upstream's CPU experts (``moe_forward_native``) drop ``routed_scaling_factor``; on CUDA the
        Triton runner's ``moe_sum_reduce`` applies it whenever the top-k did not
        (``should_fuse_routed_scaling_factor_in_topk`` False, as for K3's unquantized experts)."""
        import sglang.srt.layers.moe.fused_moe_native as native

        orig = native.moe_forward_native

        def scaled(layer, x, topk_output, cfg):
            out = orig(layer, x, topk_output, cfg)
            if layer.should_fuse_routed_scaling_factor_in_topk or cfg.routed_scaling_factor in (None, 1.0):
                return out
            return out * cfg.routed_scaling_factor

        return mock.patch.object(native, "moe_forward_native", scaled)

    def test_moe_block_forward_matches_upstream_block(self):
        x = torch.randn(7, self.cfg.hidden_size, generator=torch.Generator().manual_seed(3))
        for layer_id in (1, 5):
            up_moe, my_moe = self._moe_pair(layer_id)
            self.assertFalse(up_moe.experts.should_fuse_routed_scaling_factor_in_topk)
            with torch.no_grad(), self._cuda_runner_scaling():
                ref = up_moe(x)
                ours = my_moe(x)
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5, msg=f"layer {layer_id}")

    def test_moe_block_with_routing_through_our_hook(self):
        """Upstream's block routes through ``select_experts``' call of ``topk.biased_grouped_topk``; with our
        AROUND hook there and the device declared CUDA, the block's output is unchanged (hook taken)."""
        from sglang.srt.layers.moe import topk as topk_mod
        from sglang_hybrid.layers.moe import routing_hook

        x = torch.randn(9, self.cfg.hidden_size, generator=torch.Generator().manual_seed(4))
        up_moe, my_moe = self._moe_pair(2)
        taken = []
        route = routing_hook.route
        hooked = functools.partial(routing_hook._around_biased_grouped_topk, topk_mod.biased_grouped_topk)
        with torch.no_grad(), self._cuda_runner_scaling(), \
                mock.patch.object(topk_mod, "biased_grouped_topk", hooked), \
                mock.patch.object(routing_hook, "device_kind", lambda t: "cuda"), \
                mock.patch.object(routing_hook, "route", lambda *a, **k: taken.append(a) or route(*a, **k)):
            ref = up_moe(x)
        self.assertEqual(len(taken), 1)
        torch.testing.assert_close(my_moe(x), ref, rtol=1e-5, atol=1e-5)

    def _upstream_stream(self, emb, attn_outs, mlp_outs):
        """The reads of upstream's attention-residual bank in KimiK3DecoderLayer's order (its stage
        boundaries' calls of AttnBankState, then the model's final read); returns every read's output."""
        from sglang.srt.layers.layer_boundary.residual.attn_bank import AttnBankState

        model = self.upstream.model
        bank = model.attn_bank
        bank.open(emb, -(-len(model.layers) // self.cfg.attn_res_block_size))
        reads, residual = [], None
        try:
            for i, layer in enumerate(model.layers):
                state = AttnBankState(bank, layer.self_attention_res_proj, layer.self_attention_res_norm,
                                      layer.mlp_res_proj, layer.mlp_res_norm, writes_block=layer.is_block_write_layer)
                if i == 0:  # the stack's input is the head
                    normed, residual = state.read_attn_input(emb, layer.input_layernorm)
                else:
                    normed, residual = state.update_and_read_attn_input(mlp_outs[i - 1], residual, layer.input_layernorm)
                reads.append(normed)
                # a write layer's attention read leaves the residual empty: the attention output is the head
                normed, residual = state.update_and_read_ffn_input(attn_outs[i], residual, layer.post_attention_layernorm)
                reads.append(normed)
            normed, _ = model._final_read(mlp_outs[-1], residual)
            reads.append(normed)
            self.assertEqual(bank.require().num_valid_blocks, bank.require().block_residual.shape[1])
        finally:
            bank.close()
        return reads

    def _our_stream(self, emb, attn_outs, mlp_outs):
        stream, reads = _ResidualStream(self.cfg.rms_norm_eps), []
        contribution = emb
        for layer, a, m in zip(self.ours.model.layers, attn_outs, mlp_outs):
            reads.append(stream.read(contribution, layer.attn_score, layer.input_layernorm, write=layer.writes_block))
            reads.append(stream.read(a, layer.mlp_score, layer.post_attention_layernorm, write=False))
            contribution = m
        reads.append(stream.read(contribution, self.ours.model.output_score, self.ours.model.norm, write=False))
        return reads

    def _stream_inputs(self, seed):
        gen, D, L = torch.Generator().manual_seed(seed), self.cfg.hidden_size, self.cfg.num_hidden_layers
        emb = torch.randn(5, D, generator=gen)
        return emb, [torch.randn(5, D, generator=gen) for _ in range(L)], [torch.randn(5, D, generator=gen) for _ in range(L)]

    def _through_attn_res_hook(self, refuse_contract: bool):
        """Upstream's module-level aggregation functions wrapped by our AROUND hooks, device declared CUDA.
        Our kernel runs its torch twin here (the Triton kernel needs the interpreter: test_attn_res_hook.py)."""
        from sglang.srt.layers import attn_residual
        from sgl_hybrid_kernel.attn_res.fused_reference import attn_res_rmsnorm_reference
        from sglang_hybrid.layers import attn_res_hook

        def never(*a, **k):
            raise AssertionError("reached upstream's Triton aggregation (it does not tile D = 128)")

        patches = [
            mock.patch.object(attn_residual, "_aggregate", functools.partial(attn_res_hook._around_aggregate, never)),
            mock.patch.object(attn_residual, "_aggregate_fused_add",
                              functools.partial(attn_res_hook._around_aggregate_fused_add, never)),
            mock.patch.object(attn_res_hook, "device_kind", lambda t: "cuda"),
            mock.patch.object(attn_res_hook, "attn_res_rmsnorm_triton", attn_res_rmsnorm_reference),
        ]
        if refuse_contract:
            patches.append(mock.patch.object(attn_res_hook, "_why_not_triton", lambda x, bank: "refused (test)"))
        return patches

    def test_attn_res_stream_through_upstream_bank_and_our_hook(self):
        """Upstream's bank semantics (which head is written when, what each read mixes, the final read over
        a full bank) through our hook, against our reference stream: every one of the 2L + 1 reads."""
        for refuse in (False, True):  # our kernel; upstream's eager reference (the hook's fallback off 1024)
            emb, attn_outs, mlp_outs = self._stream_inputs(5)
            patches = self._through_attn_res_hook(refuse)
            with torch.no_grad(), contextlib.ExitStack() as stack:
                for p in patches:
                    stack.enter_context(p)
                ref = self._upstream_stream(emb, attn_outs, mlp_outs)
            with torch.no_grad():
                ours = self._our_stream(emb, attn_outs, mlp_outs)
            self.assertEqual(len(ours), len(ref))
            for i, (a, b) in enumerate(zip(ours, ref)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"read {i} (refuse_contract={refuse})")

    def test_kda_layer_plumbing_matches_upstream_layer(self):
        """Upstream's KimiK3DeltaAttention.forward (extend) on CPU around the recurrence: its [q,k,v,g] / b /
        f_a -> f_b projections reach RadixLinearAttention as ours do, and the same core output leaves through
        the sigmoid-gated output norm and o_proj as ours. The recurrence is stubbed (one fixed core output
        for both; upstream's kernels vs ours: test/srt/layers/test_kda_upstream_kernels.py, which also checks
        upstream's FusedRMSNormGated, here replaced by its torch twin: its Triton kernel needs the interpreter)."""
        from types import SimpleNamespace

        from sgl_hybrid_kernel.norm.reference import gated_rms_norm
        from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        la = self.cfg.linear_attn_config
        H, K, N = la["num_heads"], la["head_dim"], 6
        gen = torch.Generator().manual_seed(6)
        x = torch.randn(N, self.cfg.hidden_size, generator=gen)
        core = torch.randn(1, N, H, K, generator=gen)
        mode = ForwardMode.EXTEND
        batch = SimpleNamespace(forward_mode=mode, logical_forward_mode=mode)
        seen = {}

        class _Recurrence(torch.nn.Module):  # stands in for RadixLinearAttention
            def __init__(self, name):
                super().__init__()
                self.name = name

            def forward(self, forward_batch, mixed_qkv, a, b):
                seen[self.name] = (mixed_qkv.reshape(N, -1), a.reshape(N, -1), b.reshape(N, -1))
                return core.clone()

        def stub(name):
            return _Recurrence(name)

        def onorm(module, x, g):
            return gated_rms_norm(x.reshape(g.shape), g, module.weight, module.eps, module.activation)

        up_attn, my_attn = self.upstream.model.layers[0].self_attn, self.ours.model.layers[0].self_attn
        with torch.no_grad(), mock.patch.object(up_attn, "attn", stub("up")), \
                mock.patch.object(my_attn, "attn", stub("me")), mock.patch.object(FusedRMSNormGated, "forward", onorm):
            ref = up_attn(x, None, batch, None)
            ours = my_attn(x, batch)
        self.assertEqual(up_attn.o_norm.activation, "sigmoid")
        self.assertEqual(up_attn.o_norm.eps, my_attn.norm_eps)
        for name, a, b in zip(("mixed_qkv", "forget gate", "beta"), seen["me"], seen["up"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
