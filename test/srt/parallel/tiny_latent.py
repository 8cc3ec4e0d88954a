"""A latent-MoE variant of the tiny Kimi K3 checkpoint (``routed_expert_hidden_size``), for the MoE ownership tests.

Same files as ``tiny_kimi_k3`` except: ``config.json`` gains
``routed_expert_hidden_size = hidden_size / 2`` and ``latent_moe_use_norm``;
every MoE layer's experts work in the latent space and gain
``routed_expert_down_proj`` / ``routed_expert_norm`` / ``routed_expert_up_proj``
(upstream's checkpoint names), all seeded.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from tiny_model import tiny_kimi_k3


def tiny_kimi_k3_latent(out_dir: str, seed: int = 0) -> str:
    """Write the latent-MoE tiny checkpoint into ``out_dir`` (created) and return it."""
    src = tiny_kimi_k3(seed)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    D = cfg["hidden_size"]
    L, I = D // 2, cfg["moe_intermediate_size"]
    cfg["routed_expert_hidden_size"], cfg["latent_moe_use_norm"] = L, True
    W = load_file(os.path.join(src, "model.safetensors"))
    g = torch.Generator().manual_seed(1000 + seed)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * shape[-1] ** -0.5).contiguous()

    moe_prefixes = sorted({k.split(".experts.")[0] for k in W if ".experts." in k})
    for p in moe_prefixes:
        for e in range(cfg["num_experts"]):
            W[f"{p}.experts.{e}.w1.weight"] = rnd(I, L)
            W[f"{p}.experts.{e}.w3.weight"] = rnd(I, L)
            W[f"{p}.experts.{e}.w2.weight"] = rnd(L, I)
        W[f"{p}.routed_expert_down_proj.weight"] = rnd(L, D)
        W[f"{p}.routed_expert_norm.weight"] = 1.0 + 0.1 * torch.randn(L, generator=g)
        W[f"{p}.routed_expert_up_proj.weight"] = rnd(D, L)
    save_file(W, os.path.join(out_dir, "model.safetensors"))
    for name in os.listdir(src):
        if name not in ("config.json", "model.safetensors") and os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), out_dir)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return out_dir
