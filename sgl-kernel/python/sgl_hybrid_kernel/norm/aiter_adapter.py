"""Adapter from our RMSNorm calls to aiter's ``rmsnorm2d_fwd`` / ``rmsnorm2d_fwd_with_add`` (ROCm).

aiter's boundary as read from ROCm/aiter ``aiter/ops/rmsnorm.py`` (not run here: no ROCm):

* ``rmsnorm2d_fwd(input [N, D], weight [D], epsilon, use_model_sensitive_rmsnorm=0) -> out [N, D]``
* ``rmsnorm2d_fwd_with_add(out, input, residual_in, residual_out, weight, epsilon, ...) -> None``
  writes ``residual_out = input + residual_in`` and ``out = rmsnorm(input + residual_in) * weight``.

Both want FP16 / BF16 (FP32 only on newer builds), a weight of the input's dtype
(SGLang's ``RMSNorm.forward_aiter`` notes that an FP32 weight with BF16
activations gives wrong numbers on gfx950, and falls back) and contiguous 2-D
rows. The keyword arguments after ``epsilon`` changed order between aiter
releases (``gemma_norm`` / ``use_model_sensitive_rmsnorm``), so the adapter passes
only the six leading arguments, positionally.

Pre-processing: flatten ``[..., D]`` to ``[N, D]`` contiguous rows, allocate the
outputs (``out``, ``residual_out``) in the input dtype; zero rows skip the call
(aiter's kernels reject an empty grid). Post-processing: check what aiter
returned, restore the leading dimensions.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

AITER_RMSNORM_DTYPES = (torch.bfloat16, torch.float16)


def aiter_rms_norm_unsupported(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Optional[str]:
    """Why aiter's RMSNorm does not take these tensors (``None``: it does).

    Checked: activation dtype FP16 / BF16, weight ``[D]`` of the same dtype,
    residual of ``x``'s shape and dtype.
    """
    if x.dtype not in AITER_RMSNORM_DTYPES:
        return f"activation dtype {x.dtype} (aiter RMSNorm: bf16 / fp16)"
    if weight.dtype != x.dtype:
        return f"weight dtype {weight.dtype} != activation dtype {x.dtype} (aiter needs them equal)"
    if weight.shape != (x.shape[-1],):
        return f"weight shape {tuple(weight.shape)} for hidden size {x.shape[-1]}"
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        return f"residual {tuple(residual.shape)} {residual.dtype} differs from x {tuple(x.shape)} {x.dtype}"
    return None


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


def rms_norm_aiter(x: torch.Tensor, weight: torch.Tensor, eps: float, rms_fn: Optional[Callable] = None) -> torch.Tensor:
    """RMSNorm of the last dimension through aiter's ``rmsnorm2d_fwd``.

    Args:
        x: ``[..., D]`` BF16 / FP16; weight: ``[D]`` of ``x``'s dtype; eps: added to the mean square.
        rms_fn: aiter's ``rmsnorm2d_fwd`` (default: ``aiter.rmsnorm2d_fwd``).

    Returns:
        ``[..., D]`` in ``x.dtype``.

    Raises:
        ValueError: tensors aiter does not take (see :func:`aiter_rms_norm_unsupported`).
        RuntimeError: aiter returned a tensor of another shape or dtype.
        ImportError: aiter missing and no ``rms_fn`` given.
    """
    why = aiter_rms_norm_unsupported(x, weight)
    if why:
        raise ValueError(f"x / weight: {why}")
    if rms_fn is None:
        from aiter import rmsnorm2d_fwd as rms_fn  # noqa: N813  (ROCm only)
    if x.numel() == 0:
        return torch.empty_like(x)
    out = rms_fn(_rows(x), weight.contiguous(), float(eps))
    rows = x.numel() // x.shape[-1]
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows, x.shape[-1]) or out.dtype != x.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise RuntimeError(f"aiter rmsnorm2d_fwd returned {got}, expected ({rows}, {x.shape[-1]}) {x.dtype}")
    return out.reshape(x.shape)


def fused_add_rms_norm_aiter(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, add_fn: Optional[Callable] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` through aiter's ``rmsnorm2d_fwd_with_add``.

    Args:
        x, residual: ``[..., D]`` BF16 / FP16, same shape; weight: ``[D]`` of their dtype.
        add_fn: aiter's ``rmsnorm2d_fwd_with_add`` (default: ``aiter.rmsnorm2d_fwd_with_add``).

    Returns:
        ``(normed, residual_out)``, both ``[..., D]`` in ``x.dtype`` (new tensors; the
        inputs are not written).

    Raises:
        ValueError: tensors aiter does not take.
        ImportError: aiter missing and no ``add_fn`` given.
    """
    why = aiter_rms_norm_unsupported(x, weight, residual)
    if why:
        raise ValueError(f"x / residual / weight: {why}")
    if add_fn is None:
        from aiter import rmsnorm2d_fwd_with_add as add_fn  # noqa: N813  (ROCm only)
    if x.numel() == 0:
        return torch.empty_like(x), torch.empty_like(x)
    x2, r2 = _rows(x), _rows(residual)
    out, res_out = torch.empty_like(x2), torch.empty_like(x2)
    add_fn(out, x2, r2, res_out, weight.contiguous(), float(eps))
    return out.reshape(x.shape), res_out.reshape(x.shape)
