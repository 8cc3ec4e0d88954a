"""Strided index tensors (issue 42): every delta-rule op loads its index tensors as ``ptr + i``, so the
host wrappers make them unit-stride (``delta_rule/slot_index.py``). Column 0 of a ``[B, 4]`` int32
table must give the same outputs and states, bit for bit, as the same indices contiguous, and must
leave the other slots (NaN here: a wrong read shows in the output) untouched. A slot past its pool is
a ``ValueError`` naming the argument (CPU tensors). Triton interpreter, FP32, tiny shapes."""

import pytest
import torch

from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton, replay_commit
from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode
from test_delta_rule_triton import _batch

NAN = float("nan")
SLOTS = 8
# column 0 holds the slots (a padding row too); the other columns hold other requests' slots (0, 2, 6, 7,
# NaN in every pool): a kernel reading the table's first B words takes 5, 6, 0 instead of 5, -1, 3.
TABLE = torch.tensor([[5, 6, 0, 2], [-1, 7, 0, 2], [3, 0, 6, 7]], dtype=torch.int32)
NAMED = (5, 3)


def _pool(gen, *shape):
    p = torch.randn(SLOTS, *shape, generator=gen)
    p[[j for j in range(SLOTS) if j not in NAMED]] = NAN
    return p


def _same_for_strided_and_contiguous(run, col=None):
    """``run(idx)`` -> tuple of tensors (outputs, then pools it wrote); equal for the strided column and its
    contiguous copy; pool rows never named keep their NaN."""
    col = TABLE[:, 0] if col is None else col
    assert not col.is_contiguous()
    want, got = run(col.contiguous()), run(col)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    assert not got[0].isnan().any()
    return got


def _untouched(pool) -> bool:
    """Whether every pool row no request named still holds its NaN."""
    return bool(pool[[j for j in range(pool.shape[0]) if j not in NAMED]].isnan().all())


@pytest.mark.parametrize("kw", [dict(plan=RecurrentOverrides(wide=False, value_tile=4)),
                                dict(plan=RecurrentOverrides(wide=True, value_tile=4)),
                                dict(plan=RecurrentOverrides(wide=True, value_tile=8, key_lanes=2)),
                                dict(plan=RecurrentOverrides(form="chunk", value_tile=8))],
                         ids=["register_tile", "one_warp", "lanes", "chunk_form"])
@pytest.mark.parametrize("T", [1, 3])
def test_decode_and_verify_take_a_strided_state_index_column(kw, T):
    gen = torch.Generator().manual_seed(42)
    B, H, HV, K, V = 3, 1, 2, 32, 32
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, HV, K, V, "gdn")
    base = _pool(gen, HV, V, K)

    def run(idx):
        pool = base.clone()
        o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx, T, "gdn", state_layout="vk", **kw)
        return o, pool

    o, pool = _same_for_strided_and_contiguous(run)
    assert (o[T:2 * T] == 0).all()  # the padding row
    assert _untouched(pool)
    assert not torch.equal(pool[5], base[5])  # committed


@pytest.mark.parametrize("kw", [dict(plan=RecurrentOverrides(wide=False, value_tile=4)),
                                dict(plan=RecurrentOverrides(wide=True, value_tile=4)),
                                dict(plan=RecurrentOverrides(wide=True, value_tile=8, key_lanes=2))],
                         ids=["register_tile", "one_warp", "lanes"])
def test_verify_takes_strided_inter_indices(kw):
    gen = torch.Generator().manual_seed(43)
    B, T, H, K, V = 3, 2, 2, 32, 32
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, H, K, V, "kda")
    base = _pool(gen, H, V, K)
    # snapshot rows per token (column 0; -1: skip), the other columns other requests' rows
    itab = torch.tensor([[4, 0], [1, 6], [-1, 7], [-1, 2], [0, 5], [6, 3]], dtype=torch.int32)

    def run(iidx):
        pool, inter = base.clone(), torch.full((SLOTS, H, V, K), NAN)
        o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, TABLE[:, 0].contiguous(), T, "kda", -5.0,
                                         state_layout="vk", commit=False, inter_state=inter, inter_indices=iidx, **kw)
        return o, pool, inter

    o, pool, inter = _same_for_strided_and_contiguous(run, itab[:, 0])
    torch.testing.assert_close(pool, base, rtol=0, atol=0, equal_nan=True)  # verify does not commit
    saved = {4, 1, 0, 6}
    assert not inter[sorted(saved)].isnan().any() and inter[[2, 3, 5, 7]].isnan().all()


def test_replay_commit_takes_strided_accepted_counts():
    gen = torch.Generator().manual_seed(44)
    B, T, H, K, V = 3, 3, 1, 16, 16
    w1 = _batch(gen, B, T, H, H, K, V, "gdn")
    base = _pool(gen, H, K, V)
    idx = TABLE[:, 0].contiguous()
    rb = torch.zeros(SLOTS, T - 1, H, K + 1 + 1 + V)
    gated_delta_recurrent_triton(*w1, base, idx, T, "gdn", replay_buffer=rb, plan=RecurrentOverrides(value_tile=4))
    acc = torch.tensor([[2, 3], [1, 1], [3, 2]], dtype=torch.int32)

    def run(acc_col):
        pool = base.clone()
        replay_commit(pool, idx, acc_col, rb, K, "gdn", plan=RecurrentOverrides(value_tile=4))
        return pool[list(NAMED)], pool

    named, pool = _same_for_strided_and_contiguous(run, acc[:, 0])
    assert _untouched(pool)
    assert not torch.equal(named[0], base[5]) and not torch.equal(named[1], base[3])  # both replays committed


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_chunk_prefill_takes_strided_indices_flags_and_offsets(method):
    gen = torch.Generator().manual_seed(45)
    H, K, V = 1, 16, 16
    lens = [20, 9, 17]
    N = sum(lens)
    q, k, v, f, b, A, dtb = _batch(gen, 1, N, H, H, K, V, "kda")
    base = _pool(gen, H, K, V)
    init = torch.tensor([[1, 0], [0, 1], [0, 1]], dtype=torch.int32)
    cu = torch.tensor([[0, 9], [20, 9], [29, 9], [46, 9]], dtype=torch.int32)

    def run(idx):
        pool = base.clone()
        strided = not idx.is_contiguous()
        o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu[:, 0] if strided else cu[:, 0].contiguous(), pool, idx,
                                     init[:, 0] if strided else init[:, 0].contiguous(), "kda", -5.0,
                                     plan=ChunkOverrides(value_tile=8, method=method))
        return o, pool

    o, pool = _same_for_strided_and_contiguous(run)
    assert (o[20:29] != 0).any()  # the padding row's tokens still produce outputs; its state goes nowhere
    assert _untouched(pool)


def test_fused_kda_decode_takes_a_strided_state_index_column():
    gen = torch.Generator().manual_seed(46)
    B, H, K, W = 3, 2, 16, 4
    C = 3 * H * K
    x, cw = torch.randn(B, C, generator=gen), torch.randn(C, W, generator=gen) * 0.5
    conv0, ssm0 = _pool(gen, W - 1, C), _pool(gen, H, K, K)
    f, b = torch.randn(B, H * K, generator=gen), torch.randn(B, H, generator=gen)
    A, dtb = torch.rand(H, generator=gen), torch.randn(H * K, generator=gen)
    gate, nw = torch.randn(B, H * K, generator=gen), torch.rand(K, generator=gen) + 0.5

    def run(idx):
        conv, ssm = conv0.clone(), ssm0.clone()
        o = kda_fused_decode(x, conv, cw, f, b, A, dtb, ssm, idx, gate, nw, 1e-5, -5.0, value_tile=4)
        return o, conv, ssm

    o, conv, ssm = _same_for_strided_and_contiguous(run)
    assert _untouched(conv) and _untouched(ssm)
    assert (o[1] == 0).all()  # the padding row (slot -1)
    assert not torch.equal(ssm[5], ssm0[5]) and not torch.equal(ssm[3], ssm0[3])  # both states updated in place
    assert not torch.equal(conv[5], conv0[5])  # the conv window advanced


def test_slots_outside_the_pool_name_the_argument():
    gen = torch.Generator().manual_seed(47)
    B, T, H, K, V = 3, 2, 1, 16, 16
    q, k, v, f, b, A, dtb = _batch(gen, B, T, H, H, K, V, "gdn")
    pool = torch.zeros(4, H, K, V)
    with pytest.raises(ValueError, match=r"state_indices: slot 4 is outside state \(4 slots\)"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.tensor([0, 4, 1]), T, "gdn")
    with pytest.raises(ValueError, match=r"inter_indices: slot 6 is outside inter_state \(6 slots\)"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, torch.tensor([0, 1, 2]), T, "gdn", commit=False,
                                     inter_state=torch.zeros(6, H, K, V), inter_indices=torch.arange(6) + 1)
    with pytest.raises(ValueError, match="state_indices: slot 9 is outside replay_buffer"):
        gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, torch.zeros(10, H, K, V), torch.tensor([0, 9, 1]), T, "gdn",
                                     replay_buffer=torch.zeros(4, T - 1, H, K + 2 + V))
    cu = torch.tensor([0, 2, 4, 6])
    with pytest.raises(ValueError, match="state_indices: slot 7 is outside state"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, torch.tensor([0, 7, 1]), gate="gdn")
    with pytest.raises(ValueError, match="checkpoints: slot 3 is outside checkpoint_pool"):
        gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, torch.tensor([0, 1, 2]), gate="gdn",
                                 checkpoints=[(0, 2, 3)], checkpoint_pool=torch.zeros(3, H, K, V))
    C = 3 * H * K
    with pytest.raises(ValueError, match="state_indices: slot 2 is outside conv_state"):
        kda_fused_decode(torch.zeros(B, C), torch.zeros(2, 3, C), torch.zeros(C, 4), torch.zeros(B, H * K), torch.zeros(B, H),
                         torch.zeros(H), torch.zeros(H * K), torch.zeros(5, H, K, K), torch.tensor([0, 2, 1]),
                         torch.zeros(B, H * K), torch.ones(K))
