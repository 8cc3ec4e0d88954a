"""``SglHybridKDAKernel`` driven through upstream's KDA kernel call signature (CPU).

Upstream's ``KDAAttnBackend`` calls ``decode(q, k, v, a, b, *, A_log, dt_bias,
ssm_states, cache_indices, query_start_loc, lower_bound)`` and
``extend(q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, A_log,
dt_bias, lower_bound, beta_is_raw, return_intermediate_states, track_state,
track_chunk_idx)``: a fake batch in exactly those layouts (``[1, N, H, D]``
activations, FP32 pool ``[slots, H, V, K]``, parameter shapes as upstream's
K3 layer holds them) through both paths (Triton kernels in the interpreter, and
the torch fallback) must equal the plain-torch reference.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, kda_gate, kda_recurrent
from sgl_hybrid_kernel.norm import l2_norm
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from sglang_hybrid.layers.attention import kda_kernel
from sglang_hybrid.layers.attention.kda_kernel import SglHybridKDAKernel

H, K = 2, 16
LB = -5.0


def _params(gen):
    A_log = torch.rand(1, 1, H, 1, generator=gen)  # upstream's K3 parameter shape
    dt_bias = torch.randn(H * K, generator=gen)
    return A_log, dt_bias


@pytest.mark.parametrize("force_triton", [True, False])
def test_decode_signature(force_triton):
    gen = torch.Generator().manual_seed(0)
    B = 3
    q, k, v = (torch.randn(1, B, H, K, generator=gen) for _ in range(3))
    a, b = torch.randn(B, H * K, generator=gen), torch.randn(1, B, H, generator=gen)
    A_log, dt_bias = _params(gen)
    pool = torch.randn(6, H, K, K, generator=gen)
    ref_pool = pool.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    o = SglHybridKDAKernel(force_triton).decode(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=pool,
                                                cache_indices=idx, query_start_loc=torch.arange(B + 1), lower_bound=LB)
    assert o.shape == (1, B, H, K)
    for i, s in enumerate(idx.tolist()):
        g = kda_gate(a[i].view(1, H, K), A_log.reshape(-1), dt_bias, LB)
        ro, rS = kda_recurrent(l2_norm(q[0, i : i + 1]), l2_norm(k[0, i : i + 1]), v[0, i : i + 1], g, torch.sigmoid(b[0, i : i + 1]),
                               initial_state=ref_pool[s].transpose(-1, -2))
        torch.testing.assert_close(o[0, i], ro[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[s].transpose(-1, -2), rS, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("force_triton", [True, False])
def test_extend_signature_with_track_snapshots(force_triton):
    """Varlen extend from pooled states, with upstream's prefix-cache track request:
    track_chunk_idx c >= 0 asks for the state after c * 64 tokens of the extend."""
    gen = torch.Generator().manual_seed(1)
    lens = [130, 20, 64]
    N = sum(lens)
    qsl = torch.tensor([0, 130, 150, 214], dtype=torch.int32)
    q, k, v = (torch.randn(1, N, H, K, generator=gen) for _ in range(3))
    g, beta = torch.randn(1, N, H, K, generator=gen), torch.randn(1, N, H, generator=gen)
    A_log, dt_bias = _params(gen)
    pool = torch.randn(6, H, K, K, generator=gen)
    ref_pool = pool.clone()
    idx = torch.tensor([5, 1, 3], dtype=torch.int32)
    track = torch.full((3, H, K, K), float("nan"))
    chunk_idx = torch.tensor([2, -1, 0], dtype=torch.int32)  # after 128 tokens; none; at the start
    o, h = SglHybridKDAKernel(force_triton).extend(
        q, k, v, g, beta, ssm_states=pool, cache_indices=idx, query_start_loc=qsl, A_log=A_log, dt_bias=dt_bias,
        lower_bound=LB, beta_is_raw=True, return_intermediate_states=True, track_state=track, track_chunk_idx=chunk_idx)
    assert h is None and o.shape == (1, N, H, K)
    for i, s in enumerate(idx.tolist()):
        sl = slice(int(qsl[i]), int(qsl[i + 1]))
        gg = kda_gate(g[0, sl], A_log.reshape(-1), dt_bias, LB)
        ro, rS, saved = gated_delta_recurrent(l2_norm(q[0, sl]), l2_norm(k[0, sl]), v[0, sl], gg, torch.sigmoid(beta[0, sl]),
                                              initial_state=ref_pool[s].transpose(-1, -2), save_positions=[128] if i == 0 else [])
        torch.testing.assert_close(o[0, sl], ro, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pool[s].transpose(-1, -2), rS, rtol=1e-4, atol=1e-4)
        if i == 0:
            torch.testing.assert_close(track[0].transpose(-1, -2), saved[0], rtol=1e-4, atol=1e-4)
    assert track[1].isnan().all()  # not requested, not written
    torch.testing.assert_close(track[2], ref_pool[3])  # c = 0: the state the extend started from


def test_dispatcher_hook_installs_our_kernel_only_for_sgl_hybrid():
    calls = []

    class FakeDispatcher:
        pass

    def original(self, d, p, v):
        calls.append((d, p, v))
        self.decode_kernel, self.extend_kernel, self.verify_kernel = "up-decode", "up-extend", "up-verify"

    fake_exec = mock.Mock()
    fake_exec.mamba.linear_attn_backend = "sgl_hybrid"
    fake_exec.mamba.linear_attn_decode_backend = None
    fake_exec.mamba.linear_attn_prefill_backend = None
    fake_exec.mamba.linear_attn_verify_backend = "triton"
    custom, triton = LinearAttnKernelBackend("sgl_hybrid"), LinearAttnKernelBackend.TRITON
    assert custom.is_custom()
    d = FakeDispatcher()
    with mock.patch("sglang.srt.runtime_context.get_exec", return_value=fake_exec):
        kda_kernel._around_dispatcher_init(original, d, custom, custom, triton)
    assert calls == [(triton, triton, triton)]
    assert isinstance(d.decode_kernel, SglHybridKDAKernel) and isinstance(d.extend_kernel, SglHybridKDAKernel)
    assert d.verify_kernel == "up-verify" and d.supports_packed_decode is False
    # Plain upstream choices pass straight through.
    d2 = FakeDispatcher()
    kda_kernel._around_dispatcher_init(original, d2, triton, triton, triton)
    assert d2.decode_kernel == "up-decode"
    # A misspelt name is an error naming it, not a silent fallback.
    fake_exec.mamba.linear_attn_backend = "sgl_hybird"
    with mock.patch("sglang.srt.runtime_context.get_exec", return_value=fake_exec), pytest.raises(ValueError, match="sgl_hybird"):
        kda_kernel._around_dispatcher_init(original, FakeDispatcher(), custom, custom, triton)


@pytest.mark.parametrize("force_triton", [True, False])
def test_extend_takes_host_lengths_and_prefix_flags_from_upstream(force_triton):
    """Upstream's KDA extend passes ``extend_seq_lens_cpu`` (a host list) and ``extend_prefix_lens``
    (a device tensor): the lengths are taken from the list, a sequence with no prefix starts from
    zeros (its slot's old contents, NaN here, must not leak), one with a prefix from its slot."""
    gen = torch.Generator().manual_seed(6)
    lens = [70, 9]
    N = sum(lens)
    qsl = torch.tensor([0, 70, 79], dtype=torch.int32)
    q, k, v = (torch.randn(1, N, H, K, generator=gen) for _ in range(3))
    g, beta = torch.randn(1, N, H, K, generator=gen), torch.randn(1, N, H, generator=gen)
    A_log, dt_bias = _params(gen)
    pool = torch.randn(3, H, K, K, generator=gen)
    pool[2] = float("nan")
    ref_pool = pool.clone()
    idx = torch.tensor([0, 2], dtype=torch.int32)
    o = SglHybridKDAKernel(force_triton).extend(
        q, k, v, g, beta, ssm_states=pool, cache_indices=idx, query_start_loc=qsl, A_log=A_log, dt_bias=dt_bias,
        lower_bound=LB, beta_is_raw=True, extend_seq_lens_cpu=lens, extend_prefix_lens=torch.tensor([64, 0]))
    assert not o.isnan().any()
    for i, s in enumerate(idx.tolist()):
        sl = slice(int(qsl[i]), int(qsl[i + 1]))
        gg = kda_gate(g[0, sl], A_log.reshape(-1), dt_bias, LB)
        ro, rS, _ = gated_delta_recurrent(l2_norm(q[0, sl]), l2_norm(k[0, sl]), v[0, sl], gg, torch.sigmoid(beta[0, sl]),
                                          initial_state=ref_pool[s].transpose(-1, -2) if i == 0 else None)
        torch.testing.assert_close(o[0, sl], ro, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pool[s].transpose(-1, -2), rS, rtol=1e-4, atol=1e-4)


def test_extend_host_inputs_do_not_read_the_device():
    """``extend_lengths`` with upstream's host list and ``initial_state_flags`` never read device
    tensors on the host (a meta tensor raises on any read): no sync per layer on a GPU; a list of
    the wrong length falls back to reading ``cu``."""
    from sglang_hybrid.layers.attention.delta_rule_common import extend_lengths, initial_state_flags

    cu_meta = torch.empty(4, dtype=torch.int32, device="meta")
    assert extend_lengths(cu_meta, [3, 0, 5]) == [3, 0, 5]
    flags = initial_state_flags(torch.empty(3, dtype=torch.int64, device="meta"), 3, torch.device("meta"))
    assert flags.device.type == "meta" and flags.dtype == torch.int32 and flags.shape == (3,)
    assert initial_state_flags(torch.tensor([5, 0, 1]), 3, torch.device("cpu")).tolist() == [1, 0, 1]
    assert extend_lengths(torch.tensor([0, 3, 3, 8], dtype=torch.int32), [1, 2]) == [3, 0, 5]
    with pytest.raises((NotImplementedError, RuntimeError)):  # without the list: one read of cu
        extend_lengths(cu_meta, None)


def test_extend_asks_the_prefill_dispatcher_with_the_kda_gate(monkeypatch):
    """The served KDA extend hands the dispatcher its gate kind and bound, so the start-up
    ``kernel path: delta_rule_prefill`` line carries the chunk plan of K3's gate (issue 43)."""
    from sgl_hybrid_kernel.delta_rule.gate import gate_kind

    seen = []
    monkeypatch.setattr(kda_kernel, "choose_chunk", lambda q, v, s, *a: seen.append(a) or "torch")
    gen = torch.Generator().manual_seed(9)
    N = 5
    q, k, v = (torch.randn(1, N, H, K, generator=gen) for _ in range(3))
    g, beta = torch.randn(1, N, H, K, generator=gen), torch.randn(1, N, H, generator=gen)
    A_log, dt_bias = _params(gen)
    SglHybridKDAKernel(False).extend(
        q, k, v, g, beta, ssm_states=torch.zeros(1, H, K, K), cache_indices=torch.tensor([0], dtype=torch.int32),
        query_start_loc=torch.tensor([0, N], dtype=torch.int32), A_log=A_log, dt_bias=dt_bias, lower_bound=LB,
        beta_is_raw=True, extend_seq_lens_cpu=[N])
    assert seen == [(gate_kind("kda", LB), LB)]
