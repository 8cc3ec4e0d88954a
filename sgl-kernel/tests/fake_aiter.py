"""A stand-in ``aiter`` package for CPU tests of our aiter adapters (aiter itself needs ROCm).

Each fake entry point checks the boundary contract we read from ROCm/aiter (argument
order, dtypes, contiguity, shuffle flag, expert mask) and computes the result with
the plain-torch reference math *from the exact tensors it receives*, so a wrong
layout, dtype, padding or argument order in an adapter changes the result or fails
an assertion here. The fake weight shuffle is its own invertible tile permutation
(not aiter's): only "the adapter passes what the shuffle returned" is tested.
"""

from __future__ import annotations

import sys
import types

import torch

from sgl_hybrid_kernel.moe.reference import moe_experts
from sgl_hybrid_kernel.norm import reference as norm_ref

SILU, NO_QUANT = object(), object()
TILE_N, TILE_K = 16, 32


def fake_shuffle(w: torch.Tensor, layout=(16, 16)) -> torch.Tensor:
    assert layout == (16, 16), layout
    E, N, K = w.shape
    assert N % TILE_N == 0 and K % TILE_K == 0, (N, K)
    s = w.reshape(E, N // TILE_N, TILE_N, K // TILE_K, TILE_K).permute(0, 1, 3, 2, 4).contiguous().view(E, N, K)
    s.is_shuffled = True
    return s


def fake_unshuffle(s: torch.Tensor) -> torch.Tensor:
    E, N, K = s.shape
    return s.reshape(E, N // TILE_N, K // TILE_K, TILE_N, TILE_K).permute(0, 1, 3, 2, 4).reshape(E, N, K)


class FakeAiter:
    """Builds the fake modules and records every call as ``(name, info)``."""

    def __init__(self):
        self.calls = []

    # aiter.rmsnorm2d_fwd(input, weight, epsilon, use_model_sensitive_rmsnorm=0) -> out
    def rmsnorm2d_fwd(self, input, weight, epsilon, use_model_sensitive_rmsnorm=0):
        assert input.dim() == 2 and input.is_contiguous(), (input.shape, input.stride())
        assert input.dtype in (torch.bfloat16, torch.float16) and weight.dtype == input.dtype
        assert weight.shape == (input.shape[1],) and weight.is_contiguous()
        assert isinstance(epsilon, float) and use_model_sensitive_rmsnorm == 0
        self.calls.append(("rmsnorm2d_fwd", tuple(input.shape)))
        return norm_ref.rms_norm(input, weight, epsilon)

    # aiter.rmsnorm2d_fwd_with_add(out, input, residual_in, residual_out, weight, epsilon, ...) -> None
    def rmsnorm2d_fwd_with_add(self, out, input, residual_in, residual_out, weight, epsilon, *more, **kw):
        assert not more and not kw, (more, kw)  # the adapter passes the six leading arguments only
        for t in (out, input, residual_in, residual_out):
            assert t.dim() == 2 and t.is_contiguous() and t.dtype == input.dtype and t.shape == input.shape
        assert weight.dtype == input.dtype and isinstance(epsilon, float)
        ptrs = {t.data_ptr() for t in (out, input, residual_in, residual_out)}
        assert len(ptrs) == 4, "outputs must not alias inputs"
        self.calls.append(("rmsnorm2d_fwd_with_add", tuple(input.shape)))
        normed, res = norm_ref.fused_add_rms_norm(input, residual_in, weight, epsilon)
        out.copy_(normed)
        residual_out.copy_(res)

    # aiter.fused_moe.fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation=, quant_type=, ...)
    def fused_moe(self, hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation=None,
                  quant_type=None, **more):
        assert not more, more
        assert activation is SILU and quant_type is NO_QUANT
        assert hidden_states.dim() == 2 and hidden_states.is_contiguous()
        assert hidden_states.dtype in (torch.bfloat16, torch.float16) and w1.dtype == w2.dtype == hidden_states.dtype
        assert getattr(w1, "is_shuffled", False) and getattr(w2, "is_shuffled", False), "weights not flagged shuffled"
        assert topk_ids.dtype == torch.int32 and topk_ids.is_contiguous()
        assert topk_weight.dtype == torch.float32 and topk_weight.is_contiguous()
        assert topk_ids.shape == topk_weight.shape and topk_ids.shape[0] == hidden_states.shape[0]
        E = w1.shape[0]
        ids = topk_ids.long()
        weights = topk_weight
        if expert_mask is not None:  # global ids -> local ids through the mask's running sum; masked -> no expert
            n_global = expert_mask.numel()
            assert int(ids.min()) >= 0 and int(ids.max()) < n_global
            local = expert_mask.long().cumsum(0) - 1
            local[expert_mask == 0] = -1
            ids = local[ids]
            weights = torch.where(ids < 0, torch.zeros_like(weights), weights)
            ids = ids.clamp_min(0)
        assert int(ids.min()) >= 0 and int(ids.max()) < E, "expert id out of range"
        self.calls.append(("fused_moe", tuple(hidden_states.shape), expert_mask is not None))
        return moe_experts(hidden_states, fake_unshuffle(w1), fake_unshuffle(w2), weights, ids)

    def install(self, monkeypatch) -> "FakeAiter":
        """Put ``aiter``, ``aiter.fused_moe``, ``aiter.ops`` and ``aiter.ops.shuffle`` into ``sys.modules``."""
        root = types.ModuleType("aiter")
        root.rmsnorm2d_fwd = self.rmsnorm2d_fwd
        root.rmsnorm2d_fwd_with_add = self.rmsnorm2d_fwd_with_add
        root.ActivationType = types.SimpleNamespace(Silu=SILU)
        root.QuantType = types.SimpleNamespace(No=NO_QUANT)
        fm = types.ModuleType("aiter.fused_moe")
        fm.fused_moe = self.fused_moe
        ops = types.ModuleType("aiter.ops")
        shuffle = types.ModuleType("aiter.ops.shuffle")
        shuffle.shuffle_weight = fake_shuffle
        root.fused_moe, root.ops, ops.shuffle = fm, ops, shuffle
        for name, mod in (("aiter", root), ("aiter.fused_moe", fm), ("aiter.ops", ops), ("aiter.ops.shuffle", shuffle)):
            monkeypatch.setitem(sys.modules, name, mod)
        return self


def hide_aiter(monkeypatch) -> None:
    """Make ``import aiter`` fail (as on a machine without it)."""
    for name in ("aiter", "aiter.fused_moe", "aiter.ops", "aiter.ops.shuffle"):
        monkeypatch.setitem(sys.modules, name, None)
