"""RMSNorm ops in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

| op | implementations | oracle |
|---|---|---|
| ``rms_norm`` | ``aiter`` (``rmsnorm2d_fwd`` via ``aiter_adapter``), ``triton`` (``rms_norm_triton``), ``torch`` (reference) | FP64 formula |
| ``fused_add_rms_norm`` | ``aiter`` (``rmsnorm2d_fwd_with_add``), ``triton``, ``torch`` | FP64 formula; ``residual_out`` against the FP64 sum |

The plan asks the dispatcher about Kimi K3's hidden size (7168) in BF16, the
serving dtype. Gate cases: hidden 96 with rows taken from a wider buffer (row
stride != D, so a path that ignores the stride fails) and hidden 7168; FP32
inputs on the Triton / torch paths, BF16 on aiter (it takes no FP32 on older
builds), with tolerances to match.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch
from sgl_hybrid_kernel.norm import reference as norm_ref
from sgl_hybrid_kernel.norm.dispatch import aiter_rms_norm_fns, rms_norm_choice

PLAN_HIDDEN = 7168  # Kimi K3 hidden size
EPS = 1e-6
# FP32 paths vs FP64: ~1e-6 observed; BF16 (aiter): output rounding 2^-9 relative on |y| <= ~4.
# A dropped weight, wrong eps or unnormalised row is off by >= ~1e-1.
TOLERANCE = {"fp32": 1e-4, "bf16": 4e-2}
# (name, rows, hidden, row stride padding)
CASES = [("strided rows", 3, 96, 32), ("kimi-k3 hidden", 2, 7168, 0)]


def _describe() -> str:
    return "; ".join(f"{name} rows={r} D={d}" + (f" stride={d + pad}" if pad else "") for name, r, d, pad in CASES)


def _impl(op: str, impl: str):
    from sgl_hybrid_kernel.norm import aiter_adapter
    from sgl_hybrid_kernel.norm.rms_norm_launch import rms_norm_triton

    add = op == "fused_add_rms_norm"
    if impl == "torch":
        return norm_ref.fused_add_rms_norm if add else norm_ref.rms_norm
    if impl == "triton":
        return (lambda x, r, w, eps: rms_norm_triton(x, w, eps, residual=r)) if add else rms_norm_triton
    if impl == "aiter":
        fns = aiter_rms_norm_fns()
        if fns is None:
            raise ValueError("impl: 'aiter' chosen but aiter does not import")
        if add:
            return lambda x, r, w, eps: aiter_adapter.fused_add_rms_norm_aiter(x, r, w, eps, add_fn=fns[1])
        return lambda x, w, eps: aiter_adapter.rms_norm_aiter(x, w, eps, rms_fn=fns[0])
    raise ValueError(f"impl: no {op} implementation named {impl!r}")


def _inputs(seed: int, rows: int, D: int, pad: int, dtype: torch.dtype, device):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, D + pad, generator=gen).to(dtype).to(device)[:, :D]
    r = torch.randn(rows, D, generator=gen).to(dtype).to(device)
    w = (1.0 + 0.5 * torch.randn(D, generator=gen)).to(dtype).to(device)
    return x, r, w


def _oracle(x, r, w):
    s = x.double() + (r.double() if r is not None else 0.0)
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.double(), s


def _gate(op: str, impl: str, device) -> _dispatch.GateResult:
    fn = _impl(op, impl)
    dtype, tol = (torch.bfloat16, TOLERANCE["bf16"]) if impl == "aiter" else (torch.float32, TOLERANCE["fp32"])
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, rows, D, pad) in enumerate(CASES):
        x, r, w = _inputs(300 + n, rows, D, pad, dtype, device)
        if op == "fused_add_rms_norm":
            x0, r0 = x.clone(), r.clone()
            out, res_out = fn(x, r, w, EPS)
            want, s = _oracle(x, r, w)
            pairs += [(out, want), (res_out, s), (x, x0), (r, r0)]  # inputs must stay unchanged
        else:
            pairs.append((fn(x, w, EPS), _oracle(x, None, w)[0]))
    return _dispatch.GateResult(op, impl, _dispatch.max_abs_error(pairs), tol, _describe())


def gate_rms_norm(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``rms_norm``: ``impl`` vs the FP64 formula (raises ValueError for an unknown ``impl``)."""
    return _gate("rms_norm", impl, device)


def gate_fused_add_rms_norm(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``fused_add_rms_norm``: output and ``residual_out`` vs FP64 (ValueError for an unknown ``impl``)."""
    return _gate("fused_add_rms_norm", impl, device)


def _plan_tensors(device):
    x = torch.empty(1, PLAN_HIDDEN, dtype=torch.bfloat16, device=device)
    return x, torch.empty(PLAN_HIDDEN, dtype=torch.bfloat16, device=device)


def plan_rms_norm(device) -> _dispatch.KernelChoice:
    """What the dispatcher picks on ``device`` for Kimi K3's hidden size in BF16 (recorded and returned)."""
    x, w = _plan_tensors(device)
    c = rms_norm_choice(x, w)
    return _dispatch.record_choice(c.op, c.impl, c.reason)


def plan_fused_add_rms_norm(device) -> _dispatch.KernelChoice:
    """As :func:`plan_rms_norm`, with a residual."""
    x, w = _plan_tensors(device)
    c = rms_norm_choice(x, w, torch.empty_like(x))
    return _dispatch.record_choice(c.op, c.impl, c.reason)


_dispatch.register_op("rms_norm", plan_rms_norm, gate_rms_norm, "RMSNorm")
_dispatch.register_op("fused_add_rms_norm", plan_fused_add_rms_norm, gate_fused_add_rms_norm, "residual add + RMSNorm")
