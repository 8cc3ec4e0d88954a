"""RMSNorm dispatch (plain and after a residual add): aiter (ROCm), Triton (CUDA / ROCm), or plain torch.

Choice per op (``rms_norm``, ``fused_add_rms_norm``), recorded through
``sgl_hybrid_kernel.dispatch.record_choice`` the first time each input kind
(device, dtypes, hidden size) is seen, so a model whose norms alternate between
hidden sizes does not log on every call:

* CPU tensors -> ``norm.reference``.
* ROCm, ``aiter`` importable and the tensors inside aiter's contract (BF16 / FP16
  activations, weight of the same dtype; ``aiter_adapter.aiter_rms_norm_unsupported``)
  -> aiter's ``rmsnorm2d_fwd`` / ``rmsnorm2d_fwd_with_add`` through ``aiter_adapter``.
* CUDA / ROCm otherwise -> the Triton row kernel (``rms_norm.rms_norm_triton``)
  for ``D <= 8192`` and FP32 / BF16 / FP16; the reason aiter was not taken is
  part of the recorded reason on ROCm.
* Anything else -> the plain-torch reference (the reason is recorded).

Upstream's model classes do not call this dispatcher: on ROCm their ``RMSNorm``
picks aiter itself under ``SGLANG_USE_AITER=1`` (docs/rocm.md, "aiter").
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import KernelChoice, record_choice
from sgl_hybrid_kernel.norm import reference as norm_ref
from sgl_hybrid_kernel.norm.aiter_adapter import aiter_rms_norm_unsupported, fused_add_rms_norm_aiter, rms_norm_aiter
from sgl_hybrid_kernel.norm.rms_norm_launch import MAX_D, rms_norm_num_warps, rms_norm_triton

logger = logging.getLogger(__name__)

TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=1)
def aiter_rms_norm_fns() -> Optional[Tuple[Callable, Callable]]:
    """``(aiter.rmsnorm2d_fwd, aiter.rmsnorm2d_fwd_with_add)`` if ``aiter`` imports (ROCm), else ``None``."""
    try:
        import aiter

        return aiter.rmsnorm2d_fwd, aiter.rmsnorm2d_fwd_with_add
    except Exception:  # ImportError, a failing JIT load inside aiter, or an aiter without these names
        return None


@functools.lru_cache(maxsize=256)
def _decide(op: str, kind: str, aiter_ok: bool, why_not_aiter: Optional[str], dtype: torch.dtype, D: int) -> KernelChoice:
    if kind == "cpu":
        return record_choice(op, "torch", "CPU tensors: plain-torch reference", log=logger)
    fn = "rmsnorm2d_fwd_with_add" if op == "fused_add_rms_norm" else "rmsnorm2d_fwd"
    if kind == "rocm" and aiter_ok and why_not_aiter is None:
        return record_choice(op, "aiter", f"rocm: aiter {fn} ({dtype}, hidden {D})", log=logger)
    note = ""
    if kind == "rocm":
        note = "; aiter not used: " + ("aiter does not import" if not aiter_ok else why_not_aiter)
    if D <= MAX_D and dtype in TRITON_DTYPES:
        block_d = triton.next_power_of_2(D)
        return record_choice(op, "triton", f"{kind}: rms_norm_kernel BLOCK_D={block_d} "
                             f"num_warps={rms_norm_num_warps(block_d)}{note}", log=logger)
    return record_choice(op, "torch", f"outside the Triton contract: hidden {D}, {dtype} (kernel: D <= {MAX_D}){note}",
                         log=logger)


def rms_norm_choice(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None) -> KernelChoice:
    """The path for these tensors: op ``rms_norm`` (``fused_add_rms_norm`` with a residual),
    impl ``"aiter"``, ``"triton"`` or ``"torch"``, and why (recorded the first time per input kind)."""
    kind = device_kind(x)
    aiter_ok = kind == "rocm" and aiter_rms_norm_fns() is not None
    why = aiter_rms_norm_unsupported(x, weight, residual) if aiter_ok else None
    op = "rms_norm" if residual is None else "fused_add_rms_norm"
    return _decide(op, kind, aiter_ok, why, x.dtype, int(x.shape[-1]))


def choose_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None) -> str:
    """``"aiter"``, ``"triton"`` or ``"torch"`` (see :func:`rms_norm_choice`)."""
    return rms_norm_choice(x, weight, residual).impl


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension on the chosen path.

    Args:
        x: ``[..., D]``; weight: ``[D]``; eps: added to the mean square.

    Returns:
        ``[..., D]`` in ``x.dtype``, as ``norm.reference.rms_norm``.

    Raises:
        ValueError: a weight of another length than ``D``.
    """
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight: shape {tuple(weight.shape)}, expected ({x.shape[-1]},)")
    impl = choose_rms_norm(x, weight)
    if impl == "aiter":
        return rms_norm_aiter(x, weight, eps, rms_fn=aiter_rms_norm_fns()[0])
    if impl == "triton":
        return rms_norm_triton(x, weight, eps)
    return norm_ref.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` on the chosen path (inputs are not written).

    Args and results as ``norm.reference.fused_add_rms_norm``.

    Raises:
        ValueError: ``residual`` of another shape than ``x``, or a weight of another length than ``D``.
    """
    if residual.shape != x.shape:
        raise ValueError(f"residual: shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight: shape {tuple(weight.shape)}, expected ({x.shape[-1]},)")
    impl = choose_rms_norm(x, weight, residual)
    if impl == "aiter":
        return fused_add_rms_norm_aiter(x, residual, weight, eps, add_fn=aiter_rms_norm_fns()[1])
    if impl == "triton":
        return rms_norm_triton(x, weight, eps, residual=residual)
    return norm_ref.fused_add_rms_norm(x, residual, weight, eps)
