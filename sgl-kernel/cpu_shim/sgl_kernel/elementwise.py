"""Norms, gated activations and rotary embedding of ``sgl_kernel``, in plain torch.

Device-agnostic (CPU or CUDA tensors) and graph-capture safe (no host syncs).
Semantics follow the real ops as upstream SGLang 0.5.23 calls them:

* the math runs in float32 and the result is cast to the input dtype;
* the RMS is taken over the last dimension (the real kernels take
  ``[tokens, hidden]``; leading dimensions are flattened here);
* ``rmsnorm`` / ``gemma_rmsnorm`` return a new tensor, or write ``out`` and
  return it; ``fused_add_rmsnorm`` / ``gemma_fused_add_rmsnorm`` return ``None``
  and update **both** arguments in place: ``residual += input`` (in the
  residual's dtype), then ``input = norm(residual) * weight``;
* Gemma variants scale by ``1 + weight``;
* ``enable_pdl`` (programmatic dependent launch) is accepted and ignored.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgl_kernel._unprovided import define


def _rms_scale(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


def _norm(input: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    x = input.float()
    w = weight.float()
    if gemma:
        w = w + 1.0
    return (x * _rms_scale(x, eps) * w).to(input.dtype)


def _write(result: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out is None:
        return result
    out.copy_(result)
    return out


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``out = input / RMS(input) * weight``."""
    return _write(_norm(input, weight, eps, gemma=False), out)


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: Optional[torch.Tensor] = None,
    enable_pdl: Optional[bool] = None,
) -> torch.Tensor:
    """``out = input / RMS(input) * (1 + weight)``."""
    return _write(_norm(input, weight, eps, gemma=True), out)


def _fused_add(input, residual, weight, eps, gemma) -> None:
    x = input.float() + residual.float()
    residual.copy_(x)
    w = weight.float()
    if gemma:
        w = w + 1.0
    input.copy_(x * _rms_scale(x, eps) * w)


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
) -> None:
    """In place: ``residual += input``; ``input = residual / RMS(residual) * weight``."""
    _fused_add(input, residual, weight, eps, gemma=False)


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: Optional[bool] = None,
) -> None:
    """In place: ``residual += input``; ``input = residual / RMS(residual) * (1 + weight)``."""
    _fused_add(input, residual, weight, eps, gemma=True)


def _gated(input: torch.Tensor, out: Optional[torch.Tensor], act) -> torch.Tensor:
    d = input.shape[-1] // 2
    if out is not None:
        if out.shape != input.shape[:-1] + (d,):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(input.shape[:-1]) + (d,)}")
    result = (act(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)
    return _write(result, out)


def silu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``; writes ``out`` if given."""
    return _gated(input, out, F.silu)


def gelu_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]`` (exact, erf GELU)."""
    return _gated(input, out, F.gelu)


def gelu_tanh_and_mul(input: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` (tanh-approximated GELU)."""
    return _gated(input, out, lambda t: F.gelu(t, approximate="tanh"))


def gelu_quick(input: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Quick GELU, not gated: ``x * sigmoid(1.702 * x)``, same shape as ``input``."""
    x = input.float()
    return _write((x * torch.sigmoid(1.702 * x)).to(input.dtype), out)


def _rotate(x: torch.Tensor, positions: torch.Tensor, head_size: int, cache: torch.Tensor, is_neox: bool) -> None:
    tokens = positions.numel()
    view = x.view(tokens, -1, head_size)
    rot = cache.shape[-1]
    half = rot // 2
    cs = cache.index_select(0, positions.reshape(-1).long()).float()
    cos = cs[:, None, :half]
    sin = cs[:, None, half:rot]
    part = view[..., :rot].float()
    if is_neox:
        a, b = part[..., :half], part[..., half:]
        view[..., :rot] = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(x.dtype)
    else:
        a, b = part[..., 0::2], part[..., 1::2]
        rotated = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        view[..., :rot] = rotated.to(x.dtype)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor] = None,
    head_size: int = 0,
    cos_sin_cache: Optional[torch.Tensor] = None,
    is_neox: bool = True,
    *,
    interleaved: Optional[bool] = None,
) -> None:
    """Rotate ``query`` (and ``key``) in place by ``cos_sin_cache[positions]``.

    ``query``/``key``: ``[tokens, heads * head_size]`` (or ``[tokens, heads, head_size]``),
    contiguous; ``cos_sin_cache``: ``[max_pos, rot_dim]``, cosines then sines. The
    first ``rot_dim`` channels of each head rotate: NeoX style (``is_neox=True``:
    first half against second half) or GPT-J style (even against odd channels).
    """
    if cos_sin_cache is None:
        raise ValueError("rotary_embedding needs cos_sin_cache")
    if interleaved is not None:
        is_neox = interleaved
    _rotate(query, positions, head_size, cos_sin_cache, is_neox)
    if key is not None:
        _rotate(key, positions, head_size, cos_sin_cache, is_neox)


define(globals(), "sgl_kernel.elementwise", ("copy_to_gpu_no_ce",), "DeepGEMM MoE runner")
