"""The fused KDA decode as upstream's Kimi K3 hands it a step (CPU, Triton interpreter).

``try_fused_decode`` gets what ``KDAAttnBackend.forward_decode`` gets from upstream's
``KimiK3DeltaAttention.forward``: raw q|k|v as a row view of the fused projection's output,
the raw forget gate ``[B, H * K]``, raw beta ``[1, B, H]``, the output-norm gate stashed on the
attention layer, SGLang's pools (conv ``[slots, W - 1, C]``, FP32 state ``[slots, H, V, K]``).
Its output must equal the unfused chain (conv step, KDA recurrence with the safe gate, the
sigmoid-gated RMSNorm the model would apply) and leave the same pools; where the hand-off does
not apply it must return ``None`` and touch nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_hybrid_kernel.conv.reference import causal_conv1d_step
from sgl_hybrid_kernel.dispatch import call_counts, chosen_paths
from sgl_hybrid_kernel.delta_rule.naive import kda_gate, kda_recurrent
from sgl_hybrid_kernel.norm import gated_rms_norm, l2_norm
from sglang_hybrid.layers.attention import kda_fused_decode
from sglang_hybrid.layers.attention.kda_fused_decode import FusedDecodeStatic, static_contract, try_fused_decode

H, K, W, B, SLOTS = 2, 16, 4, 3, 6
C = 3 * H * K
LB = -5.0


def _step(seed=0):
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(B, C + H * K + 5, generator=gen)  # upstream splits q|k|v and the gate out of one GEMM
    mixed_qkv, gate = proj[:, :C], proj[:, C:C + H * K]
    a, b = torch.randn(B, H * K, generator=gen), torch.randn(1, B, H, generator=gen)
    conv, ssm = torch.randn(SLOTS, W - 1, C, generator=gen), torch.randn(SLOTS, H, K, K, generator=gen)
    layer = SimpleNamespace(
        layer_id=3, num_q_heads=H, num_k_heads=H, num_v_heads=H, head_k_dim=K, head_v_dim=K,
        conv_weights=torch.randn(C, W, generator=gen) * 0.5, bias=None,
        A_log=torch.rand(1, 1, H, 1, generator=gen), dt_bias=torch.randn(H * K, generator=gen), lower_bound=LB,
        _sgl_hybrid_fused_decode=FusedDecodeStatic(torch.rand(K, generator=gen) + 0.5, 1e-5),
        _k3_onorm_gate=gate, _k3_onorm_consumed=False,
    )
    idx = torch.tensor([4, -1, 1], dtype=torch.int32)  # a CUDA-graph padding row in the middle
    tracked = []
    cache = SimpleNamespace(conv=[conv], temporal=ssm, replayssm_d=None)
    backend = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(mamba2_layer_cache=lambda layer_id: cache),
        forward_metadata=SimpleNamespace(mamba_cache_indices=idx),
        _track_mamba_state_decode=lambda *args: tracked.append(args),
    )
    return layer, backend, cache, mixed_qkv, a, b, tracked


def _unfused(layer, cache, mixed_qkv, a, b):
    """The ordinary path on copies of the pools: conv step, recurrence, the model's o_norm."""
    conv, ssm = cache.conv[0].clone(), cache.temporal.clone()
    idx = [4, -1, 1]
    out = torch.zeros(B, H, K)
    live = torch.tensor([s for s in idx if s >= 0])
    rows = [i for i, s in enumerate(idx) if s >= 0]
    x = causal_conv1d_step(mixed_qkv[rows], layer.conv_weights, conv, live, activation="silu")
    q, k, v = (t.reshape(len(rows), H, K) for t in x.split([H * K] * 3, -1))
    g = kda_gate(a[rows].reshape(len(rows), H, K), layer.A_log.reshape(-1), layer.dt_bias, LB)
    for j, (i, s) in enumerate(zip(rows, live.tolist())):
        o, S = kda_recurrent(l2_norm(q[j:j + 1]), l2_norm(k[j:j + 1]), v[j:j + 1], g[j:j + 1],
                             torch.sigmoid(b[0, i:i + 1]), initial_state=ssm[s].transpose(-1, -2))
        ssm[s] = S.transpose(-1, -2)
        gate = layer._k3_onorm_gate[i].reshape(H, K)
        out[i] = gated_rms_norm(o[0], gate, layer._sgl_hybrid_fused_decode.norm_weight, 1e-5, "sigmoid")
    return out, conv, ssm


def test_fused_step_equals_the_unfused_chain_and_consumes_the_stash():
    layer, backend, cache, mixed_qkv, a, b, tracked = _step()
    want, conv_want, ssm_want = _unfused(layer, cache, mixed_qkv, a, b)
    before = call_counts().get("kda_decode=fused", 0)
    out = try_fused_decode(backend, layer, None, mixed_qkv, a, b)
    assert out.shape == (1, B, H, K)
    torch.testing.assert_close(out[0], want, rtol=1e-5, atol=1e-5)
    assert (out[0, 1] == 0).all()  # the padding row
    torch.testing.assert_close(cache.conv[0], conv_want)
    torch.testing.assert_close(cache.temporal, ssm_want, rtol=1e-5, atol=1e-5)
    assert layer._k3_onorm_consumed is True  # the model must not apply o_norm again
    assert len(tracked) == 1 and tracked[0][-1] == 3  # the prefix-cache track copy, with the layer id
    assert call_counts().get("kda_decode=fused", 0) == before + 1


@pytest.mark.parametrize("why", ["no_stash", "deferred_f_b", "replayssm", "gqa_state", "not_ours"])
def test_hand_off_declined_touches_nothing(why):
    layer, backend, cache, mixed_qkv, a, b, tracked = _step(1)
    if why == "no_stash":
        layer._k3_onorm_gate = None
    elif why == "deferred_f_b":
        layer._k3_deferred_f_b = True  # upstream's ROCm kernel: `a` is f_a, not the forget gate
    elif why == "replayssm":
        cache.replayssm_d = torch.zeros(1)
    elif why == "gqa_state":
        cache.temporal = torch.randn(SLOTS, 2 * H, K, K)
    else:
        del layer._sgl_hybrid_fused_decode  # the prepare hook declined this layer
    conv0, ssm0 = cache.conv[0].clone(), cache.temporal.clone()
    assert try_fused_decode(backend, layer, None, mixed_qkv, a, b) is None
    assert torch.equal(cache.conv[0], conv0) and torch.equal(cache.temporal, ssm0)
    assert layer._k3_onorm_consumed is False and not tracked


def test_static_contract_names_what_is_outside():
    layer = _step()[0]
    o_norm = SimpleNamespace(activation="sigmoid", weight=torch.ones(K), eps=1e-5)
    assert static_contract(layer, o_norm) is None
    assert "bias" in static_contract(SimpleNamespace(**{**vars(layer), "bias": torch.zeros(C)}), o_norm)
    assert "heads" in static_contract(SimpleNamespace(**{**vars(layer), "num_k_heads": 1}), o_norm)
    assert "norm" in static_contract(layer, SimpleNamespace(activation="silu", weight=torch.ones(K), eps=1e-5))
    assert "dt_bias" in static_contract(SimpleNamespace(**{**vars(layer), "dt_bias": torch.zeros(H)}), o_norm)


def test_prepare_hook_leaves_cpu_layers_unfused():
    layer = _step()[0]
    del layer._sgl_hybrid_fused_decode
    module = SimpleNamespace(attn=layer, o_norm=SimpleNamespace(activation="sigmoid", weight=torch.ones(K), eps=1e-5),
                             _kda_fused_decode_ready=False, _kda_hip_fused_decode_ready=False)
    kda_fused_decode._after_prepare(None, module)
    assert module._kda_fused_decode_ready is False and not hasattr(layer, "_sgl_hybrid_fused_decode")
    assert {c.op: c for c in chosen_paths()}["kda_decode_fused"].impl == "unfused"
    assert "CPU" in {c.op: c for c in chosen_paths()}["kda_decode_fused"].reason


@pytest.mark.parametrize("always_ours", [False, True])
def test_steps_upstreams_cuda_kernel_covers_go_to_it_unless_forced(always_ours):
    """Where the model published upstream's CUDA kernel inputs and its ``covered()`` accepts the step,
    the step is handed back (upstream's kernel is the faster on NVIDIA), unless
    ``SGLANG_HYBRID_KDA_FUSED_DECODE=ours``."""
    from unittest import mock

    from sglang.kernels.ops.attention import kda_fused_decode as upstream

    layer, backend, cache, mixed_qkv, a, b, tracked = _step(2)
    layer._k3_fused_decode_args = ("upstream's static inputs",)
    ssm0 = cache.temporal.clone()
    before = call_counts().get("kda_decode=upstream_cuda_fused", 0)
    with mock.patch.object(upstream, "covered", return_value=True) as covered:
        resolved = kda_fused_decode._upstream_covered(layer, "ours" if always_ours else "auto")
        layer._sgl_hybrid_fused_decode = FusedDecodeStatic(layer._sgl_hybrid_fused_decode.norm_weight, 1e-5, resolved)
        out = try_fused_decode(backend, layer, None, mixed_qkv, a, b)
    if always_ours:
        assert out is not None and layer._k3_onorm_consumed and not torch.equal(cache.temporal, ssm0)
        covered.assert_not_called()
    else:
        assert out is None and not layer._k3_onorm_consumed and torch.equal(cache.temporal, ssm0)
        assert covered.call_args.args[2].shape == (B, H)  # beta as upstream's backend passes it: b[0]
        assert call_counts().get("kda_decode=upstream_cuda_fused", 0) == before + 1
