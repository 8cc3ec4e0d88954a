"""Our fused AttnRes + RMSNorm kernel under upstream's attention-residual aggregation (issue 5, Wiring).

Upstream's Kimi K3 (``models/kimi_k3.py``) reads its attention-residual stream
through ``AttnResidual.forward`` in ``sglang.srt.layers.attn_residual``, which
calls the module-level ``_aggregate(prefix_sum, bank, nvb, score_proj,
score_norm, out_norm, write_bank_row)`` (score -> softmax -> mix -> RMSNorm) and
``_aggregate_fused_add(prefix_a, prefix_b, ...)`` (the same after a pending
residual add; returns ``(normed, prefix)``). AROUND hooks on both send GPU/ROCm
calls inside our contract to ``sgl_hybrid_kernel.attn_res`` (:func:`aggregate`):
hidden size <= 16384, <= 16 bank rows, both norms plain ``RMSNorm`` with the same
epsilon, a bias-free unquantized ``[1, D]`` score projection. CPU and everything
else run upstream's functions unchanged.
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
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

logger = logging.getLogger(__name__)

AGGREGATE = "sglang.srt.layers.attn_residual._aggregate"
AGGREGATE_FUSED_ADD = "sglang.srt.layers.attn_residual._aggregate_fused_add"


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


def _ours(x: torch.Tensor, bank, nvb, score_proj, score_norm, out_norm) -> bool:
    if device_kind(x) == "cpu":
        return False
    why = "empty batch" if x.shape[0] == 0 else (_why_not_triton(x, bank) or None)
    if why is None and nvb >= bank.shape[1]:
        why = f"nvb={nvb} outside a bank of {bank.shape[1]}"
    if why is None:
        got = _weights(score_proj, score_norm, out_norm, x.shape[-1])
        why = got if isinstance(got, str) else None
    if why:
        record_choice("attn_res_hook", "upstream", why, log=logger)
        return False
    record_choice("attn_res_hook", "sgl_hybrid", "upstream attn_residual._aggregate -> attn_res_rmsnorm_kernel", log=logger)
    return True


def _around_aggregate(original, prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=False, **kw):
    if kw or not _ours(prefix_sum, bank, nvb, score_proj, score_norm, out_norm):
        return original(prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=write_bank_row, **kw)
    return aggregate(None, prefix_sum, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)[0]


def _around_aggregate_fused_add(original, prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm,
                                write_bank_row=False, **kw):
    if kw or not _ours(prefix_a, bank, nvb, score_proj, score_norm, out_norm):
        return original(prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm, write_bank_row=write_bank_row, **kw)
    return aggregate(prefix_a, prefix_b, bank, nvb, score_proj, score_norm, out_norm, write_bank_row)


def install() -> None:
    """AROUND hooks on upstream's ``attn_residual._aggregate`` / ``_aggregate_fused_add`` (GPU/ROCm only)."""
    HookRegistry.register(AGGREGATE, _around_aggregate, HookType.AROUND)
    HookRegistry.register(AGGREGATE_FUSED_ADD, _around_aggregate_fused_add, HookType.AROUND)
