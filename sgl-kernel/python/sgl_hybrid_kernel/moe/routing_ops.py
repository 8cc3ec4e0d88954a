"""MoE routing in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

| op | implementations | oracle |
|---|---|---|
| ``moe_routing`` | ``triton`` (``fused_moe_routing_triton``: gating + top-k, then the expert-sorted layout), ``torch`` (``route_tokens_reference`` + ``expert_sorted_layout_reference``) | FP64 scores and a per-token loop for the choice; the layout by a per-expert loop |

Everything the grouped GEMM reads is compared: weights (FP64 tolerance), ids,
sorted entry ids, block owners and the used row count (a wrong id counts as an
error >= 1, far above the tolerance). Cases: Kimi K3's rule on 32 experts
(sigmoid, correction bias for the choice only, 4 groups scored by their two best,
2 kept, renormalised, scaled by 2.5); Qwen's rule (softmax, top 3, a fused shared
expert slot); 70 tokens (the layout spans two 64-token bitmap words, as decode
batches up to 160 do). Logits are random (no ties: the tie rule is a unit-test matter).

The plan runs ``moe.dispatch.fused_moe_routing`` once on a Kimi K3 decode batch
(32 tokens, 896 experts, top 16): the dispatcher has no public function that
only names its choice.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch

OP = "moe_routing"
PLAN_TOKENS, PLAN_EXPERTS, PLAN_TOP_K = 32, 896, 16  # Kimi K3 decode batch
# FP32 weights vs FP64: ~1e-7 observed; a wrong expert, weight or layout entry is off by >= ~1e-2 (ids: >= 1).
TOLERANCE = 1e-4
# (name, M, E, routing arguments, block size)
CASES = [
    ("kimi-k3 rule", 3, 32, dict(top_k=4, scoring_func="sigmoid", num_expert_group=4, topk_group=2,
                                 routed_scaling_factor=2.5, bias=True), 4),
    ("qwen rule + shared", 5, 16, dict(top_k=3, scoring_func="softmax", shared_expert_weight=0.7), 4),
    ("70 tokens", 70, 16, dict(top_k=2, scoring_func="softmax", shared_expert_weight=1.0), 16),
]


def _describe() -> str:
    return "; ".join(f"{n} M={M} E={E} top{a['top_k']}" + (" +shared" if "shared_expert_weight" in a else "")
                     for n, M, E, a, _ in CASES)


def _oracle_route(logits: torch.Tensor, top_k: int, scoring_func: str, bias: Optional[torch.Tensor],
                  num_expert_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0,
                  shared_expert_weight: Optional[float] = None):
    """FP64, token by token: ``(weights [M, k'], ids [M, k'])``, ids in descending biased-score order."""
    x = logits.double()
    scores = x.sigmoid() if scoring_func == "sigmoid" else x.softmax(-1)
    M, E = x.shape
    weights, ids = [], []
    for m in range(M):
        choice = scores[m] + (bias.double() if bias is not None else 0.0)
        if num_expert_group > 1:
            groups = choice.view(num_expert_group, -1)
            n_best = 2 if bias is not None else 1
            group_score = groups.sort(-1, descending=True).values[:, :n_best].sum(-1)
            kept = group_score.argsort(descending=True)[:topk_group]
            allowed = torch.zeros(num_expert_group, dtype=torch.bool)
            allowed[kept] = True
            choice = choice.masked_fill(~allowed.repeat_interleave(E // num_expert_group), float("-inf"))
        chosen = choice.argsort(descending=True)[:top_k]
        w = scores[m, chosen]
        w = w / w.sum() * routed_scaling_factor
        row_ids = chosen.tolist()
        w = w.tolist()
        if shared_expert_weight is not None:
            row_ids.append(E)
            w.append(shared_expert_weight)
        weights.append(w)
        ids.append(row_ids)
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(ids)


def _oracle_layout(ids: torch.Tensor, num_experts: int, block: int, capacity: int):
    """Entries grouped by expert (ascending entry within an expert), each run padded with the sentinel ``N``."""
    flat = ids.reshape(-1).tolist()
    N = len(flat)
    sorted_ids, owners = [], []
    for e in range(num_experts):
        entries = [i for i, x in enumerate(flat) if x == e]
        if entries:
            padded = -(-len(entries) // block) * block
            sorted_ids += entries + [N] * (padded - len(entries))
            owners += [e] * (padded // block)
    used = len(sorted_ids)
    sorted_ids += [N] * (capacity - used)
    owners += [-1] * (capacity // block - len(owners))
    return torch.tensor(sorted_ids), torch.tensor(owners), torch.tensor([used])


def _impl(impl: str):
    if impl == "triton":
        from sgl_hybrid_kernel.moe.routing import fused_moe_routing_triton

        return fused_moe_routing_triton
    if impl == "torch":
        from sgl_hybrid_kernel.moe.routing import MoeRouting
        from sgl_hybrid_kernel.moe.routing_reference import expert_sorted_layout_reference, route_tokens_reference

        def torch_routing(logits, top_k, scoring_func, correction_bias, num_expert_group, topk_group, renormalize,
                          routed_scaling_factor, shared_expert_weight, block_size):
            w, ids = route_tokens_reference(logits, top_k, scoring_func, correction_bias, num_expert_group, topk_group,
                                            renormalize, routed_scaling_factor, shared_expert_weight)
            n_experts = logits.shape[1] + int(shared_expert_weight is not None)
            return MoeRouting(w, ids, *expert_sorted_layout_reference(ids, n_experts, block_size))

        return torch_routing
    raise ValueError(f"impl: no {OP} implementation named {impl!r}")


def _same_shape_pairs(got: torch.Tensor, want: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    if tuple(got.shape) != tuple(want.shape):  # a layout of the wrong size fails outright
        return [(torch.tensor([float("inf")]), torch.tensor([0.0]))]
    return [(got, want)]


def gate_moe_routing(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``moe_routing``: weights, ids and the sorted layout of ``impl`` vs the FP64 / loop oracle.

    Raises:
        ValueError: unknown ``impl``.
    """
    from sgl_hybrid_kernel.moe.routing_reference import sorted_layout_capacity

    fn = _impl(impl)
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, M, E, args, block) in enumerate(CASES):
        gen = torch.Generator().manual_seed(800 + n)
        logits = torch.randn(M, E, generator=gen)
        bias = 0.1 * torch.randn(E, generator=gen) if args.get("bias") else None
        a = {k: v for k, v in args.items() if k != "bias"}
        shared = a.get("shared_expert_weight")
        r = fn(logits.to(device), a["top_k"], a["scoring_func"], None if bias is None else bias.to(device),
               a.get("num_expert_group", 1), a.get("topk_group", 1), True, a.get("routed_scaling_factor", 1.0),
               shared, block)
        want_w, want_ids = _oracle_route(logits, a["top_k"], a["scoring_func"], bias,
                                         a.get("num_expert_group", 1), a.get("topk_group", 1),
                                         a.get("routed_scaling_factor", 1.0), shared)
        n_experts = E + int(shared is not None)
        cap = sorted_layout_capacity(want_ids.numel(), n_experts, block)
        want_layout = _oracle_layout(want_ids, n_experts, block, cap)
        pairs += _same_shape_pairs(r.weights, want_w) + _same_shape_pairs(r.ids, want_ids)
        for got, want in zip((r.sorted_ids, r.block_expert, r.num_rows), want_layout):
            pairs += _same_shape_pairs(got.reshape(-1), want)
    return _dispatch.GateResult(OP, impl, _dispatch.max_abs_error(pairs), TOLERANCE, _describe())


def plan_moe_routing(device) -> _dispatch.KernelChoice:
    """What ``moe.dispatch.fused_moe_routing`` picks on ``device`` for a Kimi K3 decode batch (recorded and returned)."""
    from sgl_hybrid_kernel.moe.dispatch import fused_moe_routing

    logits = torch.zeros(PLAN_TOKENS, PLAN_EXPERTS, dtype=torch.float32, device=device)
    fused_moe_routing(logits, PLAN_TOP_K, "sigmoid", torch.zeros(PLAN_EXPERTS, device=device))
    return next(c for c in _dispatch.chosen_paths() if c.op == OP)


_dispatch.register_op(OP, plan_moe_routing, gate_moe_routing, "MoE gating, top-k and expert-sorted layout")
