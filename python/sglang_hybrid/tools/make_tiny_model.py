"""Build a tiny random-weight checkpoint in upstream SGLang 0.5.23's schema.

    python -m sglang_hybrid.tools.make_tiny_model --arch kimi-k3 --out DIR [--seed 0] [--vocab-size 32000]
    python -m sglang_hybrid.tools.make_tiny_model --arch kimi-k3-shaped --out DIR
    python -m sglang_hybrid.tools.make_tiny_model --arch qwen3.8-flash-next --out DIR

Writes ``config.json``, ``model.safetensors`` with upstream's tensor names, and
an offline-trained byte-level BPE tokenizer. The same seed gives byte-identical
files.

* ``kimi-k3``: model type ``kimi_linear``, architecture
  ``KimiK3LinearForCausalLM`` (the fields of ``sglang/srt/configs/kimi_linear.py``).
* ``kimi-k3-shaped``: the same schema with Kimi K3's per-rank attention geometry at
  TP8 (MLA: 12 heads, ``kv_lora_rank`` 512, rope 64, nope 128, value 128; KDA: 12
  heads of 128, the shapes upstream's fused KDA decode is compiled for), small
  elsewhere: 4 layers (KDA, MLA, KDA, MLA), hidden 128, 8 experts, the 965-token
  vocabulary. For upstream's GPU kernels, which do not take the tiny geometry.
* ``qwen3.8-flash-next``: model type ``qwen4_exp`` with a nested ``text_config``
  (``qwen4_exp_text``), architecture ``Qwen4ExpForConditionalGeneration`` (the
  fields of ``sglang/srt/configs/qwen4_exp.py``): GDN + QSA layers, gated
  hyper-connection streams, per-layer n-gram embeddings (PLE), MoE with a gated
  shared expert, and one MTP layer (``mtp.*`` tensors).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Callable, Dict, List, Optional

import torch

from sglang_hybrid.tools.tokenizer import BOS_TOKEN, EOS_TOKEN, write_tokenizer

ARCHS = ("kimi-k3", "kimi-k3-shaped", "qwen3.8-flash-next")
DEFAULT_LAYERS = {"kimi-k3": 8, "kimi-k3-shaped": 4, "qwen3.8-flash-next": 8}


def kimi_k3_tiny_config(vocab_size: int, bos_id: int, eos_id: int, dtype: str, num_layers: int = 8) -> Dict:
    """A Kimi K3-shaped config, scaled down (full size in the comments).

    Layer pattern as Kimi Linear / K3: three KDA layers then one MLA layer
    (K3: 69 KDA + 24 MLA of 93). Layer 0 is dense, the rest MoE.
    """
    full = [i for i in range(1, num_layers + 1) if i % 4 == 0]
    kda = [i for i in range(1, num_layers + 1) if i % 4 != 0]
    return {
        "architectures": ["KimiK3LinearForCausalLM"],
        "model_type": "kimi_linear",
        "dtype": dtype,
        "vocab_size": vocab_size,
        "hidden_size": 128,  # K3: 7168
        "intermediate_size": 256,  # dense MLP of the first layer
        "num_hidden_layers": num_layers,  # K3: 93
        "num_attention_heads": 4,  # K3: 96 (12 per GPU at TP8)
        "num_key_value_heads": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        # MLA (K3: kv_lora_rank 512, rope 64 -> 576 values per token and layer)
        "q_lora_rank": None,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        # KDA (K3: 96 heads of 128)
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": 4,
            "head_dim": 32,
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
            "gate_lower_bound": -5.0,
        },
        # MoE (K3: 896 routed experts, top-16, shared expert)
        "num_experts": 8,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 64,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "use_grouped_topk": True,
        "num_expert_group": 2,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        # Attention residuals: a bank snapshot every 3 layers
        "attn_res_block_size": 3,
        "num_nextn_predict_layers": 0,
    }


def kimi_k3_shaped_tiny_config(vocab_size: int, bos_id: int, eos_id: int, dtype: str, num_layers: int = 4) -> Dict:
    """:func:`kimi_k3_tiny_config` with Kimi K3's attention geometry per TP8 rank, small elsewhere.

    MLA: 12 heads (K3: 96, 12 per rank), ``kv_lora_rank`` 512 + rope 64 (576 cache values per
    token, what upstream's Triton MLA decode and our ``mla_split_kv_kernel`` are tuned for),
    nope 128, value 128. KDA: 12 heads of 128, so at TP1 upstream's fused KDA decode
    (``KimiK3DeltaAttention._prepare_fused_decode``: conv ``[3 * 12 * 128, 4]``, ``A_log`` of 12,
    ``dt_bias`` of 12 * 128, all FP32) takes the layers. Layers alternate KDA and MLA (K3: three
    KDA per MLA) so that four layers hold two of each; layer 0 dense, the rest MoE (8 experts,
    top 2, shared expert); hidden 128.
    """
    cfg = kimi_k3_tiny_config(vocab_size, bos_id, eos_id, dtype, num_layers)
    cfg.update({
        "num_attention_heads": 12,  # K3: 96 (12 per GPU at TP8)
        "num_key_value_heads": 12,
        "head_dim": 128,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    })
    cfg["linear_attn_config"].update({
        "kda_layers": [i for i in range(1, num_layers + 1) if i % 2 == 1],
        "full_attn_layers": [i for i in range(1, num_layers + 1) if i % 2 == 0],
        "num_heads": 12,  # K3: 96 (12 per GPU at TP8)
        "head_dim": 128,
    })
    return cfg


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def kimi_k3_tensor_specs(cfg: Dict) -> Dict[str, tuple]:
    """Checkpoint tensor name -> (shape, init kind). Names are upstream's."""
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    la = cfg["linear_attn_config"]
    H, K, C = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    P = H * K
    nq = cfg["num_attention_heads"]
    nope, rope, vdim, R = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    E, I = cfg["num_experts"], cfg["moe_intermediate_size"]
    specs: Dict[str, tuple] = {
        "model.embed_tokens.weight": ((V, D), "embed"),
        "model.norm.weight": ((D,), "ones"),
        "lm_head.weight": ((V, D), "linear"),
    }
    if cfg.get("attn_res_block_size") is not None:
        specs["model.output_attn_res_norm.weight"] = ((D,), "ones")
        specs["model.output_attn_res_proj.weight"] = ((1, D), "linear")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        specs[f"{p}.input_layernorm.weight"] = ((D,), "ones")
        specs[f"{p}.post_attention_layernorm.weight"] = ((D,), "ones")
        if cfg.get("attn_res_block_size") is not None:
            for n in ("self_attention_res", "mlp_res"):
                specs[f"{p}.{n}_norm.weight"] = ((D,), "ones")
                specs[f"{p}.{n}_proj.weight"] = ((1, D), "linear")
        a = f"{p}.self_attn"
        if (i + 1) in la["kda_layers"]:
            for n in ("q_proj", "k_proj", "v_proj", "g_proj"):
                specs[f"{a}.{n}.weight"] = ((P, D), "linear")
            specs[f"{a}.b_proj.weight"] = ((H, D), "linear")
            specs[f"{a}.f_a_proj.weight"] = ((K, D), "linear")
            specs[f"{a}.f_b_proj.weight"] = ((P, K), "linear")
            for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
                specs[f"{a}.{n}.weight"] = ((P, 1, C), "conv")
            specs[f"{a}.A_log"] = ((H,), "a_log")
            specs[f"{a}.dt_bias"] = ((P,), "dt_bias")
            specs[f"{a}.o_norm.weight"] = ((K,), "ones")
            specs[f"{a}.o_proj.weight"] = ((D, P), "linear")
        else:
            specs[f"{a}.q_proj.weight"] = ((nq * (nope + rope), D), "linear")
            specs[f"{a}.kv_a_proj_with_mqa.weight"] = ((R + rope, D), "linear")
            specs[f"{a}.kv_a_layernorm.weight"] = ((R,), "ones")
            specs[f"{a}.kv_b_proj.weight"] = ((nq * (nope + vdim), R), "linear")
            specs[f"{a}.o_proj.weight"] = ((D, nq * vdim), "linear")
            if cfg.get("mla_use_output_gate"):
                specs[f"{a}.g_proj.weight"] = ((nq * vdim, D), "linear")
        m = f"{p}.mlp"
        if i >= cfg["first_k_dense_replace"] and i % cfg["moe_layer_freq"] == 0:
            specs[f"{m}.gate.weight"] = ((E, D), "linear")
            specs[f"{m}.gate.e_score_correction_bias"] = ((E,), "bias")
            for e in range(E):
                specs[f"{m}.experts.{e}.w1.weight"] = ((I, D), "linear")
                specs[f"{m}.experts.{e}.w3.weight"] = ((I, D), "linear")
                specs[f"{m}.experts.{e}.w2.weight"] = ((D, I), "linear")
            S = I * cfg["num_shared_experts"]
            if S:
                specs[f"{m}.shared_experts.gate_proj.weight"] = ((S, D), "linear")
                specs[f"{m}.shared_experts.up_proj.weight"] = ((S, D), "linear")
                specs[f"{m}.shared_experts.down_proj.weight"] = ((D, S), "linear")
        else:
            Id = cfg["intermediate_size"]
            specs[f"{m}.gate_proj.weight"] = ((Id, D), "linear")
            specs[f"{m}.up_proj.weight"] = ((Id, D), "linear")
            specs[f"{m}.down_proj.weight"] = ((D, Id), "linear")
    return specs


# ---------------------------------------------------------------- Qwen3.8-Flash-Next

QWEN38_ARCHITECTURE = "Qwen4ExpForConditionalGeneration"

# Image-processor settings in the Qwen2-VL schema (16-pixel patches, 2x2 merge);
# only present so upstream's multimodal processor can be built for a text server.
QWEN38_PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def qwen38_ngram_head_sizes(text_cfg: Dict, ple_layer_index: int) -> List[int]:
    """Per-head hash-table sizes of one PLE layer: the ``(g + 1)``-th prime >= ``ngram_vocab_size_base``
    for global head ``g = ple_layer_index * heads + h`` (upstream ``Qwen4ExpNGramEmbedding``)."""
    heads = (text_cfg["ngram_size"] - 1) * text_cfg["heads_per_ngram"]
    sizes, p = [], text_cfg["ngram_vocab_size_base"] - 1
    for _ in range(ple_layer_index * heads + heads):
        p += 1
        while not _is_prime(p):
            p += 1
        sizes.append(p)
    return sizes[ple_layer_index * heads :]


def qwen38_ngram_table_rows(text_cfg: Dict, ple_layer_index: int) -> int:
    """Rows of one PLE layer's n-gram table: the head sizes summed, padded to
    ``make_ngram_vocab_size_divisible_by``."""
    total = sum(qwen38_ngram_head_sizes(text_cfg, ple_layer_index))
    div = text_cfg["make_ngram_vocab_size_divisible_by"]
    return -(-total // div) * div


def qwen38_tiny_config(vocab_size: int, bos_id: int, eos_id: int, dtype: str, num_layers: int = 8) -> Dict:
    """A Qwen3.8-Flash-Next-shaped config, scaled down (article sizes in the comments).

    Layer pattern three GDN layers then one QSA layer (article: 36 GDN + 12 QSA of 48;
    checkpoints spell QSA layers ``full_attention``: the indexer fields make every
    full-attention layer sparse). PLE on layers 1 and 5 (1-based; PLE is only
    defined on GDN layers). QSA's indexer
    budget is the smallest upstream accepts (``budget / ratio`` must be 512 or
    2048), so selection is sparse only past 1,024 visible tokens.
    """
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)]
    text = {
        "model_type": "qwen4_exp_text",
        "dtype": dtype,
        "vocab_size": vocab_size,  # article: 248,320
        "hidden_size": 64,  # article: 2,560
        "intermediate_size": 128,
        "num_hidden_layers": num_layers,  # article: 48
        "layer_types": layer_types,
        "full_attention_interval": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        # QSA attention (article: 12 query heads per KV head, budget 2,048 tokens)
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "attn_output_gate": True,
        "indexer_n_heads": 16,  # many heads: a block scores exactly 0 (all heads negative) with p = 2**-16
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 1024,
        "indexer_compress_ratio": 2,
        # GDN (article: 48 value heads, state 128 x 128)
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        # MoE (article: 512 routed experts, top-10, shared expert of 640)
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        # four gated residual streams (article: 4 x 2,560 = 10,240, low rank 320)
        "hc_count": 4,
        "hc_lowrank": 16,
        # per-layer n-gram embeddings
        "ple_layer_ids": [i for i in (1, 5) if i <= num_layers and i % 4 != 0],
        "ple_embed_dim": 32,
        "ple_conv_kernel_size": 4,
        "ngram_size": 3,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": 97,
        "make_ngram_vocab_size_divisible_by": 128,
        "split_ngram_parts": 2,
        # MTP head (article: drafts up to 4 tokens with one MTP layer)
        "num_nextn_predict_layers": 1,
    }
    return {
        "architectures": [QWEN38_ARCHITECTURE],
        "model_type": "qwen4_exp",
        "dtype": dtype,
        "text_config": text,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def _qwen38_hc_specs(prefix: str, D: int, hc: int, r: int, combine: bool = True) -> Dict[str, tuple]:
    specs = {
        f"{prefix}.hc_norm.weight": ((hc * D,), "gemma_bf16"),
        f"{prefix}.input_mix_weight_down.weight": ((r, hc * D), "linear_bf16"),
        f"{prefix}.input_mix_weight_up.weight": ((hc * D, r), "linear_bf16"),
    }
    if combine:
        specs[f"{prefix}.block_inject_weight.weight"] = ((hc, hc * D), "linear_bf16")
    return specs


def _qwen38_layer_specs(t: Dict, p: str, is_linear: bool, ple_index: Optional[int]) -> Dict[str, tuple]:
    D, hc, r = t["hidden_size"], t["hc_count"], t["hc_lowrank"]
    specs: Dict[str, tuple] = {}
    specs.update(_qwen38_hc_specs(f"{p}.attn_hyper_connection", D, hc, r))
    specs.update(_qwen38_hc_specs(f"{p}.mlp_hyper_connection", D, hc, r))
    if is_linear:
        a = f"{p}.linear_attn"
        Hk, Hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
        Kd, Vd = Hk * t["linear_key_head_dim"], Hv * t["linear_value_head_dim"]
        specs[f"{a}.in_proj_qkv.weight"] = ((2 * Kd + Vd, D), "linear")
        specs[f"{a}.in_proj_z.weight"] = ((Vd, D), "linear")
        specs[f"{a}.in_proj_b.weight"] = ((Hv, D), "linear")
        specs[f"{a}.in_proj_a.weight"] = ((Hv, D), "linear")
        specs[f"{a}.conv1d.weight"] = ((2 * Kd + Vd, 1, t["linear_conv_kernel_dim"]), "conv")
        specs[f"{a}.A_log"] = ((Hv,), "a_log")
        specs[f"{a}.dt_bias"] = ((Hv,), "dt_bias")
        specs[f"{a}.norm.weight"] = ((t["linear_value_head_dim"],), "norm")
        specs[f"{a}.out_proj.weight"] = ((D, Vd), "linear")
    else:
        a = f"{p}.self_attn"
        H, KV, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
        n, idim = t["indexer_n_heads"], t["indexer_head_dim"]
        specs[f"{a}.q_proj.weight"] = ((2 * H * hd, D), "linear")  # per head: [query | output gate]
        specs[f"{a}.k_proj.weight"] = ((KV * hd, D), "linear")
        specs[f"{a}.v_proj.weight"] = ((KV * hd, D), "linear")
        specs[f"{a}.o_proj.weight"] = ((D, H * hd), "linear")
        specs[f"{a}.q_norm.weight"] = ((hd,), "gemma")
        specs[f"{a}.k_norm.weight"] = ((hd,), "gemma")
        specs[f"{a}.indexer.index_qk_proj.weight"] = (((n + t["indexer_kv_heads"]) * idim, D), "linear")
        specs[f"{a}.indexer.q_layernorm.weight"] = ((idim,), "gemma")
        specs[f"{a}.indexer.k_layernorm.weight"] = ((idim,), "gemma")
    m = f"{p}.mlp"
    E, I, S = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    specs[f"{m}.gate.weight"] = ((E, D), "linear")
    for e in range(E):
        specs[f"{m}.experts.{e}.gate_proj.weight"] = ((I, D), "linear")
        specs[f"{m}.experts.{e}.up_proj.weight"] = ((I, D), "linear")
        specs[f"{m}.experts.{e}.down_proj.weight"] = ((D, I), "linear")
    specs[f"{m}.shared_expert.gate_proj.weight"] = ((S, D), "linear")
    specs[f"{m}.shared_expert.up_proj.weight"] = ((S, D), "linear")
    specs[f"{m}.shared_expert.down_proj.weight"] = ((D, S), "linear")
    specs[f"{m}.shared_expert_gate.weight"] = ((1, D), "linear")
    if ple_index is not None:
        q = f"{p}.ple"
        E_ple = t["ple_embed_dim"]
        heads = (t["ngram_size"] - 1) * t["heads_per_ngram"]
        rows = qwen38_ngram_table_rows(t, ple_index)
        parts = t["split_ngram_parts"]
        shard = -(-rows // parts)
        for k in range(parts):
            n_rows = min(shard, rows - k * shard)
            if n_rows > 0:
                specs[f"{q}.ple_embedding.ngram_embedding.shard_{k}.weight"] = ((n_rows, E_ple // heads), "embed_bf16")
        specs[f"{q}.key_proj.weight"] = ((hc * D, E_ple), "linear")
        specs[f"{q}.value_proj.weight"] = ((D, E_ple), "linear")
        for nm in ("norm_key", "norm_query", "norm_conv"):
            specs[f"{q}.{nm}.weight"] = ((hc * D,), "gemma")
        specs[f"{q}.conv1d.weight"] = ((hc * D, 1, t["ple_conv_kernel_size"]), "conv")
    return specs


def qwen38_tensor_specs(cfg: Dict) -> Dict[str, tuple]:
    """Checkpoint tensor name -> (shape, init kind). Names are upstream's
    (``model.language_model.*`` as in Qwen3.5/Qwen4-Exp VL checkpoints, ``mtp.*``)."""
    t = cfg["text_config"]
    D, V, hc, r = t["hidden_size"], t["vocab_size"], t["hc_count"], t["hc_lowrank"]
    lm = "model.language_model"
    specs: Dict[str, tuple] = {
        f"{lm}.embed_tokens.weight": ((V, D), "embed"),
        "lm_head.weight": ((V, D), "linear"),
    }
    specs.update(_qwen38_hc_specs(f"{lm}.hyper_connection_mixer", D, hc, r, combine=False))
    ple_ids = sorted(set(t["ple_layer_ids"]))
    for i, kind in enumerate(t["layer_types"]):
        ple_index = ple_ids.index(i + 1) if (i + 1) in ple_ids else None
        specs.update(_qwen38_layer_specs(t, f"{lm}.layers.{i}", kind == "linear_attention", ple_index))
    if t.get("num_nextn_predict_layers", 0):
        specs["mtp.fc_embedding.weight"] = ((D, D), "linear")
        specs["mtp.fc_hidden.weight"] = ((D, D), "linear")
        specs["mtp.pre_fc_norm_embedding.weight"] = ((D,), "gemma")
        specs["mtp.pre_fc_norm_hidden.weight"] = ((hc * D,), "gemma")
        specs.update(_qwen38_layer_specs(t, "mtp.layers.0", False, None))
        specs.update(_qwen38_hc_specs("mtp.hyper_connection_mixer", D, hc, r, combine=False))
    return specs


def tensor_specs(cfg: Dict) -> Dict[str, tuple]:
    """Checkpoint tensor specs for either tiny architecture (chosen by ``cfg``'s model type)."""
    if cfg.get("model_type") == "qwen4_exp":
        return qwen38_tensor_specs(cfg)
    return kimi_k3_tensor_specs(cfg)


# Parameters SGLang keeps in FP32 whatever the model dtype.
_FP32_KINDS = {"a_log", "dt_bias", "bias"}


def _init(kind: str, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    if kind == "ones":
        return torch.ones(shape)
    if kind == "embed":
        return torch.randn(shape, generator=gen)
    if kind == "linear":
        return torch.randn(shape, generator=gen) * (shape[-1] ** -0.5)
    if kind == "conv":
        return torch.randn(shape, generator=gen) * (shape[-1] ** -0.5)
    if kind == "a_log":  # per-head decay rates in [1, 16], as fla initialises KDA
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if kind == "dt_bias":  # inverse softplus of dt ~ logU(1e-3, 1e-1)
        dt = torch.empty(shape).uniform_(0.0, 1.0, generator=gen) * (torch.log(torch.tensor(0.1)) - torch.log(torch.tensor(1e-3))) + torch.log(torch.tensor(1e-3))
        dt = dt.exp()
        return dt + torch.log(-torch.expm1(-dt))
    if kind == "bias":
        return torch.randn(shape, generator=gen) * 0.01
    if kind == "norm":  # a plain RMSNorm weight, near one but not one
        return 1.0 + torch.randn(shape, generator=gen) * 0.1
    if kind == "gemma":  # a Gemma RMSNorm weight (the norm multiplies by 1 + w)
        return torch.randn(shape, generator=gen) * 0.1
    if kind.endswith("_bf16"):  # upstream keeps these in BF16: BF16-exact values load losslessly
        return _init(kind[: -len("_bf16")], shape, gen).to(torch.bfloat16).float()
    raise ValueError(f"unknown init kind {kind!r}")


def build(
    arch: str,
    out: str,
    seed: int = 0,
    dtype: str = "float32",
    num_layers: Optional[int] = None,
    vocab_size: Optional[int] = None,
) -> Dict:
    """Write the tiny checkpoint into ``out``; returns the config dict.

    ``vocab_size`` (default: the tokenizer's size, 965) pads the model's
    vocabulary beyond the tokenizer: config ``vocab_size`` and the embedding /
    LM-head rows grow to it (random rows, deterministic per seed); the tokenizer
    is unchanged, so ids from its size up are valid model inputs and outputs
    without text. Used to serve upstream kits that send token ids up to 31,999.
    ``num_layers`` defaults to ``DEFAULT_LAYERS[arch]`` (8; 4 for ``kimi-k3-shaped``).

    Raises:
        ValueError: unknown ``arch`` or ``dtype``, ``num_layers`` < 1, or
            ``vocab_size`` below the tokenizer's size.
    """
    from safetensors.torch import save_file

    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {ARCHS}, got {arch!r}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if num_layers is None:
        num_layers = DEFAULT_LAYERS[arch]
    if num_layers < 1:
        raise ValueError(f"--num-layers must be >= 1, got {num_layers}")
    os.makedirs(out, exist_ok=True)
    tok = write_tokenizer(out)
    if vocab_size is not None and vocab_size < tok["vocab_size"]:
        raise ValueError(f"--vocab-size must be >= the tokenizer's {tok['vocab_size']}, got {vocab_size}")
    make_config = {"kimi-k3": kimi_k3_tiny_config, "kimi-k3-shaped": kimi_k3_shaped_tiny_config,
                   "qwen3.8-flash-next": qwen38_tiny_config}[arch]
    cfg = make_config(vocab_size or tok["vocab_size"], tok[BOS_TOKEN], tok[EOS_TOKEN], dtype, num_layers)
    tdtype = getattr(torch, dtype)
    tensors = {}
    for name, (shape, kind) in sorted(tensor_specs(cfg).items()):
        t = _init(kind, shape, _generator(seed, name))
        tensors[name] = (t.float() if kind in _FP32_KINDS else t.to(tdtype)).contiguous()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    if arch == "qwen3.8-flash-next":
        # Upstream lists Qwen4ExpForConditionalGeneration as multimodal, so the server
        # builds its processor (Qwen3VLProcessor) even for text: give it an image processor.
        with open(os.path.join(out, "preprocessor_config.json"), "w", encoding="utf-8") as f:
            json.dump(QWEN38_PREPROCESSOR, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, f, indent=2, sort_keys=True)
        f.write("\n")
    return cfg


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, choices=ARCHS)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--num-layers", type=int, default=None,
                        help="decoder layers (default: 8; 4 for kimi-k3-shaped, KDA and MLA alternating)")
    parser.add_argument(
        "--vocab-size", type=int, default=None,
        help="pad the model's vocabulary (embedding and LM-head rows) to this size; the tokenizer stays as is",
    )
    args = parser.parse_args(argv)
    cfg = build(args.arch, args.out, args.seed, args.dtype, args.num_layers, args.vocab_size)
    n = len(tensor_specs(cfg))
    layers = cfg.get("text_config", cfg)["num_hidden_layers"]
    print(f"wrote {args.arch} tiny checkpoint ({n} tensors, {layers} layers) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
