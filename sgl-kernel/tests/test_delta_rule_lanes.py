"""The lanes kernel (``delta_rule/triton_lanes.py``, issue 4): per-token prologue + a state tile with the
warp's lanes split between keys and value columns. Triton interpreter, FP32, tiny shapes; fla's naive
recurrences as the outside oracle; bit-exact deferred commit across its modes; the tile rule; and, for
the installed Triton, that the compiled state tile really puts lanes on the value axis."""

import ast
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from fla.ops.kda.gate import naive_kda_lowerbound_gate
from fla.ops.kda.naive import naive_recurrent_kda

import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as rec
import sgl_hybrid_kernel.delta_rule.plan as plan_mod
import sgl_hybrid_kernel.delta_rule.recurrent.rules as rules
from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton, replay_commit
from sgl_hybrid_kernel.delta_rule.recurrent.rules import pick_lanes_tile
from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import _fold_last
from sgl_hybrid_kernel.delta_rule.naive import gdn_gate
from sgl_hybrid_kernel.norm import l2_norm
from test_delta_rule_triton import _batch  # the same random inputs as the one-warp kernel's tests

NAN = float("nan")


def _naive(gate, q, k, v, f, b, A, dtb, lb, S0, G):
    """fla's naive recurrence for one request's window (V-major pool slice ``S0`` [HV, V, K])."""
    qq, kk = l2_norm(q).repeat_interleave(G, 1), l2_norm(k).repeat_interleave(G, 1)
    s0 = S0.transpose(-1, -2)[None]  # fla: [K, V]
    if gate == "kda":
        o, S = naive_recurrent_kda(qq[None], kk[None], v[None], naive_kda_lowerbound_gate(f, A, dtb, lower_bound=lb)[None],
                                   torch.sigmoid(b)[None], initial_state=s0, output_final_state=True)
    else:
        o, S = naive_recurrent_gated_delta_rule(qq[None], kk[None], v[None], torch.sigmoid(b)[None], gdn_gate(f, A, dtb)[None],
                                                initial_state=s0, output_final_state=True)
    return o[0], S[0].transpose(-1, -2)


@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("gate,T,value_tile,key_lanes,commit", [("gdn", 3, 8, 2, True), ("kda", 4, 16, 4, False),
                                                                ("gdn", 1, 16, 8, True), ("kda", 2, 4, 1, True)])
def test_lanes_kernel_matches_fla_naive(monkeypatch, v_first, gate, T, value_tile, key_lanes, commit):
    """Outputs and committed states against fla's naive recurrences: GVA for GDN, a padding row whose
    slot holds NaN (zeros out, pool untouched), both tile arrangements (``V_FIRST``)."""
    monkeypatch.setattr(plan_mod, "lanes_v_first", lambda: v_first)
    gen = torch.Generator().manual_seed(21)
    B, H, K, V = 3, 2, 32, 32
    HV = 4 if gate == "gdn" else H
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, gate)
    pool = torch.randn(5, HV, V, K, generator=gen) * 0.5
    pool[1] = NAN
    before = pool.clone()
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    lb = -5.0 if gate == "kda" else None
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, gate, lb, state_layout="vk", commit=commit,
                                     plan=RecurrentOverrides(value_tile=value_tile, key_lanes=key_lanes))
    assert (o[T:2 * T] == 0).all() and not o.isnan().any()
    assert pool[1].isnan().all()
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        ro, rS = _naive(gate, q[sl], k[sl], v[sl], f[sl], b[sl], A, dtb, lb, before[s], HV // H)
        torch.testing.assert_close(o[sl], ro, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[s], rS if commit else before[s], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate", ["gdn", "kda"])
def test_lanes_deferred_commit_is_bit_exact_against_snapshots(gate):
    """One binary for every mode: the deferred verify's outputs equal the snapshot verify's, the state
    that replay_commit rebuilds from the records equals the snapshot of the last accepted token, and a
    next window with the replay fused equals a plain window started from those snapshots; bit for bit.
    A padding row keeps its NaN slot untouched and writes no record."""
    gen = torch.Generator().manual_seed(22)
    B, T, H, K, V, bv, kl = 4, 4, 2, 32, 16, 8, 4
    HV = 4 if gate == "gdn" else H
    lb = -5.0 if gate == "kda" else None
    w1, w2 = _batch(gen, B, T, H, HV, K, V, gate), _batch(gen, B, T, H, HV, K, V, gate)
    A, dtb = w1[5], w1[6]
    pool = torch.randn(7, HV, V, K, generator=gen) * 0.3
    pool[6] = NAN
    idx = torch.tensor([2, 6, 0, 5], dtype=torch.int32)
    idx_pad = torch.tensor([2, -1, 0, 5], dtype=torch.int32)
    acc = torch.tensor([1, 2, 4, 3], dtype=torch.int32)
    kw = dict(state_layout="vk", plan=RecurrentOverrides(value_tile=bv, key_lanes=kl))
    N = B * T
    inter = torch.zeros(N, HV, V, K)
    o_s = gated_delta_recurrent_triton(*w1[:5], A, dtb, pool.clone(), idx_pad, T, gate, lb, commit=False, inter_state=inter,
                                       inter_indices=torch.arange(N, dtype=torch.int32), **kw)
    gk = 1 if gate == "gdn" else K
    rb1, rb2 = (torch.full((7, T - 1, HV, K + gk + 1 + V), NAN) for _ in range(2))
    p_def = pool.clone()
    o_d = gated_delta_recurrent_triton(*w1[:5], A, dtb, p_def, idx_pad, T, gate, lb, replay_buffer=rb1, **kw)
    assert torch.equal(o_s, o_d)
    assert rb1[6].isnan().all() and p_def[6].isnan().all()  # the padding row's slot: no record, no state
    p_fused = p_def.clone()
    replay_commit(p_def, idx_pad, acc, rb1, K, gate, state_layout="vk", num_k_heads=H,
                  activation_dtype=torch.float32, lower_bound=lb, plan=RecurrentOverrides(value_tile=bv, key_lanes=kl))
    live = [i for i, s in enumerate(idx_pad.tolist()) if s >= 0]
    for i in live:
        assert torch.equal(p_def[int(idx[i])], inter[i * T + int(acc[i]) - 1])
    p_ref = pool.clone()
    for i in live:
        p_ref[int(idx[i])] = inter[i * T + int(acc[i]) - 1]
    o2_ref = gated_delta_recurrent_triton(*w2[:5], A, dtb, p_ref, idx_pad, T, gate, lb, commit=True, **kw)
    o2_f = gated_delta_recurrent_triton(*w2[:5], A, dtb, p_fused, idx_pad, T, gate, lb, replay_buffer=rb2, replay_prev=rb1,
                                        accept_prev=acc, **kw)
    assert torch.equal(o2_ref, o2_f)
    # and the lanes kernel agrees with the one-warp kernel to FP32 rounding (different summation order)
    o_w = gated_delta_recurrent_triton(*w1[:5], A, dtb, pool.clone(), idx_pad, T, gate, lb, state_layout="vk", commit=False,
                                       plan=RecurrentOverrides(value_tile=bv, key_lanes=0))
    torch.testing.assert_close(o_s, o_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gate", ["gdn", "kda"])
@pytest.mark.parametrize("verify_lanes,replay_lanes", [(4, 0), (0, 4)])
def test_replay_records_work_across_kernels(gate, verify_lanes, replay_lanes):
    """Both kernels write the same record format (k, log decay, beta, v), so a window verified by one
    kernel and replayed by the other (the batch, hence the rule's choice, changed in between) rebuilds the
    accepted state: equal to the snapshots to FP32 rounding (bit for bit only within one kernel)."""
    gen = torch.Generator().manual_seed(25)
    B, T, H, K, V, bv = 3, 4, 2, 32, 16, 8
    HV = 4 if gate == "gdn" else H
    lb = -5.0 if gate == "kda" else None
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, gate)
    pool = torch.randn(4, HV, V, K, generator=gen) * 0.3
    idx = torch.tensor([3, 0, 2], dtype=torch.int32)
    acc = torch.tensor([2, 4, 3], dtype=torch.int32)
    N = B * T
    inter = torch.zeros(N, HV, V, K)
    gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool.clone(), idx, T, gate, lb, state_layout="vk", commit=False,
                                 inter_state=inter, inter_indices=torch.arange(N, dtype=torch.int32),
                                 plan=RecurrentOverrides(value_tile=bv, key_lanes=verify_lanes))
    gk = 1 if gate == "gdn" else K
    rb = torch.zeros(4, T - 1, HV, K + gk + 1 + V)
    p = pool.clone()
    gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, p, idx, T, gate, lb, state_layout="vk", replay_buffer=rb,
                                 plan=RecurrentOverrides(value_tile=bv, key_lanes=verify_lanes))
    replay_commit(p, idx, acc, rb, K, gate, state_layout="vk", num_k_heads=H,
                  activation_dtype=torch.float32, lower_bound=lb,
                  plan=RecurrentOverrides(value_tile=bv, key_lanes=replay_lanes))
    for i, s in enumerate(idx.tolist()):
        torch.testing.assert_close(p[s], inter[i * T + int(acc[i]) - 1], rtol=1e-5, atol=1e-5)


def test_lanes_tile_rule_follows_the_h200_sweep():
    """16 columns x 8 key lanes: plain verify windows of either gate from 8 programs per SM at 16 columns
    (132 SMs: B * HV >= 132), GDN's all-modes windows from 64 (B * HV >= 1056) at any T; GDN's plain
    windows below that at 8 columns from 4 programs per SM at 8 columns (B * HV >= 33); never decode,
    never KDA's all-modes windows, never a shape outside the kernel's contract."""
    kda = [pick_lanes_tile(b, 12, 128, 128, 4, True) for b in (1, 4, 8, 10, 11, 16, 32, 128)]
    assert kda == [None, None, None, None, (16, 8), (16, 8), (16, 8), (16, 8)]
    gdn = [pick_lanes_tile(b, 48, 128, 128, 5, False) for b in (1, 2, 3, 4, 32)]
    assert gdn == [(8, 8), (8, 8), (16, 8), (16, 8), (16, 8)]
    assert pick_lanes_tile(1, 32, 128, 128, 5, False) is None  # 512 programs at 8 columns: under 4 per SM
    assert pick_lanes_tile(1, 48, 128, 128, 5, False, plain=False) is None  # the narrow tile is for plain windows
    assert pick_lanes_tile(128, 12, 128, 128, 1, True) is None and pick_lanes_tile(128, 48, 128, 128, 1, False) is None
    assert [pick_lanes_tile(22, 48, 128, 128, t, False, plain=False) for t in (1, 5, 8)] == [(16, 8)] * 3
    assert pick_lanes_tile(21, 48, 128, 128, 5, False, plain=False) is None
    assert pick_lanes_tile(32, 12, 128, 128, 4, True, plain=False) is None
    assert pick_lanes_tile(32, 48, 128, 96, 5, False) is None and pick_lanes_tile(32, 48, 120, 128, 5, False) is None


def test_wrapper_takes_the_lanes_kernel_by_the_rule(monkeypatch):
    """Serving shapes (interpreter = the H200 table), kernels replaced by spies: plain GDN verify at B=32
    and KDA at B=16 launch the prologue and the lanes kernel (16 columns, 8 key lanes, PLAIN); GDN
    deferred verify, its fused replay and replay_commit launch the same lanes binary; KDA verify at
    B=8, decode and an explicit ``value_tile`` keep the one-warp kernel."""
    launched = []

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append((self.name, kw.get("BV"), kw.get("KL"), kw.get("PLAIN")))

    for name in ("gated_delta_verify_lanes_kernel", "token_prep_kernel", "gated_delta_verify_wide_kernel"):
        monkeypatch.setattr(rec, name, Spy(name))
    gen = torch.Generator().manual_seed(23)

    def launch(B, T, H, HV, gate, **kw):
        q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, 128, 128, gate)
        pool = torch.zeros(B, HV, 128, 128)
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.arange(B, dtype=torch.int32), T, gate,
                                     -5.0 if gate == "kda" else None, state_layout="vk", **kw)

    launch(32, 5, 16, 48, "gdn", commit=False)
    launch(16, 4, 12, 12, "kda", commit=False)
    assert launched == [("token_prep_kernel", None, None, None), ("gated_delta_verify_lanes_kernel", 16, 8, True)] * 2
    launched.clear()
    rb = [torch.zeros(32, 4, 48, 128 + 1 + 1 + 128) for _ in range(2)]
    launch(32, 5, 16, 48, "gdn", replay_buffer=rb[0])
    launch(32, 5, 16, 48, "gdn", replay_buffer=rb[1], replay_prev=rb[0], accept_prev=torch.full((32,), 2, dtype=torch.int32))
    replay_commit(torch.zeros(32, 48, 128, 128), torch.arange(32, dtype=torch.int32), torch.full((32,), 2), rb[1], 128, "gdn",
                  state_layout="vk", num_k_heads=16)
    assert launched == [("token_prep_kernel", None, None, None), ("gated_delta_verify_lanes_kernel", 16, 8, False)] * 3
    launched.clear()
    launch(8, 4, 12, 12, "kda", commit=False)
    launch(32, 1, 16, 48, "gdn", commit=True)
    launch(32, 5, 16, 48, "gdn", commit=False, plan=RecurrentOverrides(value_tile=8))
    assert [name for name, *_ in launched] == ["gated_delta_verify_wide_kernel"] * 3


def test_lanes_kernel_refuses_shapes_outside_its_contract():
    gen = torch.Generator().manual_seed(24)
    q, k, v, f, b, A, dtb = _batch(gen, 2, 2, 2, 2, 24, 16, "gdn")
    with pytest.raises(ValueError, match="key_lanes"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, torch.zeros(2, 2, 16, 24), torch.arange(2), 2, "gdn",
                                     state_layout="vk", plan=RecurrentOverrides(value_tile=8, key_lanes=4))


def _run_compiled(code: str) -> str:
    """stdout of ``code`` run in a subprocess without ``TRITON_INTERPRET`` (this suite runs the interpreter; the
    checks below read what Triton compiles for sm_90)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_installed_triton_puts_lanes_on_the_value_axis():
    """Speed, not correctness: with the installed Triton's coalescing (``lanes_v_first``), the state tile of
    the served config compiles (sm_90) to 8 lanes on the keys and 4 on the value columns; the other
    arrangement would put every lane on the keys (Triton 3.6 and 3.7+ break the tie between the two
    non-contiguous axes in opposite directions). Compiled in a subprocess: this suite runs the interpreter."""
    out = _run_compiled("from sgl_hybrid_kernel.compile_gate import blocked_layouts; "
                        "from sgl_hybrid_kernel.delta_rule.recurrent.triton_lanes import lanes_v_first; "
                        "print(lanes_v_first(), [t for s, t in blocked_layouts('gdn_lanes_t5_bv16_kl8') if len(t) == 3])")
    v_first, three_d = out.split(" ", 1)
    three_d = ast.literal_eval(three_d)
    assert three_d, "no 3-D state layout in the compiled kernel"
    v_axis = 0 if v_first == "True" else 1
    # the tile itself, and its [BV, KC, KB] view that the key-block sum folds (triton_recurrent._fold_last)
    tile = [t for t in three_d if t[2] == 8 and t[v_axis] == 4]
    assert tile, three_d
    assert all(t in tile or t == (4, 8, 1) for t in three_d), three_d


@pytest.mark.parametrize("plat, env, want", [
    (("cuda", "sm90"), None, True),
    (("cuda", "sm100"), None, True),
    (("cuda", "sm90"), "0", False),  # SGL_HYBRID_LANES_PDL=0 turns it off
    (("cuda", "sm86"), None, False),  # griddepcontrol needs sm_90
    (("rocm", "gfx950"), None, False),
    (("cpu", None), None, False),
])
def test_programmatic_dependent_launch_only_on_sm90_and_newer(monkeypatch, plat, env, want):
    """``lanes_pdl`` decides whether the prologue -> lanes pair is launched with programmatic dependent
    launch (the lanes kernel's ``gdc_wait`` is NVIDIA-only PTX): sm_90 and newer, not on ROCm / CPU /
    older NVIDIA, and not when the environment turns it off."""
    from sgl_hybrid_kernel.platform import DevicePlatform, Target

    target = Target.from_platform(DevicePlatform(*plat), interpreter=False)
    if env is None:
        monkeypatch.delenv("SGL_HYBRID_LANES_PDL", raising=False)
    else:
        monkeypatch.setenv("SGL_HYBRID_LANES_PDL", env)
    assert rules.lanes_pdl(target) is want


@pytest.mark.parametrize("version, plain, per_channel, bv, want", [
    ((3, 6), True, False, 16, True),  # Triton 3.6: every window keeps it
    ((3, 8), True, False, 16, False),  # 3.7+: plain GDN windows launch plainly
    ((3, 8), True, False, 8, True),  # ... except at the narrow 8-column tile
    ((3, 8), True, True, 16, True),  # KDA plain windows keep it
    ((3, 8), False, False, 16, True),  # GDN deferred / snapshot windows keep it
])
def test_plain_gdn_windows_skip_programmatic_dependent_launch_from_triton_3_7(monkeypatch, version, plain, per_channel, bv,
                                                                               want):
    """``lanes_pdl``'s version rule (H200 figures in its docstring): only plain windows with a per-head decay
    (GDN) over 8 columns under Triton >= 3.7 lose the programmatic dependent launch; the kernel pair honours the
    answer."""
    from sgl_hybrid_kernel.platform import Target

    target = Target("cuda", "sm90", 132, False, version)
    monkeypatch.delenv("SGL_HYBRID_LANES_PDL", raising=False)
    assert rules.lanes_pdl(target, plain, per_channel, bv) is want
    assert rules.lanes_pdl(target) is True  # callers that do not name the window keep the old answer


@pytest.mark.parametrize("version", [(3, 6), (3, 8)])
def test_lanes_pair_launches_as_the_pdl_rule_says(monkeypatch, version):
    """The wrapper hands ``lanes_pdl``'s answer for the window to both kernels of the pair (``PDL``) and to the
    lanes kernel's launch (``launch_pdl``): on an sm_90 device under Triton 3.8 a plain GDN window at 16 columns goes
    without it, one at 8 columns, a plain KDA window and a deferred GDN window with it; under 3.6 all with it. Kernels
    replaced by spies."""
    from sgl_hybrid_kernel.platform import Target

    if rules.gdc_wait is None:
        pytest.skip("this Triton has no grid dependency control: lanes_pdl is always False")
    launched = []

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append((self.name, kw.get("PDL"), kw.get("launch_pdl", False)))

    for name in ("gated_delta_verify_lanes_kernel", "token_prep_kernel"):
        monkeypatch.setattr(rec, name, Spy(name))
    monkeypatch.setattr(Target, "of", staticmethod(lambda device: Target("cuda", "sm90", 132, True, version)))
    monkeypatch.delenv("SGL_HYBRID_LANES_PDL", raising=False)
    gen = torch.Generator().manual_seed(25)

    def launch(B, T, H, HV, gate, bv=16, **kw):
        q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, 128, 128, gate)
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, torch.zeros(B, HV, 128, 128), torch.arange(B, dtype=torch.int32),
                                     T, gate, -5.0 if gate == "kda" else None, state_layout="vk", **kw,
                                     plan=RecurrentOverrides(key_lanes=8, value_tile=bv))
        got = launched[-2:]
        launched.clear()
        return got

    on = version >= (3, 7)
    pair = lambda pdl: [("token_prep_kernel", pdl, False), ("gated_delta_verify_lanes_kernel", pdl, pdl)]  # noqa: E731
    assert launch(4, 5, 16, 48, "gdn", commit=False) == pair(not on)
    assert launch(2, 5, 16, 48, "gdn", bv=8, commit=False) == pair(True)  # the narrow tile keeps it
    assert launch(4, 4, 12, 12, "kda", commit=False) == pair(True)
    assert launch(4, 5, 16, 48, "gdn", replay_buffer=torch.zeros(4, 4, 48, 128 + 1 + 1 + 128)) == pair(True)


@triton.jit
def _fold_kernel(x_ptr, o_ptr, A: tl.constexpr, C: tl.constexpr, N: tl.constexpr):
    o = tl.arange(0, A)[:, None, None] * (C * N) + tl.arange(0, C)[None, :, None] * N + tl.arange(0, N)[None, None, :]
    s = _fold_last(tl.load(x_ptr + o), N)
    tl.store(o_ptr + tl.arange(0, A)[:, None] * C + tl.arange(0, C)[None, :], s)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_fold_last_adds_in_index_order(n):
    """``_fold_last`` (the lanes and one-warp kernels' in-thread key sums) adds ``((x0 + x1) + x2) + ...`` per row:
    random FP32 values over 40 binary orders of magnitude, different in every row, equal bit for bit to a
    left-to-right FP32 sum of the same row; for n >= 4 a balanced tree of the same values differs somewhere
    (so the check tells the two orders apart)."""
    gen = torch.Generator().manual_seed(n)
    A, C = 2, 4
    x = (torch.randn(A, C, n, generator=gen).sign() * torch.exp2(torch.rand(A, C, n, generator=gen) * 40 - 20)).float()
    want = x[..., 0].clone()
    for j in range(1, n):
        want = want + x[..., j]  # FP32, index order
    out = torch.empty(A, C)
    _fold_kernel[(1,)](x.contiguous(), out, A=A, C=C, N=n)
    assert torch.equal(out, want), (out - want).abs().max()
    if n >= 4:
        tree = x
        while tree.shape[-1] > 1:
            tree = tree[..., 0::2] + tree[..., 1::2]
        assert not torch.equal(tree[..., 0], want)


@pytest.mark.parametrize("vendor, interpreter, want", [
    ("cuda", False, True),  # CUDA: the key blocks in index order
    ("rocm", False, False),  # ROCm: compiled, not run, so off
    ("cpu", True, True),  # the interpreter runs the CUDA form (these tests)
    ("cpu", False, False),
])
def test_lanes_fold_rule(vendor, interpreter, want):
    """``recurrent.rules.lanes_fold``: ``FOLD`` on CUDA and in the interpreter only; one answer per target, so a
    window and its replays sum alike."""
    from sgl_hybrid_kernel.platform import Target

    assert rules.lanes_fold(Target(vendor, interpreter=interpreter)) is want


def test_replay_records_and_states_are_stored_streaming():
    """A deferred window's replay records are read only by the next window's replay, so they are stored
    streaming (``st.global.cs``, ``triton_recurrent.RECORD_STORE_CACHE``) like the states (H200: GDN deferred
    B=32 70.3 -> 68.3 us, issue 4, twenty-first round). Checked in the sm_90 PTX the wrappers launch: the prologue
    writes its records streaming and its lanes-kernel inputs (read at once) plainly; the one-warp all-modes
    binary writes every FP32 value (state, snapshots, records) streaming and only the BF16 outputs plainly.
    Compiled in a subprocess: this suite runs the interpreter."""
    out = _run_compiled("import collections, re; from sgl_hybrid_kernel.compile_gate import compiled_asm; "
                        "print([dict(collections.Counter(re.findall(r'st\\.global[.\\w]*', compiled_asm(n)['ptx']))) "
                        "for n in ('token_prep_gdn_t5_hb8', 'gdn_verify1w_t5_bv8_allmodes_xred')])")
    prep, one_warp = ast.literal_eval(out.strip().splitlines()[-1])
    assert sum(n for op, n in prep.items() if ".cs." in op) >= 4, prep  # k, g, beta and v of the records
    assert sum(n for op, n in prep.items() if ".cs." not in op) > 0, prep  # q, k, gates for the lanes kernel
    plain = {op: n for op, n in one_warp.items() if ".cs." not in op}
    assert plain and all(op.endswith(".b16") for op in plain), one_warp
