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
    other_eps = _Norm(D, eps=1e-5)
    assert attn_res_hook._around_aggregate(orig, a, bank, 2, proj, score_norm, other_eps) == "upstream"
    assert len(calls) == 3
    with torch.no_grad():
        normed = attn_res_hook._around_aggregate(lambda *x, **k: pytest.fail("reached upstream"), a, bank, 2, proj,
                                                 score_norm, out_norm, write_bank_row=False)
        ref = out_norm.forward_native(upstream.aggregate_stream_torch(a, bank, 2, proj, score_norm))
    torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-5)
