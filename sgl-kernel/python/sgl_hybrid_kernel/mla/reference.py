"""Plain-torch MLA attention over a latent KV history (absorbed form).

MLA (DeepSeek-V2, 2024) caches one latent vector ``c`` (``kv_lora_rank``) and a
decoupled positional key ``k_pe`` (``qk_rope_head_dim``) per token, shared by
all heads. With the key up-projection absorbed into the query
(``q_lat = W_kc^T q_nope``) every head attends directly over the latent cache::

    score[t, h, s] = scale * (q_lat[t, h] . c[s] + q_pe[t, h] . k_pe[s])
    o_lat[t, h]    = sum_s softmax_s(score) c[s]

and the caller applies the value up-projection ``W_vc`` to ``o_lat``.
"""

from __future__ import annotations

from typing import Tuple

import torch


def mla_attention_absorbed(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    k_pe: torch.Tensor,
    scale: float,
    prefix_len: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal MLA attention for one sequence's new tokens.

    Args:
        q_lat: ``[T, H, R]`` absorbed queries (R = kv_lora_rank).
        q_pe: ``[T, H, P]`` positional part of the queries (P = qk_rope_head_dim).
        latent: ``[S, R]`` latent cache of the whole sequence so far
            (``S = prefix_len + T``), new tokens included.
        k_pe: ``[S, P]`` positional keys.
        scale: softmax scale (``qk_head_dim ** -0.5``).
        prefix_len: tokens before the first query; query ``t`` sees cache rows
            ``[0, prefix_len + t]``.

    Returns:
        ``(o_lat, lse)``: ``o_lat`` ``[T, H, R]`` in ``q_lat.dtype`` (FP32 math),
        ``lse`` ``[T, H]`` (FP32, or FP64 for FP64 inputs), the natural-log log-sum-exp of the scaled scores.

    Raises:
        ValueError: inconsistent lengths.
    """
    T, H, R = q_lat.shape
    S = latent.shape[0]
    if S != prefix_len + T or k_pe.shape[0] != S:
        raise ValueError(
            f"cache holds {S} latent / {k_pe.shape[0]} rope rows, expected prefix_len + T = {prefix_len + T}"
        )
    acc = torch.promote_types(q_lat.dtype, torch.float32)  # FP32 math, FP64 stays FP64
    scores = torch.einsum("thr,sr->ths", q_lat.to(acc), latent.to(acc))
    scores = scores + torch.einsum("thp,sp->ths", q_pe.to(acc), k_pe.to(acc))
    scores = scores * scale
    pos_q = torch.arange(T, device=q_lat.device) + prefix_len
    mask = torch.arange(S, device=q_lat.device).unsqueeze(0) > pos_q.unsqueeze(1)  # [T, S]
    scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    o_lat = torch.einsum("ths,sr->thr", probs, latent.to(acc))
    return o_lat.to(q_lat.dtype), lse
