"""Our Qwen3.8-Flash-Next CPU reference model against upstream SGLang 0.5.23's own ``qwen4_exp`` classes.

Upstream's ``Qwen4ExpForConditionalGeneration`` cannot run a whole forward pass on
CPU (GPU attention backends, Triton GDN and FusedMoE kernels), but it can be
built here, it loads our checkpoint, and several of its layers run on CPU. So:

* upstream's config class parses our ``config.json`` to the layer pattern and the
  state-pool shapes (GDN, PLE short conv, n-gram context) our model assumes;
* upstream's class loads our checkpoint through its own ``load_weights``: every
  non-vision parameter is filled, and holds exactly our values (same for the MTP
  class ``Qwen4ExpForCausalLMMTP``);
* upstream code that runs on CPU gives our results: the n-gram hash and the whole
  PLE layer (state included), the gated hyper-connection read / write-back / final
  read, the QSA projections, RoPE and compressed keys, the QSA token selection
  (upstream's CPU scoring, top-k and block expansion), the MoE router, and the MTP
  input fusion.
"""

from __future__ import annotations

import types
import unittest
from unittest import mock

import torch
import torch._dynamo

from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.test.layer_ut_utils import init_single_process_dist
from sglang_hybrid.bench.server import free_port
from tiny_model import tiny_qwen38

import sglang.srt.models.qwen4_exp as upstream  # noqa: E402  (after sglang's own imports)
from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig
from sglang.srt.configs.update_config import adjust_tp_num_heads_if_necessary
from sglang.srt.layers.attention.qsa.config import parse_qsa_profile
from sglang.srt.layers.attention.qsa.kernel import average_pool_qsa_keys, qsa_fast_topk, torch_expand_qsa_block_indices
from sglang.srt.layers.attention.qsa.mqa import torch_qsa_mqa_prefill
from sglang.srt.layers.moe.topk import fused_topk_torch_native
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.models.qwen4_exp_mtp import Qwen4ExpForCausalLMMTP
from sglang_hybrid.models.qwen38 import Qwen38ReferenceForConditionalGeneration
from sglang_hybrid.models.qwen38.mtp import Qwen38ReferenceMTP
from sglang_hybrid.models.qwen38.ple import ngram_ids
from sglang_hybrid.models.qwen38.qsa import qsa_selection_mask

EOS = 0


def _weights(model_dir):
    return safetensors_weights_iterator([f"{model_dir}/model.safetensors"])


def _our_name(name: str) -> str:
    """Upstream parameter name -> ours (same tree; upstream hangs QSA on the layer itself)."""
    for a, b in (
        (".qkv_proj.", ".self_attn.qkv_proj."), (".o_proj.", ".self_attn.o_proj."),
        (".q_norm.", ".self_attn.q_norm."), (".k_norm.", ".self_attn.k_norm."),
        (".indexer.index_qk_proj.", ".self_attn.index_qk_proj."),
        (".indexer.q_layernorm.", ".self_attn.index_q_norm."), (".indexer.k_layernorm.", ".self_attn.index_k_norm."),
        (".experts.w13_weight", ".w13"), (".experts.w2_weight", ".w2"),
        (".ple_embedding.ngram_embedding.weight", ".ngram_embedding"),
    ):
        name = name.replace(a, b)
    for suffix in ("linear_attn.conv1d.weight", "ple.conv1d.weight", "ple.key_proj.weight", "ple.value_proj.weight",
                   "norm_key.weight", "norm_query.weight", "norm_conv.weight", "linear_attn.norm.weight",
                   "hc_norm.weight", "input_mix_weight_down.weight", "input_mix_weight_up.weight",
                   "block_inject_weight.weight", "in_proj_qkvz.weight", "in_proj_ba.weight", "out_proj.weight",
                   "self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "q_norm.weight", "k_norm.weight",
                   "index_qk_proj.weight", "index_q_norm.weight", "index_k_norm.weight", "gate_up_proj.weight",
                   "shared_expert.down_proj.weight", "fc_embedding.weight", "fc_hidden.weight",
                   "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight"):
        if name.endswith(suffix):
            return name[: -len(".weight")]
    return name


class TestQwen38UpstreamParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        init_single_process_dist(free_port())
        cls.model_dir = tiny_qwen38()
        cls.cfg = Qwen4ExpConfig.from_pretrained(cls.model_dir)
        cls.text = cls.cfg.text_config
        adjust_tp_num_heads_if_necessary(cls.text, 1, True)  # upstream's class reads the *_cpu head counts on CPU
        torch.set_default_dtype(torch.float32)
        cls.upstream = upstream.Qwen4ExpForConditionalGeneration(cls.cfg)
        cls.upstream_loaded = cls.upstream.load_weights(_weights(cls.model_dir))
        cls.ours = Qwen38ReferenceForConditionalGeneration(cls.cfg)
        cls.ours.load_weights(_weights(cls.model_dir))
        cls.up = {n: p for n, p in cls.upstream.named_parameters() if not n.startswith("visual.")}
        cls.me = dict(cls.ours.named_parameters())
        cls.gen = torch.Generator().manual_seed(0)

    # ------------------------------------------------------------------ config and weights
    def test_upstream_config_parses_our_checkpoint(self):
        t = self.text
        self.assertEqual(type(self.cfg).model_type, "qwen4_exp")
        self.assertEqual(t.full_attention_layer_ids, [3, 7])
        self.assertEqual(t.linear_layer_ids, [0, 1, 2, 4, 5, 6])
        shape = t.mamba2_cache_params.shape
        conv = 2 * t.linear_num_key_heads * t.linear_key_head_dim + t.linear_num_value_heads * t.linear_value_head_dim
        self.assertEqual(shape.conv, [(conv, t.linear_conv_kernel_dim - 1)])  # our GDN backend's conv layout
        self.assertEqual(shape.temporal, (t.linear_num_value_heads, t.linear_value_head_dim, t.linear_key_head_dim))
        self.assertEqual(t.short_conv_layer_ids, [0, 4])  # PLE on layers 1 and 5 (1-based)
        self.assertEqual(t.short_conv_state_shape, (t.hc_count * t.hidden_size, (t.ple_conv_kernel_size - 1) * t.ngram_size))
        self.assertEqual(t.ngram_context_len, t.ngram_size - 1)
        profile = parse_qsa_profile(self.cfg)
        self.assertEqual((profile.budget, profile.compress_ratio, profile.block_topk), (1024, 2, 512))

    def test_upstream_class_loads_every_parameter_with_our_values(self):
        self.assertEqual(set(self.up) - set(self.upstream_loaded), set())
        for name, p in self.up.items():
            mine = self.me[_our_name(name)]
            if mine.dim() == p.dim() - 1:  # conv weights [C, K] vs upstream's [C, 1, K]
                mine = mine.unsqueeze(1)
            if "ngram_embedding" in name:  # upstream pads the table rows to 64
                p = p[: mine.shape[0]]
            self.assertEqual(tuple(p.shape), tuple(mine.shape), name)
            torch.testing.assert_close(p.data.float(), mine.data.float(), rtol=0, atol=0, msg=name)
        self.assertEqual(len(self.me), len(self.up))

    def test_mtp_weights_match_upstream_mtp_class(self):
        up_mtp = Qwen4ExpForCausalLMMTP(self.cfg)
        loaded = up_mtp.load_weights(_weights(self.model_dir))
        params = {n: p for n, p in up_mtp.named_parameters() if n not in ("lm_head.weight", "model.embed_tokens.weight")}
        self.assertEqual(set(params) - set(loaded), set())
        mine_mtp = Qwen38ReferenceMTP(self.cfg)
        mine_mtp.load_weights(_weights(self.model_dir))
        me = dict(mine_mtp.named_parameters())
        for name, p in params.items():
            ours = _our_name(name.replace("model.layers.0.", "layer.").replace("model.hyper_connection_mixer.", "hyper_connection_mixer."))
            torch.testing.assert_close(p.data.float(), me[ours].data.float(), rtol=0, atol=0, msg=name)
        self.assertEqual(len(me), len(params))
        # input fusion: upstream's GemmaRMSNorm pieces through forward_native (the CPU op is AMX-only)
        D, hc = self.text.hidden_size, self.text.hc_count
        e, s = torch.randn(5, D, generator=self.gen), torch.randn(5, hc * D, generator=self.gen)
        with torch.no_grad():
            ref = up_mtp.fc_embedding(up_mtp.pre_fc_norm_embedding.forward_native(e)).unsqueeze(-2)
            ref = ref + up_mtp.fc_hidden(up_mtp.pre_fc_norm_hidden.forward_native(s).view(5, hc, D))
            torch.testing.assert_close(mine_mtp.fuse(e, s), ref.view(5, hc * D), rtol=1e-5, atol=1e-5)

    # ------------------------------------------------------------------ PLE
    def _windows(self, T):
        toks = torch.randint(1, self.text.vocab_size, (T,), generator=self.gen)
        toks[[3, 4, 17, 30]] = EOS  # n-grams must restart after an EOS
        ctx = torch.cat([torch.full((self.text.ngram_size - 1,), EOS), toks])
        return ctx, ctx.unfold(0, self.text.ngram_size, 1)

    def test_ngram_hash_equals_upstream(self):
        for layer in (0, 4):
            up_emb, me = self.upstream.model.layers[layer].ple.ple_embedding, self.ours.model.layers[layer].ple
            self.assertEqual(up_emb.layer_multipliers.tolist(), me.multipliers)
            self.assertEqual(up_emb.ngram_heads_vocab_sizes.tolist(), me.head_sizes)
            _, windows = self._windows(60)
            with mock.patch.object(upstream, "get_req_to_token_pool", lambda: types.SimpleNamespace(ple_window_cache=None)):
                ref = up_emb._hash_contexts(windows)
            torch.testing.assert_close(ngram_ids(windows, me.multipliers, me.head_sizes, me.heads_per_ngram, EOS), ref,
                                       rtol=0, atol=0)

    def test_ple_layer_and_conv_state_equal_upstream(self):
        """Upstream's whole PLE layer on a one-request extend batch (stub pool), state included."""
        T = 50
        up_ple, me = self.upstream.model.layers[0].ple, self.ours.model.layers[0].ple
        ctx, windows = self._windows(T)
        C, S = up_ple.conv_channels, up_ple.short_conv_state_len
        state = torch.zeros(2, C, S)
        state[1] = torch.randn(C, S, generator=self.gen)  # a resumed request: the window of an earlier chunk
        pool = types.SimpleNamespace(ple_window_cache=None, short_conv_layer_cache=lambda layer_id: state)
        batch = upstream._PLEBatch(
            mode=ForwardMode.EXTEND, use_decode_fast_path=False, physical_tokens=T, processed_tokens=T,
            lengths=torch.tensor([T]), row_width=T, req_indices=torch.zeros(T, dtype=torch.long),
            token_offsets=torch.arange(T), valid_tokens=torch.ones(T, dtype=torch.bool), state_indices=torch.tensor([1]),
            ngram_context=ctx.unsqueeze(0), ngram_eos_token_id=EOS)
        fb = types.SimpleNamespace(mamba_track_indices=None, mamba_track_mask=None, global_dp_buffer_len=None)
        streams = torch.randn(T, C, generator=self.gen)
        with torch.no_grad():
            mine, xx = me.forward_sequence(streams, windows, state[1].t().clone())
            # the table is BF16-exact; read it out in FP32 so the rest runs in FP32 as ours
            with mock.patch.object(up_ple.ple_embedding.ngram_embedding, "output_dtype", torch.float32), \
                    mock.patch.object(upstream, "get_req_to_token_pool", lambda: pool):
                ref = up_ple(streams, fb, batch)
        torch.testing.assert_close(mine, ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(xx[T:].t(), state[1], rtol=0, atol=0)

    # ------------------------------------------------------------------ residual streams
    def test_gated_streams_equal_upstream_gated_residual(self):
        C = self.text.hc_count * self.text.hidden_size
        s, out = torch.randn(7, C, generator=self.gen), torch.randn(7, self.text.hidden_size, generator=self.gen)
        for up_site, me_site, combine in (
            (self.upstream.model.layers[3].mlp_hyper_connection, self.ours.model.layers[3].mlp_hyper_connection, True),
            (self.upstream.model.hyper_connection_mixer, self.ours.model.hyper_connection_mixer, False),
        ):
            # upstream keeps these weights (BF16-exact in our checkpoint) in BF16 and casts its
            # outputs to BF16; run it in FP32 and eagerly (its math is torch.compile'd)
            with torch.no_grad(), torch._dynamo.config.patch(disable=True), \
                    mock.patch.object(up_site, "params_dtype", torch.float32):
                site = up_site.float()
                x_ref, res = site.mix(s)
                x, xn = me_site.mix(s)
                torch.testing.assert_close(x, x_ref, rtol=1e-6, atol=1e-6)
                if combine:
                    torch.testing.assert_close(me_site.combine(out, s, xn), site.combine(out, res), rtol=1e-6, atol=1e-6)

    # ------------------------------------------------------------------ QSA
    def test_qsa_projections_rope_and_compressed_keys_equal_upstream(self):
        up_layer, me = self.upstream.model.layers[3], self.ours.model.layers[3].self_attn
        L, hd = 300, me.hd
        x, pos = torch.randn(L, self.text.hidden_size, generator=self.gen), torch.arange(L)
        with torch.no_grad():
            q, gate, k, v, iq, ik = me.project(x, pos)
            qkv, _ = up_layer.qkv_proj(x)
            qg, k_ref, v_ref = qkv.split([up_layer.q_size * 2, up_layer.kv_size, up_layer.kv_size], dim=-1)
            q_ref, gate_ref = torch.chunk(qg.view(L, up_layer.num_heads, -1), 2, dim=-1)
            q_ref = up_layer.q_norm.forward_native(q_ref.reshape(-1, hd)).view(L, -1)
            k_ref = up_layer.k_norm.forward_native(k_ref.reshape(-1, hd)).view(L, -1)
            q_ref, k_ref = up_layer.rotary_emb.forward_native(pos, q_ref, k_ref)
            # upstream's cos/sin are FP32 (ours FP64): a few ulps at position 300
            torch.testing.assert_close(q, q_ref.view_as(q), rtol=2e-5, atol=2e-5)
            torch.testing.assert_close(k, k_ref.view_as(k), rtol=2e-5, atol=2e-5)
            torch.testing.assert_close(v, v_ref.view_as(v), rtol=0, atol=0)
            torch.testing.assert_close(gate, gate_ref.reshape_as(gate), rtol=0, atol=0)
            iq_ref, ik_ref, _ = up_layer.indexer.project_qk(x, pos)
            torch.testing.assert_close(iq, iq_ref, rtol=2e-5, atol=2e-5)
            torch.testing.assert_close(ik, ik_ref[:, 0], rtol=0, atol=0)
            r = me.ratio
            pooled = average_pool_qsa_keys(ik[: L // r * r].view(L // r, r, 1, -1))
            ref_keys = up_layer.indexer.normalize_compressed_keys(pooled, torch.arange(L // r) * r)
            torch.testing.assert_close(me.block_keys(ik), ref_keys[:, 0], rtol=2e-5, atol=2e-5)

    def test_qsa_selection_equals_upstream_cpu_selection(self):
        """Past the budget (1,024 tokens) the selection is sparse; compare every query row."""
        me = self.ours.model.layers[7].self_attn
        L, r, topk = 1100, me.ratio, me.block_topk
        with torch.no_grad():
            _, _, _, _, iq, ik = me.project(torch.randn(L, self.text.hidden_size, generator=self.gen), torch.arange(L))
            keys = me.block_keys(ik)
        qpos = torch.arange(990, L)
        starts = torch.zeros(len(qpos), dtype=torch.int32)
        ends = ((qpos + 1) // r).to(torch.int32)
        logits = torch_qsa_mqa_prefill(iq[qpos], keys.unsqueeze(1), starts, ends)
        blocks = qsa_fast_topk(logits, starts, ends, topk)
        tokens = torch_expand_qsa_block_indices(blocks, qpos, torch.full((len(qpos),), L), r, topk * r)
        ref = torch.zeros(len(qpos), L, dtype=torch.bool)
        for i in range(len(qpos)):
            ref[i, tokens[i][tokens[i] >= 0].long()] = True
        mask = qsa_selection_mask(iq[qpos], keys, qpos, L, r, topk)
        torch.testing.assert_close(mask, ref, rtol=0, atol=0)
        # the last query keeps its budget of blocks plus its incomplete tail: sparse, fewer than all L tokens
        self.assertEqual(int(mask[-1].sum()), topk * r + L % r)
        self.assertLess(int(mask[-1].sum()), L)

    # ------------------------------------------------------------------ MoE
    def test_moe_router_equals_upstream_softmax_topk(self):
        x = torch.randn(64, self.text.hidden_size, generator=self.gen)
        me = self.ours.model.layers[2].mlp
        logits = self.upstream.model.layers[2].mlp.gate(x)[0]
        w_ref, ids_ref = fused_topk_torch_native(x, logits, self.text.num_experts_per_tok, renormalize=True)
        w, ids = me.route(x)
        o_ref, o = ids_ref.long().sort(-1), ids.sort(-1)
        torch.testing.assert_close(o.values, o_ref.values, rtol=0, atol=0)
        torch.testing.assert_close(w.gather(1, o.indices), w_ref.gather(1, o_ref.indices), rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    unittest.main()
