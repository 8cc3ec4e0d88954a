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
import triton
import triton.language as tl
from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from fla.ops.kda.naive import naive_recurrent_kda

from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides
from sgl_hybrid_kernel.delta_rule.chunk import rules as chunk_rules
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk import _tril_inverse_16
from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk_parallel import _tf32_split, _tril_inverse_16_x3
from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, gdn_gate, kda_gate
from sgl_hybrid_kernel.norm import l2_norm
from test_delta_rule_triton import _batch

NAN = float("nan")
LENS = [5, 64, 130, 77]
# (sequence, position, checkpoint slot): inside a chunk, chunk border, 2 chunks + 2, ragged end
CKPTS = [(0, 5, 0), (1, 64, 1), (2, 16, 2), (2, 80, 3), (2, 128, 4), (2, 130, 5), (3, 48, 6)]


def _inputs(gen, gate, H, HV, K, V):
    """The packed ``LENS`` tokens, drawn as ``test_delta_rule_triton._batch`` draws a batch."""
    return _batch(gen, 1, sum(LENS), H, HV, K, V, gate)


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
    gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, init, gate, lower_bound, state_layout=layout, checkpoints=CKPTS, checkpoint_pool=ck, out=o,
                             plan=ChunkOverrides(value_tile=8, method=method))
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
                                 plan=ChunkOverrides(value_tile=16, method="parallel"))
    ro, rS, _ = gated_delta_recurrent(l2_norm(q), l2_norm(k), v, kda_gate(f, A, dtb), torch.sigmoid(b), acc_dtype=torch.float64)
    rel = lambda a, r: float((a.double() - r).norm() / r.norm())  # noqa: E731
    assert rel(o, ro) < 1e-5 and rel(pool[0], rS) < 1e-5
    with pytest.raises(ValueError, match="method"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, torch.tensor([0, T]), pool, torch.tensor([0]),
                                 plan=ChunkOverrides(method="fast"))


@pytest.mark.parametrize("early,stages,x3,intra,okd", [(True, 1, False, "split_inv", 16), (False, 2, True, "split", 128),
                                                       (False, 1, True, "fused", 32), (True, 3, True, "stacked", 32), (False, 2, True, "stacked_a", 16),
                                                       (True, 2, True, "stacked_bf16qk", 16), (True, 3, True, "stacked_rowspec", 32)])
@pytest.mark.parametrize("gate,lower_bound", [("kda", -5.0), ("kda", None), ("gdn", None)])
def test_parallel_key_blocks_and_value_blocks_match_fla_naive(gate, lower_bound, early, stages, x3, intra, okd):
    """K = V = 64 with 16-channel key blocks (the state held as four blocks S0..S3, four gate
    cumsum programs, four w / kg / u blocks) and 8- / 16-column state tiles, as the CDNA / sm_90
    launch tables split the 128-wide heads (issue 9), with the state pass's loads issued before
    or after its stores and its chunk loop pipelined or not, and A's products as FP32 or as 3xTF32
    with TF32 allowed (the sm_90 table; exact in the interpreter, the H200 bound is in
    bench_delta_rule_chunk.py), and the in-chunk step fused or split into per-16-row-block ``A``
    programs + a solve launch (with or without a separate 16x16-block inverse launch; the ``A``
    programs also in the stacked form, ``intra_a_stacked``, with and without the diagonal inverses
    computed there, ``intra_diag_inv``: bounded KDA gate and GDN, the unbounded gate keeps the
    plain form; ``stacked_bf16qk``: q / k given as BF16, which for GDN takes the single exact TF32
    product instead of 3xTF32; ``stacked_rowspec``: one code path per row block, column factors
    ``e^{G_r - G_s}`` in one exponential, the inverse's merges and (with 3xTF32) the diagonal inverses as chained 3xTF32,
    as the sm_90 table), and the output
    step's ``(q e^G) h_c`` over key blocks of 16 / 32 (norm factor, scale and GDN decay applied to
    the accumulated block) or in one piece: same results as fla's naive recurrences, checkpoints
    included."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import gated_delta_chunk_parallel
    from sgl_hybrid_kernel.delta_rule.chunk.rules import ChunkLaunch
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE

    gen = torch.Generator().manual_seed(13)
    lens, H, HV, K, V = [70, 33], 1, 2, 64, 64
    N = sum(lens)
    q, k, v = torch.randn(N, H, K, generator=gen), torch.randn(N, H, K, generator=gen), torch.randn(N, HV, V, generator=gen)
    f = torch.randn(N, HV, generator=gen) if gate == "gdn" else torch.randn(N, HV, K, generator=gen)
    b, A = torch.randn(N, HV, generator=gen), torch.rand(HV, generator=gen)
    dtb = torch.randn(HV if gate == "gdn" else HV * K, generator=gen)
    cu = torch.tensor([0, lens[0], N])
    pool = torch.randn(2, HV, K, V, generator=gen)
    init = pool.clone()
    ck = torch.full((2, HV, K, V), NAN)
    qk16 = intra == "stacked_bf16qk"
    q, k = (q.bfloat16(), k.bfloat16()) if qk16 else (q, k)
    launch = ChunkLaunch("test", cumsum_bk=16, intra_kd=16, intra_kb=4, intra_bv=16, state_kd=16, state_bv=16,
                         state_bv_ckpt=8, value_tile=16, state_early=early, state_stages=stages,
                         intra_precision="tf32x3" if x3 else "ieee", intra_split=intra != "fused",
                         intra_inv=intra in ("split_inv", "stacked", "stacked_rowspec"), intra_a_kd=16, output_kd=okd, output_stages=2,
                         intra_a_stacked=intra.startswith("stacked"), intra_diag_inv=intra in ("stacked", "stacked_rowspec"),
                         intra_a_rowspec=intra == "stacked_rowspec", intra_a_direct=intra == "stacked_rowspec",
                         intra_inv_chain=intra == "stacked_rowspec", intra_diag_inv_x3=intra == "stacked_rowspec",
                         cumsum_row_loop=intra in ("stacked_rowspec", "split"), cumsum_row_bk=16,
                         intra_a_join=intra in ("stacked_rowspec", "stacked_bf16qk"),
                         intra_inv_stream=1 if intra == "stacked_rowspec" and lower_bound is None else 2)
    kind = {"gdn": GATE_GDN, "kda": GATE_KDA if lower_bound is None else GATE_KDA_SAFE}[gate]
    o = gated_delta_chunk_parallel(q, k, v, f, b, A, dtb, cu, pool, torch.tensor([1, 0]), torch.tensor([1, 0], dtype=torch.int32),
                                   kind, lower_bound, K ** -0.5, True, "kv", [(0, 48, 0), (1, 33, 1)], ck, lens,
                                   launch=launch, tf32=x3)
    q, k = q.float(), k.float()
    for i, (s, n0) in enumerate(zip([1, 0], [0, lens[0]])):
        sl = slice(n0, n0 + lens[i])
        g = kda_gate(f[sl], A, dtb, lower_bound) if gate == "kda" else gdn_gate(f[sl], A, dtb)
        qn, kn = l2_norm(q[sl]).repeat_interleave(HV // H, 1), l2_norm(k[sl]).repeat_interleave(HV // H, 1)
        s0 = init[s] if i == 0 else torch.zeros(HV, K, V)
        if gate == "kda":
            ro, rS = naive_recurrent_kda(qn[None], kn[None], v[sl][None], g[None], torch.sigmoid(b[sl])[None],
                                         initial_state=s0[None], output_final_state=True)
        else:
            ro, rS = naive_recurrent_gated_delta_rule(qn[None], kn[None], v[sl][None], torch.sigmoid(b[sl])[None], g[None],
                                                      initial_state=s0[None], output_final_state=True)
        torch.testing.assert_close(o[sl], ro[0], rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(pool[s], rS[0], rtol=2e-5, atol=2e-5)
        pos = 48 if i == 0 else 33
        _, _, saved = gated_delta_recurrent(qn, kn, v[sl], g, torch.sigmoid(b[sl]), initial_state=s0,
                                            acc_dtype=torch.float64, save_positions=[pos])
        torch.testing.assert_close(ck[i].double(), saved[0], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("flag", ["state_lowp", "output_lowp", "intra_solve_lowp"])
def test_bf16_rounded_products_stay_within_the_bf16_bound(flag):
    """``state_lowp`` / ``output_lowp`` / ``intra_solve_lowp`` (the sm_90 table, issue 4): with BF16
    scratch the state pass multiplies the state and ``v_new`` rounded to BF16 (as fla's state pass),
    the output step ``q e^G`` and ``Aqk`` (as fla's output step), the w / u step the finished inverse
    and its right operands (as fla's recompute of w / u); on the GPU one BF16 tensor-core product each, here
    the interpreter's FP32 product of the same rounded operands. 100 tokens, bounded KDA gate:
    output and final state within 1.5e-2 relative of the FP64 recurrence (measured 5.0e-3 / 8.0e-3
    with state_lowp, 7.9e-3 / 5.0e-3 with output_lowp, 7.6e-3 / 8.1e-3 with intra_solve_lowp;
    5.0e-3 / 5.0e-3 without any rounding), and the flag changes what it rounds
    (state_lowp, intra_solve_lowp: the final state; output_lowp: the output, not the state)."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import gated_delta_chunk_parallel
    from sgl_hybrid_kernel.delta_rule.chunk.rules import ChunkLaunch
    from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA_SAFE

    gen = torch.Generator().manual_seed(5)
    T, H, K, V = 100, 1, 16, 16
    q, k, v = (torch.randn(T, H, d, generator=gen) for d in (K, K, V))
    f, b = torch.randn(T, H, K, generator=gen), torch.randn(T, H, generator=gen)
    A, dtb = torch.rand(H, generator=gen), torch.randn(H * K, generator=gen)
    ro, rS, _ = gated_delta_recurrent(l2_norm(q), l2_norm(k), v, kda_gate(f, A, dtb, -5.0), torch.sigmoid(b),
                                      acc_dtype=torch.float64)
    rel = lambda a, r: float((a.double() - r).norm() / r.norm())  # noqa: E731
    finals, outs = [], []
    for lowp in (True, False):
        pool = torch.zeros(1, H, K, V)
        launch = ChunkLaunch("t", intra_kd=16, state_kd=16, state_bv=16, value_tile=16, intra_split=True, intra_inv=True,
                             intra_a_kd=16, **{flag: lowp})
        o = gated_delta_chunk_parallel(q, k, v, f, b, A, dtb, torch.tensor([0, T]), pool, torch.tensor([0]),
                                       torch.tensor([0], dtype=torch.int32), GATE_KDA_SAFE, -5.0, K ** -0.5, True, "kv", [],
                                       None, [T], scratch_dtype=torch.bfloat16, launch=launch)
        assert rel(o, ro) < 1.5e-2 and rel(pool[0], rS) < 1.5e-2
        finals.append(pool[0].clone())
        outs.append(o.clone())
    assert not torch.equal(outs[0], outs[1])
    assert torch.equal(finals[0], finals[1]) == (flag == "output_lowp")


def test_bf16_inverse_rows_equal_the_rounding_the_wu_step_does(monkeypatch):
    """``intra_inv_lowp`` (the sm_90 table, issue 4): with ``intra_solve_lowp`` and BF16 scratch the
    w / u step rounds the finished inverse to BF16 before its products, so the inverse launch may
    store it as BF16 (a ``[N, HV, 64]`` BF16 buffer instead of over the FP32 ``A``): outputs and final
    state bit-identical to storing it as FP32, GDN and bounded KDA, and the BF16 buffer is really
    allocated; with FP32 scratch the flag changes nothing (no buffer)."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import gated_delta_chunk_parallel
    from sgl_hybrid_kernel.delta_rule.chunk.rules import ChunkLaunch
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE

    gen = torch.Generator().manual_seed(9)
    lens, H, HV, K, V = [90, 40], 1, 2, 16, 16
    N = sum(lens)
    q, k, v = torch.randn(N, H, K, generator=gen), torch.randn(N, H, K, generator=gen), torch.randn(N, HV, V, generator=gen)
    b, A = torch.randn(N, HV, generator=gen), torch.rand(HV, generator=gen)
    real_empty = torch.empty
    made = []

    def spy(*shape, **kw):
        t = real_empty(*shape, **kw)
        made.append((tuple(t.shape), t.dtype))
        return t

    monkeypatch.setattr(torch, "empty", spy)
    for kind, f, dtb, lb in ((GATE_KDA_SAFE, torch.randn(N, HV, K, generator=gen), torch.randn(HV * K, generator=gen), -5.0),
                             (GATE_GDN, torch.randn(N, HV, generator=gen), torch.randn(HV, generator=gen), None)):
        for sd in (torch.bfloat16, torch.float32):
            res = []
            for inv_lowp in (False, True):
                made.clear()
                pool = torch.ones(2, HV, K, V) * 0.1
                launch = ChunkLaunch("t", intra_kd=16, state_kd=16, state_bv=16, value_tile=16, intra_split=True,
                                     intra_inv=True, intra_a_kd=16, intra_solve_lowp=True, intra_inv_lowp=inv_lowp)
                o = gated_delta_chunk_parallel(q, k, v, f, b, A, dtb, torch.tensor([0, lens[0], N]), pool,
                                               torch.tensor([0, 1]), torch.tensor([1, 1], dtype=torch.int32), kind, lb,
                                               K ** -0.5, True, "kv", [], None, lens, scratch_dtype=sd, launch=launch)
                res.append((o.clone(), pool.clone()))
                assert ((N, HV, 64), torch.bfloat16) in made if (inv_lowp and sd == torch.bfloat16) else \
                    ((N, HV, 64), torch.bfloat16) not in made
            assert not res[0][0].isnan().any()
            assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


def test_state_pass_takes_wider_value_tiles_when_the_batch_fills_the_sms(monkeypatch):
    """``state_bv_costs`` (the sm_90 table, issue 4): without checkpoints and with BF16 scratch the
    state pass takes the value tile whose waves x step time is least (one program per SM). Kimi K3 TP8
    on 132 SMs: B=1 keeps 16 columns (96 programs, one wave), B=2 takes 32, B=4 64 and B=8 32 (what
    the H200 measured fastest with the 4-stage pass); no costs: ``state_bv``. End to end in the
    interpreter, a fake 2-SM sm_90 part makes 3 sequences x 2 heads (V = 64) take 64 columns: outputs and
    final states within the BF16 bound of the FP64 recurrence and within 1e-2 of the 16-column pass; FP32
    scratch and checkpoints keep 16 columns. The wrapper asks for the 16-bit state-pass stages
    (``lowp_scratch``) exactly when the scratch is BF16."""
    import dataclasses

    from sgl_hybrid_kernel.delta_rule.chunk import parallel as cp
    from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA_SAFE
    from sgl_hybrid_kernel.platform import Target

    table = chunk_rules.CHUNK_LAUNCH[("sm90", 132)]
    assert [chunk_rules.pick_state_tile(table, 12 * b, 128, 132) for b in (1, 2, 4, 8)] == [16, 32, 64, 32]
    assert chunk_rules.pick_state_tile(dataclasses.replace(table, state_bv_costs=()), 96, 128, 132) == table.state_bv == 16
    assert chunk_rules.pick_state_tile(table, 96, 128, 0) == 16  # no compute-unit count (CPU)

    gen = torch.Generator().manual_seed(21)
    lens, H, K, V = [70, 40, 20], 2, 64, 64
    N = sum(lens)
    q, k, v = (torch.randn(N, H, d, generator=gen) for d in (K, K, V))
    f, b = torch.randn(N, H, K, generator=gen), torch.randn(N, H, generator=gen)
    A, dtb = torch.rand(H, generator=gen), torch.randn(H * K, generator=gen)
    cu = torch.tensor([0, 70, 110, N])
    init = torch.randn(3, H, K, V, generator=gen) * 0.1
    tiles, real = [], cp.launch_params
    monkeypatch.setattr(Target, "of", staticmethod(lambda d: Target("cuda", "sm90", 2, interpreter=True)))
    monkeypatch.setattr(cp, "launch_params", lambda *a, **kw: tiles.append((kw.get("state_tile"), kw.get("lowp_scratch"))) or real(*a, **kw))
    runs = {}
    for name, launch, sd, ckpts in (("wide", table, torch.bfloat16, []),
                                    ("narrow", dataclasses.replace(table, state_bv_costs=()), torch.bfloat16, []),
                                    ("fp32", table, torch.float32, []), ("ckpt", table, torch.bfloat16, [(0, 64, 0)])):
        pool = init.clone()
        ck = torch.zeros(1, H, K, V)
        o = cp.gated_delta_chunk_parallel(q, k, v, f, b, A, dtb, cu, pool, torch.arange(3), torch.ones(3, dtype=torch.int32),
                                          GATE_KDA_SAFE, -5.0, K ** -0.5, True, "kv", ckpts, ck if ckpts else None, lens,
                                          scratch_dtype=sd, launch=launch, tf32=True)
        runs[name] = (o, pool)
    assert tiles == [(64, True), (None, True), (None, False), (None, True)]
    rel = lambda a, r: float((a.double() - r.double()).norm() / r.double().norm())  # noqa: E731
    for i, n0 in enumerate((0, 70, 110)):
        sl = slice(n0, n0 + lens[i])
        ro, rS = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], kda_gate(f[sl], A, dtb, -5.0),
                                       torch.sigmoid(b[sl]), initial_state=init[i], acc_dtype=torch.float64)[:2]
        assert rel(runs["wide"][0][sl], ro) < 1.5e-2 and rel(runs["wide"][1][i], rS) < 1.5e-2
        assert rel(runs["wide"][0][sl], runs["narrow"][0][sl]) < 1e-2 and rel(runs["wide"][1][i], runs["narrow"][1][i]) < 1e-2


def test_sm90_state_pass_stages_follow_the_scratch_and_the_stacked_a_programs_run_on_one_warp():
    """sm_90 table (issue 4, sixth round): the plain state pass runs 4 pipelining stages with 16-bit scratch
    and no checkpoints (H200, B=1 T=64K: 951 -> 788 us) and keeps 3 with FP32 scratch (4 stages of FP32
    tiles need 292,352 B of shared memory, over sm_90's 232,448) and with checkpoints; the stacked ``A``
    programs (bounded KDA gate, GDN) run on one warp while the unbounded gate's ``chunk_intra_a_kernel``
    keeps ``intra_a_warps`` (on one warp it spills on sm_90)."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import launch_params
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH
    from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk_parallel import chunk_intra_a_kernel, chunk_intra_arow_kernel
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE

    sm90 = CHUNK_LAUNCH[("sm90", 132)]
    assert (sm90.state_stages, sm90.state_stages_lowp, sm90.intra_arow_warps, sm90.intra_a_warps) == (3, 4, 1, 2)
    kda = (sm90, GATE_KDA_SAFE, 12, 12, 128, 128, -5.0, True, True)
    stages = {(lowp, ckpt): launch_params(*kda, ckpt, lowp_scratch=lowp)["state"][1]["STAGES"]
              for lowp in (False, True) for ckpt in (False, True)}
    assert stages == {(False, False): 3, (False, True): 3, (True, False): 4, (True, True): 3}
    for kind, H, HV, lb, kern, warps in ((GATE_KDA_SAFE, 12, 12, -5.0, chunk_intra_arow_kernel, 1),
                                         (GATE_GDN, 16, 48, 0.0, chunk_intra_arow_kernel, 1),
                                         (GATE_KDA, 12, 12, 0.0, chunk_intra_a_kernel, 2)):
        part = launch_params(sm90, kind, H, HV, 128, 128, lb, True, True, False)["intra_a"]
        assert part[0] is kern and part[2] == warps


def test_cuda_tables_never_run_the_state_pass_on_one_pipelining_stage():
    """On the H200 (Triton 3.6) the state pass compiled with one pipelining stage gives wrong outputs and
    states and reads shared memory out of bounds at its ``tl.dot`` (compute-sanitizer), fused or not
    (``benchmark/kernels/check_state_stages.py``, ``2026-12-02-h200-state_stages_check.txt``). So no CUDA
    entry of the table may launch it that way: every state pass ``launch_params`` builds for an ``sm*`` arch
    (KDA and GDN, FP32 / 16-bit scratch, with / without checkpoints, the fused output where allowed) has
    ``STAGES >= 2``; a single-stage table would fail here."""
    import dataclasses

    from sgl_hybrid_kernel.delta_rule.chunk.parallel import launch_params
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH, fused_output_allowed
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE

    def stages(launch):
        out = []
        for kind, H, HV in ((GATE_KDA_SAFE, 12, 12), (GATE_GDN, 16, 48)):
            for lowp in (False, True):
                for ckpt in (False, True):
                    for fuse in (False, True):
                        if fuse and not fused_output_allowed(launch, kind, lowp, ckpt, -5.0, True):
                            continue
                        p = launch_params(launch, kind, H, HV, 128, 128, -5.0, True, True, ckpt, lowp_scratch=lowp,
                                          fuse_output=fuse)
                        out.append(p["state"][1]["STAGES"])
        return out

    cuda = [launch for (arch, _), launch in CHUNK_LAUNCH.items() if arch.startswith("sm")]
    assert cuda and all(min(stages(launch)) >= 2 for launch in cuda)
    assert min(stages(dataclasses.replace(cuda[0], state_stages_fused=1))) == 1  # the check sees a 1-stage pass


def test_rocm_dispatch_offers_the_chunk64_form_with_the_arch_table(monkeypatch):
    """On ROCm (device reported as such) the prefill dispatch picks Triton with the gfx950 launch
    entry and logs it; ``method="auto"`` runs the chunk-64 form without TF32 and the sequential
    kernel (not compile-gated on CDNA) is refused."""
    import sgl_hybrid_kernel.delta_rule.chunk.wrapper as chunk_mod
    import sgl_hybrid_kernel.delta_rule.chunk.parallel as cp
    import sgl_hybrid_kernel.delta_rule.dispatch as disp
    from sgl_hybrid_kernel.dispatch import chosen_paths
    from sgl_hybrid_kernel.platform import DevicePlatform, Target

    monkeypatch.setattr(disp, "device_kind", lambda t: "rocm")
    monkeypatch.setattr(Target, "of", staticmethod(lambda d: Target.from_platform(DevicePlatform("rocm", "gfx950", 256, "MI355X"))))
    q, v, s = torch.zeros(2, 3, 128), torch.zeros(2, 3, 128), torch.zeros(1, 3, 128, 128)
    assert disp.choose_chunk(q, v, s) == "triton"
    choice = next(c for c in chosen_paths() if c.op == "delta_rule_prefill")
    assert choice.impl == "triton:chunk64:gfx950x256" and "untimed" in choice.reason
    calls = []
    monkeypatch.setattr(chunk_mod, "gated_delta_chunk_parallel", lambda *a, **kw: calls.append(kw) or "ran")
    args = (q, q, v, torch.zeros(2, 3, 128), torch.zeros(2, 3), torch.zeros(3), torch.zeros(3 * 128), torch.tensor([0, 2]), s,
            torch.tensor([0]))
    assert gated_delta_chunk_triton(*args, plan=ChunkOverrides(tf32=True)) == "ran" and calls[0]["plan"].tf32 is False
    with pytest.raises(ValueError, match="method"):
        gated_delta_chunk_triton(*args, plan=ChunkOverrides(method="sequential"))


def test_cuda_bf16_prefill_takes_the_gated_chunk64_form_with_tf32(monkeypatch):
    """On CUDA, 16-bit activations (what serving passes) go to the chunk-64 form with TF32 products —
    the configuration the compile gate proves spill-free on sm_90 — and the dispatcher says so; FP32
    activations keep the sequential kernel (FP32 products)."""
    import sgl_hybrid_kernel.delta_rule.chunk.wrapper as chunk_mod
    import sgl_hybrid_kernel.delta_rule.chunk.parallel as cp
    import sgl_hybrid_kernel.delta_rule.dispatch as disp
    from sgl_hybrid_kernel.dispatch import chosen_paths
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CUMSUM_ROW_LOOP_MIN_TRITON
    from sgl_hybrid_kernel.platform import DevicePlatform, Target

    monkeypatch.setattr(disp, "device_kind", lambda t: "cuda")
    monkeypatch.setattr(Target, "of", staticmethod(lambda d: Target.from_platform(DevicePlatform("cuda", "sm90", 132, "H200"))))
    q, v, s = torch.zeros(2, 3, 128, dtype=torch.bfloat16), torch.zeros(2, 3, 128, dtype=torch.bfloat16), torch.zeros(1, 3, 128, 128)
    assert disp.choose_chunk(q, v, s) == "triton"
    choice = next(c for c in chosen_paths() if c.op == "delta_rule_prefill")
    assert choice.impl == "triton:chunk64:sm90x132" and "TF32" in choice.reason
    assert "state pass 16/32/64 value columns by batch" in choice.reason
    assert "GDN: the state pass forms the output" in choice.reason
    assert "KDA: the state pass forms the output at 32 value columns" in choice.reason
    assert "Aqk one TF32 product" in choice.reason
    assert "gate cumsum: row loop (Triton 3." in choice.reason or "gate cumsum: tl.cumsum (Triton 3." in choice.reason
    assert ("row loop (Triton" in choice.reason) == (cp.TRITON_VERSION >= CUMSUM_ROW_LOOP_MIN_TRITON)
    calls = []
    monkeypatch.setattr(chunk_mod, "gated_delta_chunk_parallel", lambda *a, **kw: calls.append(kw) or "ran")
    args = (q, q, v, torch.zeros(2, 3, 128, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(3),
            torch.zeros(3 * 128), torch.tensor([0, 2]), s, torch.tensor([0]))
    assert gated_delta_chunk_triton(*args) == "ran" and calls[0]["plan"].tf32 is True
    assert (gated_delta_chunk_triton(*args, plan=ChunkOverrides(tf32=False, method="parallel")) == "ran"
            and calls[1]["plan"].tf32 is False)
    monkeypatch.undo()
    disp.choose_chunk(q.float(), v.float(), s)  # leave the process-wide record as the CPU has it


def test_host_lengths_and_cached_index_tables_give_the_same_prefill():
    """Issue 4 (host overhead): ``seq_lens_cpu`` spares the wrapper its read of ``cu_seqlens``, and
    the chunk / group index tables are built once per offsets (``chunk.parallel.seq_plan``) and
    reused; the results are the same either way (an empty sequence between two others)."""
    from sgl_hybrid_kernel.delta_rule.chunk.seq_plan import seq_plan

    gen = torch.Generator().manual_seed(5)
    H, HV, K, V = 1, 1, 16, 16
    lens = [70, 0, 5]
    q, k, v, f, b, A, dtb = _batch(gen, 1, sum(lens), H, HV, K, V, "kda")
    cu = torch.tensor([0, 70, 70, 75])
    pool0, idx = torch.randn(3, HV, K, V, generator=gen), torch.tensor([2, 0, 1])
    outs = []
    for kw, over in ((dict(), {}), (dict(seq_lens_cpu=lens), {}), (dict(seq_lens_cpu=lens), dict(group_scan=True, group_chunks=1))):
        pool = pool0.clone()
        o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=-5.0, **kw,
                                     plan=ChunkOverrides(method="parallel", **over))
        outs.append((o, pool))
    assert outs[1][0].equal(outs[0][0]) and outs[1][1].equal(outs[0][1])  # the same launches: bit-identical
    torch.testing.assert_close(outs[2][0], outs[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[2][1], outs[0][1], rtol=1e-5, atol=1e-5)
    # the empty sequence keeps its slot's state (slot 0); the 70-token one moved its slot's (slot 2)
    assert outs[2][1][0].equal(pool0[0]) and (outs[2][1][2] - pool0[2]).abs().max() > 1e-2
    plan = seq_plan([0, 70, 70, 75], torch.device("cpu"))
    assert plan is seq_plan((0, 70, 70, 75), torch.device("cpu"))  # cached: no table built or copied again
    assert plan.NC == 3 and plan.cidx.tolist() == [[0, 0], [0, 1], [2, 0]] and plan.coff.tolist() == [0, 2, 2]
    assert plan.extra[("group_scan", 1)].gcu == [0, 64, 70, 70, 75]  # group token bounds, cached on the plan
    with pytest.raises(ValueError, match="seq_lens_cpu"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool0.clone(), idx, gate="kda",
                                 seq_lens_cpu=[70, 5], plan=ChunkOverrides(method="parallel"))
    with pytest.raises(ValueError, match="seq_lens_cpu"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool0.clone(), idx, gate="kda",
                                 seq_lens_cpu=[70, 0, 500], plan=ChunkOverrides(method="parallel"))
    with pytest.raises(ValueError, match="cu_seqlens"):
        seq_plan([0, 70, 60], torch.device("cpu"))


def test_fast_exp_only_in_compiled_cuda_launches():
    """``fast_exp`` (inline PTX ``ex2.approx.ftz``) reaches the stacked A kernel only where the sm_90 table
    asks for it and the kernel is compiled, never under the CPU interpreter (which cannot run inline
    assembly) nor in the CDNA entries."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import launch_params
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH
    from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA_SAFE

    sm90 = CHUNK_LAUNCH[("sm90", 132)]
    args = (GATE_KDA_SAFE, 12, 12, 128, 128, -5.0, True, True, False)
    assert sm90.fast_exp and launch_params(sm90, *args)["intra_a"][1]["FAST_EXP"] is True
    assert launch_params(sm90, *args, interpret=True)["intra_a"][1]["FAST_EXP"] is False
    assert not any(launch.fast_exp for (arch, _), launch in CHUNK_LAUNCH.items() if arch != "sm90")


@triton.jit
def _split_kernel(x_ptr, hi_ptr, lo_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    hi, lo = _tf32_split(tl.load(x_ptr + o))
    tl.store(hi_ptr + o, hi)
    tl.store(lo_ptr + o, lo)


@triton.jit
def _tril_inverse_kernel(a_ptr, o_ptr, X3: tl.constexpr):
    r = tl.arange(0, 16)
    offs = r[:, None] * 16 + r[None, :]
    A = tl.load(a_ptr + offs)
    tl.store(o_ptr + offs, _tril_inverse_16_x3(A, 16) if X3 else _tril_inverse_16(A, 16))


@pytest.mark.parametrize("x3", [False, True])
def test_diagonal_block_inverse_matches_fp64(x3):
    """``(I + A)^-1`` of a strictly lower 16x16 block as the ``A`` programs store it (``intra_diag_inv``):
    the FP32 FMA repeated squaring and its 3xTF32 form (``intra_diag_inv_x3``, the sm_90 table; FP32
    products without TF32 rounding in the interpreter, so this checks the algebra of
    ``(I - A)(I + A^2)(I + A^4)(I + A^8)`` built as ``X + X P``; the TF32 rounding is bounded on the H200 by ``bench_delta_rule_chunk.py``) against
    ``torch.linalg.inv`` in FP64, for entries of the size ``beta k_i . k_j e^{..}`` takes (|.| <= 1): one
    block of either sign and one of negative entries, whose inverse grows past 100."""
    gen = torch.Generator().manual_seed(5)
    for lo, hi in ((-0.3, 0.3), (-1.0, 0.0)):
        A = torch.tril(lo + (hi - lo) * torch.rand(16, 16, generator=gen), diagonal=-1)
        out = torch.full((16, 16), NAN)
        _tril_inverse_kernel[(1,)](A, out, X3=x3)
        ref = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + A.double())
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-6
        assert torch.equal(torch.triu(out, diagonal=1), torch.zeros(16, 16))
    assert float(ref.abs().max()) > 100.0  # the second block's inverse is far from I - A


def test_sm90_a_programs_take_the_3xtf32_diagonal_inverse_only_with_tf32x3_products():
    """``launch_params`` passes ``DIAG_INV=2`` (3xTF32 inverses) to the stacked ``A`` programs of the sm_90
    table with TF32 products, plain ``True`` (FP32 FMA) without TF32, and the inverse launch only reads them."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import launch_params
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE

    launch = CHUNK_LAUNCH[("sm90", 132)]
    assert launch.intra_diag_inv and launch.intra_diag_inv_x3
    for kind, H, HV in ((GATE_KDA_SAFE, 12, 12), (GATE_GDN, 16, 48)):
        on = launch_params(launch, kind, H, HV, 128, 128, -5.0, True, True, False)
        off = launch_params(launch, kind, H, HV, 128, 128, -5.0, True, False, False)
        assert on["intra_a"][1]["DIAG_INV"] == 2 and on["intra_inv"][1]["DIAG_INV"] is True
        assert off["intra_a"][1]["DIAG_INV"] is True and off["intra_a"][1]["APREC"] == "ieee"


def test_sm90_cumsum_row_loop_follows_the_triton_version_and_the_inverse_streams_on_one_warp(monkeypatch):
    """The sm_90 table's gate cumsum runs the row loop only under Triton >= 3.7 (3.6's ``tl.cumsum`` is the
    faster form there, 3.8's the slower: eighteenth round), and its inverse launch (diagonal inverses from
    the ``A`` programs, chained 3xTF32 merges) stores each block once formed on one warp; without TF32
    products (no chained merges) it keeps the plain form."""
    import sgl_hybrid_kernel.delta_rule.chunk.parallel as cp
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE

    launch = chunk_rules.CHUNK_LAUNCH[("sm90", 132)]
    try:
        # (version, kind): row loop, channels per program, warps (tl.cumsum keeps the table's 64 / 4)
        for version, kind, want in (((3, 6), GATE_KDA_SAFE, (False, 64, 4)), ((3, 8), GATE_KDA_SAFE, (True, 128, 2)),
                                    ((3, 8), GATE_GDN, (False, 64, 4))):
            monkeypatch.setattr(cp, "TRITON_VERSION", version)
            cp.launch_params.cache_clear()
            p = cp.launch_params(launch, kind, 12, 12, 128, 128, -5.0, True, True, False)
            assert (p["cumsum"][1]["ROW_LOOP"], p["cumsum"][1]["BK"], p["cumsum"][2]) == want
    finally:
        cp.launch_params.cache_clear()
        monkeypatch.undo()
    for kind, H, HV in ((GATE_KDA_SAFE, 12, 12), (GATE_GDN, 16, 48)):
        on = cp.launch_params(launch, kind, H, HV, 128, 128, -5.0, True, True, False)
        off = cp.launch_params(launch, kind, H, HV, 128, 128, -5.0, True, False, False)
        assert on["intra_inv"][1]["STREAM"] == 1 and on["intra_inv"][2] == 1
        assert off["intra_inv"][1]["STREAM"] == 0


def test_tf32_split_gives_an_exact_tf32_high_part():
    """The stacked A build splits each FP32 operand once into ``hi + lo`` for its chained 3xTF32
    products: ``hi`` must have the 13 low mantissa bits clear (so a TF32 tensor-core product of it is
    exact) and ``hi + lo`` must give the operand back exactly; ``lo`` is then within ``2^-10 |x|``."""
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(60, generator=gen) * 10.0 ** torch.randint(-30, 30, (60,), generator=gen),
                   torch.tensor([0.0, -0.0, 1.0, -3.0])])
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    _split_kernel[(1,)](x, hi, lo, N=64)
    assert (hi.view(torch.int32) & 8191 == 0).all()
    assert torch.equal(hi + lo, x)
    assert (lo.abs() <= x.abs() * 2.0 ** -10).all()
    assert (lo != 0).sum() > 50  # random FP32 values do use the low bits


def test_sm90_table_at_the_serving_head_size_matches_fp64():
    """The shipped sm_90 entry at K = V = 128 (Kimi K3 head size): its state pass holds the whole
    ``[128, 16]`` state as one key block (``state_kd=128``) and its checkpoint pass 64-row blocks,
    which the K = 64 tests above never reach. Two packed sequences (130 and 64 tokens, initial
    states from slots 1 / 0), a checkpoint at token 80, a NaN slot nobody names: outputs, final
    states and the checkpoint within 1e-5 of the FP64 recurrence, the NaN slot untouched."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import gated_delta_chunk_parallel
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH
    from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA_SAFE

    launch = CHUNK_LAUNCH[("sm90", 132)]
    assert launch.state_kd == 128 and launch.state_kd_ckpt == 64
    gen = torch.Generator().manual_seed(1)
    lens, H, K, V = [130, 64], 1, 128, 128
    N = sum(lens)
    q, k, v = (torch.randn(N, H, d, generator=gen) for d in (K, K, V))
    f, b = torch.randn(N, H, K, generator=gen), torch.randn(N, H, generator=gen)
    A, dtb = torch.rand(H, generator=gen), torch.randn(H * K, generator=gen)
    pool = torch.randn(3, H, K, V, generator=gen) * 0.1
    pool[2] = NAN
    init = pool.clone()
    ck = torch.full((1, H, K, V), NAN)
    o = gated_delta_chunk_parallel(q, k, v, f, b, A, dtb, torch.tensor([0, lens[0], N]), pool, torch.tensor([1, 0]),
                                   torch.tensor([1, 1], dtype=torch.int32), GATE_KDA_SAFE, -5.0, K ** -0.5, True, "kv",
                                   [(0, 80, 0)], ck, lens, launch=launch, tf32=True)
    rel = lambda a, r: float((a.double() - r).norm() / r.norm())  # noqa: E731
    for i, (s, n0) in enumerate(zip([1, 0], [0, lens[0]])):
        sl = slice(n0, n0 + lens[i])
        ro, rS, saved = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], kda_gate(f[sl], A, dtb, -5.0),
                                              torch.sigmoid(b[sl]), initial_state=init[s], acc_dtype=torch.float64,
                                              save_positions=[80] if i == 0 else [])
        assert rel(o[sl], ro) < 1e-5 and rel(pool[s], rS) < 1e-5
        if i == 0:
            assert rel(ck[0], saved[0]) < 1e-5
    assert pool[2].isnan().all()


def test_gdn_state_pass_with_fused_output_matches_the_separate_output_step(monkeypatch):
    """``fuse_output_gdn`` (issue 4): for GDN the stacked ``A`` programs also write q's row factor (norm x
    scale x ``e^G``) and the state pass forms ``o = rq (q h_c) + Aqk v_new`` from the state in its registers,
    so neither the chunk-start states nor ``v_new`` are written (no ``[NC, HV, K, V]`` buffer is allocated)
    and the output launch is skipped. BF16 scratch, two ragged sequences with initial states, GVA (2 value
    heads per q / k head), four state key blocks (K = 32, key block 8) and the sm_90 table (one key block):
    final states bit-identical to the separate output step (the state chain is the same), outputs within
    1e-3 relative of it (the same BF16 roundings in another summation order; dropping the ``Aqk v_new``
    term gives ~1) and within the BF16 bound (1.5e-2) of the FP64 recurrence; the NaN-prefilled output
    buffer is filled. KDA, checkpoints or an FP32 scratch with ``fuse_output=True`` raise ``ValueError``;
    :func:`use_fused_output` follows the table's ``fuse_output_gdn`` for GDN only."""
    import dataclasses

    from sgl_hybrid_kernel.delta_rule.chunk import parallel as cp
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE

    gen = torch.Generator().manual_seed(31)
    lens, H, HV, K, V = [150, 41], 1, 2, 32, 32
    N = sum(lens)
    q, k, v, f, b, A, dtb = _batch(gen, 1, N, H, HV, K, V, "gdn")
    init = torch.randn(2, HV, K, V, generator=gen) * 0.1
    cu = torch.tensor([0, lens[0], N])
    real_empty = torch.empty
    made = []

    def spy(*shape, **kw):
        t = real_empty(*shape, **kw)
        made.append(tuple(t.shape))
        return t

    monkeypatch.setattr(torch, "empty", spy)
    small = chunk_rules.ChunkLaunch("t", intra_kd=16, state_kd=8, state_bv=16, value_tile=16, intra_split=True, intra_inv=True,
                           intra_a_kd=16, intra_a_stacked=True, intra_solve_lowp=True, state_lowp=True, output_lowp=True)
    qe, ke = torch.repeat_interleave(l2_norm(q), HV // H, 1), torch.repeat_interleave(l2_norm(k), HV // H, 1)
    rel = lambda a, r: float((a.double() - r.double()).norm() / r.double().norm())  # noqa: E731

    def run(launch, fuse, kind=GATE_GDN, lb=None, ckpts=(), sd=torch.bfloat16, gate=f):
        pool = init.clone()
        out = torch.full((N, HV, V), NAN)
        o = cp.gated_delta_chunk_parallel(q, k, v, gate, b, A, dtb if kind == GATE_GDN else torch.randn(HV * K, generator=gen),
                                          cu, pool, torch.arange(2), torch.ones(2, dtype=torch.int32), kind, lb, K ** -0.5,
                                          True, "kv", list(ckpts), torch.zeros(1, HV, K, V) if ckpts else None, lens,
                                          scratch_dtype=sd, launch=launch, out=out, fuse_output=fuse)
        assert o is out and not o.isnan().any()
        return o, pool

    for launch in (small, chunk_rules.INTERPRETER_LAUNCH):
        res = {}
        for fuse in (False, True):
            made.clear()
            res[fuse] = run(launch, fuse)
            assert ((3 + 1, HV, K, V) in made) != fuse  # chunk-start states: 3 + 1 chunks
        assert torch.equal(res[False][1], res[True][1])
        assert rel(res[True][0], res[False][0]) < 1e-3
        for i, n0 in enumerate((0, lens[0])):
            sl = slice(n0, n0 + lens[i])
            ro = gated_delta_recurrent(qe[sl], ke[sl], v[sl], gdn_gate(f[sl], A, dtb), torch.sigmoid(b[sl]),
                                       initial_state=init[i], scale=K ** -0.5, acc_dtype=torch.float64)[0]
            assert rel(res[True][0][sl], ro) < 1.5e-2
    fkda = torch.randn(N, HV, K, generator=gen)
    for kw in (dict(kind=GATE_KDA_SAFE, lb=-5.0, gate=fkda), dict(ckpts=[(0, 64, 0)]), dict(sd=torch.float32)):
        with pytest.raises(ValueError, match="fuse_output"):
            run(small, True, **kw)
    table = chunk_rules.CHUNK_LAUNCH[("sm90", 132)]
    off = dataclasses.replace(table, fuse_output_gdn=False)
    assert [chunk_rules.use_fused_output(t, kind, True, False) for t in (table, off) for kind in (GATE_GDN, GATE_KDA_SAFE)] == \
        [table.fuse_output_gdn, False, False, False]
    assert not chunk_rules.use_fused_output(table, GATE_GDN, True, True) and not chunk_rules.use_fused_output(table, GATE_GDN, False, False)


def test_kda_unstacked_a_programs_and_fused_output_match_the_separate_steps(monkeypatch):
    """Twelfth round (issue 4). ``intra_aqk_tf32``: the KDA ``A`` programs take ``k`` and ``q`` as two
    operands (``A`` from three TF32 products, ``Aqk`` from one) instead of the stacked ``[k; q]``; under the
    interpreter (whose TF32 products are FP32) outputs and final states equal the stacked programs' to 1e-6
    relative (a swapped row block, column block or head would be ~1 off). ``fuse_output_kda_bv``: those
    programs also write ``q e^G`` (``[N, HV, K]``, scratch dtype) and q's row factor, and the state pass forms
    the output, so no ``[NC, HV, K, V]`` chunk-start states are allocated and the output launch is skipped:
    BF16 scratch, two ragged sequences with initial states, GVA (2 value heads per q / k head), four state key
    blocks (K = 32, key block 8; V = 16) and the sm_90 table: final states bit-identical to the separate output step,
    outputs within 1e-3 relative of it (same BF16 roundings, another order; dropping ``Aqk v_new`` gives ~1)
    and within the BF16 bound (1.5e-2) of the FP64 recurrence (fla's gate); the NaN-prefilled output is
    filled; every scratch buffer starts as NaN (the blocks of ``A`` and ``Aqk`` above the diagonal are not stored and
must not be read). ``fuse_output=True`` raises ``ValueError`` for the unbounded KDA gate, a lower bound past the
    factorised range (15 |lb| > 80) and FP32 products; the sm_90 table fuses at 32-column state tiles only."""
    import dataclasses

    from sgl_hybrid_kernel.delta_rule.chunk import parallel as cp
    from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA, GATE_KDA_SAFE

    gen = torch.Generator().manual_seed(37)
    lens, H, HV, K, V = [150, 41], 1, 2, 32, 16
    N = sum(lens)
    q, k, v, f, b, A, dtb = _batch(gen, 1, N, H, HV, K, V, "kda")
    init = torch.randn(2, HV, K, V, generator=gen) * 0.1
    cu = torch.tensor([0, lens[0], N])
    real_empty = torch.empty
    made = []

    def spy(*shape, **kw):  # every scratch buffer starts as NaN: a read of an unwritten element (e.g. the
        t = real_empty(*shape, **kw)  # A / Aqk blocks above the diagonal, which are not stored) reaches the output
        made.append((tuple(t.shape), t.dtype))
        return t.fill_(NAN) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", spy)
    small = chunk_rules.ChunkLaunch("t", intra_kd=16, state_kd=8, state_bv=16, value_tile=16, intra_split=True, intra_inv=True,
                           intra_a_kd=16, intra_a_stacked=True, intra_solve_lowp=True, state_lowp=True, output_lowp=True,
                           intra_precision="tf32x3", intra_aqk_tf32=True)
    qe, ke = torch.repeat_interleave(l2_norm(q), HV // H, 1), torch.repeat_interleave(l2_norm(k), HV // H, 1)
    rel = lambda a, r: float((a.double() - r.double()).norm() / r.double().norm())  # noqa: E731

    def run(launch, fuse, kind=GATE_KDA_SAFE, lb=-5.0, sd=torch.bfloat16, tf32=True):
        pool = init.clone()
        out = torch.full((N, HV, V), NAN)
        o = cp.gated_delta_chunk_parallel(q, k, v, f, b, A, dtb, cu, pool, torch.arange(2), torch.ones(2, dtype=torch.int32),
                                          kind, lb, K ** -0.5, True, "kv", [], None, lens, tf32=tf32, scratch_dtype=sd,
                                          launch=launch, out=out, fuse_output=fuse)
        assert o is out and not o.isnan().any()
        return o, pool

    for launch in (small, chunk_rules.INTERPRETER_LAUNCH):
        stacked = run(dataclasses.replace(launch, intra_aqk_tf32=False), False, sd=torch.float32)
        split = run(launch, False, sd=torch.float32)
        assert rel(split[0], stacked[0]) < 1e-6 and rel(split[1], stacked[1]) < 1e-6
        res = {}
        for fuse in (False, True):
            made.clear()
            res[fuse] = run(launch, fuse)
            assert (((3 + 1, HV, K, V), torch.bfloat16) in made) != fuse  # chunk-start states: 3 + 1 chunks
            assert made.count(((N, HV, K), torch.bfloat16)) == 2 + fuse  # w, kg (and q e^G when fused)
            assert made.count(((N, HV, V), torch.bfloat16)) == 2 - fuse  # u (and v_new when not fused)
        assert torch.equal(res[False][1], res[True][1])
        assert rel(res[True][0], res[False][0]) < 1e-3
        for i, n0 in enumerate((0, lens[0])):
            sl = slice(n0, n0 + lens[i])
            ro = gated_delta_recurrent(qe[sl], ke[sl], v[sl], kda_gate(f[sl], A, dtb, -5.0), torch.sigmoid(b[sl]),
                                       initial_state=init[i], scale=K ** -0.5, acc_dtype=torch.float64)[0]
            assert rel(res[True][0][sl], ro) < 1.5e-2
    for kw in (dict(kind=GATE_KDA, lb=None), dict(lb=-10.0), dict(tf32=False)):
        with pytest.raises(ValueError, match="fuse_output"):
            run(small, True, **kw)
    table = chunk_rules.CHUNK_LAUNCH[("sm90", 132)]
    assert [chunk_rules.use_fused_output(table, GATE_KDA_SAFE, True, False, -5.0, True, bv) for bv in (16, 32, 64)] == \
        [False, True, False]
    assert not chunk_rules.use_fused_output(table, GATE_KDA_SAFE, True, True, -5.0, True, 32)  # checkpoints
    assert not chunk_rules.use_fused_output(dataclasses.replace(table, fuse_output_kda_bv=()), GATE_KDA_SAFE, True, False, -5.0,
                                   True, 32)
