"""``SglHybridGDNKernel`` driven through upstream's GDN kernel call signatures (CPU).

Upstream's ``GDNAttnBackend`` calls ``decode(q, k, v, a, b, *, A_log, dt_bias,
ssm_states, cache_indices, query_start_loc)``, ``extend(q, k, v, g, beta, *,
ssm_states, cache_indices, query_start_loc, state_checkpoint_cu_starts,
num_state_checkpoints, state_checkpoint_every_n_tokens, output, layer_id,
extend_prefix_lens, track_state, track_chunk_idx)`` with ``(g, beta)`` from its
``fused_gdn_gating`` and ``target_verify(A_log, dt_bias, q, k, v, a, b, *, ...,
intermediate_states_buffer, intermediate_state_indices, cache_steps,
retrieve_parent_token)``. Fake batches in exactly those layouts (grouped value
heads HV = 2H, FP32 pool ``[slots, HV, V, K]``, padding slot -1) through the
Triton kernels (interpreter) and the torch fallback must equal the token-by-token
FP64 recurrence.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, gdn_gate
from sgl_hybrid_kernel.norm import l2_norm
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from sglang_hybrid.layers.attention import gdn_kernel
from sglang_hybrid.layers.attention.gdn_kernel import SglHybridGDNKernel, raw_gdn_gates

H, HV, K, V = 2, 4, 16, 16


def _params(gen):
    return torch.rand(HV, generator=gen), torch.randn(HV, generator=gen)  # A_log, dt_bias as Qwen3.8's layer


def _oracle(q, k, v, g, beta, s0_vk, save=()):
    """FP64 recurrence; states returned in the pool's [HV, V, K] layout."""
    o, S, saved = gated_delta_recurrent(l2_norm(q.double()), l2_norm(k.double()), v.double(), g.double(), beta.double(),
                                        initial_state=None if s0_vk is None else s0_vk.transpose(-1, -2).double(),
                                        acc_dtype=torch.float64, save_positions=save)
    return o.float(), S.transpose(-1, -2).float(), [s.transpose(-1, -2).float() for s in saved]


@pytest.mark.parametrize("force_triton", [True, False])
def test_decode_signature_with_padding_slot(force_triton):
    gen = torch.Generator().manual_seed(0)
    B = 3
    q, k = (torch.randn(1, B, H, K, generator=gen) for _ in range(2))
    v = torch.randn(1, B, HV, V, generator=gen)
    a, b = torch.randn(B, HV, generator=gen), torch.randn(B, HV, generator=gen)
    A_log, dt_bias = _params(gen)
    pool = torch.randn(6, HV, V, K, generator=gen)
    ref_pool = pool.clone()
    idx = torch.tensor([4, -1, 2], dtype=torch.int32)  # -1: CUDA-graph padding row
    o = SglHybridGDNKernel(force_triton).decode(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=pool,
                                                cache_indices=idx, query_start_loc=torch.arange(B + 1, dtype=torch.int32))
    assert o.shape == (1, B, HV, V)
    g = gdn_gate(a, A_log, dt_bias)
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            assert torch.equal(o[0, i], torch.zeros(HV, V))
            continue
        ro, rS, _ = _oracle(q[0, i : i + 1], k[0, i : i + 1], v[0, i : i + 1], g[i : i + 1], torch.sigmoid(b[i : i + 1]), ref_pool[s])
        torch.testing.assert_close(o[0, i], ro[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[s], rS, rtol=1e-5, atol=1e-5)
    untouched = [0, 1, 3, 5]
    assert torch.equal(pool[untouched], ref_pool[untouched])


@pytest.mark.parametrize("force_triton", [True, False])
def test_extend_signature_gated_inputs_and_track_snapshots(force_triton):
    """Upstream hands extend the *gated* (g, beta); a fresh sequence (prefix 0) starts
    from zeros, a resumed one from its slot; track_chunk_idx c asks for the state
    after c * 64 tokens (c = 0: the start state)."""
    gen = torch.Generator().manual_seed(1)
    lens = [130, 20, 64]
    N = sum(lens)
    qsl = torch.tensor([0, 130, 150, 214], dtype=torch.int32)
    q, k = (torch.randn(1, N, H, K, generator=gen) for _ in range(2))
    v = torch.randn(1, N, HV, V, generator=gen)
    a, b = torch.randn(N, HV, generator=gen), torch.randn(N, HV, generator=gen)
    A_log, dt_bias = _params(gen)
    a[5, 0] = -60.0  # decay underflows to exactly 0 in FP32: the raw-gate adapter must give f = -inf, not NaN
    g = gdn_gate(a, A_log, dt_bias).unsqueeze(0)  # upstream's fused_gdn_gating layout [1, N, HV]
    beta = torch.sigmoid(b).unsqueeze(0)
    pool = torch.randn(6, HV, V, K, generator=gen)
    ref_pool = pool.clone()
    idx = torch.tensor([5, 1, 3], dtype=torch.int32)
    prefix = torch.tensor([7, 0, 64])
    track = torch.full((3, HV, V, K), float("nan"))
    chunk_idx = torch.tensor([2, -1, 0], dtype=torch.int32)
    o, last, h = SglHybridGDNKernel(force_triton).extend(
        q, k, v, g, beta, ssm_states=pool, cache_indices=idx, query_start_loc=qsl, state_checkpoint_cu_starts=None,
        num_state_checkpoints=0, state_checkpoint_every_n_tokens=None, output=None, layer_id=0,
        extend_prefix_lens=prefix, track_state=track, track_chunk_idx=chunk_idx)
    assert o.shape == (1, N, HV, V) and last is None and h is None
    for i, s in enumerate(idx.tolist()):
        sl = slice(int(qsl[i]), int(qsl[i + 1]))
        s0 = ref_pool[s] if prefix[i] > 0 else None
        ro, rS, saved = _oracle(q[0, sl], k[0, sl], v[0, sl], g[0, sl], beta[0, sl], s0, save=[128] if i == 0 else [])
        torch.testing.assert_close(o[0, sl], ro, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pool[s], rS, rtol=1e-4, atol=1e-4)
        if i == 0:
            torch.testing.assert_close(track[0], saved[0], rtol=1e-4, atol=1e-4)
    assert track[1].isnan().all()
    torch.testing.assert_close(track[2], ref_pool[3])


def test_raw_gate_adapter_round_trip():
    g = torch.tensor([0.0, -1e-6, -1e-3, -0.5, -5.0, -19.9, -20.5, -80.0])
    beta = torch.tensor([0.0, 1e-6, 0.1, 0.5, 0.9, 0.999, 1.0, 0.3])
    f, b = raw_gdn_gates(g, beta)
    back = -torch.nn.functional.softplus(f.double(), threshold=20.0)
    torch.testing.assert_close(back.float(), g, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(torch.sigmoid(b), beta, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("force_triton", [True, False])
def test_target_verify_chain_writes_scratch_not_pool(force_triton):
    gen = torch.Generator().manual_seed(2)
    B, T = 3, 3
    N = B * T
    q, k = (torch.randn(1, N, H, K, generator=gen) for _ in range(2))
    v = torch.randn(1, N, HV, V, generator=gen)
    a, b = torch.randn(N, HV, generator=gen), torch.randn(N, HV, generator=gen)
    A_log, dt_bias = _params(gen)
    pool = torch.randn(5, HV, V, K, generator=gen)
    ref_pool = pool.clone()
    idx = torch.tensor([3, 0, -1], dtype=torch.int32)
    scratch = torch.full((6, 4, HV, V, K), float("nan"))  # upstream allocates max steps >= T, plus a padding row
    rows = torch.tensor([2, 0, 5, 1], dtype=torch.int32)  # padded past B, as upstream's index table
    o = SglHybridGDNKernel(force_triton).target_verify(
        A_log, dt_bias, q, k, v, a, b, ssm_states=pool, cache_indices=idx,
        query_start_loc=torch.arange(0, N + 1, T, dtype=torch.int32), intermediate_states_buffer=scratch,
        intermediate_state_indices=rows, cache_steps=T, retrieve_parent_token=None)
    assert torch.equal(pool, ref_pool)  # verify never commits
    g = gdn_gate(a, A_log, dt_bias)
    for i, s in enumerate(idx.tolist()):
        sl = slice(i * T, (i + 1) * T)
        if s < 0:
            assert torch.equal(o[0, sl], torch.zeros(T, HV, V))
            assert scratch[5].isnan().all()
            continue
        ro, _, saved = _oracle(q[0, sl], k[0, sl], v[0, sl], g[sl], torch.sigmoid(b[sl]), ref_pool[s], save=range(1, T + 1))
        torch.testing.assert_close(o[0, sl], ro, rtol=1e-5, atol=1e-5)
        for t in range(T):
            torch.testing.assert_close(scratch[int(rows[i]), t], saved[t], rtol=1e-5, atol=1e-5)
        assert scratch[int(rows[i]), T].isnan().all()  # steps past T untouched


def test_dispatcher_hook_installs_our_kernel_for_sgl_hybrid_only():
    calls = []

    class FakeDispatcher:
        pass

    def original(self, d, p, v=None):
        calls.append((d, p, v))
        self.decode_kernel, self.extend_kernel, self.verify_kernel = "up-decode", "up-extend", "up-verify"
        self.tree_verify_kernel, self.supports_packed_decode = "up-tree", True

    fake_exec = mock.Mock()
    fake_exec.mamba.linear_attn_backend = "sgl_hybrid"
    fake_exec.mamba.linear_attn_decode_backend = None
    fake_exec.mamba.linear_attn_prefill_backend = None
    fake_exec.mamba.linear_attn_verify_backend = None
    custom, triton = LinearAttnKernelBackend("sgl_hybrid"), LinearAttnKernelBackend.TRITON
    d = FakeDispatcher()
    with mock.patch("sglang.srt.runtime_context.get_exec", return_value=fake_exec):
        # upstream's resolver turns an unset verify into "triton"; with decode ours, verify follows decode
        gdn_kernel._around_dispatcher_init(original, d, custom, custom, triton)
    assert calls == [(triton, triton, triton)]
    assert all(isinstance(x, SglHybridGDNKernel) for x in (d.decode_kernel, d.extend_kernel, d.verify_kernel))
    assert d.decode_kernel is d.verify_kernel and d.supports_packed_decode is False and d.tree_verify_kernel == "up-tree"
    # An explicit --linear-attn-verify-backend triton keeps upstream's verify.
    fake_exec.mamba.linear_attn_verify_backend = "triton"
    d1 = FakeDispatcher()
    with mock.patch("sglang.srt.runtime_context.get_exec", return_value=fake_exec):
        gdn_kernel._around_dispatcher_init(original, d1, custom, triton, triton)
    assert isinstance(d1.decode_kernel, SglHybridGDNKernel) and d1.extend_kernel == "up-extend" and d1.verify_kernel == "up-verify"
    # Plain upstream choices pass straight through (no runtime context needed).
    d2 = FakeDispatcher()
    gdn_kernel._around_dispatcher_init(original, d2, triton, triton, None)
    assert d2.decode_kernel == "up-decode" and calls[-1] == (triton, triton, None)
    fake_exec.mamba.linear_attn_backend = "sgl_hybird"
    with mock.patch("sglang.srt.runtime_context.get_exec", return_value=fake_exec), pytest.raises(ValueError, match="sgl_hybird"):
        gdn_kernel._around_dispatcher_init(original, FakeDispatcher(), custom, custom, triton)


def test_gpu_extend_path_hands_the_host_lengths_to_the_kernel(monkeypatch):
    """Upstream's GDN backend calls the kernel's ``extend`` without host lengths. On GPU,
    ``HybridGDNAttnBackend.forward_extend`` runs upstream's method inside
    ``forward_extend_lengths(forward_batch.extend_seq_lens_cpu)``, so the kernel's ``extend_lengths``
    takes the batch's list instead of reading ``query_start_loc`` on the host (a meta tensor here:
    any read raises); after the call it reads ``cu`` again."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_hybrid.layers.attention.delta_rule_common import extend_lengths
    from sglang_hybrid.layers.attention.gdn_backend import HybridGDNAttnBackend

    cu_meta = torch.empty(4, dtype=torch.int32, device="meta")
    seen = {}

    def upstream_forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        seen["lens"] = extend_lengths(cu_meta, kwargs.get("extend_seq_lens_cpu"))  # as SglHybridGDNKernel.extend
        return "out"

    monkeypatch.setattr(GDNAttnBackend, "forward_extend", upstream_forward_extend)
    backend = object.__new__(HybridGDNAttnBackend)  # the GPU branch needs no other state
    backend._torch_path = False
    assert backend.forward_extend(None, SimpleNamespace(extend_seq_lens_cpu=[3, 0, 5]), None, None, None) == "out"
    assert seen["lens"] == [3, 0, 5]
    with pytest.raises((NotImplementedError, RuntimeError)):
        extend_lengths(cu_meta)


def test_extend_asks_the_prefill_dispatcher_with_the_gdn_gate(monkeypatch):
    """The served GDN extend hands the dispatcher the GDN gate kind, so the start-up
    ``kernel path: delta_rule_prefill`` line carries the chunk plan of the GDN gate (issue 43)."""
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN

    seen = []
    monkeypatch.setattr(gdn_kernel, "choose_chunk", lambda q, v, s, *a: seen.append(a) or "torch")
    N, HV, KK = 4, 2, 16
    q, k = torch.randn(1, N, HV, KK), torch.randn(1, N, HV, KK)
    v = torch.randn(1, N, HV, KK)
    g, beta = -torch.rand(1, N, HV), torch.rand(1, N, HV)
    SglHybridGDNKernel(False).extend(q, k, v, g, beta, ssm_states=torch.zeros(1, HV, KK, KK),
                                     cache_indices=torch.tensor([0], dtype=torch.int32),
                                     query_start_loc=torch.tensor([0, N], dtype=torch.int32),
                                     extend_seq_lens_cpu=[N])
    assert seen == [(GATE_GDN,)]
