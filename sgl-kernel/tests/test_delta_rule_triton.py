"""Triton KDA / GDN kernels (decode, verify, deferred commit, fused decode, chunked prefill)
under the Triton interpreter, against the plain-torch references and fla-core's naive ones.

Tiny FP32 shapes (the interpreter has no BF16). Padding slots and unused pool
rows hold NaN beforehand: it must never reach an output or another slot.
"""

import pytest
import torch
from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
from fla.ops.kda.naive import naive_recurrent_kda

from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides
from sgl_hybrid_kernel.conv.reference import causal_conv1d_step
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton, replay_commit
from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, gdn_gate, kda_gate
from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode
from sgl_hybrid_kernel.norm import gated_rms_norm, l2_norm

NAN = float("nan")


def _batch(gen, B, T, H, HV, K, V, gate):
    N = B * T
    q, k = torch.randn(N, H, K, generator=gen), torch.randn(N, H, K, generator=gen)
    v = torch.randn(N, HV, V, generator=gen)
    f = torch.randn(N, HV, generator=gen) if gate == "gdn" else torch.randn(N, HV, K, generator=gen)
    b = torch.randn(N, HV, generator=gen)
    A = torch.rand(HV, generator=gen)
    dtb = torch.randn(HV if gate == "gdn" else HV * K, generator=gen)
    return q, k, v, f, b, A, dtb


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_decode_matches_fla_naive_with_nan_padding(layout, lower_bound):
    gen = torch.Generator().manual_seed(1)
    B, H, K, V = 4, 3, 16, 8
    q, k, v, f, b, A, dtb = _batch(gen, B, 1, H, H, K, V, "kda")
    kv_pool = torch.randn(7, H, K, V, generator=gen)
    kv_pool[2] = NAN
    pool = kv_pool.clone() if layout == "kv" else kv_pool.transpose(-1, -2).contiguous()
    idx = torch.tensor([5, -1, 0, 3])  # a padding row (-1); slot 2 holds NaN and is never named
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, 1, "kda", lower_bound, state_layout=layout,
                                     plan=RecurrentOverrides(value_tile=4))
    after = pool if layout == "kv" else pool.transpose(-1, -2)
    assert (o[1] == 0).all() and not o.isnan().any()
    assert after[2].isnan().all()
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        fi = f[i : i + 1]
        g = naive_kda_gate(fi, A, dtb) if lower_bound is None else naive_kda_lowerbound_gate(fi, A, dtb, lower_bound=lower_bound)
        ro, rS = naive_recurrent_kda(l2_norm(q[i : i + 1])[None], l2_norm(k[i : i + 1])[None], v[i : i + 1][None], g[None],
                                     torch.sigmoid(b[i : i + 1])[None], initial_state=kv_pool[s][None], output_final_state=True)
        torch.testing.assert_close(o[i], ro[0, 0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(after[s], rS[0], rtol=1e-5, atol=1e-5)
    untouched = [j for j in range(7) if j not in idx.tolist()]
    torch.testing.assert_close(after[untouched], kv_pool[untouched], equal_nan=True)


@pytest.mark.parametrize("preload", [True, False])
def test_gdn_verify_gva_matches_fla_naive_and_saves_every_position(preload):
    """Both input paths of the kernel: every token's inputs preloaded as tiles, or per token."""
    gen = torch.Generator().manual_seed(2)
    B, T, H, HV, K, V = 2, 5, 2, 6, 16, 8
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, "gdn")
    pool = torch.randn(4, HV, K, V, generator=gen)
    before = pool.clone()
    idx = torch.tensor([3, 1])
    inter = torch.full((B * T, HV, K, V), NAN)
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, "gdn", commit=False, inter_state=inter,
                                     inter_indices=torch.arange(B * T),
                                     plan=RecurrentOverrides(value_tile=4, preload=preload))
    torch.testing.assert_close(pool, before)  # verify does not commit
    G = HV // H
    for i, s in enumerate(idx.tolist()):
        sl = slice(i * T, (i + 1) * T)
        qq = l2_norm(q[sl]).repeat_interleave(G, 1)
        kk = l2_norm(k[sl]).repeat_interleave(G, 1)
        ro, _ = naive_recurrent_gated_delta_rule(qq[None], kk[None], v[sl][None], torch.sigmoid(b[sl])[None],
                                                 gdn_gate(f[sl], A, dtb)[None], initial_state=before[s][None])
        torch.testing.assert_close(o[sl], ro[0], rtol=1e-5, atol=1e-5)
        _, _, saved = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], gdn_gate(f[sl], A, dtb), torch.sigmoid(b[sl]),
                                            initial_state=before[s], save_positions=range(1, T + 1))
        for t in range(T):
            torch.testing.assert_close(inter[i * T + t], saved[t], rtol=1e-5, atol=1e-5)


def test_kda_verify_per_token_inputs_match_fla_naive():
    """The per-token input path (``preload=False``, the default from 16 columns at T > 1) against
    fla's naive KDA recurrence, with a padding row and the V-major pool; it commits the final state."""
    gen = torch.Generator().manual_seed(12)
    B, T, H, K, V = 3, 3, 2, 16, 16
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, H, K, V, "kda")
    kv_pool = torch.randn(5, H, K, V, generator=gen)
    pool = kv_pool.transpose(-1, -2).contiguous()
    idx = torch.tensor([4, -1, 0])
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, "kda", -5.0, state_layout="vk", commit=True,
                                     plan=RecurrentOverrides(value_tile=16))
    assert (o[T:2 * T] == 0).all() and not o.isnan().any()
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        g = naive_kda_lowerbound_gate(f[sl], A, dtb, lower_bound=-5.0)
        ro, rS = naive_recurrent_kda(l2_norm(q[sl])[None], l2_norm(k[sl])[None], v[sl][None], g[None], torch.sigmoid(b[sl])[None],
                                     initial_state=kv_pool[s][None], output_final_state=True)
        torch.testing.assert_close(o[sl], ro[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[s].transpose(-1, -2), rS[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate,commit", [("kda", True), ("gdn", False), ("kda", False), ("gdn", True)])
def test_wide_verify_kernel_matches_fla_naive(gate, commit):
    """The one-warp per-token kernel (``wide=True``, its ``PLAIN`` binary: inputs one token ahead)
    against fla's naive recurrences, GVA for GDN, a padding row, commit or not."""
    gen = torch.Generator().manual_seed(13)
    B, T, H, K, V = 3, 4, 2, 16, 32
    HV = 4 if gate == "gdn" else H
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, gate)
    pool = torch.randn(5, HV, K, V, generator=gen)
    before = pool.clone()
    idx = torch.tensor([2, -1, 4])
    lb = -5.0 if gate == "kda" else None
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, gate, lb, commit=commit,
                                     plan=RecurrentOverrides(wide=True, value_tile=16))
    assert (o[T:2 * T] == 0).all() and not o.isnan().any()
    G = HV // H
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        qq, kk = l2_norm(q[sl]).repeat_interleave(G, 1), l2_norm(k[sl]).repeat_interleave(G, 1)
        if gate == "kda":
            ro, rS = naive_recurrent_kda(qq[None], kk[None], v[sl][None], naive_kda_lowerbound_gate(f[sl], A, dtb, lower_bound=lb)[None],
                                         torch.sigmoid(b[sl])[None], initial_state=before[s][None], output_final_state=True)
        else:
            ro, rS = naive_recurrent_gated_delta_rule(qq[None], kk[None], v[sl][None], torch.sigmoid(b[sl])[None],
                                                      gdn_gate(f[sl], A, dtb)[None], initial_state=before[s][None],
                                                      output_final_state=True)
        torch.testing.assert_close(o[sl], ro[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[s], rS[0] if commit else before[s], rtol=1e-5, atol=1e-5)


def test_every_verify_mode_and_decode_take_the_one_warp_kernel(monkeypatch):
    """Default routing (H200 sweeps, docs/kernels.md 2026-11-30), KDA: verify windows run
    ``gated_delta_verify_wide_kernel`` with one warp, except plain windows from 8 programs per SM at 16
    columns (B = 32, 128 here), which run the lanes kernel (its prologue, then 16 columns x 8 key lanes;
    test_delta_rule_lanes.py). Plain windows at B=1 the one-warp ``PLAIN`` binary, 2 columns. Snapshots
    and deferred commit its all-modes binary: 4 / 8 columns (KDA's all-modes windows never take the lanes
    kernel). Decode on the V-major pool takes the ``PLAIN`` binary too; decode on the K-major pool and
    an explicit ``preload`` keep the register-tile kernel."""
    import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec

    calls = []

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((self.name, kw.get("BV"), kw["num_warps"], kw.get("PRELOAD"), kw.get("PLAIN")))

    monkeypatch.setattr(rec, "gated_delta_recurrent_kernel", Spy("narrow"))
    monkeypatch.setattr(rec, "gated_delta_verify_wide_kernel", Spy("wide"))
    monkeypatch.setattr(rec, "gated_delta_verify_lanes_kernel", Spy("lanes"))
    monkeypatch.setattr(rec, "token_prep_kernel", Spy("prep"))
    gen = torch.Generator().manual_seed(14)
    T, H, K, V = 4, 12, 128, 128
    for B in (1, 32, 128):
        q, k, v, f, b, A, dtb = _batch(gen, B, T, H, H, K, V, "kda")
        pool, idx = torch.zeros(B, H, V, K), torch.arange(B)
        run = lambda **kw: gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, "kda", -5.0, state_layout="vk", **kw)  # noqa: E731
        run(commit=False)
        run(commit=True)
        run(commit=False, inter_state=torch.zeros(B * T, H, V, K), inter_indices=torch.arange(B * T))
        run(replay_buffer=torch.zeros(B, T - 1, H, K + K + 1 + V))
        run(commit=False, plan=RecurrentOverrides(preload=True))  # that kernel's knob: the register-tile kernel
    gated_delta_recurrent_triton(q[:B], k[:B], v[:B], f[:B], b[:B], A, dtb, pool, idx, 1, "kda", -5.0, state_layout="vk")
    plain, modes, narrow = [("wide", 2, 1, None, True)] * 2, [("wide", 4, 1, None, False)] * 2, [("narrow", 4, 1, True, None)]
    lanes = [("prep", None, 1, None, None), ("lanes", 16, 1, None, True)] * 2
    b32 = lanes + [("wide", 8, 1, None, False)] * 2
    b128 = lanes + [("wide", 8, 1, None, False)] * 2
    gated_delta_recurrent_triton(q[:B], k[:B], v[:B], f[:B], b[:B], A, dtb, pool.transpose(-1, -2), idx, 1, "kda", -5.0,
                                 state_layout="kv")
    # the B=128 decode: 4 columns (16 only for B = 12-16 at 12 heads, pick_wide_tile)
    assert calls == (plain + modes + narrow + b32 + narrow + b128 + narrow + [("wide", 4, 1, None, True)]
                     + [("narrow", 64, 4, True, None)])


@pytest.mark.parametrize("gate,preload", [("gdn", True), ("kda", True), ("gdn", False), ("kda", False), ("gdn", None),
                                          ("kda", None)])
def test_deferred_commit_is_bit_exact_against_snapshots(gate, preload):
    """Seeds digest item 12: the scalar replay equals writing every snapshot, bit for bit,
    both as a separate commit and fused into the next window (``preload`` True / False: both input
    paths of the register-tile kernel; ``None``: the default one-warp per-token kernel)."""
    gen = torch.Generator().manual_seed(3)
    B, T, H, HV, K, V = 3, 4, 2, 4, 16, 8
    w1 = _batch(gen, B, T, H, HV, K, V, gate)
    w2 = _batch(gen, B, T, H, HV, K, V, gate)[:5]
    p_def, rb1 = _deferred_matches_snapshots(gate, w1, w2, torch.randn(6, HV, K, V, generator=gen), T, K, V,
                                             plan=RecurrentOverrides(preload=preload))
    with pytest.raises(ValueError, match="ping-pong"):
        gated_delta_recurrent_triton(*w2, w1[5], w1[6], p_def, torch.tensor([4, 1, 3]), T, gate, replay_buffer=rb1,
                                     replay_prev=rb1, accept_prev=torch.tensor([2, 4, 1]))


def _deferred_matches_snapshots(gate, w1, w2, pool, T, K, V, **kw):
    """Two windows of 3 requests (slots 4, 1, 3 of ``pool``: 6 slots, ``[6, HV, ., .]`` in ``kw``'s layout) run
    with snapshots (keeping each accepted state) and deferred (separate commit after window 1, fused replay into
    window 2, ``replay_commit`` after it): outputs and committed states equal bit for bit. Returns the deferred
    pool and window 1's replay buffer."""
    A, dtb = w1[5], w1[6]
    HV = pool.shape[1]
    idx, acc1, acc2 = torch.tensor([4, 1, 3]), torch.tensor([2, 4, 1]), torch.tensor([3, 1, 4])
    N, gk = 3 * T, (1 if gate == "gdn" else K)
    p_snap, inter = pool.clone(), torch.zeros((N,) + tuple(pool.shape[1:]))
    o1 = gated_delta_recurrent_triton(*w1[:5], A, dtb, p_snap, idx, T, gate, commit=False, inter_state=inter,
                                      inter_indices=torch.arange(N), **kw)
    for i, (s, a) in enumerate(zip(idx.tolist(), acc1.tolist())):
        p_snap[s] = inter[i * T + a - 1]
    o2 = gated_delta_recurrent_triton(*w2, A, dtb, p_snap, idx, T, gate, commit=False, inter_state=inter,
                                      inter_indices=torch.arange(N), **kw)
    p_def = pool.clone()
    rb1, rb2 = (torch.zeros(6, T - 1, HV, K + gk + 1 + V) for _ in range(2))
    d1 = gated_delta_recurrent_triton(*w1[:5], A, dtb, p_def, idx, T, gate, replay_buffer=rb1, **kw)
    d2 = gated_delta_recurrent_triton(*w2, A, dtb, p_def, idx, T, gate, replay_buffer=rb2, replay_prev=rb1, accept_prev=acc1,
                                      **kw)
    replay_commit(p_def, idx, acc2, rb2, K, gate, **kw)  # the verify's layout and plan
    assert torch.equal(o1, d1) and torch.equal(o2, d2)
    for i, (s, a) in enumerate(zip(idx.tolist(), acc2.tolist())):
        assert torch.equal(p_def[s], inter[i * T + a - 1])
    return p_def, rb1


@pytest.mark.parametrize("gate,value_tile", [("gdn", 8), ("kda", 4)])
def test_deferred_commit_is_bit_exact_with_in_order_key_sums(gate, value_tile):
    """The one-warp kernel on the 128-key V-major pool, where ``recurrent.rules.use_seq_key_sums`` turns ``SEQ`` on (the
    interpreter runs it; CUDA sm_90 does too): a deferred window, its fused replay and ``replay_commit`` equal the
    snapshot path bit for bit, so verify and replay add every key sum in the same order. (A replay summing with
    ``tl.sum`` while its verify folds differs here in the last bits.)"""
    from sgl_hybrid_kernel.delta_rule.recurrent.rules import use_seq_key_sums, xred_aligned
    from sgl_hybrid_kernel.platform import Target

    gen = torch.Generator().manual_seed(31)
    B, T, H, HV, K, V = 3, 4, 1, 2, 128, 16
    w1 = _batch(gen, B, T, H, HV, K, V, gate)
    w2 = _batch(gen, B, T, H, HV, K, V, gate)[:5]
    pool = torch.randn(6, HV, V, K, generator=gen)
    interp = Target("cpu", interpreter=True)
    assert use_seq_key_sums(interp, "vk", 1, K, 1, xred_aligned(pool))
    assert not use_seq_key_sums(interp, "vk", 1, 64, 1, xred_aligned(pool[..., :64]))  # another key width: off
    _deferred_matches_snapshots(gate, w1, w2, pool, T, K, V, state_layout="vk",
    plan=RecurrentOverrides(value_tile=value_tile))


@pytest.mark.parametrize("gate,T,value_tile", [("gdn", 5, 8), ("kda", 3, 4), ("gdn", 2, 16), ("kda", 5, 16)])
def test_fused_replay_matches_snapshots_for_padded_windows(gate, T, value_tile):
    """Windows whose T (and T - 1 replay records) are not powers of two are padded to the next
    one inside the kernel (issue 4): the padding columns must never reach a state or output.
    Fused replay of every accepted length 1..T equals restarting from that token's snapshot."""
    gen = torch.Generator().manual_seed(8)
    B, H, HV, K, V = T, 1, 2, 16, 16
    w1, w2 = _batch(gen, B, T, H, HV, K, V, gate), _batch(gen, B, T, H, HV, K, V, gate)[:5]
    A, dtb = w1[5], w1[6]
    pool = torch.randn(B + 2, HV, K, V, generator=gen)
    idx, acc = torch.arange(B) + 1, torch.arange(1, T + 1)  # request i accepts i + 1 tokens
    N, gk = B * T, 1 if gate == "gdn" else K
    inter = torch.full((N, HV, K, V), NAN)
    gated_delta_recurrent_triton(*w1[:5], A, dtb, pool.clone(), idx, T, gate, commit=False, inter_state=inter,
                                 inter_indices=torch.arange(N), plan=RecurrentOverrides(value_tile=value_tile))
    p_ref = pool.clone()
    for i, a in enumerate(acc.tolist()):
        p_ref[idx[i]] = inter[i * T + a - 1]
    o_ref = gated_delta_recurrent_triton(*w2, A, dtb, p_ref, idx, T, gate, commit=True,
                                         plan=RecurrentOverrides(value_tile=value_tile))
    p_def = pool.clone()
    rb1, rb2 = (torch.full((B + 2, T - 1, HV, K + gk + 1 + V), NAN) for _ in range(2))
    gated_delta_recurrent_triton(*w1[:5], A, dtb, p_def, idx, T, gate, replay_buffer=rb1,
                                 plan=RecurrentOverrides(value_tile=value_tile))
    o_f = gated_delta_recurrent_triton(*w2, A, dtb, p_def, idx, T, gate, replay_buffer=rb2, replay_prev=rb1, accept_prev=acc,
                                       plan=RecurrentOverrides(value_tile=value_tile))
    assert not o_f.isnan().any() and torch.equal(o_f, o_ref)


def test_wrapper_passes_tokens_and_gate_kind_to_the_tile_rule(monkeypatch):
    """The value tile the wrapper launches at the serving shapes (interpreter = the H200 table) is the
    decode / verify rule's for that gate and window length: KDA decode 4 columns up to B = 11, 16 for
    B = 12-16, 4 again from 17,
    GDN decode 4 at any batch, KDA verify T=4 halved until 8 waves (B=4: 4, B=8: 8)."""
    import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec

    tiles = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: tiles.append((grid[0], kw["BV"], kw["PLAIN"]))

    monkeypatch.setattr(rec, "gated_delta_verify_wide_kernel", Spy())
    gen = torch.Generator().manual_seed(3)

    def launch(B, T, H, HV, gate):
        q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, 128, 128, gate)
        pool = torch.zeros(B, HV, 128, 128)
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.arange(B), T, gate, -5.0 if gate == "kda" else None,
                                     state_layout="vk", commit=(T == 1))

    for B in (1, 11, 12, 32):
        launch(B, 1, 12, 12, "kda")
    launch(32, 1, 16, 48, "gdn")
    launch(4, 4, 12, 12, "kda")
    launch(8, 4, 12, 12, "kda")
    assert tiles == [(32, 4, True), (32, 4, True), (8, 16, True), (32, 4, True), (32, 4, True), (32, 4, True), (16, 8, True)]


def test_fast_gate_for_kda_all_modes_and_plain_verify_at_4_to_8_columns_on_cuda(monkeypatch):
    """``recurrent.rules.use_fast_gate`` (H200 sweeps, issue 4): the fix-up-free gate / beta MUFU operations
    (inline PTX) go, on CUDA only, to KDA's all-modes binary whatever the window (so snapshots, deferred
    commit, fused replay and ``replay_commit`` still share one binary) and to its plain verify windows at
    4- and 8-column tiles -- never to plain decode, 2- or 16-column plain windows, GDN, the unbounded KDA
    gate, ROCm, or the interpreter (which has no inline assembly). The wrapper passes the rule's answer as
    the kernel's ``FAST``."""
    import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec
    import sgl_hybrid_kernel.delta_rule.recurrent.rules as rules
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE
    from sgl_hybrid_kernel.platform import Target

    cuda = Target("cuda", "sm90", 132)
    fast = rules.use_fast_gate
    assert [fast(cuda, GATE_KDA_SAFE, 4, bv, True) for bv in (2, 4, 8, 16)] == [False, True, True, False]
    assert not fast(cuda, GATE_KDA_SAFE, 1, 4, True)  # decode
    # the all-modes binary: one answer for every window length and tile (one binary for every mode)
    assert all(fast(cuda, GATE_KDA_SAFE, t, bv, False) for t in (1, 2, 4, 8) for bv in (2, 4, 8, 16))
    assert not fast(cuda, GATE_GDN, 5, 4, True) and not fast(cuda, GATE_KDA, 4, 4, True)
    assert not fast(cuda, GATE_GDN, 5, 8, False) and not fast(cuda, GATE_KDA, 4, 8, False)
    cpu = Target("cpu", interpreter=True)
    assert not fast(cpu, GATE_KDA_SAFE, 4, 4, True) and not fast(cpu, GATE_KDA_SAFE, 4, 4, False)
    rocm = Target("rocm", "gfx950", 256)
    assert not fast(rocm, GATE_KDA_SAFE, 4, 4, True) and not fast(rocm, GATE_KDA_SAFE, 4, 4, False)
    interp = Target("cuda", "sm90", 132, interpreter=True)
    assert not fast(interp, GATE_KDA_SAFE, 4, 4, True) and not fast(interp, GATE_KDA_SAFE, 4, 4, False)

    # the wrapper hands the rule its gate kind, window length, tile and binary
    seen = []
    monkeypatch.setattr(rules, "use_fast_gate", lambda *a: seen.append(a[1:]) or True)

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw["FAST"])

    monkeypatch.setattr(rec, "gated_delta_verify_wide_kernel", Spy())
    gen = torch.Generator().manual_seed(4)
    q, k, v, f, b, A, dtb = _batch(gen, 4, 4, 12, 12, 128, 128, "kda")
    gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, torch.zeros(4, 12, 128, 128), torch.arange(4), 4, "kda", -5.0,
                                 state_layout="vk", commit=False)
    assert seen == [(GATE_KDA_SAFE, 4, 4, True), True]


def test_every_mode_of_a_window_launches_one_binary(monkeypatch):
    """Bit-exact deferred commit on a GPU rests on snapshots, deferred verify, fused replay and
    ``replay_commit`` running the same compiled kernel (same register layouts, so the same
    reduction order): the modes differ only in the runtime ``flags``, never in a constexpr or a
    pointer's dtype."""
    import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec

    launches = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, [getattr(a, "dtype", type(a)) for a in args[:-1]], kw, args[-1]))

    monkeypatch.setattr(rec, "gated_delta_verify_wide_kernel", Spy())  # every verify mode's default kernel
    gen = torch.Generator().manual_seed(9)
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 16
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, "kda")
    pool, idx = torch.zeros(4, HV, V, K), torch.tensor([0, 3])
    rb1, rb2 = (torch.zeros(4, T - 1, HV, K + K + 1 + V) for _ in range(2))
    run = lambda **kw: gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, "kda", -5.0, state_layout="vk", **kw)  # noqa: E731
    run(commit=False, inter_state=torch.zeros(B * T, HV, V, K), inter_indices=torch.arange(B * T))  # int64 like idx
    run(replay_buffer=rb1)
    run(replay_buffer=rb2, replay_prev=rb1, accept_prev=torch.tensor([1, 3], dtype=torch.int32))
    replay_commit(pool, idx, torch.tensor([2, 4]), rb2, K, "kda", state_layout="vk", num_k_heads=H, activation_dtype=q.dtype,
                  lower_bound=-5.0)
    assert [flags for *_, flags in launches] == [2, 4, 12, 9]
    grids, dtypes, constexprs = {g for g, *_ in launches}, {tuple(d) for _, d, _, _ in launches}, [kw for _, _, kw, _ in launches]
    assert len(grids) == 1 and len(dtypes) == 1 and all(kw == constexprs[0] for kw in constexprs)
    assert constexprs[0]["num_warps"] == 1 and constexprs[0]["BV"] == 4 and constexprs[0]["PLAIN"] is False
    # plain windows (nothing replays them) take the PLAIN binary
    launches.clear()
    run(commit=False)
    run(commit=True)
    assert [flags for *_, flags in launches] == [0, 1] and all(kw["PLAIN"] is True for _, _, kw, _ in launches)


def test_default_tiles_and_warps_follow_the_h200_sweep():
    """Issue 4 sweeps (docs/kernels.md): one warp per program; V-major decode 4 columns (KDA: up to
    32 programs per SM, then 16; GDN: always); the verify kernel's plain windows 16 columns halved to
    fill 8 waves (4 at least, 2 with KDA's per-channel gate; on a K-major pool 2 waves and 8 at least), its
    all-modes binary 8 columns (16 K-major) halved under 8 waves; the register-tile kernel's verify
    tiles (explicit ``preload``) 4 columns with per-channel decay, 8 with per-head decay or K-major."""
    from sgl_hybrid_kernel.delta_rule.recurrent.rules import (pick_deferred_tile, pick_value_tile, pick_wide_tile,
                                                              recurrent_num_warps, recurrent_preload)

    # decode (T = 1), KDA (per-channel gate, 12 heads): 4 columns up to 32 x 132 programs (B = 11), 16 below
    # 48 x 132 (B = 12-16), 4 again from there (B >= 17)
    assert [pick_wide_tile(b, 12, 128, per_channel_decay=True) for b in (1, 2, 4, 8, 11, 12, 16, 17, 32, 128)] == (
        [4] * 5 + [16] * 2 + [4] * 3)
    # decode, GDN (per-head gate, 48 value heads): 4 columns at every batch
    assert [pick_wide_tile(b, 48, 128) for b in (1, 8, 32, 256)] == [4, 4, 4, 4]
    # plain verify windows: 16 halved (to 4; KDA to 2) to fill 8 waves of 132 SMs
    assert [pick_wide_tile(b, 12, 128, tokens=4, per_channel_decay=True) for b in (1, 2, 4, 8, 16, 32, 128)] == [2, 2, 4, 8, 16, 16, 16]
    assert [pick_wide_tile(b, 48, 128, tokens=5) for b in (1, 2, 4, 32)] == [4, 8, 16, 16]
    # the K-major pool: 16 halved to fill 2 waves, 8 at least
    assert [pick_wide_tile(1, 4, 128, "kv"), pick_wide_tile(1, 12, 128, "kv", tokens=4), pick_wide_tile(32, 12, 128, "kv")] == [8, 8, 16]
    assert [pick_deferred_tile(b, 12, 128) for b in (1, 8, 32)] == [4, 8, 8]
    assert [pick_deferred_tile(1, 48, 128), pick_deferred_tile(32, 48, 128), pick_deferred_tile(32, 48, 128, "kv")] == [4, 8, 16]

    assert [pick_value_tile(b, 12, 128) for b in (1, 32, 128)] == [4, 16, 16]
    assert [pick_value_tile(b, 12, 128, 4, per_channel_decay=True) for b in (1, 32)] == [4, 4]
    assert [pick_value_tile(32, 48, 128, 5), pick_value_tile(32, 48, 128, 5, "kv", per_channel_decay=True)] == [8, 8]
    assert [pick_value_tile(1, 48, 128, 5), pick_value_tile(1, 48, 128, 5, "kv")] == [4, 8]  # GDN B=1: 4 columns, per token
    assert [recurrent_preload(4, 5, False), recurrent_preload(4, 4, True), recurrent_preload(8, 5, False), recurrent_preload(16, 4)] == [
        False, True, True, False]
    assert [pick_value_tile(1, 12, 128, state_layout="kv"), pick_value_tile(32, 48, 128, state_layout="kv")] == [32, 64]
    assert [recurrent_num_warps(bv) for bv in (4, 8, 16, 32, 64)] == [1, 1, 1, 2, 4]


@pytest.mark.parametrize("row_views", [False, True])
def test_fused_kda_decode_equals_the_unfused_chain(row_views):
    """``row_views``: q|k|v, f, beta and the output gate are column slices of one fused projection's
    output (upstream's ``torch.split``), read through their row stride."""
    gen = torch.Generator().manual_seed(4)
    B, H, K, W = 4, 2, 16, 4
    C = 3 * H * K
    x, cw = torch.randn(B, C, generator=gen), torch.randn(C, W, generator=gen) * 0.5
    conv, ssm = torch.randn(6, W - 1, C, generator=gen), torch.randn(6, H, K, K, generator=gen)
    conv[5], ssm[5] = NAN, NAN
    f, b = torch.randn(B, H * K, generator=gen), torch.randn(B, H, generator=gen)
    A, dtb = torch.rand(H, generator=gen), torch.randn(H * K, generator=gen)
    gate, nw = torch.randn(B, H * K, generator=gen), torch.rand(K, generator=gen) + 0.5
    if row_views:
        proj = torch.cat([x, gate, f, b, torch.full((B, 3), NAN)], dim=1)  # NaN columns: never read
        x, gate, f, b = proj[:, :C], proj[:, C:C + H * K], proj[:, C + H * K:C + 2 * H * K], proj[:, C + 2 * H * K:C + 2 * H * K + H]
        assert not x.is_contiguous() and x.stride(0) == proj.shape[1]
    idx = torch.tensor([4, -1, 1, 2])
    c_f, s_f, c_r, s_r = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    for step in range(2):  # twice: the arrival counters must have reset themselves
        o = kda_fused_decode(x, c_f, cw, f, b, A, dtb, s_f, idx, gate, nw, 1e-5, -5.0, value_tile=4)
        for i, s in enumerate(idx.tolist()):
            if s < 0:
                assert (o[i] == 0).all()
                continue
            y = causal_conv1d_step(x[i : i + 1], cw, c_r, torch.tensor([s]))
            q, k, v = (t.view(1, H, K) for t in y.split([H * K] * 3, -1))
            ro, S, _ = gated_delta_recurrent(l2_norm(q), l2_norm(k), v, kda_gate(f[i : i + 1].view(1, H, K), A, dtb, -5.0),
                                             torch.sigmoid(b[i : i + 1]), initial_state=s_r[s].transpose(-1, -2))
            s_r[s] = S.transpose(-1, -2)
            torch.testing.assert_close(o[i], gated_rms_norm(ro[0], gate[i].view(H, K), nw, 1e-5, "sigmoid"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_f, c_r, equal_nan=True)
    torch.testing.assert_close(s_f, s_r, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("gate,lower_bound", [("kda", -5.0), ("kda", None), ("gdn", None)])
def test_chunked_prefill_varlen_checkpoints_against_fp64(gate, lower_bound):
    gen = torch.Generator().manual_seed(5)
    H, HV, K, V = 2, 4, 16, 16
    lens = [37, 16, 70]
    cu = torch.tensor([0, 37, 53, 123])
    N = sum(lens)
    q, k, v, f, b, A, dtb = _batch(gen, 1, N, H, HV, K, V, gate)
    pool = torch.randn(6, HV, K, V, generator=gen)
    pool[0] = NAN  # never named
    idx, init = torch.tensor([4, 1, 3]), torch.tensor([1, 0, 1])
    ck = torch.full((3, HV, K, V), NAN)
    p = pool.clone()
    o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, p, idx, init, gate, lower_bound,
                                 checkpoints=[(0, 32, 0), (2, 48, 1), (2, 70, 2)], checkpoint_pool=ck,
                                 plan=ChunkOverrides(value_tile=8))
    want = {0: [32], 1: [], 2: [48, 70]}
    got = {0: [ck[0]], 1: [], 2: [ck[1], ck[2]]}
    for i, s in enumerate(idx.tolist()):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        g = kda_gate(f[sl], A, dtb, lower_bound) if gate == "kda" else gdn_gate(f[sl], A, dtb)
        ro, rS, saved = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], g, torch.sigmoid(b[sl]),
                                              initial_state=pool[s] if init[i] else None, acc_dtype=torch.float64,
                                              save_positions=want[i])
        torch.testing.assert_close(o[sl].double(), ro.double(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(p[s].double(), rS, rtol=1e-4, atol=1e-4)
        for c, ref in zip(got[i], saved):
            torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-4)
    assert p[0].isnan().all() and not o.isnan().any()
    with pytest.raises(ValueError, match="grid"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, p, idx, init, gate, lower_bound, checkpoints=[(0, 20, 0)], checkpoint_pool=ck)


def test_long_sequence_fp64_error_bound():
    """Chunked-path numerics over 1,024 tokens (64 chunks): relative error vs an FP64
    recurrence stays below 1e-5 in FP32 (documented in docs/kernels.md)."""
    gen = torch.Generator().manual_seed(6)
    T, H, K, V = 1024, 1, 16, 16
    q, k, v, f, b, A, dtb = _batch(gen, 1, T, H, H, K, V, "kda")
    pool = torch.zeros(1, H, K, V)
    o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, torch.tensor([0, T]), pool, torch.tensor([0]), gate="kda",
                                 lower_bound=-5.0, plan=ChunkOverrides(value_tile=16))
    ro, rS, _ = gated_delta_recurrent(l2_norm(q), l2_norm(k), v, kda_gate(f, A, dtb, -5.0), torch.sigmoid(b), acc_dtype=torch.float64)
    rel = lambda a, r: float((a.double() - r).norm() / r.norm())  # noqa: E731
    assert rel(o, ro) < 1e-5 and rel(pool[0], rS) < 1e-5


def test_wrapper_errors_name_the_argument():
    gen = torch.Generator().manual_seed(7)
    q, k, v, f, b, A, dtb = _batch(gen, 2, 1, 1, 1, 8, 8, "kda")
    pool = torch.zeros(2, 1, 8, 8)
    with pytest.raises(ValueError, match="gate"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.tensor([0, 1]), gate="mamba")
    with pytest.raises(ValueError, match="state_layout"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.tensor([0, 1]), state_layout="kvk")
    with pytest.raises(ValueError, match="state_indices"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.tensor([0]))


def _fp64_window(q, k, v, f, b, A, dtb, gate, lb, S0):
    """FP64 recurrence of one request's window from state ``S0`` ``[HV, K, V]``: (o, states after
    each token) with the kernel's gate, beta and L2 norm applied on the host."""
    g = gdn_gate(f, A, dtb) if gate == "gdn" else kda_gate(f, A, dtb, lower_bound=lb)
    T = q.shape[0]
    o, _, saved = gated_delta_recurrent(l2_norm(q), l2_norm(k), v, g, torch.sigmoid(b), initial_state=S0,
                                        acc_dtype=torch.float64, save_positions=range(1, T + 1))
    return o, saved


@pytest.mark.parametrize("gate,lb,T,layout,commit", [("gdn", None, 5, "kv", False), ("kda", -5.0, 4, "vk", True),
                                                     ("kda", None, 3, "kv", True), ("gdn", None, 8, "vk", True)])
def test_chunk_window_verify_matches_fp64_and_fla(gate, lb, T, layout, commit):
    """The matrix-core (chunk) form of a verify window (issue 4, ``form="chunk"``) against an FP64
    recurrence and fla's naive one: GVA for GDN, both pool layouts, a padding row (-1) and a NaN
    slot nobody names; commit writes the final state, no commit leaves the pool as it was."""
    gen = torch.Generator().manual_seed(21)
    B, H, K, V = 3, 2, 16, 32
    HV = 4 if gate == "gdn" else H
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, gate)
    kv_pool = torch.randn(5, HV, K, V, generator=gen)
    kv_pool[1] = NAN
    pool = kv_pool.clone() if layout == "kv" else kv_pool.transpose(-1, -2).contiguous()
    idx = torch.tensor([2, -1, 4])
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, gate, lb, commit=commit,
                                     state_layout=layout, plan=RecurrentOverrides(form="chunk", value_tile=16))
    after = pool if layout == "kv" else pool.transpose(-1, -2)
    assert (o[T:2 * T] == 0).all() and not o.isnan().any()
    assert after[1].isnan().all()
    G = HV // H
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        ro, saved = _fp64_window(q[sl], k[sl], v[sl], f[sl], b[sl], A, dtb, gate, lb, kv_pool[s])
        torch.testing.assert_close(o[sl].double(), ro.double(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(after[s].double(), saved[-1] if commit else kv_pool[s].double(), rtol=1e-5, atol=1e-5)
        if gate == "gdn":
            qq, kk = l2_norm(q[sl]).repeat_interleave(G, 1), l2_norm(k[sl]).repeat_interleave(G, 1)
            fo, _ = naive_recurrent_gated_delta_rule(qq[None], kk[None], v[sl][None], torch.sigmoid(b[sl])[None],
                                                     gdn_gate(f[sl], A, dtb)[None], initial_state=kv_pool[s][None])
            torch.testing.assert_close(o[sl], fo[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate,T", [("gdn", 5), ("kda", 4)])
def test_chunk_window_deferred_commit_and_fused_replay_match_fp64(gate, T):
    """Deferred commit in chunk form (issue 4's matrix-core variant): window 1 commits token 0's state
    and keeps the records (buffers prefilled with NaN), window 2 replays each request's accepted
    prefix (1..T tokens) inside its own chunk, then ``replay_commit(form="chunk")`` rebuilds window 2's
    accepted state. Outputs, committed token-0 states and rebuilt states vs an FP64 recurrence."""
    gen = torch.Generator().manual_seed(22)
    B, H, HV, K, V = T, 1, 2, 16, 32
    w1, w2 = _batch(gen, B, T, H, HV, K, V, gate), _batch(gen, B, T, H, HV, K, V, gate)[:5]
    A, dtb = w1[5], w1[6]
    pool = torch.randn(B + 2, HV, K, V, generator=gen)
    idx = torch.arange(B) + 1
    acc1, acc2 = torch.arange(1, T + 1), torch.arange(T, 0, -1)  # every accepted length in each window
    gk = 1 if gate == "gdn" else K
    rb1, rb2 = (torch.full((B + 2, T - 1, HV, K + gk + 1 + V), NAN) for _ in range(2))
    p = pool.clone()
    o1 = gated_delta_recurrent_triton(*w1[:5], A, dtb, p, idx, T, gate, replay_buffer=rb1,
                                      plan=RecurrentOverrides(form="chunk", value_tile=16))
    o2 = gated_delta_recurrent_triton(*w2, A, dtb, p, idx, T, gate, replay_buffer=rb2, replay_prev=rb1, accept_prev=acc1,
                                      plan=RecurrentOverrides(form="chunk", value_tile=16))
    token0 = p.clone()
    replay_commit(p, idx, acc2, rb2, K, gate, plan=RecurrentOverrides(form="chunk", value_tile=16))
    for i in range(B):
        sl = slice(i * T, (i + 1) * T)
        r1, s1 = _fp64_window(*(x[sl] for x in w1[:5]), A, dtb, gate, None, pool[idx[i]])
        r2, s2 = _fp64_window(*(x[sl] for x in w2), A, dtb, gate, None, s1[acc1[i] - 1])
        torch.testing.assert_close(o1[sl].double(), r1.double(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o2[sl].double(), r2.double(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(token0[idx[i]].double(), s2[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(p[idx[i]].double(), s2[acc2[i] - 1], rtol=1e-5, atol=1e-5)
    untouched = [0, B + 1]
    torch.testing.assert_close(p[untouched], pool[untouched])


def test_chunk_window_refuses_what_it_does_not_serve():
    gen = torch.Generator().manual_seed(23)
    q, k, v, f, b, A, dtb = _batch(gen, 1, 9, 1, 1, 16, 16, "gdn")
    pool = torch.zeros(2, 1, 16, 16)
    with pytest.raises(ValueError, match="T <= 8"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.tensor([0]), 9, "gdn",
                                     plan=RecurrentOverrides(form="chunk"))
    with pytest.raises(ValueError, match="inter_state"):
        gated_delta_recurrent_triton(q[:4], k[:4], v[:4], f[:4], b[:4], A, dtb, pool, torch.tensor([0]), 4, "gdn",
                                     inter_state=torch.zeros(4, 1, 16, 16), inter_indices=torch.arange(4),
                                     plan=RecurrentOverrides(form="chunk"))
    with pytest.raises(ValueError, match="form"):
        gated_delta_recurrent_triton(q[:4], k[:4], v[:4], f[:4], b[:4], A, dtb, pool, torch.tensor([0]), 4, "gdn",
                                     plan=RecurrentOverrides(form="wy"))
