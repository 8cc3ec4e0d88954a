"""Our KDA path against upstream's own Triton KDA kernels, run in Triton's interpreter (CPU).

What upstream's ``KDAAttnBackend`` runs for Kimi K3 on an H200 with its default
Triton KDA backend: prefill ``causal_conv1d_fn`` (packed over q|k|v, SiLU) then
``chunk_kda(use_qk_l2norm_in_kernel=True, A_log, dt_bias, lower_bound, beta_is_raw=True)``
(``TritonKDAKernel.extend``); decode ``causal_conv1d_update`` then
``fused_recurrent_kda_packed_decode`` (``TritonKDAKernel.packed_decode``). Our CPU
backend (``HybridKDAAttnBackend``) runs ``conv.reference`` and ``SglHybridKDAKernel``
on the same tensors, in upstream's layouts (A_log ``[1, 1, H, 1]``, dt_bias ``[H*K]``,
conv pool ``[slots, K-1, 3P]``, state pool ``[slots, H, V, K]``). Both must agree:
outputs, conv windows and recurrent states.

Upstream's kernels need three interpreter shims (scoped to this module): one
autotune config instead of a benchmark (no driver on CPU), and FLA's module-level
``tl`` aliases (``exp``, ``gather``, ...) and ``libdevice`` calls resolved through ``tl`` at call time.

Limit: the interpreter runs upstream's ``chunk_kda`` right only within one 16-token
sub-chunk per sequence. Past 16 tokens its output diverges (1e10 and more) whatever
the gate strength, head size (32, 64, 128: the last is Kimi K3's own, which upstream
serves on GPU) or intra path (fused / unfused), so prefill beyond 16 tokens is a
GPU comparison (docs/kimi-k3-reference.md, "Not comparable on CPU").
"""

from __future__ import annotations

import sys

import pytest
import torch
import triton.language as tl
from triton.runtime import autotuner

from sgl_hybrid_kernel.conv.reference import causal_conv1d, causal_conv1d_step
from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_kda_packed_decode
from sglang.kernels.ops.attention.fla.kda import chunk_kda
from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn, causal_conv1d_update
from sglang_hybrid.layers.attention.kda_kernel import SglHybridKDAKernel

H, K, W, LB = 4, 32, 4, -5.0  # the tiny Kimi K3's KDA: 4 heads of 32, conv 4, gate_lower_bound -5
P = H * K


def _tl_alias(attr, fn):
    """A module-level alias of a ``tl`` / ``tl.math`` builtin, resolved at call time (the interpreter patches
    only the ``tl`` namespaces), or None."""
    if not getattr(fn, "__triton_builtin__", False):
        return None
    for ns in (tl, tl.math):
        name = next((n for n, v in vars(ns).items() if v is fn), None)
        if name is not None:
            return lambda *a, _ns=ns, _n=name, **k: getattr(_ns, _n)(*a, **k)
    return None


class _LibDevice:
    def __getattr__(self, name):
        return lambda *a, **k: getattr(tl.math, name)(*a)


@pytest.fixture(scope="module", autouse=True)
def _interpreter_shims():
    with pytest.MonkeyPatch.context() as mp:
        prune = autotuner.Autotuner.prune_configs
        mp.setattr(autotuner.Autotuner, "prune_configs", lambda self, kw: prune(self, kw)[:1])
        import importlib
        import pkgutil

        import sglang.kernels.ops.attention.fla as fla

        for info in pkgutil.iter_modules(fla.__path__):
            importlib.import_module(f"{fla.__name__}.{info.name}")
        for name, mod in list(sys.modules.items()):
            if mod is None or not name.startswith("sglang.kernels.ops.attention.fla"):
                continue
            for attr, fn in list(vars(mod).items()):
                target = _tl_alias(attr, fn)
                if target is not None:
                    mp.setattr(mod, attr, target)
            if hasattr(mod, "libdevice"):
                mp.setattr(mod, "libdevice", _LibDevice())
        yield


def _layer(gen):
    w = torch.randn(3 * P, W, generator=gen) * 0.5  # qkv_conv1d.weight.squeeze(1), FP32 as upstream holds it
    A_log = (torch.rand(H, generator=gen) * 2).view(1, 1, H, 1)
    dt_bias = torch.randn(P, generator=gen) * 0.5
    return w, A_log, dt_bias


def _heads(x, n):
    return [t.reshape(1, n, H, K) for t in x.split([P, P, P], dim=-1)]


@pytest.mark.parametrize("force_triton", [False, True])
def test_prefill_matches_upstream_conv_and_chunk_kda(force_triton):
    gen = torch.Generator().manual_seed(0)
    w, A_log, dt_bias = _layer(gen)
    lens, prefix = [13, 9], [0, 5]  # a fresh sequence; one continuing from its conv window and state
    slots = torch.tensor([2, 0], dtype=torch.int32)
    N = sum(lens)
    cu = torch.tensor([0, lens[0], N], dtype=torch.int32)
    x = torch.randn(N, 3 * P, generator=gen)
    a, b = torch.randn(1, N, H, K, generator=gen), torch.randn(1, N, H, generator=gen)
    conv0 = torch.zeros(3, W - 1, 3 * P)
    conv0[0] = torch.randn(W - 1, 3 * P, generator=gen)
    ssm0 = torch.zeros(3, H, K, K)
    ssm0[0] = torch.randn(H, K, K, generator=gen) * 0.1

    conv_up, ssm_up = conv0.clone(), ssm0.clone()
    y_up = causal_conv1d_fn(x.t().contiguous(), w, None, activation="silu", conv_states=conv_up.transpose(-1, -2),
                            has_initial_state=torch.tensor(prefix) > 0, cache_indices=slots, query_start_loc=cu,
                            seq_lens_cpu=lens).t()
    o_up = chunk_kda(*_heads(y_up, N), g=a, beta=b, initial_state=ssm_up, initial_state_indices=slots,
                     use_qk_l2norm_in_kernel=True, cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias, lower_bound=LB,
                     beta_is_raw=True)

    conv_me, ssm_me = conv0.clone(), ssm0.clone()
    y_me = torch.empty_like(x)
    for i, (n, p, s) in enumerate(zip(lens, prefix, slots.tolist())):
        sl = slice(int(cu[i]), int(cu[i]) + n)
        y_me[sl], conv_me[s] = causal_conv1d(x[sl], w, conv_me[s] if p > 0 else None, activation="silu")
    o_me = SglHybridKDAKernel(force_triton=force_triton).extend(
        *_heads(y_me, N), a, b, ssm_states=ssm_me, cache_indices=slots, query_start_loc=cu, A_log=A_log, dt_bias=dt_bias,
        lower_bound=LB, beta_is_raw=True, extend_seq_lens_cpu=lens, extend_prefix_lens=torch.tensor(prefix))
    o_me = o_me[0] if isinstance(o_me, tuple) else o_me

    torch.testing.assert_close(y_me, y_up, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conv_me, conv_up, rtol=0, atol=0)
    torch.testing.assert_close(o_me, o_up, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ssm_me, ssm_up, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("force_triton", [False, True])
def test_decode_matches_upstream_conv_update_and_packed_decode(force_triton):
    gen = torch.Generator().manual_seed(1)
    w, A_log, dt_bias = _layer(gen)
    B = 3
    slots = torch.tensor([1, 3, 0], dtype=torch.int32)
    x = torch.randn(B, 3 * P, generator=gen)
    a, b = torch.randn(B, P, generator=gen), torch.randn(B, H, generator=gen)  # as KimiK3DeltaAttention hands them
    conv0 = torch.randn(4, W - 1, 3 * P, generator=gen)
    ssm0 = torch.randn(4, H, K, K, generator=gen) * 0.1

    conv_up, ssm_up = conv0.clone(), ssm0.clone()
    qkv_up = causal_conv1d_update(x, conv_up.transpose(-1, -2), w, None, activation="silu", conv_state_indices=slots)
    out = qkv_up.new_empty(B, 1, H, K)
    fused_recurrent_kda_packed_decode(mixed_qkv=qkv_up, a=a, b=b, A_log=A_log.reshape(-1), dt_bias=dt_bias.reshape(-1),
                                      scale=K ** -0.5, initial_state=ssm_up, out=out, ssm_state_indices=slots,
                                      use_qk_l2norm_in_kernel=True, lower_bound=LB)
    o_up = out.transpose(0, 1)

    conv_me, ssm_me = conv0.clone(), ssm0.clone()
    qkv_me = causal_conv1d_step(x, w, conv_me, slots.long(), activation="silu")
    o_me = SglHybridKDAKernel(force_triton=force_triton).decode(
        *_heads(qkv_me, B), a, b.view(1, B, H), A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_me, cache_indices=slots,
        query_start_loc=None, lower_bound=LB)

    torch.testing.assert_close(qkv_me, qkv_up, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conv_me, conv_up, rtol=0, atol=0)
    torch.testing.assert_close(o_me, o_up, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ssm_me, ssm_up, rtol=1e-4, atol=1e-5)


def test_output_norm_matches_upstream_fused_rmsnorm_gated():
    """KimiK3DeltaAttention's ``o_norm``: upstream's ``FusedRMSNormGated(head_dim, eps=1e-5, activation="sigmoid")``
    (FLA's Triton ``layer_norm_gated`` kernel) on the core output ``[1, N, H, K]`` with the gate ``[N, H, K]``,
    against our ``gated_rms_norm`` (the reference model's KDA output norm)."""
    from sgl_hybrid_kernel.norm.reference import gated_rms_norm
    from sglang.kernels.ops.attention.fla import fused_norm_gate

    gen = torch.Generator().manual_seed(2)
    N = 5
    norm = fused_norm_gate.FusedRMSNormGated(K, eps=1e-5, activation="sigmoid")
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(K, generator=gen))
    core, gate = torch.randn(1, N, H, K, generator=gen), torch.randn(N, H, K, generator=gen)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(fused_norm_gate, "_use_cpu", False)  # the CUDA path (the AMX CPU kernel takes silu only)
        ref = norm(core.clone(), gate)  # upstream writes the result into x (layer_norm_gated_fwd: y = x)
    ours = gated_rms_norm(core[0], gate, norm.weight, 1e-5, "sigmoid")
    torch.testing.assert_close(ours, ref.reshape(ours.shape), rtol=1e-5, atol=1e-5)
