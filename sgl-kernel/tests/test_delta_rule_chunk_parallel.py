"""Multi-kernel chunked prefill (chunk 64, ``triton_chunk_parallel.py``) and the single-kernel
fallback under the Triton interpreter, against fla-core's naive recurrences (outside
oracle) and an FP64 recurrence.

Sequences of 5, 64, 130 and 77 tokens cover a chunk shorter than 64, an exact chunk,
two chunks plus a tail; grouped value heads (HV = 2 H); checkpoints inside chunks
(16-token grid), on chunk borders and at ragged ends; a fresh start (no initial
state); a NaN-filled output buffer and NaN pool slots that no sequence names.
"""

import pytest
import torch
from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from fla.ops.kda.naive import naive_recurrent_kda

from sgl_hybrid_kernel.delta_rule.chunk import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.reference import gated_delta_recurrent
from sgl_hybrid_kernel.gdn import gdn_gate
from sgl_hybrid_kernel.kda import kda_gate
from sgl_hybrid_kernel.norm import l2_norm

NAN = float("nan")
LENS = [5, 64, 130, 77]
# (sequence, position, checkpoint slot): inside a chunk, chunk border, 2 chunks + 2, ragged end
CKPTS = [(0, 5, 0), (1, 64, 1), (2, 16, 2), (2, 80, 3), (2, 128, 4), (2, 130, 5), (3, 48, 6)]


def _inputs(gen, gate, H, HV, K, V):
    N = sum(LENS)
    q, k = torch.randn(N, H, K, generator=gen), torch.randn(N, H, K, generator=gen)
    v = torch.randn(N, HV, V, generator=gen)
    f = torch.randn(N, HV, generator=gen) if gate == "gdn" else torch.randn(N, HV, K, generator=gen)
    b = torch.randn(N, HV, generator=gen)
    A = torch.rand(HV, generator=gen)
    dtb = torch.randn(HV if gate == "gdn" else HV * K, generator=gen)
    return q, k, v, f, b, A, dtb


@pytest.mark.parametrize("method", ["parallel", "sequential"])
@pytest.mark.parametrize("gate,lower_bound,layout", [("kda", -5.0, "kv"), ("kda", None, "vk"), ("gdn", None, "kv")])
def test_chunk_methods_match_fla_naive_and_fp64(method, gate, lower_bound, layout):
    gen = torch.Generator().manual_seed(11)
    H, HV, K, V = 1, 2, 16, 16
    q, k, v, f, b, A, dtb = _inputs(gen, gate, H, HV, K, V)
    cu = torch.tensor([0] + torch.tensor(LENS).cumsum(0).tolist())
    pool_kv = torch.randn(6, HV, K, V, generator=gen)
    pool_kv[0] = NAN  # named by no sequence
    idx, init = torch.tensor([2, 5, 1, 3]), torch.tensor([1, 1, 0, 1])
    pool = pool_kv.clone() if layout == "kv" else pool_kv.transpose(-1, -2).contiguous()
    ck = torch.full((7, HV, K, V), NAN)
    ck = ck if layout == "kv" else ck.transpose(-1, -2).contiguous()
    o = torch.full_like(v, NAN)
    gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, init, gate, lower_bound, state_layout=layout,
                             value_tile=8, checkpoints=CKPTS, checkpoint_pool=ck, out=o, method=method)
    final = pool if layout == "kv" else pool.transpose(-1, -2)
    ckv = ck if layout == "kv" else ck.transpose(-1, -2)
    assert not o.isnan().any() and final[0].isnan().all() and final[4].equal(pool_kv[4])
    for i, s in enumerate(idx.tolist()):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        g = kda_gate(f[sl], A, dtb, lower_bound) if gate == "kda" else gdn_gate(f[sl], A, dtb)
        qn, kn = l2_norm(q[sl]).repeat_interleave(HV // H, 1), l2_norm(k[sl]).repeat_interleave(HV // H, 1)
        s0 = pool_kv[s] if init[i] else torch.zeros(HV, K, V)
        if gate == "kda":
            ro, rS = naive_recurrent_kda(qn[None], kn[None], v[sl][None], g[None], torch.sigmoid(b[sl])[None],
                                         initial_state=s0[None], output_final_state=True)
        else:
            ro, rS = naive_recurrent_gated_delta_rule(qn[None], kn[None], v[sl][None], torch.sigmoid(b[sl])[None], g[None],
                                                      initial_state=s0[None], output_final_state=True)
        torch.testing.assert_close(o[sl], ro[0].to(o.dtype), rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(final[s], rS[0].to(o.dtype), rtol=2e-5, atol=2e-5)
        want = [(p, d) for (seq, p, d) in CKPTS if seq == i]
        _, _, saved = gated_delta_recurrent(qn, kn, v[sl], g, torch.sigmoid(b[sl]), initial_state=s0,
                                            acc_dtype=torch.float64, save_positions=[p for p, _ in want])
        for (_, d), ref in zip(want, saved):
            torch.testing.assert_close(ckv[d].double(), ref, rtol=2e-5, atol=2e-5)


def test_parallel_long_sequence_fp64_bound_and_bad_method():
    """512 tokens (8 chunks of 64), unbounded KDA gate: relative error vs FP64 below 1e-5."""
    gen = torch.Generator().manual_seed(12)
    T, H, K, V = 512, 1, 16, 16
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v, f, b = torch.randn(T, H, V, generator=gen), torch.randn(T, H, K, generator=gen), torch.randn(T, H, generator=gen)
    A, dtb = torch.rand(H, generator=gen), torch.randn(H * K, generator=gen)
    pool = torch.zeros(1, H, K, V)
    o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, torch.tensor([0, T]), pool, torch.tensor([0]), gate="kda",
                                 value_tile=16, method="parallel")
    ro, rS, _ = gated_delta_recurrent(l2_norm(q), l2_norm(k), v, kda_gate(f, A, dtb), torch.sigmoid(b), acc_dtype=torch.float64)
    rel = lambda a, r: float((a.double() - r).norm() / r.norm())  # noqa: E731
    assert rel(o, ro) < 1e-5 and rel(pool[0], rS) < 1e-5
    with pytest.raises(ValueError, match="method"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, torch.tensor([0, T]), pool, torch.tensor([0]), method="fast")
