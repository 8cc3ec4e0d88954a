"""The one-warp decode / verify kernel's key sums as one reduce-scatter across the warp (``XRED``,
``triton_recurrent._xred_pair``; issue 4, docs/kernels.md sixteenth round).

Under the Triton interpreter the warp shuffles run as gathers along the lane axis (``xred=2``): same lane
bookkeeping as the CUDA path, checked here against fla-core's naive recurrences and against the ordinary
butterflies (``xred=0``), with NaN in every buffer a kernel must not read or write. The CUDA path's layout
premise (dim 0 of every shuffled tile on the 32 lanes) is checked on the compiled kernel; its bit-identity
to ``tl.sum`` was measured on the H200 (``benchmark/results/2026-12-02-h200-*xred*.json``).
"""

import ast
import os
import subprocess
import sys

import pytest
import torch
from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from fla.ops.kda.gate import naive_kda_lowerbound_gate
from fla.ops.kda.naive import naive_recurrent_kda

from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton
from sgl_hybrid_kernel.delta_rule.naive import gdn_gate
from sgl_hybrid_kernel.norm import l2_norm
from test_delta_rule_triton import _batch as _window  # same inputs as the rest of the suite

NAN = float("nan")
LB = -5.0


def _naive(gate, q, k, v, f, b, A, dtb, S0_kv, G):
    """fla's naive recurrence of one request's window (state ``[HV, K, V]``)."""
    qq, kk = l2_norm(q).repeat_interleave(G, 1), l2_norm(k).repeat_interleave(G, 1)
    if gate == "kda":
        return naive_recurrent_kda(qq[None], kk[None], v[None], naive_kda_lowerbound_gate(f, A, dtb, lower_bound=LB)[None],
                                   torch.sigmoid(b)[None], initial_state=S0_kv[None], output_final_state=True)
    return naive_recurrent_gated_delta_rule(qq[None], kk[None], v[None], torch.sigmoid(b)[None], gdn_gate(f, A, dtb)[None],
                                            initial_state=S0_kv[None], output_final_state=True)


@pytest.mark.parametrize("gate,T,BV,V,K", [("kda", 1, 4, 16, 128), ("kda", 3, 8, 16, 128), ("kda", 2, 16, 24, 96),
                                           ("gdn", 3, 4, 16, 128), ("gdn", 2, 2, 16, 96), ("gdn", 1, 8, 24, 128)])
def test_reduce_scatter_matches_fla_naive_and_the_butterflies(gate, T, BV, V, K):
    """Decode and plain verify windows with ``xred=2`` on the 128-key tile the CUDA path serves (``K`` = 128, or 96
    with masked keys): outputs and committed states equal fla's naive recurrence and the ``xred=0`` kernel; a
    padding row gives zeros, NaN pool slots nobody names stay NaN, and with ``V`` not a multiple of the tile (24
    at 16 columns) the masked lanes write nothing."""
    gen = torch.Generator().manual_seed(21)
    B, H = 3, 1
    HV = 2 if gate == "gdn" else H
    w = _window(gen, B, T, H, HV, K, V, gate)
    pool = torch.randn(6, HV, V, K, generator=gen)
    pool[2] = NAN
    idx = torch.tensor([5, -1, 0])
    lb = LB if gate == "kda" else None
    outs, pools = [], []
    for xred in (2, 0):
        p = pool.clone()
        o = torch.full_like(w[2], NAN)
        gated_delta_recurrent_triton(*w, p, idx, T, gate, lb, state_layout="vk", commit=True, out=o,
                                     plan=RecurrentOverrides(wide=True, value_tile=BV, xred=xred))
        outs.append(o)
        pools.append(p)
    o, p = outs[0], pools[0]
    assert (o[T:2 * T] == 0).all() and not o.isnan().any()
    assert p[2].isnan().all() and torch.equal(p[[1, 3, 4]], pool[[1, 3, 4]])
    torch.testing.assert_close(o, outs[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(p, pools[1], rtol=1e-6, atol=1e-6, equal_nan=True)
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        ro, rS = _naive(gate, w[0][sl], w[1][sl], w[2][sl], w[3][sl], w[4][sl], w[5], w[6], pool[s].transpose(-1, -2), HV // H)
        torch.testing.assert_close(o[sl], ro[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(p[s].transpose(-1, -2), rS[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate,BV", [("kda", 4), ("gdn", 8)])
def test_reduce_scatter_in_snapshot_and_deferred_windows(gate, BV):
    """The all-modes binary with ``xred=2``: snapshots (NaN-prefilled pool; the unnamed slot stays NaN), the
    deferred window (token 0's state committed, records of tokens 1..T-1, whose ``v`` the kernel stores from
    one lane per column) and the next window's fused replay agree with the same modes at ``xred=0``, and the
    fused replay of each accepted prefix equals a plain window started from that prefix's snapshot."""
    gen = torch.Generator().manual_seed(22)
    B, T, H, K, V = 3, 3, 1, 128, 16
    HV = 2
    w1, w2 = _window(gen, B, T, H, HV, K, V, gate), _window(gen, B, T, H, HV, K, V, gate)[:5]
    A, dtb = w1[5], w1[6]
    pool = torch.randn(B + 1, HV, V, K, generator=gen)
    idx, acc = torch.tensor([3, 0, 2]), torch.tensor([2, 3, 1])
    N, gk = B * T, (1 if gate == "gdn" else K)
    lb = LB if gate == "kda" else None
    res = {}
    for xred in (2, 0):
        inter = torch.full((N + 1, HV, V, K), NAN)
        o_s = gated_delta_recurrent_triton(*w1[:5], A, dtb, pool.clone(), idx, T, gate, lb, state_layout="vk", commit=False,
                                           inter_state=inter, inter_indices=torch.arange(N),
                                           plan=RecurrentOverrides(value_tile=BV, xred=xred))
        p = pool.clone()
        rb1, rb2 = (torch.full((B + 1, T - 1, HV, K + gk + 1 + V), NAN) for _ in range(2))
        o_d = gated_delta_recurrent_triton(*w1[:5], A, dtb, p, idx, T, gate, lb, state_layout="vk", replay_buffer=rb1,
                                           plan=RecurrentOverrides(value_tile=BV, xred=xred))
        o_f = gated_delta_recurrent_triton(*w2, A, dtb, p, idx, T, gate, lb, state_layout="vk", replay_buffer=rb2,
                                           replay_prev=rb1, accept_prev=acc,
                                           plan=RecurrentOverrides(value_tile=BV, xred=xred))
        res[xred] = (o_s, inter, o_d, rb1, o_f)
        assert inter[N].isnan().all() and not inter[:N].isnan().any()
        assert rb1[1].isnan().all() and not rb1[idx].isnan().any()  # slot 1 is nobody's
        torch.testing.assert_close(o_d, o_s, rtol=1e-6, atol=1e-6)
        p_ref = pool.clone()
        for i, a in enumerate(acc.tolist()):
            p_ref[idx[i]] = inter[i * T + a - 1]
        o_ref = gated_delta_recurrent_triton(*w2, A, dtb, p_ref, idx, T, gate, lb, state_layout="vk", commit=False,
                                             plan=RecurrentOverrides(value_tile=BV, xred=xred))
        torch.testing.assert_close(o_f, o_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(res[2], res[0]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_xred_rule_is_cuda_only_below_16_columns_and_moves_the_tiles(monkeypatch):
    """``recurrent.rules.use_xred``: on CUDA (sm_90, the arch the compile gate checks) for one-warp tiles under 16
    columns of a V-major pool with key stride 1 and ``K`` a multiple of 32 (decode, plain and all-modes windows
    alike), never on ROCm, another CUDA arch, the interpreter, a K-major pool or 16 columns. Where it applies, KDA's plain verify windows stop halving at 4 columns
    (H200: 4 columns faster than 2 with it) and GDN's plain windows at B=1 leave the lanes kernel for it.
    An explicit ``xred`` outside the kernel's contract is a ``ValueError`` naming it."""
    import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec
    import sgl_hybrid_kernel.delta_rule.recurrent.rules as rules
    from sgl_hybrid_kernel.platform import Target

    cuda = Target("cuda", "sm90", 132)
    use = rules.use_xred
    assert [use(cuda, "vk", 1, 128, bv) for bv in (1, 2, 4, 8, 16)] == [0, 1, 1, 1, 0]
    # a plain GDN window whose scalars are prepared first (use_tokprep) takes it at 16 columns too
    assert [use(cuda, "vk", 1, 128, bv, prepped=True) for bv in (1, 4, 16, 32)] == [0, 1, 1, 0]
    assert use(cuda, "vk", 1, 96, 4) == 1  # a 128-key tile with masked keys
    # other key widths lay the state tile out otherwise (K=64: 16 lanes on the keys; K=256: 8 keys per thread)
    assert [use(cuda, "vk", 1, kk, 4) for kk in (32, 64, 160, 256)] == [0, 0, 0, 0]
    assert use(cuda, "kv", 1, 128, 4) == 0 and use(cuda, "vk", 128, 128, 4) == 0 and use(cuda, "vk", 1, 128, 4, 2) == 0
    assert use(cuda, "vk", 1, 128, 4, aligned=False) == 0  # an unaligned pool loses the 4-key vectors
    assert use(Target("cpu"), "vk", 1, 128, 4) == 0
    # a CUDA arch whose shuffle layouts the compile gate does not check
    assert use(Target("cuda", "sm100", 132), "vk", 1, 128, 4) == 0
    assert use(Target("rocm", "gfx950", 256), "vk", 1, 128, 4) == 0
    assert use(Target("cuda", "sm90", 132, interpreter=True), "vk", 1, 128, 4) == 0
    pool = torch.zeros(3, 2, 16, 128)
    assert rules.xred_aligned(pool, None)
    assert not rules.xred_aligned(pool, torch.zeros(3 * 4100).as_strided((3, 2, 16, 128), (4100, 2048, 128, 1)))  # slot stride
    assert not rules.xred_aligned(torch.zeros(pool.numel() + 1)[1:].view(pool.shape))  # base 4 bytes past an aligned one
    assert rules.xred_aligned(torch.zeros(3, 2, 16, 100)) and not rules.xred_aligned(torch.zeros(3, 2, 16, 102))  # row stride

    assert [rules.pick_wide_tile(b, 12, 128, tokens=4, per_channel_decay=True, xred=True) for b in (1, 2, 4, 8, 16)] == [4, 4, 4, 8, 16]
    assert [rules.pick_wide_tile(b, 12, 128, tokens=4, per_channel_decay=True) for b in (1, 2, 4)] == [2, 2, 4]
    assert [rules.pick_lanes_tile(b, 48, 128, 128, 5, False, xred=True) for b in (1, 2, 3)] == [None, (8, 8), (16, 8)]
    assert [rules.pick_lanes_tile(b, 48, 128, 128, 5, False) for b in (1, 2)] == [(8, 8), (8, 8)]

    # the wrapper: the rule's answer reaches the kernel as XRED, and moves KDA B=1's tile to 4 columns
    seen = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((kw["BV"], kw["XRED"]))

    monkeypatch.setattr(rec, "gated_delta_verify_wide_kernel", Spy())
    monkeypatch.setattr(rules, "use_xred", lambda target, layout, key_stride, K, bv, *a: int(layout == "vk" and bv < 16))
    gen = torch.Generator().manual_seed(4)
    w = _window(gen, 1, 4, 12, 12, 128, 128, "kda")
    gated_delta_recurrent_triton(*w, torch.zeros(2, 12, 128, 128), torch.tensor([1]), 4, "kda", LB, state_layout="vk",
                                 commit=False)
    w = _window(gen, 1, 5, 16, 48, 128, 128, "gdn")
    gated_delta_recurrent_triton(*w, torch.zeros(2, 48, 128, 128), torch.tensor([0]), 5, "gdn", state_layout="vk", commit=False)
    # B=2: a prepared GDN window (TOKPREP) stays on the one-warp kernel, at 8 columns, where it took the lanes kernel
    w2 = _window(gen, 2, 5, 16, 48, 128, 128, "gdn")
    gated_delta_recurrent_triton(*w2, torch.zeros(3, 48, 128, 128), torch.tensor([0, 2]), 5, "gdn", state_layout="vk",
                                 commit=False)
    assert seen == [(4, 1), (4, 1), (8, 1)]
    # an explicit xred outside the kernel's contract: a ValueError naming it
    pool = torch.zeros(2, 48, 128, 128)
    bad = [dict(state_layout="kv", plan=RecurrentOverrides(wide=True, value_tile=4, xred=1)),  # K-major pool
           dict(state_layout="vk", plan=RecurrentOverrides(wide=True, value_tile=4, xred=3)),  # no such mode
           dict(state_layout="vk",
           plan=RecurrentOverrides(wide=False, value_tile=4, xred=1)),  # the register-tile kernel
           dict(state_layout="vk", plan=RecurrentOverrides(key_lanes=8, xred=1)),  # the lanes kernel
           dict(state_layout="vk", plan=RecurrentOverrides(wide=True, value_tile=4, num_warps=2, xred=1))]
    for kw in bad:
        with pytest.raises(ValueError, match="xred"):
            gated_delta_recurrent_triton(*w, pool, torch.tensor([0]), 5, "gdn", commit=False, **kw)
    unaligned = torch.zeros(2 * 48 * 128 * 128 + 1)[1:].view(2, 48, 128, 128)  # base 4 bytes past an aligned one
    with pytest.raises(ValueError, match="aligned=False"):
        gated_delta_recurrent_triton(*w, unaligned, torch.tensor([0]), 5, "gdn", commit=False, state_layout="vk",
                                     plan=RecurrentOverrides(wide=True, value_tile=4, xred=1))


def test_shuffle_layout_check_accepts_lanes_on_dim_0_only():
    """``compile_gate.shuffle_layout_error``, which the gate applies to every compiled config: a warp shuffle
    is trusted only on a ``[32, n]`` tile whose dim 0 is the 32 lanes in order (linear, blocked and sliced
    forms), and rejected where Triton put lanes on dim 1, split dim 0 between lanes and registers, or
    spread it over warps."""
    from sgl_hybrid_kernel.compile_gate import shuffle_layout_error

    def ttgir(defs, layout):
        return "\n".join(defs) + f'\n  %y = tt.elementwise_inline_asm "shfl.sync.bfly.b32 $0, $1, 16, 31, -1;" %x : ' \
                                  f"tensor<32x4xi32, {layout}> -> tensor<32x4xi32, {layout}>\n"

    lin = "#linear = #ttg.linear<{register = [[0, 1], [0, 2]], lane = [[1, 0], [2, 0], [4, 0], [8, 0], [16, 0]], warp = [], block = []}>"
    blk = "#blocked = #ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [32, 1], warpsPerCTA = [1, 1], order = [1, 0]}>"
    par = ("#blocked1 = #ttg.blocked<{sizePerThread = [1, 4, 1], threadsPerWarp = [32, 1, 1], warpsPerCTA = [1, 1, 1], "
           "order = [1, 0, 2]}>")
    assert shuffle_layout_error(ttgir([lin], "#linear")) is None
    assert shuffle_layout_error(ttgir([blk], "#blocked")) is None
    assert shuffle_layout_error(ttgir([par], "#ttg.slice<{dim = 1, parent = #blocked1}>")) is None
    lin3 = ("#linear3 = #ttg.linear<{register = [[0, 1, 0], [0, 2, 0], [0, 0, 1]], lane = [[1, 0, 0], [2, 0, 0], [4, 0, 0], "
            "[8, 0, 0], [16, 0, 0]], warp = [], block = []}>")  # what a 1-column tile's partial sums compile to
    assert shuffle_layout_error(ttgir([lin3], "#ttg.slice<{dim = 1, parent = #linear3}>")) is None
    bad = [
        ("#linear = #ttg.linear<{register = [[1, 0], [2, 0]], lane = [[0, 1], [0, 2], [4, 0], [8, 0], [16, 0]], warp = [], block = []}>", "#linear"),
        ("#linear = #ttg.linear<{register = [[16, 0]], lane = [[1, 0], [2, 0], [4, 0], [8, 0], [0, 1]], warp = [], block = []}>", "#linear"),
        ("#blocked = #ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [8, 4], warpsPerCTA = [1, 1], order = [1, 0]}>", "#blocked"),
        ("#blocked = #ttg.blocked<{sizePerThread = [2, 1], threadsPerWarp = [32, 1], warpsPerCTA = [1, 1], order = [1, 0]}>", "#blocked"),
        ("#blocked = #ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [32, 1], warpsPerCTA = [2, 1], order = [1, 0]}>", "#blocked"),
        (par, "#ttg.slice<{dim = 0, parent = #blocked1}>"),
        ("#linear3 = #ttg.linear<{register = [[0, 1, 0], [4, 0, 0]], lane = [[1, 0, 0], [2, 0, 0], [0, 0, 1], [8, 0, 0], "
         "[16, 0, 0]], warp = [], block = []}>", "#ttg.slice<{dim = 1, parent = #linear3}>"),
    ]
    for d, layout in bad:
        assert "dim 0 on the lanes" in shuffle_layout_error(ttgir([d], layout)), d


def test_compiled_kernel_shuffles_on_the_lanes_and_fewer_times():
    """The CUDA binary as the wrapper launches it (KDA T=4, 4 columns, fix-up-free gate), compiled for sm_90 with
    the installed Triton: every inline shuffle on a lanes-on-dim-0 tile, and the reduce-scatter's point, fewer
    shuffles per program than Triton's per-column butterflies (220 -> 116 with Triton 3.8). Compiled in a
    subprocess: this suite runs the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from sgl_hybrid_kernel.compile_gate import compiled_asm, shuffle_layout_error; "
            "x = compiled_asm('kda_verify1w_t4_bv4_fast_xred'); p = compiled_asm('kda_verify1w_t4_bv4_fast'); "
            "print(shuffle_layout_error(x['ttgir']), x['ttgir'].count('shfl.sync'), x['ptx'].count('shfl.sync'), "
            "p['ptx'].count('shfl.sync'))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    err, n_ir, nx, n0 = res.stdout.split()
    assert err == "None" and int(n_ir) > 0
    assert int(nx) < 0.6 * int(n0), (nx, n0)


@pytest.mark.parametrize("gate,T,BV,V,K,l2norm", [("gdn", 5, 4, 16, 128, True), ("gdn", 2, 8, 24, 96, True),
                                                  ("gdn", 4, 2, 16, 128, False), ("gdn", 9, 4, 8, 128, True),
                                                  ("kda", 4, 4, 16, 128, True), ("kda", 3, 8, 24, 96, True),
                                                  ("kda_std", 4, 2, 16, 128, True), ("kda", 2, 16, 16, 128, False)])
def test_window_scalars_first_match_fla_naive_and_the_per_token_chain(gate, T, BV, V, K, l2norm):
    """``tokprep`` (``triton_recurrent._verify_window_prep``): a plain window whose per-token scalars -- every
    token's norms and ``q.k`` as one reduce-scatter (16 sums at T = 5, 32 at T = 9), betas (and GDN's per-head decays)
    one token per lane, KDA's per-key decays as one ``[K, T]`` tile -- are computed before the state's chain gives
    fla's naive recurrence's outputs and final state, and the per-token chain's (``tokprep=False``) to FP32 rounding;
    padding rows write zeros, slots nobody names stay NaN, masked columns (V = 24 at 8 columns) are not written.
    KDA with the bounded gate (``kda``, fla's ``naive_kda_lowerbound_gate``) and the standard one (``kda_std``, whose
    oracle is the per-token chain). Without the L2 norm (inputs scaled so the recurrence stays bounded) the oracle
    is the per-token chain."""
    gen = torch.Generator().manual_seed(23)
    B, H, HV = 3, 1, 3
    w = list(_window(gen, B, T, H, HV, K, V, "gdn" if gate == "gdn" else "kda"))
    if not l2norm:
        w[0], w[1] = w[0] * 0.08, w[1] * 0.08
    pool = torch.randn(6, HV, V, K, generator=gen)
    pool[2] = NAN
    idx = torch.tensor([5, -1, 0])
    lb = LB if gate == "kda" else None
    res = {}
    for tp in (True, False):
        p = pool.clone()
        o = torch.full_like(w[2], NAN)
        gated_delta_recurrent_triton(*w, p, idx, T, "gdn" if gate == "gdn" else "kda", lb, state_layout="vk", commit=True, l2norm=l2norm, out=o,
                                     plan=RecurrentOverrides(wide=True, value_tile=BV, xred=2, tokprep=tp))
        res[tp] = (o, p)
    o, p = res[True]
    assert (o[T:2 * T] == 0).all() and not o.isnan().any()
    assert p[2].isnan().all() and torch.equal(p[[1, 3, 4]], pool[[1, 3, 4]])
    torch.testing.assert_close(o, res[False][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p, res[False][1], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert not torch.equal(o, res[False][0]) or not torch.equal(p, res[False][1])  # another path, not the same code
    if not l2norm or gate == "kda_std":
        return
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        ro, rS = _naive(gate, w[0][sl], w[1][sl], w[2][sl], w[3][sl], w[4][sl], w[5], w[6], pool[s].transpose(-1, -2), HV // H)
        torch.testing.assert_close(o[sl], ro[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(p[s].transpose(-1, -2), rS[0], rtol=1e-5, atol=1e-5)


def test_window_scalars_first_rule_and_contract(monkeypatch):
    """``recurrent.rules.use_tokprep``: plain windows that take the reduce-scatter, of 2 to 6 tokens (GDN) or 2 to 4 (KDA),
    not decode, longer windows, snapshot / deferred windows or butterflies; ``SGL_HYBRID_TOKPREP=0`` turns it off,
    ``SGL_HYBRID_TOKPREP_KDA=0`` for KDA only, and the wrapper passes the answer as ``TOKPREP``. Prepared windows
    take their own tile rules (:func:`pick_wide_tile`, never the lanes kernel). An explicit ``tokprep=True`` outside
    that contract is a ``ValueError`` naming it."""
    import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec
    import sgl_hybrid_kernel.delta_rule.recurrent.rules as rules
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE

    monkeypatch.delenv("SGL_HYBRID_TOKPREP", raising=False)
    monkeypatch.delenv("SGL_HYBRID_TOKPREP_KDA", raising=False)
    use = rules.use_tokprep
    # by itself up to 6 tokens (GDN) / 4 (KDA), where the H200 measured it faster; the kernel takes 2-10 when asked
    assert [use(GATE_GDN, t, True, 1) for t in (1, 2, 5, 6, 7, 10, 11)] == [False, True, True, True, False, False, False]
    assert [use(GATE_KDA_SAFE, t, True, 1) for t in (1, 2, 4, 5, 11)] == [False, True, True, False, False]
    assert use(GATE_KDA, 4, True, 1)
    assert not use(GATE_GDN, 5, False, 1) and not use(GATE_GDN, 5, True, 0) and not use(GATE_KDA_SAFE, 4, False, 1)
    monkeypatch.setenv("SGL_HYBRID_TOKPREP_KDA", "0")
    assert not use(GATE_KDA_SAFE, 4, True, 1) and not use(GATE_KDA, 4, True, 1) and use(GATE_GDN, 5, True, 1)
    monkeypatch.delenv("SGL_HYBRID_TOKPREP_KDA")
    monkeypatch.setenv("SGL_HYBRID_TOKPREP", "0")
    assert not use(GATE_GDN, 5, True, 1) and not use(GATE_KDA_SAFE, 4, True, 1)
    monkeypatch.delenv("SGL_HYBRID_TOKPREP")

    seen = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append((kw["XRED"], kw["TOKPREP"]))

    # the tiles of prepared windows (the H200's table). GDN, 48 value heads: 4 columns at B=1, 8 at B=2, 16 at B=4 (the
    # one batch whose 16-column grid is 9-12 programs per SM) and from B=44 (>= 128 per SM), 8 otherwise. KDA, 12 heads:
    # 4 columns to B=4, then 8 (never 16). Neither takes the lanes kernel.
    tiles = [rules.pick_wide_tile(b, 48, 128, tokens=5, xred=True, prepped=True) for b in (1, 2, 3, 4, 5, 8, 21, 43, 44, 128)]
    assert tiles == [4, 8, 8, 16, 8, 8, 8, 8, 16, 16], tiles
    tiles = [rules.pick_wide_tile(b, 12, 128, tokens=4, per_channel_decay=True, xred=True, prepped=True)
             for b in (1, 4, 5, 16, 160)]
    assert tiles == [4, 4, 8, 8, 8], tiles
    for kda in (False, True):
        assert [rules.pick_lanes_tile(b, 12 if kda else 48, 128, 128, 5, kda, xred=True, prepped=True)
                for b in (2, 22, 160)] == [None] * 3
    assert rules.pick_lanes_tile(2, 48, 128, 128, 5, False, xred=True) == (8, 8)  # without TOKPREP, as before
    assert rules.pick_lanes_tile(16, 12, 128, 128, 4, True, xred=True) == (16, 8)

    monkeypatch.setattr(rec, "gated_delta_verify_wide_kernel", Spy())
    gen = torch.Generator().manual_seed(5)
    w = _window(gen, 1, 5, 1, 2, 128, 16, "gdn")
    pool = torch.zeros(2, 2, 16, 128)
    for xr in (1, 0):
        gated_delta_recurrent_triton(*w, pool, torch.tensor([0]), 5, "gdn", state_layout="vk", commit=False,
                                     plan=RecurrentOverrides(wide=True, value_tile=4, xred=xr))
    inter = torch.zeros(6, 2, 16, 128)
    gated_delta_recurrent_triton(*w, pool, torch.tensor([0]), 5, "gdn", state_layout="vk", commit=False, inter_state=inter, inter_indices=torch.arange(5),
                                 plan=RecurrentOverrides(wide=True, value_tile=4, xred=1))
    wk = _window(gen, 1, 4, 1, 1, 128, 16, "kda")
    gated_delta_recurrent_triton(*wk, torch.zeros(2, 1, 16, 128), torch.tensor([0]), 4, "kda", LB, state_layout="vk",
                                 commit=False, plan=RecurrentOverrides(wide=True, value_tile=4, xred=1))
    assert seen == [(1, True), (0, False), (1, False), (1, True)]
    bad = [(w, 5, "gdn", 0, {}), (w, 5, "gdn", 1, dict(inter_state=inter, inter_indices=torch.arange(5))),
           (wk, 4, "kda", 0, {}), (_window(gen, 1, 11, 1, 1, 128, 16, "kda"), 11, "kda", 1, {})]
    for ww, T, gate, xr, kw in bad:
        with pytest.raises(ValueError, match="tokprep"):
            gated_delta_recurrent_triton(*ww, torch.zeros(2, ww[2].shape[1], 16, 128), torch.tensor([0]), T, gate,
                                         LB if gate == "kda" else None, state_layout="vk", commit=False, **kw,
                                         plan=RecurrentOverrides(wide=True, value_tile=4, tokprep=True, xred=xr))


def test_window_scalars_first_compile_once_per_window():
    """What the ``TOKPREP`` binary is for, read from the sm_90 PTX of the served T=5, 4-column row: the window's
    norms take one ``rsqrt`` and its gates and betas one set of exponentials, where the per-token binary takes
    two ``rsqrt`` and three exponentials per token (so 10 and 15 + 1 at T = 5). Compiled in a subprocess (this
    suite runs the interpreter)."""
    from test_delta_rule_lanes import _run_compiled

    out = _run_compiled("import re; from sgl_hybrid_kernel.compile_gate import compiled_asm; "
                        "print([(len(re.findall(r'rsqrt\\.approx', p)), len(re.findall(r'ex2\\.approx', p))) for p in "
                        "(compiled_asm(n)['ptx'] for n in ('gdn_verify1w_t5_bv4_xred_tokprep', 'gdn_verify1w_t5_bv4_xred'))])")
    (rs_tp, ex_tp), (rs_tok, ex_tok) = ast.literal_eval(out.strip().splitlines()[-1])
    assert rs_tok == 10 and ex_tok == 16, (rs_tok, ex_tok)
    assert rs_tp == 1 and ex_tp == 4, (rs_tp, ex_tp)


def test_kda_window_scalars_first_take_the_norms_out_of_the_chain():
    """KDA's ``TOKPREP`` binary as CUDA serves it (T=4, 4 columns, fix-up-free bounded gate, ``XRED``), from its sm_90
    PTX: the window's 8 norms take one ``rsqrt`` (the per-token binary: 2 per token), and the warp exchanges drop from
    116 to under 100 (the norms' and ``q.k``'s butterflies become one 16-column reduce-scatter); the per-key decays
    stay 2 ``ex2`` per key and token plus one per beta, so the same MUFU work moves before the state's chain. Compiled in
    a subprocess (this suite runs the interpreter)."""
    from test_delta_rule_lanes import _run_compiled

    out = _run_compiled("import re; from sgl_hybrid_kernel.compile_gate import compiled_asm; "
                        "print([(len(re.findall(r'rsqrt\\.approx', p)), p.count('shfl.sync')) for p in "
                        "(compiled_asm(n)['ptx'] for n in ('kda_verify1w_t4_bv4_fast_xred_tokprep', "
                        "'kda_verify1w_t4_bv4_fast_xred'))])")
    (rs_tp, sh_tp), (rs_tok, sh_tok) = ast.literal_eval(out.strip().splitlines()[-1])
    assert rs_tok == 8 and rs_tp == 1, (rs_tok, rs_tp)
    assert sh_tp < 100 < sh_tok, (sh_tp, sh_tok)
