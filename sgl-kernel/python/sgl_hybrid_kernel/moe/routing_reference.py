"""Plain-torch references of the fused MoE routing op: gating, top-k, shared slot, expert-sorted layout.

Routing configurations served (read from upstream SGLang 0.5.23's model configs):

* Kimi K3 (``kimi_k3.py``: ``TopK(use_grouped_topk=True, scoring_func=
  moe_router_activation_func, correction_bias=e_score_correction_bias,
  renormalize=moe_renormalize, routed_scaling_factor=...)``): sigmoid scores, a
  correction bias used for the *choice* only, group-limited choice with a
  group's score = the sum of its two best biased scores, renormalised weights
  times the routed scaling factor; 896 experts, top 16.
* Qwen3.8 / Qwen MoE (``Qwen2MoeSparseMoeBlock``: ``renormalize=norm_topk_prob``):
  softmax scores, plain top-k, renormalised; 512 experts, top 10, plus one shared
  expert (seeds digest item 14: metadata ``[M, 11]`` over 513 entries).

The shared expert, when fused into the grouped GEMM, is one more expert
(index ``E``) in every token's last slot with a fixed weight.

Exactness contract (seeds digest item 14): ties go to the smaller expert index,
the ``k`` ids of a row are distinct even when logits are NaN or infinite (NaN
ranks below every number), and every entry of the sorted layout's padding is
written (sentinel ids, expert -1 for unused blocks) whatever the buffer held.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

SCORING_FUNCS = ("sigmoid", "softmax")


def _stable_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    x = torch.nan_to_num(x.float(), nan=float("-inf"))
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def route_tokens_reference(
    router_logits: torch.Tensor,
    top_k: int,
    scoring_func: str = "sigmoid",
    correction_bias: Optional[torch.Tensor] = None,
    num_expert_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    shared_expert_weight: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Choose experts per token.

    Args:
        router_logits: ``[M, E]`` gate logits (any float dtype; math in FP32).
        top_k: routed experts per token, ``1 <= top_k <= E``.
        scoring_func: ``"sigmoid"`` (Kimi K3) or ``"softmax"`` (Qwen).
        correction_bias: optional ``[E]`` added to the scores for the choice only.
        num_expert_group / topk_group: group-limited choice (``E`` divisible by the
            group count); a group's score is its best biased score, or the sum of
            its two best when a correction bias is given (DeepSeek-V3 ``noaux_tc``).
        renormalize: divide the chosen scores by their sum (+1e-20).
        routed_scaling_factor: multiplies the routed weights.
        shared_expert_weight: if given, append slot ``top_k`` holding expert ``E``
            (the fused shared expert) with this weight.

    Returns:
        ``(weights [M, k'] FP32, ids [M, k'] int32)`` with ``k' = top_k (+1)``; routed
        ids in descending biased-score order.

    Raises:
        ValueError: unknown ``scoring_func``, bad ``top_k`` / grouping.
    """
    M, E = router_logits.shape
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    if E % num_expert_group or not 1 <= topk_group <= num_expert_group:
        raise ValueError(f"num_expert_group={num_expert_group} must divide E={E} and topk_group={topk_group} be in [1, groups]")
    logits = router_logits.float()
    scores = logits.sigmoid() if scoring_func == "sigmoid" else logits.softmax(dim=-1)
    choice = scores if correction_bias is None else scores + correction_bias.float().unsqueeze(0)
    if num_expert_group > 1:
        grouped = torch.nan_to_num(choice, nan=float("-inf")).view(M, num_expert_group, E // num_expert_group)
        n_best = 2 if correction_bias is not None and grouped.shape[-1] >= 2 else 1
        group_scores = grouped.topk(n_best, dim=-1).values.sum(-1)
        keep = torch.zeros(M, num_expert_group, dtype=torch.bool, device=choice.device)
        keep.scatter_(1, _stable_topk(group_scores, topk_group), True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // num_expert_group, dim=1), float("-inf"))
    ids = _stable_topk(choice, top_k)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * routed_scaling_factor
    ids = ids.to(torch.int32)
    if shared_expert_weight is not None:
        weights = torch.cat([weights, torch.full((M, 1), float(shared_expert_weight), device=weights.device)], 1)
        ids = torch.cat([ids, torch.full((M, 1), E, dtype=torch.int32, device=ids.device)], 1)
    return weights, ids


def sorted_layout_capacity(num_entries: int, num_experts: int, block_size: int) -> int:
    """Rows of the expert-sorted layout in the worst case (every used expert adds ``block_size - 1`` padding rows)."""
    rows = num_entries + min(num_experts, num_entries) * (block_size - 1)
    return max(block_size, (rows + block_size - 1) // block_size * block_size)


def expert_sorted_layout_reference(
    topk_ids: torch.Tensor, num_experts: int, block_size: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expert-sorted, block-padded layout of the routing entries for a grouped GEMM.

    Entry ``i = m * k' + j`` (token ``m``, slot ``j``) goes to expert ``topk_ids[m, j]``.
    Entries are sorted by expert, then by ``i``; each expert's run is padded to a
    multiple of ``block_size`` with the sentinel ``N = M * k'``.

    Args:
        topk_ids: ``[M, k']`` int expert ids in ``[0, num_experts)`` (shared slot included).
        num_experts: experts including a fused shared expert (Qwen: 513).
        block_size: rows per GEMM block.

    Returns:
        ``(sorted_ids [cap] int32, block_expert [cap // block_size] int32,
        num_rows [1] int32)``: ``cap = sorted_layout_capacity(N, num_experts,
        block_size)``; rows past ``num_rows`` hold the sentinel and their blocks
        expert ``-1``.

    Raises:
        ValueError: an id outside ``[0, num_experts)``.
    """
    flat = topk_ids.reshape(-1).long()
    N = flat.numel()
    device = flat.device
    if device.type == "cpu" and N and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        raise ValueError(f"topk_ids must lie in [0, {num_experts})")  # (not checked on GPU: a host sync)
    cap = sorted_layout_capacity(N, num_experts, block_size)
    order = torch.sort(flat * max(N, 1) + torch.arange(N, device=device)).indices  # by expert, then entry
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(0, flat, torch.ones_like(flat))  # no sync
    padded = (counts + block_size - 1) // block_size * block_size
    start_pad = torch.cumsum(padded, 0) - padded
    start_raw = torch.cumsum(counts, 0) - counts
    s_exp = flat[order]
    dest = start_pad[s_exp] + torch.arange(N, device=device) - start_raw[s_exp]
    sorted_ids = torch.full((cap,), N, dtype=torch.int32, device=device)
    sorted_ids[dest] = order.to(torch.int32)
    ends = torch.cumsum(padded, 0)
    first_row = torch.arange(cap // block_size, device=device) * block_size
    owner = torch.searchsorted(ends, first_row, right=True)
    block_expert = torch.where(first_row < ends[-1], owner, torch.full_like(owner, -1)).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


def gather_sorted_rows(x: torch.Tensor, sorted_ids: torch.Tensor, slots: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Grouped-GEMM input ``[cap, D]``: row ``r`` = ``x[sorted_ids[r] // slots]``, padding rows written as zeros.

    ``out`` may be a reused (NaN-filled) buffer: every row is overwritten.
    """
    N = x.shape[0] * slots
    valid = sorted_ids < N
    tok = torch.where(valid, sorted_ids.long() // slots, torch.zeros_like(sorted_ids, dtype=torch.long))
    rows = torch.where(valid.unsqueeze(1), x[tok], torch.zeros((), dtype=x.dtype, device=x.device))
    if out is None:
        return rows
    out.copy_(rows)
    return out


def grouped_swiglu_sorted_reference(
    rows: torch.Tensor, block_expert: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, block_size: int,
    inter_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SwiGLU experts over the sorted layout, one block at a time (the grouped GEMM's plain-torch model).

    Args:
        rows: ``[cap, D]`` from ``gather_sorted_rows``.
        block_expert: ``[cap // block_size]`` (-1 = unused block: output rows zero).
        w13: ``[E, 2 * I_pad, D]``, w2: ``[E, D, I_pad]``: the intermediate may be laid
            out padded (seeds digest item 17: 640 as 768) with zero padding columns.
        inter_out: optional ``[cap, I_pad]`` workspace for the activation (reused
            buffers may hold garbage: every row and column is overwritten).

    Returns:
        ``[cap, D]`` FP32 expert outputs per row (unweighted).
    """
    cap, D = rows.shape
    I_pad = w2.shape[-1]
    act = torch.empty(cap, I_pad, dtype=torch.float32) if inter_out is None else inter_out
    out = torch.zeros(cap, D, dtype=torch.float32)
    for blk, e in enumerate(block_expert.tolist()):
        r = slice(blk * block_size, (blk + 1) * block_size)
        if e < 0:
            act[r] = 0.0
            continue
        h = rows[r].float() @ w13[e].float().t()
        act[r] = torch.nn.functional.silu(h[:, :I_pad]) * h[:, I_pad:]
        out[r] = act[r] @ w2[e].float().t()
    return out
