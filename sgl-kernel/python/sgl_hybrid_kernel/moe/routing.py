"""Host wrapper of the two-launch MoE routing kernels (``triton_routing.py``)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton

from sgl_hybrid_kernel.moe.routing_reference import SCORING_FUNCS, sorted_layout_capacity
from sgl_hybrid_kernel.moe.triton_routing import SCORING_SIGMOID, SCORING_SOFTMAX, moe_gating_topk_kernel, moe_sorted_layout_kernel

MAX_ENTRIES = 4096  # M * k' entries of the one-program layout kernel (M <= 160 with k' <= 17 fits)


class MoeRouting(NamedTuple):
    """Routing metadata: ``weights [M, k'] FP32``, ``ids [M, k'] int32`` (k' = top_k (+1 shared)),
    ``sorted_ids [cap] int32`` (sentinel ``M * k'``), ``block_expert [cap // block_size] int32`` (-1 unused),
    ``num_rows [1] int32`` (rows of the layout in use). The three layout fields are ``None`` when the
    caller asked for the routing only (``layout=False``)."""

    weights: torch.Tensor
    ids: torch.Tensor
    sorted_ids: Optional[torch.Tensor]
    block_expert: Optional[torch.Tensor]
    num_rows: Optional[torch.Tensor]


def fused_moe_routing_triton(
    router_logits: torch.Tensor,
    top_k: int,
    scoring_func: str = "sigmoid",
    correction_bias: Optional[torch.Tensor] = None,
    num_expert_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    shared_expert_weight: Optional[float] = None,
    block_size: int = 16,
    num_warps: int = 4,
    layout_warps: int = 8,
    layout_block: int = 1024,
    layout: bool = True,
) -> MoeRouting:
    """Gating + top-k + shared slot + renormalisation (launch 1) and the expert-sorted layout (launch 2).

    ``layout=False``: launch 1 only (a caller whose MoE runner builds its own layout, as upstream's
    does: launch 2 would have no consumer).

    Arguments as ``routing_reference.route_tokens_reference`` plus ``block_size``
    (rows per grouped-GEMM block); ``num_warps`` / ``layout_warps`` / ``layout_block``
    (entries per step of launch 2) are the tile choice (H200 sweep:
    ``benchmark/kernels/bench_attention_moe.py --sweep``). Returns ``MoeRouting``.

    Raises:
        ValueError: bad ``top_k`` / grouping / scoring, or ``M * k'`` above ``MAX_ENTRIES``.
    """
    M, E = router_logits.shape
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    if E % num_expert_group or not 1 <= topk_group <= num_expert_group:
        raise ValueError(f"num_expert_group={num_expert_group} must divide E={E} and topk_group={topk_group} be in [1, groups]")
    if router_logits.stride(-1) != 1:
        raise ValueError("router_logits needs a contiguous last dimension")
    shared = shared_expert_weight is not None
    kout = top_k + int(shared)
    n_experts = E + int(shared)
    N = M * kout
    if N > MAX_ENTRIES:
        raise ValueError(f"M * k' = {N} above {MAX_ENTRIES} (use the torch path)")
    device = router_logits.device
    weights = torch.empty(M, kout, dtype=torch.float32, device=device)
    ids = torch.empty(M, kout, dtype=torch.int32, device=device)
    sorted_ids = block_expert = num_rows = None
    if layout:
        cap = sorted_layout_capacity(N, n_experts, block_size)
        sorted_ids = torch.empty(cap, dtype=torch.int32, device=device)
        block_expert = torch.empty(cap // block_size, dtype=torch.int32, device=device)
        num_rows = torch.empty(1, dtype=torch.int32, device=device)
    if M == 0:
        if layout:
            sorted_ids.fill_(0)
            block_expert.fill_(-1)
            num_rows.zero_()
        return MoeRouting(weights, ids, sorted_ids, block_expert, num_rows)
    G = num_expert_group
    EG = E // G
    bias = correction_bias.float().contiguous() if correction_bias is not None else weights
    moe_gating_topk_kernel[(M,)](
        router_logits, bias, weights, ids,
        router_logits.stride(0), weights.stride(0), ids.stride(0),
        float(routed_scaling_factor), float(shared_expert_weight or 0.0),
        TOPK=top_k, KPAD=triton.next_power_of_2(kout), G=G, EG=EG, GPAD=triton.next_power_of_2(G),
        EGPAD=triton.next_power_of_2(EG), TOPK_GROUP=topk_group,
        SCORING=SCORING_SOFTMAX if scoring_func == "softmax" else SCORING_SIGMOID,
        HAS_BIAS=correction_bias is not None, RENORM=renormalize, SHARED=int(shared),
        num_warps=num_warps,
    )
    if not layout:
        return MoeRouting(weights, ids, None, None, None)
    ne_pad = triton.next_power_of_2(n_experts)
    nw = triton.cdiv(M, 64)
    bits = torch.empty(nw * ne_pad, dtype=torch.int64, device=device)
    scratch = torch.empty((nw + 1) * ne_pad, dtype=torch.int32, device=device)
    moe_sorted_layout_kernel[(1,)](
        ids, sorted_ids, block_expert, num_rows, bits, scratch, N, cap, n_experts, nw, triton.cdiv(M, block_size),
        KOUT=kout, NE_PAD=ne_pad, EB=layout_block, FILL=1024, BLOCK_SIZE=block_size, num_warps=layout_warps,
    )
    return MoeRouting(weights, ids, sorted_ids, block_expert, num_rows)
