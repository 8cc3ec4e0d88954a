"""MoE routing dispatch: the two-launch Triton routing (CUDA / ROCm, small M) or plain torch.

Triton contract (else torch, reason logged once): ``M <= 160`` rows (decode and
verify batches; seeds digest item 14), ``M * k' <= 4096`` routing entries, at most
65,535 experts. aiter's ``biased_grouped_topk`` / ``topk_softmax`` return ids and
weights only (no sorted layout, no shared slot), so ROCm also takes Triton here.
The expert compute after routing is dispatched in ``moe.experts`` (aiter's
``fused_moe`` on ROCm through ``moe.aiter_adapter``, else plain torch).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.moe.routing import MAX_ENTRIES, MoeRouting, fused_moe_routing_triton
from sgl_hybrid_kernel.moe.routing_reference import expert_sorted_layout_reference, route_tokens_reference

logger = logging.getLogger(__name__)

MAX_ROWS = 160


def fused_moe_routing(
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
    layout: bool = True,
) -> MoeRouting:
    """Route ``M`` tokens and build the expert-sorted, block-padded grouped-GEMM layout.

    Arguments as ``moe.routing_reference.route_tokens_reference`` plus ``block_size``; ``layout=False``
    routes only (the layout fields are ``None``). Returns ``moe.routing.MoeRouting``.

    Raises:
        ValueError: bad ``top_k``, grouping or ``scoring_func``.
    """
    M, E = router_logits.shape
    kout = top_k + int(shared_expert_weight is not None)
    kind = device_kind(router_logits)
    if kind == "cpu":
        why = "CPU tensors: plain-torch reference"
    elif M > MAX_ROWS:
        why = f"outside the Triton contract: M={M} above {MAX_ROWS}"
    elif M * kout > MAX_ENTRIES or E >= 65535:
        why = f"outside the Triton contract: {M * kout} entries / {E} experts"
    else:
        record_choice("moe_routing", "triton", f"{kind}: moe_gating_topk_kernel" + (
            " + moe_sorted_layout_kernel (2 launches)" if layout else " (1 launch: the caller builds its own layout)"), log=logger)
        return fused_moe_routing_triton(router_logits, top_k, scoring_func, correction_bias, num_expert_group, topk_group,
                                        renormalize, routed_scaling_factor, shared_expert_weight, block_size, layout=layout)
    record_choice("moe_routing", "torch", why, log=logger)
    w, ids = route_tokens_reference(router_logits, top_k, scoring_func, correction_bias, num_expert_group, topk_group,
                                    renormalize, routed_scaling_factor, shared_expert_weight)
    if not layout:
        return MoeRouting(w, ids, None, None, None)
    sorted_ids, block_expert, num_rows = expert_sorted_layout_reference(ids, E + int(shared_expert_weight is not None), block_size)
    return MoeRouting(w, ids, sorted_ids, block_expert, num_rows)
