"""Attention helpers of ``sgl_kernel``: ``merge_state_v2`` in plain torch, the rest placeholders.

``merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None)`` merges two
partial attention results over disjoint key sets: ``v_*`` ``[tokens, heads,
head_dim]``, ``s_*`` their log-sum-exp ``[tokens, heads]`` (natural log). With
``m = max(s_a, s_b)``::

    s_merged = m + log(exp(s_a - m) + exp(s_b - m))
    v_merged = v_a * exp(s_a - s_merged) + v_b * exp(s_b - s_merged)

computed in float32; ``v_merged`` has ``v_a``'s dtype, ``s_merged`` is float32. An
LSE of ``+inf`` counts as ``-inf`` (an empty part), as in upstream's Triton
version. Outputs are written into ``v_merged`` / ``s_merged`` when given; the
pair is returned.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sgl_kernel._unprovided import define


def merge_state_v2(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    v_merged: Optional[torch.Tensor] = None,
    s_merged: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    inf = float("inf")
    sa = s_a.float().masked_fill(s_a == inf, -inf)
    sb = s_b.float().masked_fill(s_b == inf, -inf)
    m = torch.maximum(sa, sb)
    ea = torch.exp(sa - m)
    eb = torch.exp(sb - m)
    total = ea + eb
    out = v_a.float() * (ea / total).unsqueeze(-1) + v_b.float() * (eb / total).unsqueeze(-1)
    lse = torch.log(total) + m
    if v_merged is None:
        v_merged = torch.empty_like(v_a)
    if s_merged is None:
        s_merged = torch.empty_like(sa)
    v_merged.copy_(out)
    s_merged.copy_(lse)
    return v_merged, s_merged


merge_state = merge_state_v2

define(
    globals(),
    "sgl_kernel",
    (
        "flash_mla_decode",
        "flash_mla_decode_get_workspace_size",
        "flash_mla_get_workspace_size",
        "flash_mla_prefill",
        "flash_mla_prefill_get_workspace_size",
        "flash_mla_sparse_fwd",
        "flash_mla_with_kvcache",
        "fp8_mqa_logits",
        "fp8_paged_mqa_logits",
        "fp8_paged_mqa_logits_triton",
        "infllmv2_attn_stage1",
        "max_pooling_1d_varlen",
        "gdn_attention",
        "concat_mla_k",
        "fast_topk_v2",
        "fast_topk_transform_fused",
        "fast_topk_transform_ragged_fused",
        "minimax_decode_topk",
    ),
    "attention kernel: choose --attention-backend triton",
)
