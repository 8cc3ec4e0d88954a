"""Plain-torch reference of Kimi K3's attention-residual mixing (AttnRes).

Kimi K3 keeps a bank of residual-stream snapshots, one per block of
``attn_res_block_size`` layers, plus the running partial sum of the current
block. Before each RMSNorm read (attention input, FFN input, final norm) the
rows ``[bank_0, ..., bank_{n-1}, partial]`` are mixed with softmax weights from
a learned scoring vector applied to each row's RMSNorm (seeds digest, item 6).
"""

from __future__ import annotations

import torch

from sgl_hybrid_kernel.norm.reference import rms_norm


def attn_res_mix(
    rows: torch.Tensor,
    score_norm_weight: torch.Tensor,
    score_proj_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Mix banked rows with softmax weights.

    Args:
        rows: ``[T, R, D]``: R-1 banked snapshots followed by the partial sum.
        score_norm_weight: ``[D]`` RMSNorm weight of the scoring path.
        score_proj_weight: ``[1, D]`` or ``[D]`` scoring vector.
        eps: RMSNorm epsilon.

    Returns:
        ``[T, D]`` in ``rows.dtype``: ``sum_r softmax_r(score_r) * rows[:, r]`` with
        ``score_r = proj . rms_norm(rows[:, r])``; softmax and sum in FP32 (the
        scores themselves are rounded to ``rows.dtype`` like the unfused linear).
    """
    T, R, D = rows.shape
    if R == 1:
        return rows[:, 0]
    normed = rms_norm(rows.reshape(T * R, D), score_norm_weight, eps)
    scores = (normed @ score_proj_weight.reshape(D, 1).to(normed.dtype)).reshape(T, R)
    probs = torch.softmax(scores.float(), dim=-1)
    return (probs.unsqueeze(-1) * rows.float()).sum(1).to(rows.dtype)
