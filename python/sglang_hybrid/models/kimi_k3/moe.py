"""Feed-forward blocks of the Kimi K3 reference model: dense SwiGLU MLP and MoE.

MoE (upstream ``KimiK3MoE`` without the latent projection): router logits
``x W_gate^T`` (FP32), sigmoid scores, ``e_score_correction_bias`` for the
choice only, grouped top-k, renormalised weights times
``routed_scaling_factor``; output = routed experts + shared expert(s).
Ties go to the smaller expert index (``sgl_hybrid_kernel.moe``).

Latent MoE (``routed_expert_hidden_size = L``, upstream's ``use_latent_moe``):
routed experts run on ``routed_expert_down_proj(x)`` (``[N, L]``); their output is
(all-reduced under TP,) optionally RMS-normed (``latent_moe_use_norm``) and
projected back by ``routed_expert_up_proj`` (``[D, L]``, replicated).

TP (issue 8, as upstream's FusedMoE): each rank keeps ``I / t`` of every expert's
intermediate (rows of ``w1``/``w3``, columns of ``w2``) and of the shared
expert's; partial sums are completed by all-reduce. With
``parallel.moe_owned_output`` the replicated ``routed_expert_up_proj`` is cut to
this rank's output rows and added into the shared partial sum before its
all-reduce (``sglang_hybrid.parallel.moe_ownership``).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sgl_hybrid_kernel.moe.reference import biased_grouped_topk, moe_experts
from sgl_hybrid_kernel.norm.reference import rms_norm

from sglang_hybrid.models.kimi_k3.kda import _param
from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.parallel.moe_ownership import owned_output_rows
from sglang_hybrid.parallel.spec import ParallelSpec


class SwiGLUMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with checkpoint names gate_proj / up_proj / down_proj.

    TP: ``I / t`` intermediate rows per rank (gate/up column-parallel, down
    row-parallel). ``reduce_output=False`` returns the rank's partial sum (the
    MoE block reduces shared + routed together).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, parallel: Optional[ParallelSpec] = None,
                 reduce_output: bool = True):
        super().__init__()
        self.parallel = parallel or ParallelSpec()
        self.reduce_output = reduce_output
        self.inter_shard = self.parallel.tp_shard(intermediate_size)
        self.intermediate_size = intermediate_size // self.parallel.tp_size
        self.gate_up_proj = _param(2 * self.intermediate_size, hidden_size)
        self.down_proj = _param(hidden_size, self.intermediate_size)

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        I = self.intermediate_size
        if self.parallel.tp_size == 1:
            return {
                f"{prefix}.gate_proj.weight": ShardSpec(f"{prefix}.gate_up_proj", (slice(0, I),)),
                f"{prefix}.up_proj.weight": ShardSpec(f"{prefix}.gate_up_proj", (slice(I, 2 * I),)),
                f"{prefix}.down_proj.weight": ShardSpec(f"{prefix}.down_proj"),
            }
        rows = self.inter_shard
        return {
            f"{prefix}.gate_proj.weight": ShardSpec(f"{prefix}.gate_up_proj", (slice(0, I),), (rows,)),
            f"{prefix}.up_proj.weight": ShardSpec(f"{prefix}.gate_up_proj", (slice(I, 2 * I),), (rows,)),
            f"{prefix}.down_proj.weight": ShardSpec(f"{prefix}.down_proj", (), (slice(None), rows)),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.gate_up_proj.t()
        g, u = h.split(self.intermediate_size, dim=-1)
        out = (F.silu(g) * u) @ self.down_proj.t()
        return self.parallel.all_reduce(out) if self.reduce_output else out


class _Gate(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int):
        super().__init__()
        self.weight = _param(num_experts, hidden_size)
        self.e_score_correction_bias = _param(num_experts, dtype=torch.float32)


class KimiK3MoE(nn.Module):
    """Routed experts (``w1`` gate, ``w3`` up, ``w2`` down per expert) plus shared experts."""

    def __init__(self, config, parallel: Optional[ParallelSpec] = None):
        super().__init__()
        self.parallel = par = parallel or ParallelSpec()
        self.latent = getattr(config, "routed_expert_hidden_size", None) or None
        if par.moe_owned_output and self.latent is None:
            raise ValueError("parallel.moe_owned_output needs latent MoE (routed_expert_hidden_size): "
                             "without it no routed projection is replicated across TP ranks")
        if config.hidden_act != "silu":
            raise NotImplementedError(f"reference MoE supports hidden_act='silu', got {config.hidden_act!r}")
        if config.moe_router_activation_func != "sigmoid":
            raise NotImplementedError("reference MoE implements sigmoid routing (Kimi K2/K3)")
        D, E = config.hidden_size, config.num_experts
        self.inter_shard = par.tp_shard(config.moe_intermediate_size)
        I = config.moe_intermediate_size // par.tp_size
        self.num_experts, self.inter, self.hidden = E, I, D
        self.eps = config.rms_norm_eps
        self.top_k = config.num_experts_per_token
        self.num_expert_group = config.num_expert_group
        self.topk_group = config.topk_group
        self.renormalize = config.moe_renormalize
        self.routed_scaling_factor = config.routed_scaling_factor
        self.gate = _Gate(E, D)
        X = self.latent or D  # the experts' model dimension
        self.w13 = _param(E, 2 * I, X)
        self.w2 = _param(E, X, I)
        self.shared_experts = (
            SwiGLUMLP(D, config.moe_intermediate_size * config.num_shared_experts, par, reduce_output=False)
            if config.num_shared_experts
            else None
        )
        if self.latent is not None:
            self.routed_expert_down_proj = _param(self.latent, D)
            self.use_latent_norm = bool(getattr(config, "latent_moe_use_norm", False))
            if self.use_latent_norm:
                self.routed_expert_norm = _param(self.latent)
            self.owned_rows = owned_output_rows(D, par.tp_rank, par.tp_size) if par.moe_owned_output else slice(0, D)
            self.routed_expert_up_proj = _param(self.owned_rows.stop - self.owned_rows.start, self.latent)

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        I = self.inter
        m = {
            f"{prefix}.gate.weight": ShardSpec(f"{prefix}.gate.weight"),
            f"{prefix}.gate.e_score_correction_bias": ShardSpec(f"{prefix}.gate.e_score_correction_bias"),
        }
        tp = self.parallel.tp_size > 1  # TP: this rank's intermediate rows of w1/w3, columns of w2
        rows = (self.inter_shard,) if tp else ()
        cols = (slice(None), self.inter_shard) if tp else ()
        for e in range(self.num_experts):
            ex = f"{prefix}.experts.{e}"
            m[f"{ex}.w1.weight"] = ShardSpec(f"{prefix}.w13", (e, slice(0, I)), rows)
            m[f"{ex}.w3.weight"] = ShardSpec(f"{prefix}.w13", (e, slice(I, 2 * I)), rows)
            m[f"{ex}.w2.weight"] = ShardSpec(f"{prefix}.w2", (e,), cols)
        if self.latent is not None:
            m[f"{prefix}.routed_expert_down_proj.weight"] = ShardSpec(f"{prefix}.routed_expert_down_proj")
            m[f"{prefix}.routed_expert_up_proj.weight"] = ShardSpec(
                f"{prefix}.routed_expert_up_proj", (), (self.owned_rows,) if self.parallel.moe_owned_output else ()
            )
            if self.use_latent_norm:
                m[f"{prefix}.routed_expert_norm.weight"] = ShardSpec(f"{prefix}.routed_expert_norm")
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
        if self.latent is not None:
            return self._forward_latent(x, weights, ids)
        out = moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return self.parallel.all_reduce(out)  # routed + shared partial sums: one collective

    def _forward_latent(self, x, weights, ids) -> torch.Tensor:
        """Latent MoE: two collectives under TP (latent, then shared), with or without ownership."""
        par = self.parallel
        latent = par.all_reduce(moe_experts(x @ self.routed_expert_down_proj.t(), self.w13, self.w2, weights, ids))
        if self.use_latent_norm:
            latent = rms_norm(latent, self.routed_expert_norm, self.eps)
        shared = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)
        routed = latent @ self.routed_expert_up_proj.t()  # [N, D] or, owned, [N, D / t]
        if par.moe_owned_output:
            shared = shared.clone()
            shared[:, self.owned_rows] += routed
            return par.all_reduce(shared)
        return routed + par.all_reduce(shared)
