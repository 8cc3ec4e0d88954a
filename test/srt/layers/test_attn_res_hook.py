"""AttnRes + RMSNorm hook: our fused kernel behind upstream's ``attn_residual._aggregate`` (CPU).

Upstream's ``AttnResidual.forward`` calls ``_aggregate(prefix_sum, bank, nvb,
score_proj, score_norm, out_norm, write_bank_row)`` and
``_aggregate_fused_add(prefix_a, prefix_b, ...)``. With upstream's own
``RMSNorm`` modules and a ``[1, D]`` score projection, our path (torch, and the
Triton kernel in the interpreter) must equal upstream's eager reference
``aggregate_stream_torch`` followed by the output norm; CPU calls through the
hooks must stay on upstream's functions.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers import attn_residual as upstream
from sglang.srt.layers.layernorm import RMSNorm
from sglang_hybrid.layers import attn_res_hook
from sglang_hybrid.layers.attn_res_hook import aggregate

T, NB, D, EPS = 3, 4, 64, 1e-6


class _Proj(torch.nn.Module):
    """Bias-free [1, D] projection returning ``(out, bias)`` like upstream's ReplicatedLinear."""

    def __init__(self, w):
        super().__init__()
        self.weight, self.bias = torch.nn.Parameter(w), None

    def forward(self, x):
        return x @ self.weight.T, None


class _Norm(RMSNorm):
    def forward(self, x, *a, **k):  # upstream's plain-torch RMSNorm math (CPU has no sgl_kernel ops)
        return self.forward_native(x)


def _setup(seed):
    gen = torch.Generator().manual_seed(seed)
    score_norm, out_norm = _Norm(D, eps=EPS), _Norm(D, eps=EPS)
    with torch.no_grad():
        score_norm.weight.copy_(1 + 0.2 * torch.randn(D, generator=gen))
        out_norm.weight.copy_(1 + 0.2 * torch.randn(D, generator=gen))
    proj = _Proj(torch.randn(1, D, generator=gen) * 0.3)
    bank = torch.randn(T, NB, D, generator=gen)
    a, b = torch.randn(T, D, generator=gen), torch.randn(T, D, generator=gen)
    return score_norm, out_norm, proj, bank, a, b


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("nvb", [0, 2])
def test_aggregate_fused_add_matches_upstream_eager(impl, nvb):
    score_norm, out_norm, proj, bank, a, b = _setup(nvb)
    with torch.no_grad():
        ref_head = a + b
        ref = out_norm.forward_native(upstream.aggregate_stream_torch(ref_head, bank, nvb, proj, score_norm))
        ref_bank = bank.clone()
        ref_bank[:, nvb] = ref_head
        normed, head = aggregate(a, b, bank, nvb, proj, score_norm, out_norm, write_bank_row=True, impl=impl)
    assert torch.equal(head, ref_head)  # the persisted residual is bit-exact
    torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(bank, ref_bank)


def test_contract_errors_name_the_modules():
    score_norm, out_norm, proj, bank, a, _ = _setup(0)
    proj.bias = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="score_proj"):
        aggregate(None, a, bank, 1, proj, score_norm, out_norm)


def test_hooks_leave_cpu_to_upstream_and_take_gpu_calls(monkeypatch):
    score_norm, out_norm, proj, bank, a, b = _setup(1)
    calls = []
    orig = lambda *x, **k: calls.append(x) or "upstream"  # noqa: E731
    assert attn_res_hook._around_aggregate(orig, a, bank, 2, proj, score_norm, out_norm) == "upstream"
    assert attn_res_hook._around_aggregate_fused_add(orig, a, b, bank, 2, proj, score_norm, out_norm) == "upstream"
    monkeypatch.setattr(attn_res_hook, "device_kind", lambda t: "cuda")
    # outside our contract, at a hidden size upstream's Triton pipeline covers (its tile made D here)
    monkeypatch.setattr(upstream, "_BLOCK_H", D)
    other_eps = _Norm(D, eps=1e-5)
    assert attn_res_hook._around_aggregate(orig, a, bank, 2, proj, score_norm, other_eps) == "upstream"
    assert len(calls) == 3
    with torch.no_grad():
        normed = attn_res_hook._around_aggregate(lambda *x, **k: pytest.fail("reached upstream"), a, bank, 2, proj,
                                                 score_norm, out_norm, write_bank_row=False)
        ref = out_norm.forward_native(upstream.aggregate_stream_torch(a, bank, 2, proj, score_norm))
    torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-5)


def _never(*a, **k):
    pytest.fail("reached upstream's _aggregate")


@pytest.mark.parametrize("fused_add", [False, True])
def test_read_of_a_full_bank_takes_our_kernel(monkeypatch, fused_add):
    """Kimi K3's final read (AttnBankOutputRead) aggregates every bank row: nvb == bank rows.

    The bank holds ceil(layers / block) rows and every one is written by then (tiny
    checkpoint: 8 layers, block 3 -> 3 rows, nvb 3). Without a row to write, the read
    is inside our kernel's contract; before the fix the hook declined it and sent it
    to upstream's Triton pipeline, which returns uninitialized memory at D = 128
    (see test_upstream_triton_aggregation_leaves_output_unwritten_off_1024).
    """
    score_norm, out_norm, proj, bank, a, b = _setup(4)
    monkeypatch.setattr(attn_res_hook, "device_kind", lambda t: "cuda")
    with torch.no_grad():
        if fused_add:
            normed, head = attn_res_hook._around_aggregate_fused_add(_never, a, b, bank, NB, proj, score_norm, out_norm)
            assert torch.equal(head, a + b)
        else:
            normed = attn_res_hook._around_aggregate(_never, a + b, bank, NB, proj, score_norm, out_norm)
        ref = out_norm.forward_native(upstream.aggregate_stream_torch(a + b, bank, NB, proj, score_norm))
    torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused_add", [False, True])
def test_out_of_contract_gpu_read_off_1024_runs_upstream_eager(monkeypatch, fused_add):
    """A GPU read outside our contract (norm epsilons differ) at D % 1024 != 0 must not reach
    upstream's _aggregate (which leaves its output unwritten there): upstream's eager reference runs."""
    score_norm, out_norm, proj, bank, a, b = _setup(5)
    out_norm = _Norm(D, eps=1e-5)
    monkeypatch.setattr(attn_res_hook, "device_kind", lambda t: "cuda")
    assert D % upstream._BLOCK_H != 0
    with torch.no_grad():
        ref = out_norm.forward_native(upstream.aggregate_stream_torch(a + b, bank, 2, proj, score_norm))
        if fused_add:
            ref_bank = bank.clone()
            ref_bank[:, 2] = a + b
            normed, head = attn_res_hook._around_aggregate_fused_add(_never, a, b, bank, 2, proj, score_norm, out_norm,
                                                                     write_bank_row=True)
            assert torch.equal(head, a + b) and torch.equal(bank, ref_bank)
        else:
            normed = attn_res_hook._around_aggregate(_never, a + b, bank, 2, proj, score_norm, out_norm)
    torch.testing.assert_close(normed, ref, rtol=1e-6, atol=1e-6)


def test_upstream_triton_aggregation_leaves_output_unwritten_off_1024(monkeypatch):
    """Why the hook must not hand a D % 1024 != 0 read to upstream (the cause, kept as evidence).

    Upstream's off-SM100 CUDA path (_aggregate -> _aggregate_fused -> _mix_fused) tiles D by
    _BLOCK_H = 1024 without a tail mask: its combine kernel gets a grid of D // 1024 = 0
    programs and the result is torch.empty_like memory (here filled with NaN to see it). Run
    in Triton's interpreter; the inputs are views into larger buffers so the unmasked score
    loads stay in bounds. If this starts failing, upstream covers such sizes and the hook's
    eager fallback can go.
    """
    score_norm, _, proj, _, _, _ = _setup(6)
    gen = torch.Generator().manual_seed(7)
    pad = upstream._BLOCK_H // D + 2
    prefix = torch.randn(T + pad, D, generator=gen)[:T]
    bank = torch.randn(T + pad, NB, D, generator=gen)[:T]
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda x, **k: empty_like(x, **k).fill_(float("nan")))
    with torch.no_grad():
        mixed = upstream._mix_fused(prefix, bank, NB, proj, score_norm)
    assert mixed.shape == prefix.shape and torch.isnan(mixed).all()
