"""Top-k / top-p renormalisation of ``sgl_kernel``, in plain torch.

``probs``: ``[batch, vocab]``; ``top_k`` / ``top_p``: a scalar or a ``[batch]``
tensor. The result is a new float32 tensor (the real ops cast to float32 too):

* top-k keeps the probabilities ``>=`` the row's k-th largest one (ties at the
  pivot are kept), zeroes the rest and renormalises; ``k <= 0`` or
  ``k >= vocab`` keeps the whole row (SGLang passes ``1 << 30`` for "off");
* top-p keeps the smallest set of largest probabilities whose mass reaches
  ``top_p`` (again every probability ``>=`` the smallest kept one), zeroes the
  rest and renormalises; ``top_p >= 1`` keeps the whole row.

No host synchronisation, so both run inside CUDA graphs.
"""

from __future__ import annotations

from typing import Union

import torch

from sgl_kernel._unprovided import define


def _per_row(value, batch: int, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        t = value.to(device=device, dtype=dtype).reshape(-1)
        return t.expand(batch) if t.numel() == 1 else t
    return torch.full((batch,), value, dtype=dtype, device=device)


def _renorm(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_k: Union[torch.Tensor, int], *args, **kwargs) -> torch.Tensor:
    p = probs.float()
    vocab = p.shape[-1]
    k = _per_row(top_k, p.shape[0], torch.long, p.device)
    sorted_desc = torch.sort(p, dim=-1, descending=True).values
    pivot = sorted_desc.gather(-1, (k.clamp(1, vocab) - 1).unsqueeze(-1))
    off = ((k <= 0) | (k >= vocab)).unsqueeze(-1)
    return _renorm(p, (p >= pivot) | off)


def top_p_renorm_prob(probs: torch.Tensor, top_p: Union[torch.Tensor, float], *args, **kwargs) -> torch.Tensor:
    p = probs.float()
    tp = _per_row(top_p, p.shape[0], torch.float32, p.device).unsqueeze(-1)
    sorted_desc = torch.sort(p, dim=-1, descending=True).values
    cumulative = torch.cumsum(sorted_desc, dim=-1)
    mass_before = torch.cat((torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]), dim=-1)
    n_keep = (mass_before < tp).sum(dim=-1, keepdim=True).clamp(min=1)
    pivot = sorted_desc.gather(-1, n_keep - 1)
    return _renorm(p, (p >= pivot) | (tp >= 1.0))


# The real package exports both spellings.
top_k_renorm_probs = top_k_renorm_prob
top_p_renorm_probs = top_p_renorm_prob

define(
    globals(),
    "sgl_kernel",
    (
        "min_p_sampling_from_probs",
        "top_k_top_p_sampling_from_probs",
        "tree_speculative_sampling_target_only",
    ),
    "sampling kernels: use --sampling-backend pytorch",
)
