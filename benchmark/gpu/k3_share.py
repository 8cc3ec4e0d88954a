"""One GPU's share of Kimi K3 at TP8 as a served checkpoint config, for the GPU benchmarks
(``profile_decode_step.py``, ``system_bench.py``; issue 41 items 2 and 3).

hidden 7168; MLA 12 heads (latent 512, rope 64); KDA 12 heads of 128; three KDA layers per MLA
layer; layer 0 dense (its MLP the TP8 share of 18432); the routed experts one GPU holds under EP8
(``experts``) with the routed picks that land on it (``top_k``). Weights are not written: the
servers load it with ``--load-format dummy`` (random weights), so outputs are meaningless and only
speed is measured. Also the GPU benchmarks' one server query (:func:`plugin_state`).
"""

from __future__ import annotations

import json
import os
from typing import Dict

import requests


def k3_share_config(vocab_size: int, bos: int, eos: int, experts: int, top_k: int, moe_inter: int, layers: int) -> Dict:
    """The HF ``config.json`` dict (BF16) of the share with ``layers`` decoder layers (every 4th MLA)."""
    from sglang_hybrid.tools.make_tiny_model import kimi_k3_shaped_tiny_config

    cfg = kimi_k3_shaped_tiny_config(vocab_size, bos, eos, "bfloat16", layers)
    cfg.update({
        "hidden_size": 7168,
        "intermediate_size": 18432 // 8,  # the dense layer's MLP, TP8 share
        "num_experts": experts,
        "num_experts_per_token": top_k,
        "moe_intermediate_size": moe_inter,
        "num_expert_group": 1,
        "topk_group": 1,
    })
    full = [i for i in range(1, layers + 1) if i % 4 == 0]  # K3's three KDA layers per MLA layer
    cfg["linear_attn_config"].update({"kda_layers": [i for i in range(1, layers + 1) if i not in full],
                                      "full_attn_layers": full})
    return cfg


def add_model_args(p) -> None:
    """The share's size flags (``--layers``, ``--experts``, ``--top-k``, ``--moe-intermediate-size``)."""
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=112, help="routed experts on one GPU (K3: 896 over EP8)")
    p.add_argument("--top-k", type=int, default=2, help="routed picks per token landing on one GPU (K3: 16 of 896 over 8)")
    p.add_argument("--moe-intermediate-size", type=int, default=2048)


def write_model(out: str, args) -> Dict:
    """Write ``config.json`` and the test tokenizer into ``out`` (sizes from ``add_model_args``' flags); return the config."""
    from sglang_hybrid.tools.tokenizer import BOS_TOKEN, EOS_TOKEN, write_tokenizer

    os.makedirs(out, exist_ok=True)
    ids = write_tokenizer(out)
    cfg = k3_share_config(ids["vocab_size"], ids[BOS_TOKEN], ids[EOS_TOKEN], args.experts, args.top_k,
                          args.moe_intermediate_size, args.layers)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return cfg


def plugin_state(base: str) -> Dict:
    """The plugin's entry of the first scheduler in ``GET {base}/get_server_info`` (``kernel_paths``,
    ``kernel_calls``, ...; empty when absent)."""
    states = requests.get(f"{base}/get_server_info", timeout=30).json().get("internal_states") or [{}]
    return states[0].get("sglang_hybrid", {})
