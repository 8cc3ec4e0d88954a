"""``SglHybridKDAKernel.target_verify`` through upstream's KDA verify call (CPU).

Upstream's ``KDAKernelDispatcher.target_verify(A_log, dt_bias, q, k, v, a, b, *,
ssm_states, cache_indices, query_start_loc, intermediate_states_buffer,
intermediate_state_indices, cache_steps, retrieve_parent_token, lower_bound)``
with Kimi K3's parameter shapes (``A_log`` ``[1, 1, H, 1]``, ``dt_bias``
``[H*K]``, raw gate ``[N, H*K]``) and the safe gate: the output and every
per-draft state in the scratch must equal the FP64 recurrence, the committed
pool must stay untouched, padding rows produce zeros and write nothing.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, kda_gate
from sgl_hybrid_kernel.norm import l2_norm
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from sglang_hybrid.layers.attention import kda_kernel
from sglang_hybrid.layers.attention.kda_kernel import SglHybridKDAKernel

H, K = 2, 16
LB = -5.0


@pytest.mark.parametrize("force_triton", [True, False])
def test_target_verify_chain(force_triton):
    gen = torch.Generator().manual_seed(3)
    B, T = 3, 4
    N = B * T
    q, k, v = (torch.randn(1, N, H, K, generator=gen) for _ in range(3))
    a, b = torch.randn(N, H * K, generator=gen), torch.randn(N, H, generator=gen)
    A_log, dt_bias = torch.rand(1, 1, H, 1, generator=gen), torch.randn(H * K, generator=gen)
    pool = torch.randn(5, H, K, K, generator=gen)
    ref_pool = pool.clone()
    idx = torch.tensor([-1, 4, 1], dtype=torch.int32)
    scratch = torch.full((4, T, H, K, K), float("nan"))
    rows = torch.tensor([3, 0, 2], dtype=torch.int32)
    o = SglHybridKDAKernel(force_triton).target_verify(
        A_log, dt_bias, q, k, v, a, b, ssm_states=pool, cache_indices=idx,
        query_start_loc=torch.arange(0, N + 1, T, dtype=torch.int32), intermediate_states_buffer=scratch,
        intermediate_state_indices=rows, cache_steps=T, retrieve_parent_token=None, lower_bound=LB)
    assert o.shape == (1, N, H, K)
    assert torch.equal(pool, ref_pool)
    g = kda_gate(a.view(N, H, K), A_log.reshape(-1), dt_bias, LB)
    for i, s in enumerate(idx.tolist()):
        sl = slice(i * T, (i + 1) * T)
        if s < 0:
            assert torch.equal(o[0, sl], torch.zeros(T, H, K)) and scratch[3].isnan().all()
            continue
        ro, _, saved = gated_delta_recurrent(l2_norm(q[0, sl].double()), l2_norm(k[0, sl].double()), v[0, sl].double(),
                                             g[sl].double(), torch.sigmoid(b[sl].double()),
                                             initial_state=ref_pool[s].transpose(-1, -2).double(),
                                             acc_dtype=torch.float64, save_positions=range(1, T + 1))
        torch.testing.assert_close(o[0, sl], ro.float(), rtol=1e-5, atol=1e-5)
        for t in range(T):
            torch.testing.assert_close(scratch[int(rows[i]), t], saved[t].transpose(-1, -2).float(), rtol=1e-5, atol=1e-5)
    assert scratch[1].isnan().all()  # no request owns row 1


def test_verify_rejects_ragged_windows():
    q = torch.zeros(1, 5, H, K)
    with pytest.raises(ValueError, match="cache_steps"):
        SglHybridKDAKernel().target_verify(
            torch.zeros(1, 1, H, 1), torch.zeros(H * K), q, q, q, torch.zeros(5, H * K), torch.zeros(5, H),
            ssm_states=torch.zeros(2, H, K, K), cache_indices=torch.tensor([0, 1]), query_start_loc=None,
            intermediate_states_buffer=torch.zeros(2, 2, H, K, K), intermediate_state_indices=torch.tensor([0, 1]),
            cache_steps=2, retrieve_parent_token=None, lower_bound=LB)


def test_dispatcher_hook_verify_follows_decode_when_unset():
    def original(self, d, p, v):
        self.decode_kernel, self.extend_kernel, self.verify_kernel = "up-decode", "up-extend", "up-verify"

    class FakeDispatcher:
        pass

    fake_exec = mock.Mock()
    fake_exec.mamba.linear_attn_backend = "sgl_hybrid"
    fake_exec.mamba.linear_attn_decode_backend = None
    fake_exec.mamba.linear_attn_prefill_backend = None
    fake_exec.mamba.linear_attn_verify_backend = None
    custom, triton = LinearAttnKernelBackend("sgl_hybrid"), LinearAttnKernelBackend.TRITON
    d = FakeDispatcher()
    with mock.patch("sglang.srt.runtime_context.get_exec", return_value=fake_exec):
        kda_kernel._around_dispatcher_init(original, d, custom, custom, triton)
    assert isinstance(d.verify_kernel, SglHybridKDAKernel) and d.verify_kernel is d.decode_kernel


def test_upstream_ring_extras_go_to_upstream_kernel(monkeypatch):
    """A verify carrying upstream's ReplaySSM ring tensors is not ours to run (tensor-valued extras)."""
    seen = []
    monkeypatch.setattr(kda_kernel.TritonKDAKernel, "target_verify", lambda self, *a, **k: seen.append(k) or "upstream")
    q = torch.zeros(1, 2, H, K)
    out = SglHybridKDAKernel().target_verify(
        torch.zeros(1, 1, H, 1), torch.zeros(H * K), q, q, q, torch.zeros(2, H * K), torch.zeros(2, H),
        ssm_states=torch.zeros(2, H, K, K), cache_indices=torch.tensor([0, 1]), query_start_loc=None,
        intermediate_states_buffer=torch.zeros(2, 1, H, K, K), intermediate_state_indices=torch.tensor([0, 1]),
        cache_steps=1, retrieve_parent_token=None, lower_bound=LB, cache_ring=False, replayssm_rawv=torch.zeros(4, 3))
    assert out == "upstream" and seen[0]["replayssm_rawv"].shape == (4, 3)


def test_target_verify_refuses_ragged_windows_given_on_the_host():
    """A CPU ``query_start_loc`` whose windows are not 1 + drafts each is refused by name; the pool
    is not touched. (A GPU one is never read on the host: no sync, CUDA-graph capture safe.)"""
    gen = torch.Generator().manual_seed(5)
    B, T = 2, 3
    N = B * T
    q, k, v = (torch.randn(1, N, H, K, generator=gen) for _ in range(3))
    a, b = torch.randn(N, H * K, generator=gen), torch.randn(N, H, generator=gen)
    pool = torch.randn(2, H, K, K, generator=gen)
    before = pool.clone()
    with pytest.raises(ValueError, match="query_start_loc"):
        SglHybridKDAKernel(True).target_verify(
            torch.rand(1, 1, H, 1, generator=gen), torch.randn(H * K, generator=gen), q, k, v, a, b, ssm_states=pool,
            cache_indices=torch.tensor([0, 1], dtype=torch.int32), query_start_loc=torch.tensor([0, 2, 6], dtype=torch.int32),
            intermediate_states_buffer=torch.zeros(2, T, H, K, K), intermediate_state_indices=torch.tensor([0, 1]),
            cache_steps=T, retrieve_parent_token=None, lower_bound=LB)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("force_triton", [True, False])
def test_target_verify_takes_strided_index_columns(force_triton):
    """Issue 42: ``cache_indices`` and ``intermediate_state_indices`` as column 0 of ``[B, 4]`` int32 tables give
    the same output and scratch, bit for bit, as the same indices contiguous; scratch rows of the other columns
    stay NaN. A slot past its pool is refused by the argument's name."""
    gen = torch.Generator().manual_seed(9)
    B, T = 3, 2
    N = B * T
    q, k, v = (torch.randn(1, N, H, K, generator=gen) for _ in range(3))
    a, b = torch.randn(N, H * K, generator=gen), torch.randn(N, H, generator=gen)
    A_log, dt_bias = torch.rand(1, 1, H, 1, generator=gen), torch.randn(H * K, generator=gen)
    pool = torch.randn(6, H, K, K, generator=gen)
    idx_table = torch.tensor([[4, 0, 5, 2], [-1, 3, 0, 5], [1, 2, 3, 0]], dtype=torch.int32)
    row_table = torch.tensor([[2, 0, 5, 1], [0, 5, 4, 3], [4, 1, 3, 5]], dtype=torch.int32)

    def run(idx, rows):
        scratch = torch.full((6, T, H, K, K), float("nan"))
        o = SglHybridKDAKernel(force_triton).target_verify(
            A_log, dt_bias, q, k, v, a, b, ssm_states=pool, cache_indices=idx, query_start_loc=None,
            intermediate_states_buffer=scratch, intermediate_state_indices=rows, cache_steps=T,
            retrieve_parent_token=None, lower_bound=LB)
        return o, scratch

    want_o, want_s = run(idx_table[:, 0].contiguous(), row_table[:, 0].contiguous())
    got_o, got_s = run(idx_table[:, 0], row_table[:, 0])
    assert torch.equal(got_o, want_o) and not got_o.isnan().any()
    torch.testing.assert_close(got_s, want_s, rtol=0, atol=0, equal_nan=True)
    assert got_s[[1, 3, 5]].isnan().all() and not got_s[[2, 4]].isnan().any()
    with pytest.raises(ValueError, match="cache_indices: slot 6 is outside ssm_states"):
        run(torch.tensor([4, 6, 1]), row_table[:, 0])
    with pytest.raises(ValueError, match="intermediate_state_indices: slot 7 is outside intermediate_states_buffer"):
        run(idx_table[:, 0], torch.tensor([0, 7, 1]))
