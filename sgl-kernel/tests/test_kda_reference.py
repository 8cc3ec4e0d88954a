"""KDA references against fla-core's naive implementations and an FP64 recurrence."""

import pytest
import torch
from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
from fla.ops.kda.naive import naive_recurrent_kda

from sgl_hybrid_kernel.delta_rule.naive import kda_chunk, kda_gate, kda_recurrent
from sgl_hybrid_kernel.norm import l2_norm


def _inputs(T, H, K, V, seed=0, lower_bound=-5.0):
    g = torch.Generator().manual_seed(seed)
    q = l2_norm(torch.randn(T, H, K, generator=g))
    k = l2_norm(torch.randn(T, H, K, generator=g))
    v = torch.randn(T, H, V, generator=g)
    f = torch.randn(T, H, K, generator=g)
    A_log = torch.rand(H, generator=g) * 2
    dt_bias = torch.randn(H * K, generator=g)
    beta = torch.rand(T, H, generator=g)
    S0 = torch.randn(H, K, V, generator=g)
    return q, k, v, kda_gate(f, A_log, dt_bias, lower_bound), beta, S0, (f, A_log, dt_bias)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_gate_matches_fla(lower_bound):
    gen = torch.Generator().manual_seed(11)
    f = torch.randn(7, 3, 16, generator=gen)
    A_log, dt_bias = torch.rand(3, generator=gen), torch.randn(48, generator=gen)
    ours = kda_gate(f, A_log, dt_bias, lower_bound)
    if lower_bound is None:
        ref = naive_kda_gate(f, A_log, dt_bias)
    else:
        ref = naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=lower_bound)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    assert (ours <= 0).all()


def test_recurrent_matches_fla_naive():
    q, k, v, g, beta, S0, _ = _inputs(40, 2, 16, 8)
    o, S = kda_recurrent(q, k, v, g, beta, initial_state=S0)
    o_ref, S_ref = naive_recurrent_kda(q[None], k[None], v[None], g[None], beta[None], initial_state=S0[None], output_final_state=True)
    torch.testing.assert_close(o, o_ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,chunk", [(1, 64), (63, 64), (64, 64), (65, 64), (200, 64), (37, 8)])
def test_chunked_equals_fp64_recurrence(T, chunk):
    q, k, v, g, beta, S0, _ = _inputs(T, 3, 16, 12, seed=T)
    o64, S64 = kda_recurrent(q, k, v, g, beta, initial_state=S0, acc_dtype=torch.float64)
    o, S, _ = kda_chunk(q, k, v, g, beta, initial_state=S0, chunk_size=chunk)
    torch.testing.assert_close(o.double(), o64.double(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S.double(), S64, rtol=1e-4, atol=1e-4)


def test_chunk_checkpoints_are_exact_prefix_states():
    q, k, v, g, beta, S0, _ = _inputs(150, 2, 16, 8, seed=7)
    _, _, states = kda_chunk(q, k, v, g, beta, initial_state=S0, checkpoints=[1, 64, 100, 150])
    for p in (1, 64, 100, 150):
        _, S_p = kda_recurrent(q[:p], k[:p], v[:p], g[:p], beta[:p], initial_state=S0, acc_dtype=torch.float64)
        torch.testing.assert_close(states[p].double(), S_p, rtol=1e-4, atol=1e-4)


def test_split_prefill_resumes_exactly():
    """Prefill in two calls (state handed over) equals one call: the resume contract of the cache."""
    q, k, v, g, beta, _, _ = _inputs(130, 2, 16, 8, seed=3)
    o_full, S_full, _ = kda_chunk(q, k, v, g, beta)
    o1, S1, _ = kda_chunk(q[:70], k[:70], v[:70], g[:70], beta[:70])
    o2, S2, _ = kda_chunk(q[70:], k[70:], v[70:], g[70:], beta[70:], initial_state=S1)
    torch.testing.assert_close(torch.cat([o1, o2]), o_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S2, S_full, rtol=1e-5, atol=1e-5)


def test_shape_errors_name_the_argument():
    q, k, v, g, beta, S0, _ = _inputs(5, 2, 8, 4)
    with pytest.raises(ValueError, match="beta"):
        kda_recurrent(q, k, v, g, beta[:, :1])
    with pytest.raises(ValueError, match="initial_state"):
        kda_chunk(q, k, v, g, beta, initial_state=S0[:1])
    with pytest.raises(ValueError, match="checkpoints"):
        kda_chunk(q, k, v, g, beta, checkpoints=[6])
