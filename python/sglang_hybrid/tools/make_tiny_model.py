"""Build a tiny random-weight checkpoint in upstream SGLang 0.5.23's schema.

    python -m sglang_hybrid.tools.make_tiny_model --arch kimi-k3 --out DIR [--seed 0]

Writes ``config.json`` (model type ``kimi_linear``, architecture
``KimiK3LinearForCausalLM``: the fields of ``sglang/srt/configs/kimi_linear.py``),
``model.safetensors`` with upstream's tensor names, and an offline-trained
byte-level BPE tokenizer. The same seed gives byte-identical files.
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

ARCHS = ("kimi-k3",)


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
    raise ValueError(f"unknown init kind {kind!r}")


def build(arch: str, out: str, seed: int = 0, dtype: str = "float32", num_layers: int = 8) -> Dict:
    """Write the tiny checkpoint into ``out``; returns the config dict.

    Raises:
        ValueError: unknown ``arch`` or ``dtype``, or ``num_layers`` < 1.
    """
    from safetensors.torch import save_file

    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {ARCHS}, got {arch!r}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if num_layers < 1:
        raise ValueError(f"--num-layers must be >= 1, got {num_layers}")
    os.makedirs(out, exist_ok=True)
    tok = write_tokenizer(out)
    cfg = kimi_k3_tiny_config(tok["vocab_size"], tok[BOS_TOKEN], tok[EOS_TOKEN], dtype, num_layers)
    tdtype = getattr(torch, dtype)
    tensors = {}
    for name, (shape, kind) in sorted(kimi_k3_tensor_specs(cfg).items()):
        t = _init(kind, shape, _generator(seed, name))
        tensors[name] = (t.float() if kind in _FP32_KINDS else t.to(tdtype)).contiguous()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
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
    parser.add_argument("--num-layers", type=int, default=8)
    args = parser.parse_args(argv)
    cfg = build(args.arch, args.out, args.seed, args.dtype, args.num_layers)
    n = sum(1 for _ in kimi_k3_tensor_specs(cfg))
    print(f"wrote {args.arch} tiny checkpoint ({n} tensors, {cfg['num_hidden_layers']} layers) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
