"""Qwen-style MoE of Qwen3.8-Flash-Next (upstream ``Qwen2MoeSparseMoeBlock``).

Router logits ``x W_gate^T`` in FP32, softmax over all experts, top-k (ties to
the smaller expert index), weights renormalised to sum 1 when
``norm_topk_prob``; SwiGLU experts; plus one shared SwiGLU expert scaled by
``sigmoid(x W_shared_gate^T)`` (article 002: 512 routed experts, top-10, shared
expert of intermediate 640).
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import nn

from sgl_hybrid_kernel.moe.reference import moe_experts

from sglang_hybrid.models.kimi_k3.moe import SwiGLUMLP
from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.models.qwen38.hyper import _param


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing: ``[M, E]`` logits -> ``(weights [M, k] FP32, ids [M, k] int64)``.

    Ids are in descending probability order, ties to the smaller index (a
    stable sort; NaN ranks last), so the ``k`` ids are always distinct.

    Raises:
        ValueError: ``top_k`` outside ``[1, E]``.
    """
    E = router_logits.shape[-1]
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    probs = torch.softmax(router_logits.float(), dim=-1)
    ids = torch.sort(torch.nan_to_num(probs, nan=-1.0), dim=-1, descending=True, stable=True).indices[..., :top_k]
    weights = probs.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


class _Gate(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int):
        super().__init__()
        self.weight = _param(num_experts, hidden_size)


class Qwen38MoE(nn.Module):
    """Routed experts (``gate_proj``/``up_proj``/``down_proj`` per expert) plus the gated shared expert."""

    def __init__(self, config):
        super().__init__()
        if config.hidden_act != "silu":
            raise NotImplementedError(f"reference MoE supports hidden_act='silu', got {config.hidden_act!r}")
        D, I, E = config.hidden_size, config.moe_intermediate_size, config.num_experts
        self.num_experts, self.inter = E, I
        self.top_k = config.num_experts_per_tok
        self.renormalize = bool(config.norm_topk_prob)
        self.gate = _Gate(E, D)
        self.w13 = _param(E, 2 * I, D)
        self.w2 = _param(E, D, I)
        S = config.shared_expert_intermediate_size
        self.shared_expert = SwiGLUMLP(D, S) if S else None
        self.shared_expert_gate = _Gate(1, D) if S else None

    def checkpoint_mapping(self, ckpt: str, me: str) -> Dict[str, ShardSpec]:
        I = self.inter
        m = {f"{ckpt}.gate.weight": ShardSpec(f"{me}.gate.weight")}
        for e in range(self.num_experts):
            ex = f"{ckpt}.experts.{e}"
            m[f"{ex}.gate_proj.weight"] = ShardSpec(f"{me}.w13", (e, slice(0, I)))
            m[f"{ex}.up_proj.weight"] = ShardSpec(f"{me}.w13", (e, slice(I, 2 * I)))
            m[f"{ex}.down_proj.weight"] = ShardSpec(f"{me}.w2", (e,))
        if self.shared_expert is not None:
            shared = self.shared_expert.checkpoint_mapping(f"{me}.shared_expert")
            m.update({k.replace(f"{me}.", f"{ckpt}.", 1): v for k, v in shared.items()})
            m[f"{ckpt}.shared_expert_gate.weight"] = ShardSpec(f"{me}.shared_expert_gate.weight")
        return m

    def route(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Router for ``x`` ``[M, D]`` -> ``(weights [M, k] FP32, ids [M, k])``."""
        return softmax_topk(x.float() @ self.gate.weight.float().t(), self.top_k, self.renormalize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(x @ self.shared_expert_gate.weight.t()) * self.shared_expert(x)
        return out
