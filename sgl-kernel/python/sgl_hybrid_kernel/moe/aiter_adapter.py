"""Adapter from our routed-expert compute (SwiGLU experts, ``moe.reference.moe_experts``) to aiter's ``fused_moe`` (ROCm).

aiter's boundary as read from ROCm/aiter ``aiter/fused_moe.py`` and ``aiter/ops/shuffle.py``
(not run here: no ROCm):

* ``fused_moe(hidden_states [M, D], w1 [E, 2I, D], w2 [E, D, I], topk_weight [M, k],
  topk_ids [M, k], expert_mask=None, activation=ActivationType.Silu,
  quant_type=QuantType.No, ...) -> [M, D]`` in the activation dtype (BF16 / FP16).
  ``w1`` rows are the gate projection then the up projection (our ``w13`` layout),
  and the routing weight multiplies each expert's output (``doweight_stage1=False``),
  as in our reference. aiter sorts the tokens by expert itself (``moe_sorting``:
  token ids padded per expert to its ``block_size_M``, in its own packed format),
  so the adapter hands it the unsorted ``topk_ids`` and never our block layout
  (``moe.routing.MoeRouting.sorted_ids``, sentinel ``M * k'``), which it cannot read.
* ``topk_ids`` int32 and ``topk_weight`` FP32, contiguous (SGLang's aiter runner
  converts to exactly these).
* The CK kernels want *pre-shuffled* weights: ``shuffle_weight(w, (16, 16))`` once at
  load, which returns a tensor flagged ``is_shuffled``; ``fused_moe`` reads that flag
  (``getattr(w1, "is_shuffled", False)``). A flag set on a tensor is lost when the
  tensor is re-wrapped (``nn.Parameter``), so the adapter re-marks *views* of the
  weights the caller declares shuffled instead of trusting the attribute.
* ``expert_mask [E_global]`` (1 = local expert): ids are global and mapped to local
  ones through its running sum; an id whose mask entry is 0 contributes nothing.
  For slots with no expert (id ``-1``: padding or, under EP, another rank's expert)
  the adapter uses SGLang's convention: such ids become a sink id ``E`` and the
  mask has ``E + 1`` entries with the last one 0.
* Supported shapes (capability check): BF16 / FP16 activations and weights of the
  same dtype; ``I % 128 == 0`` (CK fused MoE, as SGLang's unquantized method
  checks); ``D % 32 == 0`` (the 16 x 32 shuffle tile of 2-byte weights).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

AITER_MOE_DTYPES = (torch.bfloat16, torch.float16)
AITER_SHUFFLE_LAYOUT = (16, 16)
AITER_MOE_INTER_ALIGN = 128
AITER_MOE_HIDDEN_ALIGN = 32


def aiter_moe_unsupported_shape(dtype: torch.dtype, hidden: int, inter: int) -> Optional[str]:
    """Why aiter's fused MoE does not take experts of this dtype / hidden size ``D`` / intermediate size ``I`` (``None``: it does)."""
    if dtype not in AITER_MOE_DTYPES:
        return f"dtype {dtype} (aiter fused_moe unquantized: bf16 / fp16)"
    if inter % AITER_MOE_INTER_ALIGN:
        return f"intermediate size {inter} not a multiple of {AITER_MOE_INTER_ALIGN} (CK fused MoE)"
    if hidden % AITER_MOE_HIDDEN_ALIGN:
        return f"hidden size {hidden} not a multiple of {AITER_MOE_HIDDEN_ALIGN} (weight shuffle tile)"
    return None


def _check_weights(w13: torch.Tensor, w2: torch.Tensor) -> Tuple[int, int, int]:
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"w13 / w2: expected [E, 2I, D] and [E, D, I], got {tuple(w13.shape)} and {tuple(w2.shape)}")
    E, two_i, D = w13.shape
    if two_i % 2 or tuple(w2.shape) != (E, D, two_i // 2):
        raise ValueError(f"w2: shape {tuple(w2.shape)} does not match w13 {tuple(w13.shape)} (expected ({E}, {D}, {two_i // 2}))")
    if w13.dtype != w2.dtype:
        raise ValueError(f"w13 / w2: dtypes differ ({w13.dtype}, {w2.dtype})")
    return E, D, two_i // 2


def mark_shuffled(w: torch.Tensor) -> torch.Tensor:
    """A view of ``w`` flagged ``is_shuffled`` (the caller's tensor object is not changed)."""
    v = w.view(w.shape)
    v.is_shuffled = True
    return v


def shuffle_moe_weights(w13: torch.Tensor, w2: torch.Tensor, shuffle_fn: Optional[Callable] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pre-shuffle both expert weight tensors for aiter's CK kernels, once at load time.

    Args:
        w13: ``[E, 2I, D]``; w2: ``[E, D, I]``, BF16 / FP16 inside the capability check.
        shuffle_fn: aiter's ``shuffle_weight`` (default: ``aiter.ops.shuffle.shuffle_weight``),
            called as ``shuffle_fn(w, (16, 16))``.

    Returns:
        ``(w13_shuffled, w2_shuffled)``: same shapes and dtype, flagged ``is_shuffled``;
        only :func:`fused_moe_aiter` can use them.

    Raises:
        ValueError: inconsistent shapes, or experts outside aiter's contract.
        RuntimeError: the shuffle changed a shape or dtype.
    """
    E, D, inter = _check_weights(w13, w2)
    why = aiter_moe_unsupported_shape(w13.dtype, D, inter)
    if why:
        raise ValueError(f"w13 / w2: {why}")
    if shuffle_fn is None:
        from aiter.ops.shuffle import shuffle_weight as shuffle_fn  # noqa: N813  (ROCm only)
    out = []
    for w in (w13, w2):
        s = shuffle_fn(w.contiguous(), AITER_SHUFFLE_LAYOUT)
        if tuple(s.shape) != tuple(w.shape) or s.dtype != w.dtype:
            raise RuntimeError(f"aiter shuffle_weight returned {tuple(s.shape)} {s.dtype} for {tuple(w.shape)} {w.dtype}")
        out.append(mark_shuffled(s))
    return out[0], out[1]


def sink_expert_ids(topk_ids: torch.Tensor, num_experts: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ids int32, expert_mask [E + 1] int32)``: id ``-1`` (no expert) becomes the sink ``E``, masked off.

    No host sync: the remap is elementwise and the mask does not depend on the ids.
    """
    ids = torch.where(topk_ids < 0, torch.full_like(topk_ids, num_experts), topk_ids).to(torch.int32).contiguous()
    mask = torch.ones(num_experts + 1, dtype=torch.int32, device=topk_ids.device)
    mask[num_experts] = 0
    return ids, mask


def fused_moe_aiter(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    weights_shuffled: bool,
    has_empty_slots: bool = False,
    fused_moe_fn: Optional[Callable] = None,
    activation=None,
    quant_type=None,
) -> torch.Tensor:
    """Weighted sum of the chosen SwiGLU experts' outputs through aiter's ``fused_moe``.

    Args:
        x: ``[..., D]`` BF16 / FP16 tokens (``M`` = product of the leading dimensions).
        w13, w2: from :func:`shuffle_moe_weights` (``[E, 2I, D]``, ``[E, D, I]``).
        topk_weights: ``[M, k]`` any float dtype (passed as FP32); topk_ids: ``[M, k]`` any
            integer dtype, in ``[0, E)`` (passed as int32), or ``-1`` for a slot without an
            expert when ``has_empty_slots``.
        weights_shuffled: must be True: the caller declares ``w13`` / ``w2`` pre-shuffled.
        has_empty_slots: remap ``-1`` ids to a masked sink expert (:func:`sink_expert_ids`).
        fused_moe_fn: aiter's ``fused_moe`` (default: ``aiter.fused_moe.fused_moe``).
        activation, quant_type: aiter's ``ActivationType.Silu`` / ``QuantType.No``
            (default: read from ``aiter``).

    Returns:
        ``[..., D]`` in ``x.dtype``, as ``moe.reference.moe_experts`` (slots without an expert add nothing).

    Raises:
        ValueError: unshuffled weights, mismatched shapes / dtypes, or experts outside aiter's contract.
        RuntimeError: aiter returned a tensor of another shape or dtype.
        ImportError: aiter missing and no ``fused_moe_fn`` given.
    """
    if not weights_shuffled:
        raise ValueError("weights_shuffled: aiter's CK kernels need weights from shuffle_moe_weights (shuffle once at load)")
    E, D, inter = _check_weights(w13, w2)
    if x.shape[-1] != D or x.dtype != w13.dtype:
        raise ValueError(f"x: [..., {D}] {w13.dtype} expected for these experts, got {tuple(x.shape)} {x.dtype}")
    why = aiter_moe_unsupported_shape(x.dtype, D, inter)
    if why:
        raise ValueError(f"x / w13 / w2: {why}")
    x2 = x.reshape(-1, D).contiguous()
    M = x2.shape[0]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != M or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids / topk_weights: [{M}, k] expected, got {tuple(topk_ids.shape)} / {tuple(topk_weights.shape)}")
    if M == 0:
        return torch.empty_like(x)
    if fused_moe_fn is None:
        from aiter.fused_moe import fused_moe as fused_moe_fn  # noqa: N813  (ROCm only)
    if activation is None or quant_type is None:
        import aiter

        activation = aiter.ActivationType.Silu if activation is None else activation
        quant_type = aiter.QuantType.No if quant_type is None else quant_type
    if has_empty_slots:
        ids, mask = sink_expert_ids(topk_ids, E)
    else:
        ids, mask = topk_ids.to(torch.int32).contiguous(), None
    weights = topk_weights.to(torch.float32).contiguous()
    out = fused_moe_fn(x2, mark_shuffled(w13), mark_shuffled(w2), weights, ids, expert_mask=mask,
                       activation=activation, quant_type=quant_type)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, D) or out.dtype != x.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise RuntimeError(f"aiter fused_moe returned {got}, expected ({M}, {D}) {x.dtype}")
    return out.reshape(x.shape)
