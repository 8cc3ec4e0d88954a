"""Plain-torch vocab screening for the LM head (seeds digest item 16, issue 6).

Computing ``hidden @ W^T`` over the whole vocabulary (248,320 rows x 2,560 for
Qwen3.8-Flash-Next, 1.27 GB in BF16) dominates a decode step's LM head. Screening
reads a low-precision copy of ``W`` for every row and the original rows only for
a few candidates::

    approx  = hidden @ dequant(Q)^T                    [N, V]  all rows, low precision
    cand    = top_k(approx)                            [N, k]  k = 64 by default
    exact   = hidden @ W[cand]^T                       [N, k]  original rows, >= FP32 sums
    token   = cand[argmax(exact)]                      greedy choice

The chosen token equals the full-precision argmax whenever the true argmax is
among the ``k`` best approximate logits (always, if the approximation is exact
and ``k >= 1``); the greedy oracle test measures how often it is not.

Formats of ``Q`` (``quantize_rows``):

* ``"int8"``: symmetric int8, one FP32 scale per row (``amax / 127``);
* ``"fp8"``: e4m3 (``float8_e4m3fn``), one FP32 scale per row (``amax / 448``);
* ``"mxfp4"``: OCP MX FP4 (e2m1 values ``0, .5, 1, 1.5, 2, 3, 4, 6``) with one
  power-of-two (E8M0) scale per block of 32 along the hidden dim,
  ``2^(floor(log2 amax) - 2)``; the article's format (values past 6 clamp to 6).

Full-vocabulary logits for sampling (:func:`screen_logits`): the candidates carry
their exact logits, every other row its approximate logit clamped just below the
smallest exact candidate logit, so the row's argmax is always the screened
token while temperature sampling still sees the approximate tail.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FORMATS = ("int8", "fp8", "mxfp4")
MX_BLOCK = 32
EXACT_CHUNK_ELEMENTS = 1 << 24  # gathered candidate rows per step (64 MiB in FP32)
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@dataclass(frozen=True)
class QuantizedRows:
    """A low-precision copy of ``W [V, D]``.

    Attributes:
        fmt: one of :data:`FORMATS`.
        codes: ``[V, D]``: int8 values (``"int8"``), e4m3 values (``"fp8"``), or
            twice the e2m1 value as int8 (``"mxfp4"``, so ``6.0`` is stored as ``12``).
        scale: ``[V]`` FP32 per-row scales, or ``[V, D / 32]`` FP32 powers of two (``"mxfp4"``).
    """

    fmt: str
    codes: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self):
        return tuple(self.codes.shape)


@dataclass(frozen=True)
class ScreenedLogits:
    """Result of :func:`screen_logits` for ``N`` hidden states and ``k`` candidates.

    Attributes:
        logits: ``[N, V]`` FP32 (FP64 for FP64 inputs): exact at the candidates, the clamped
            approximation elsewhere (module docstring).
        candidates: ``[N, k]`` int64 vocabulary ids, best approximate logit first.
        exact: ``[N, k]`` exact logits of the candidates.
        token: ``[N]`` int64 greedy choice: the candidate with the largest exact logit (ties: the smaller
            id, as ``argmax`` over ``logits`` picks).
    """

    logits: torch.Tensor
    candidates: torch.Tensor
    exact: torch.Tensor
    token: torch.Tensor


def quantize_rows(weight: torch.Tensor, fmt: str = "fp8") -> QuantizedRows:
    """Quantise the LM head ``weight [V, D]`` to ``fmt`` (module docstring).

    Raises:
        ValueError: ``fmt`` unknown; ``weight`` not 2-D floating point or not finite;
            ``D`` not a multiple of 32 for ``"mxfp4"``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D floating-point tensor, got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("weight holds NaN or inf values")
    if fmt == "mxfp4":
        V, D = w.shape
        if D % MX_BLOCK:
            raise ValueError(f"weight: hidden dim {D} is not a multiple of the MX block {MX_BLOCK}")
        blocks = w.view(V, D // MX_BLOCK, MX_BLOCK)
        amax = blocks.abs().amax(-1)
        exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(torch.finfo(torch.float32).tiny))) - 2,
                          torch.zeros_like(amax))
        scale = torch.exp2(exp.clamp(-127, 127))
        u = (blocks / scale[..., None]).abs()
        grid = _E2M1.to(w.device)
        idx = torch.bucketize(u, (grid[1:] + grid[:-1]) / 2)  # nearest grid point; a midpoint rounds down
        codes = (torch.sign(blocks) * grid[idx] * 2).to(torch.int8).view(V, D)
        return QuantizedRows(fmt, codes, scale)
    amax = w.abs().amax(dim=1)
    fmax = 127.0 if fmt == "int8" else torch.finfo(torch.float8_e4m3fn).max
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    u = (w / scale[:, None]).clamp(-fmax, fmax)
    codes = u.round().to(torch.int8) if fmt == "int8" else u.to(torch.float8_e4m3fn)
    return QuantizedRows(fmt, codes, scale)


def dequantize_rows(q: QuantizedRows) -> torch.Tensor:
    """``[V, D]`` FP32 values the screen multiplies with."""
    if q.fmt == "mxfp4":
        return q.codes.float() * 0.5 * q.scale.repeat_interleave(MX_BLOCK, dim=1)
    return q.codes.float() * q.scale[:, None]


def approximate_logits(hidden: torch.Tensor, q: QuantizedRows) -> torch.Tensor:
    """``hidden [N, D]`` -> ``[N, V]`` FP32 logits from the low-precision rows.

    Per-row formats multiply the codes first and scale the FP32 sums once per row.

    Raises:
        ValueError: ``hidden``'s last dim is not ``D``.
    """
    if hidden.shape[-1] != q.codes.shape[1]:
        raise ValueError(f"hidden has {hidden.shape[-1]} channels, the LM head {q.codes.shape[1]}")
    h = hidden.float()
    if q.fmt == "mxfp4":
        return h @ dequantize_rows(q).t()
    return (h @ q.codes.float().t()) * q.scale


def screen_logits(hidden: torch.Tensor, weight: torch.Tensor, q: QuantizedRows, topk: int = 64) -> ScreenedLogits:
    """Screen the vocabulary with ``q``, then recompute the ``topk`` best rows exactly from ``weight``.

    Args:
        hidden: ``[N, D]`` final hidden states.
        weight: ``[V, D]`` the original LM head rows (BF16 served; any float dtype).
        q: ``quantize_rows(weight, ...)``.
        topk: candidates per row, ``1 <= topk``; more than ``V`` means all rows.

    Returns:
        :class:`ScreenedLogits`. Exact logits are summed in
        ``promote(hidden, weight, FP32)`` (FP64 inputs stay FP64).

    Raises:
        ValueError: ``topk < 1``; shapes of ``hidden``, ``weight`` and ``q`` disagree.
    """
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [N, D] and weight [V, D] disagree: {tuple(hidden.shape)} vs {tuple(weight.shape)}")
    if q.shape != tuple(weight.shape):
        raise ValueError(f"q has shape {q.shape}, weight {tuple(weight.shape)}")
    acc = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)
    approx = approximate_logits(hidden, q).to(acc)
    k = min(topk, weight.shape[0])
    cand = approx.topk(k, dim=-1, sorted=True).indices  # [N, k]
    exact = torch.empty(cand.shape, dtype=acc, device=hidden.device)
    step = max(1, EXACT_CHUNK_ELEMENTS // (k * weight.shape[1]))  # bounds the gathered rows [step, k, D]
    for s in range(0, hidden.shape[0], step):
        rows = weight[cand[s : s + step]].to(acc)  # [n, k, D]
        exact[s : s + step] = torch.bmm(rows, hidden[s : s + step].to(acc).unsqueeze(-1)).squeeze(-1)
    top = exact == exact.max(dim=-1, keepdim=True).values
    token = torch.where(top, cand, torch.full_like(cand, weight.shape[0])).min(dim=-1).values  # ties: smaller id
    floor = torch.nextafter(exact.min(dim=-1, keepdim=True).values, torch.tensor(float("-inf"), dtype=acc))
    logits = torch.minimum(approx, floor).scatter(1, cand, exact)
    return ScreenedLogits(logits, cand, exact, token)
