"""Feed-forward blocks of the Kimi K3 reference model: dense SwiGLU MLP and MoE.

MoE (upstream ``KimiK3MoE`` without the latent projection): router logits
``x W_gate^T`` (FP32), sigmoid scores, ``e_score_correction_bias`` for the
choice only, grouped top-k, renormalised weights times
``routed_scaling_factor``; output = routed experts + shared expert(s).
Ties go to the smaller expert index (``sgl_hybrid_kernel.moe``).
"""

from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from sgl_hybrid_kernel.moe.reference import biased_grouped_topk, moe_experts

from sglang_hybrid.models.kimi_k3.kda import _param
from sglang_hybrid.models.kimi_k3.weights import ShardSpec


class SwiGLUMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with checkpoint names gate_proj / up_proj / down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = _param(2 * intermediate_size, hidden_size)
        self.down_proj = _param(hidden_size, intermediate_size)

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        I = self.intermediate_size
        return {
            f"{prefix}.gate_proj.weight": ShardSpec(f"{prefix}.gate_up_proj", (slice(0, I),)),
            f"{prefix}.up_proj.weight": ShardSpec(f"{prefix}.gate_up_proj", (slice(I, 2 * I),)),
            f"{prefix}.down_proj.weight": ShardSpec(f"{prefix}.down_proj"),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.gate_up_proj.t()
        g, u = h.split(self.intermediate_size, dim=-1)
        return (F.silu(g) * u) @ self.down_proj.t()


class _Gate(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int):
        super().__init__()
        self.weight = _param(num_experts, hidden_size)
        self.e_score_correction_bias = _param(num_experts, dtype=torch.float32)


class KimiK3MoE(nn.Module):
    """Routed experts (``w1`` gate, ``w3`` up, ``w2`` down per expert) plus shared experts."""

    def __init__(self, config):
        super().__init__()
        if getattr(config, "routed_expert_hidden_size", None):
            raise NotImplementedError("latent MoE (routed_expert_hidden_size) is not in the reference model yet")
        if config.hidden_act != "silu":
            raise NotImplementedError(f"reference MoE supports hidden_act='silu', got {config.hidden_act!r}")
        if config.moe_router_activation_func != "sigmoid":
            raise NotImplementedError("reference MoE implements sigmoid routing (Kimi K2/K3)")
        D, I, E = config.hidden_size, config.moe_intermediate_size, config.num_experts
        self.num_experts, self.inter = E, I
        self.top_k = config.num_experts_per_token
        self.num_expert_group = config.num_expert_group
        self.topk_group = config.topk_group
        self.renormalize = config.moe_renormalize
        self.routed_scaling_factor = config.routed_scaling_factor
        self.gate = _Gate(E, D)
        self.w13 = _param(E, 2 * I, D)
        self.w2 = _param(E, D, I)
        self.shared_experts = (
            SwiGLUMLP(D, I * config.num_shared_experts) if config.num_shared_experts else None
        )

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        I = self.inter
        m = {
            f"{prefix}.gate.weight": ShardSpec(f"{prefix}.gate.weight"),
            f"{prefix}.gate.e_score_correction_bias": ShardSpec(f"{prefix}.gate.e_score_correction_bias"),
        }
        for e in range(self.num_experts):
            ex = f"{prefix}.experts.{e}"
            m[f"{ex}.w1.weight"] = ShardSpec(f"{prefix}.w13", (e, slice(0, I)))
            m[f"{ex}.w3.weight"] = ShardSpec(f"{prefix}.w13", (e, slice(I, 2 * I)))
            m[f"{ex}.w2.weight"] = ShardSpec(f"{prefix}.w2", (e,))
        if self.shared_experts is not None:
            m.update(self.shared_experts.checkpoint_mapping(f"{prefix}.shared_experts"))
        return m

    def route(self, x: torch.Tensor):
        """Router for ``x`` ``[M, D]`` -> ``(weights [M, k] FP32, ids [M, k])``."""
        logits = x.float() @ self.gate.weight.float().t()
        return biased_grouped_topk(
            logits,
            self.gate.e_score_correction_bias,
            self.top_k,
            self.num_expert_group,
            self.topk_group,
            self.renormalize,
            self.routed_scaling_factor,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
