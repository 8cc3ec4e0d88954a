"""Routed-expert compute dispatch (op ``moe_experts``): aiter's fused MoE (ROCm) or plain torch.

The path is decided per weight set, once, at load time (:func:`prepare_moe_weights`),
because aiter needs its weights pre-shuffled while every other path reads them
as they are; :func:`moe_experts` then follows the layout the weights carry.
Choice, recorded through ``sgl_hybrid_kernel.dispatch.record_choice``:

* CPU tensors -> ``moe.reference.moe_experts``.
* ROCm, ``aiter`` importable (``fused_moe``, ``shuffle_weight``, its enums) and the
  experts inside aiter's contract (``aiter_adapter.aiter_moe_unsupported_shape``)
  -> ``aiter_adapter.fused_moe_aiter`` on weights shuffled once.
* Otherwise plain torch, with the reason. This package has no Triton grouped-GEMM
  expert kernel (only the routing kernels, ``moe.dispatch``): on CUDA / ROCm the
  served models run upstream's ``fused_moe_triton`` (docs/rocm.md, "aiter").

Boot gate (op registry): the chosen path on tiny experts against an FP64 loop
over (token, slot) pairs, including a slot without an expert (id ``-1``).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from sgl_hybrid_kernel import dispatch as _dispatch
from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.moe.aiter_adapter import aiter_moe_unsupported_shape, fused_moe_aiter, shuffle_moe_weights
from sgl_hybrid_kernel.moe.reference import moe_experts as moe_experts_reference

logger = logging.getLogger(__name__)

OP = "moe_experts"
LAYOUT_PLAIN = "plain"
LAYOUT_AITER = "aiter_shuffled"


class AiterMoe(NamedTuple):
    """aiter's fused-MoE entry points, resolved once."""

    fused_moe: Callable
    shuffle_weight: Callable
    silu: object
    no_quant: object


@functools.lru_cache(maxsize=1)
def aiter_moe_fns() -> Optional[AiterMoe]:
    """aiter's ``fused_moe``, ``shuffle_weight``, ``ActivationType.Silu``, ``QuantType.No`` if they import (ROCm), else ``None``."""
    try:
        import aiter
        from aiter.fused_moe import fused_moe
        from aiter.ops.shuffle import shuffle_weight

        return AiterMoe(fused_moe, shuffle_weight, aiter.ActivationType.Silu, aiter.QuantType.No)
    except Exception:  # ImportError, aiter's own load errors, or a build without these names
        return None


class MoeExpertWeights(NamedTuple):
    """Expert weights in the layout of their path: ``w13 [E, 2I, D]``, ``w2 [E, D, I]``;
    ``layout`` is ``"plain"`` (torch) or ``"aiter_shuffled"`` (only aiter can read them)."""

    w13: torch.Tensor
    w2: torch.Tensor
    layout: str


def moe_experts_choice(kind: str, dtype: torch.dtype, hidden: int, inter: int) -> _dispatch.KernelChoice:
    """The path for experts of this dtype and sizes on a device of ``kind`` (recorded)."""
    if kind == "cpu":
        return _dispatch.record_choice(OP, "torch", "CPU tensors: plain-torch reference", log=logger)
    no_triton = "no Triton expert kernel in sgl_hybrid_kernel"
    if kind == "rocm":
        why = "aiter does not import" if aiter_moe_fns() is None else aiter_moe_unsupported_shape(dtype, hidden, inter)
        if why is None:
            return _dispatch.record_choice(OP, "aiter", f"rocm: aiter fused_moe (CK, weights shuffled 16x16 at load), "
                                           f"{dtype}, hidden {hidden}, intermediate {inter}", log=logger)
        return _dispatch.record_choice(OP, "torch", f"aiter not used: {why}; {no_triton}", log=logger)
    return _dispatch.record_choice(OP, "torch", f"{kind}: {no_triton}", log=logger)


def prepare_moe_weights(w13: torch.Tensor, w2: torch.Tensor) -> MoeExpertWeights:
    """Choose the path for these experts on their device and lay the weights out for it (once, at load).

    Args:
        w13: ``[E, 2I, D]`` gate then up projections; w2: ``[E, D, I]``.

    Returns:
        :class:`MoeExpertWeights` (shuffled copies for aiter, the same tensors otherwise).

    Raises:
        ValueError: inconsistent shapes.
    """
    if w13.dim() != 3 or w2.dim() != 3 or tuple(w2.shape) != (w13.shape[0], w13.shape[2], w13.shape[1] // 2):
        raise ValueError(f"w13 / w2: expected [E, 2I, D] and [E, D, I], got {tuple(w13.shape)} and {tuple(w2.shape)}")
    choice = moe_experts_choice(device_kind(w13), w13.dtype, w13.shape[2], w2.shape[2])
    if choice.impl == "aiter":
        w13s, w2s = shuffle_moe_weights(w13, w2, shuffle_fn=aiter_moe_fns().shuffle_weight)
        return MoeExpertWeights(w13s, w2s, LAYOUT_AITER)
    return MoeExpertWeights(w13, w2, LAYOUT_PLAIN)


def moe_experts(x: torch.Tensor, weights: MoeExpertWeights, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                has_empty_slots: bool = False) -> torch.Tensor:
    """Weighted sum of the chosen SwiGLU experts' outputs on the path ``weights`` were prepared for.

    Args:
        x: ``[M, D]``; weights: from :func:`prepare_moe_weights`.
        topk_weights, topk_ids: ``[M, k]``; with ``has_empty_slots``, id ``-1`` marks a slot
            without an expert (it adds nothing).

    Returns:
        ``[M, D]`` in ``x.dtype``, as ``moe.reference.moe_experts``.

    Raises:
        ValueError: an unknown layout, or mismatched shapes / dtypes on the aiter path.
    """
    if weights.layout == LAYOUT_AITER:
        fns = aiter_moe_fns()
        if fns is None:
            raise ValueError("weights: laid out for aiter, but aiter does not import in this process")
        return fused_moe_aiter(x, weights.w13, weights.w2, topk_weights, topk_ids, weights_shuffled=True,
                               has_empty_slots=has_empty_slots, fused_moe_fn=fns.fused_moe, activation=fns.silu,
                               quant_type=fns.no_quant)
    if weights.layout != LAYOUT_PLAIN:
        raise ValueError(f"weights: unknown layout {weights.layout!r}")
    if has_empty_slots:
        empty = topk_ids < 0
        topk_weights = topk_weights.masked_fill(empty, 0.0)
        topk_ids = topk_ids.masked_fill(empty, 0)
    return moe_experts_reference(x, weights.w13, weights.w2, topk_weights, topk_ids)


# ------------------------------------------------------------------ op registry
PLAN_HIDDEN, PLAN_INTER = 7168, 256  # Kimi K3 hidden size; an expert shard of I = 256 per rank (illustrative)
# (M, E, k, D, I): tiny, and inside aiter's contract (I % 128, D % 32) so the aiter path can be gated too.
GATE_CASE = (5, 4, 2, 128, 128)
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # BF16: aiter rounds the intermediate to BF16 (2^-9 relative)


def _oracle(x, w13, w2, tw, ti) -> torch.Tensor:
    """FP64 loop over (token, slot): ``sum_j w_j * W2_e (silu(G_e x) * U_e x)``; id < 0 adds nothing."""
    x, w13, w2, tw = x.double(), w13.double(), w2.double(), tw.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = int(ti[m, j])
            if e < 0:
                continue
            h = w13[e] @ x[m]
            out[m] += tw[m, j] * (w2[e] @ (F.silu(h[:inter]) * h[inter:]))
    return out


def gate_moe_experts(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``moe_experts``: ``impl`` (``"aiter"`` or ``"torch"``) vs the FP64 loop.

    Raises:
        ValueError: unknown ``impl``, or ``"aiter"`` without aiter.
    """
    if impl not in ("aiter", "torch"):
        raise ValueError(f"impl: no moe_experts implementation named {impl!r}")
    M, E, k, D, inter = GATE_CASE
    dtype, tol = (torch.bfloat16, TOLERANCE["bf16"]) if impl == "aiter" else (torch.float32, TOLERANCE["fp32"])
    gen = torch.Generator().manual_seed(400)
    x = torch.randn(M, D, generator=gen).to(dtype)
    w13 = (torch.randn(E, 2 * inter, D, generator=gen) / D ** 0.5).to(dtype)
    w2 = (torch.randn(E, D, inter, generator=gen) / inter ** 0.5).to(dtype)
    ti = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)])
    ti[1, 1] = -1  # a slot without an expert (padding / another EP rank's expert)
    tw = torch.rand(M, k, generator=gen) + 0.5
    if impl == "aiter":
        fns = aiter_moe_fns()
        if fns is None:
            raise ValueError("impl: 'aiter' chosen but aiter does not import")
        w13s, w2s = shuffle_moe_weights(w13.to(device), w2.to(device), shuffle_fn=fns.shuffle_weight)
        weights = MoeExpertWeights(w13s, w2s, LAYOUT_AITER)
    else:
        weights = MoeExpertWeights(w13.to(device), w2.to(device), LAYOUT_PLAIN)
    got = moe_experts(x.to(device), weights, tw.to(device), ti.to(device), has_empty_slots=True)
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = [(got, _oracle(x, w13, w2, tw, ti))]
    return _dispatch.GateResult(OP, impl, _dispatch.max_abs_error(pairs), tol,
                                f"M={M} E={E} top{k} D={D} I={inter}, one empty slot, {str(dtype)[6:]}")


def plan_moe_experts(device) -> _dispatch.KernelChoice:
    """What :func:`prepare_moe_weights` picks on ``device`` for BF16 experts of hidden 7168, I = 256 (recorded)."""
    return moe_experts_choice(device_kind(torch.empty(0, device=device)), torch.bfloat16, PLAN_HIDDEN, PLAN_INTER)


_dispatch.register_op(OP, plan_moe_experts, gate_moe_experts, "routed SwiGLU experts (fused MoE)")
