"""Plain-torch MoE routing and expert compute.

Routing is DeepSeek-V3's "noaux_tc" scheme used by Kimi K2/K3: sigmoid scores,
a per-expert correction bias that only affects *which* experts are chosen,
optional group-limited selection, renormalised weights times a routed scaling
factor. Exactness contract (seeds digest, item 14): ties go to the smaller
expert index and the chosen ids are distinct even for non-finite logits.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def _stable_topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries per row, ties to the smaller index.

    NaN ranks below every number (it is replaced by ``-inf`` first), and a
    stable descending sort keeps equal values in index order, so the result is
    always ``k`` distinct indices.
    """
    x = torch.nan_to_num(x.float(), nan=float("-inf"))
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def biased_grouped_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    num_expert_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Choose experts per token.

    Args:
        router_logits: ``[M, E]`` gate logits.
        correction_bias: ``[E]`` added to the sigmoid scores for selection only.
        top_k: experts per token.
        num_expert_group: expert groups (E divisible by it).
        topk_group: groups kept per token; a group's score is the sum of its two
            best biased scores.
        renormalize: divide the chosen scores by their sum.
        routed_scaling_factor: multiplies the final weights.

    Returns:
        ``(topk_weights [M, top_k] FP32, topk_ids [M, top_k] int64)``, ids in
        descending biased-score order.

    Raises:
        ValueError: ``E`` not divisible by ``num_expert_group`` or ``top_k`` too large.
    """
    M, E = router_logits.shape
    if E % num_expert_group != 0:
        raise ValueError(f"num_experts={E} is not divisible by num_expert_group={num_expert_group}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    scores = router_logits.float().sigmoid()
    choice = scores + correction_bias.float().unsqueeze(0)
    if num_expert_group > 1:
        grouped = choice.view(M, num_expert_group, E // num_expert_group)
        group_scores = torch.nan_to_num(grouped, nan=float("-inf")).topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        keep = _stable_topk_indices(group_scores, topk_group)
        group_mask = torch.zeros(M, num_expert_group, dtype=torch.bool, device=choice.device)
        group_mask.scatter_(1, keep, True)
        choice = choice.masked_fill(~group_mask.repeat_interleave(E // num_expert_group, dim=1), float("-inf"))
    ids = _stable_topk_indices(choice, top_k)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Weighted sum of the chosen SwiGLU experts' outputs.

    Args:
        x: ``[M, D]`` tokens.
        w13: ``[E, 2 * I, D]`` fused gate (first I rows) and up projections.
        w2: ``[E, D, I]`` down projections.
        topk_weights: ``[M, k]``; topk_ids: ``[M, k]``.

    Returns:
        ``[M, D]`` in ``x.dtype``: ``sum_j w_j * down_e(silu(gate_e x) * up_e x)``,
        accumulated in FP32. Rows are computed independently of any padding.
    """
    M, D = x.shape
    out = torch.zeros(M, D, dtype=torch.float32, device=x.device)
    inter = w13.shape[1] // 2
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(M, device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_w = topk_weights.reshape(-1).float()
    for e in torch.unique(flat_ids).tolist():
        sel = (flat_ids == e).nonzero(as_tuple=True)[0]
        tok = token_of[sel]
        h = x[tok] @ w13[e].t()
        h = F.silu(h[:, :inter]) * h[:, inter:]
        y = (h @ w2[e].t()).float() * flat_w[sel].unsqueeze(-1)
        out.index_add_(0, tok, y)
    return out.to(x.dtype)
