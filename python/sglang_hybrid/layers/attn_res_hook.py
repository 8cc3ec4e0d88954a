"""Our fused AttnRes + RMSNorm kernel under upstream's attention-residual aggregation (issue 5, Wiring).

Upstream's Kimi K3 (``models/kimi_k3.py``) reads its attention-residual stream
through ``AttnResidual.forward`` in ``sglang.srt.layers.attn_residual``, which
calls the module-level ``_aggregate(prefix_sum, bank, nvb, score_proj,
score_norm, out_norm, write_bank_row)`` (score -> softmax -> mix -> RMSNorm) and
``_aggregate_fused_add(prefix_a, prefix_b, ...)`` (the same after a pending
residual add; returns ``(normed, prefix)``). AROUND hooks on both send GPU/ROCm
calls inside our contract to ``sgl_hybrid_kernel.attn_res`` (:func:`aggregate`):
hidden size <= 16384, <= 16 bank rows, both norms plain ``RMSNorm`` with the same
epsilon, a bias-free unquantized ``[1, D]`` score projection. A read with every
bank row valid (``nvb == bank rows``: the final read of every Kimi K3 stack, whose
bank holds ``ceil(layers / attn_res_block_size)`` rows) is inside the contract
unless it also writes a row.

A GPU call outside our contract goes to upstream's functions only where upstream
computes its shape: upstream's Triton score/combine pair (``_mix_fused``, the
path off SM100's TMA kernel and ROCm's single kernel) tiles the hidden size by
``attn_residual._BLOCK_H = 1024`` with no tail, so at any other hidden size it
launches ``H // 1024 = 0`` combine programs and returns ``torch.empty_like``
memory (``aggregate_stream`` guards this, ``_aggregate`` does not). Such calls run
upstream's eager reference ``aggregate_stream_torch`` and the output norm module
instead. CPU calls run upstream's functions unchanged.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.attn_res.dispatch import _why_not_triton
from sgl_hybrid_kernel.attn_res.fused import attn_res_rmsnorm_triton
from sgl_hybrid_kernel.attn_res.fused_reference import attn_res_rmsnorm_reference
from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice
from sglang_hybrid.patches import register_patches

logger = logging.getLogger(__name__)


def _eps(norm) -> Optional[float]:
    return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))


def _weights(score_proj, score_norm, out_norm, D: int):
    """``(score_norm_w, score_proj_w, out_norm_w, eps)`` or a reason string."""
    w = getattr(score_proj, "weight", None)
    if getattr(score_proj, "bias", None) is not None or not isinstance(w, torch.Tensor) or w.numel() != D \
            or not w.dtype.is_floating_point or w.element_size() < 2:
        return "score projection is not a bias-free unquantized [1, D] matrix"
    e1, e2 = _eps(score_norm), _eps(out_norm)
    if e1 is None or e1 != e2 or not getattr(score_norm, "has_weight", True) or not getattr(out_norm, "has_weight", True):
        return "norms differ in epsilon or carry no weight"
    return score_norm.weight, w.reshape(-1), out_norm.weight, float(e1)


def aggregate(prefix: Optional[torch.Tensor], addend: torch.Tensor, bank: torch.Tensor, nvb: int, score_proj, score_norm,
              out_norm, write_bank_row: bool = False, impl: str = "triton") -> Tuple[torch.Tensor, torch.Tensor]:
    """One read on our kernel with upstream's module arguments: ``(normed [T, D], head [T, D])``,
    ``head = prefix + addend`` (``addend`` when ``prefix`` is None). impl: ``"triton"`` or ``"torch"``.

    Raises:
        ValueError: modules outside the contract (see the module docstring).
    """
    got = _weights(score_proj, score_norm, out_norm, addend.shape[-1])
    if isinstance(got, str):
        raise ValueError(f"score_proj/score_norm/out_norm: {got}")
    fn = attn_res_rmsnorm_triton if impl == "triton" else attn_res_rmsnorm_reference
    return fn(prefix, addend, bank, nvb, *got, write_bank_row)


def _upstream_covers(hidden: int, nvb: int) -> bool:
    """Whether upstream's ``_aggregate`` computes a GPU read at this hidden size (module docstring)."""
    from sglang.srt.layers import attn_residual as up

    return hidden % up._BLOCK_H == 0 or up._use_hip_fused(hidden, nvb)


def _eager(prefix: Optional[torch.Tensor], addend: torch.Tensor, bank: torch.Tensor, nvb: int, score_proj, score_norm,
           out_norm, write_bank_row: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Upstream's eager read: ``(out_norm(aggregate_stream_torch(head, ...)), head)``, ``head = prefix + addend``."""
    from sglang.srt.layers.attn_residual import aggregate_stream_torch

    head = addend if prefix is None else prefix + addend
    normed = out_norm(aggregate_stream_torch(head, bank, nvb, score_proj, score_norm))
    if write_bank_row:
        bank[:, nvb].copy_(head)
    return normed, head


def _route(x: torch.Tensor, bank, nvb, score_proj, score_norm, out_norm, write_bank_row: bool = False) -> str:
    """``"ours"``, ``"upstream"`` or ``"eager"`` (upstream's eager reference) for one read."""
    if device_kind(x) == "cpu":
        return "upstream"
    if x.shape[0] == 0:
        return "upstream"  # upstream returns the empty input before any kernel
    why = _why_not_triton(x, bank) or None
    if why is None and not (0 <= nvb <= bank.shape[1] and not (write_bank_row and nvb >= bank.shape[1])):
        why = f"nvb={nvb} outside a bank of {bank.shape[1]} rows (write_bank_row={write_bank_row})"
    if why is None:
        got = _weights(score_proj, score_norm, out_norm, x.shape[-1])
        why = got if isinstance(got, str) else None
    if why is None:
        record_choice("attn_res_hook", "sgl_hybrid", "upstream attn_residual._aggregate -> attn_res_rmsnorm_kernel", log=logger)
        return "ours"
    if _upstream_covers(x.shape[-1], nvb):
        record_choice("attn_res_hook", "upstream", why, log=logger)
        return "upstream"
    record_choice("attn_res_hook", "upstream_eager",
                  f"{why}; upstream's Triton aggregation does not cover hidden size {x.shape[-1]} "
                  "(not a multiple of 1024): aggregate_stream_torch + out_norm", log=logger)
    return "eager"


def _around_aggregate(original, prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=False, **kw):
    route = "upstream" if kw else _route(prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)
    if route == "upstream":
        return original(prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=write_bank_row, **kw)
    if route == "eager":
        return _eager(None, prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)[0]
    return aggregate(None, prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)[0]


def _around_aggregate_fused_add(original, prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm,
                                write_bank_row=False, **kw):
    route = "upstream" if kw else _route(prefix_a, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)
    if route == "upstream":
        return original(prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=write_bank_row, **kw)
    if route == "eager":
        return _eager(prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)
    return aggregate(prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)


def install() -> None:
    """AROUND hooks on upstream's ``attn_residual._aggregate`` / ``_aggregate_fused_add`` (GPU/ROCm only)."""
    register_patches(__name__)
