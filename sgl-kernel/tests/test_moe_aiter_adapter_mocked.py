"""Fused MoE's aiter path on CPU, with aiter mocked only at its boundary (``fake_aiter.py``).

The fake ``fused_moe`` checks aiter's contract (int32 ids, FP32 weights, contiguous
2-D tokens, weights flagged ``is_shuffled``, ids inside the expert mask's range),
undoes the fake shuffle and computes the reference experts from what it received;
the adapter's pre/post processing must give the reference result. Also: the
load-time weight preparation, fallbacks, the boot gate and the start-up table row.
"""

import pytest
import torch

import sgl_hybrid_kernel.moe.experts as me
from fake_aiter import NO_QUANT, SILU, FakeAiter, fake_shuffle, hide_aiter
from sgl_hybrid_kernel import dispatch
from sgl_hybrid_kernel.moe.aiter_adapter import fused_moe_aiter, shuffle_moe_weights, sink_expert_ids
from sgl_hybrid_kernel.moe.reference import moe_experts

BF16 = torch.bfloat16


@pytest.fixture
def rocm(monkeypatch):
    monkeypatch.setattr(me, "device_kind", lambda t: "rocm")
    me.aiter_moe_fns.cache_clear()
    yield
    me.aiter_moe_fns.cache_clear()


def _experts(M=6, E=4, k=2, D=64, inter=128, seed=0, dtype=BF16):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, D, generator=gen).to(dtype)
    w13 = (torch.randn(E, 2 * inter, D, generator=gen) / D ** 0.5).to(dtype)
    w2 = (torch.randn(E, D, inter, generator=gen) / inter ** 0.5).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)])  # int64, as routing returns
    tw = (torch.rand(M, k, generator=gen) + 0.5).to(dtype)  # not FP32: the adapter converts
    return x, w13, w2, tw, ids


def _reference(x, w13, w2, tw, ids):
    empty = ids < 0
    return moe_experts(x, w13, w2, tw.float().masked_fill(empty, 0.0), ids.masked_fill(empty, 0))


def test_fused_moe_aiter_boundary_mocked_converts_ids_weights_and_passes_shuffled_experts(monkeypatch):
    fake = FakeAiter().install(monkeypatch)
    x, w13, w2, tw, ids = _experts()
    w13s, w2s = shuffle_moe_weights(w13, w2, shuffle_fn=fake_shuffle)
    assert not torch.equal(w13s, w13)  # really permuted
    w13s, w2s = torch.nn.Parameter(w13s, requires_grad=False), torch.nn.Parameter(w2s, requires_grad=False)  # flag lost
    out = fused_moe_aiter(x.t().contiguous().t(), w13s, w2s, tw, ids, weights_shuffled=True, fused_moe_fn=fake.fused_moe,
                          activation=SILU, quant_type=NO_QUANT)
    assert fake.calls == [("fused_moe", (6, 64), False)]
    assert out.shape == x.shape and out.dtype == BF16
    torch.testing.assert_close(out, _reference(x, w13, w2, tw, ids), rtol=0, atol=0)


def test_fused_moe_aiter_boundary_mocked_empty_slots_go_to_a_masked_sink(monkeypatch):
    fake = FakeAiter().install(monkeypatch)
    x, w13, w2, tw, ids = _experts(M=5, E=3, k=3, D=32, seed=3)
    ids[0, 2] = -1
    ids[4, 0] = -1
    w13s, w2s = shuffle_moe_weights(w13, w2, shuffle_fn=fake_shuffle)
    out = fused_moe_aiter(x, w13s, w2s, tw, ids, weights_shuffled=True, has_empty_slots=True)  # defaults: import aiter
    assert fake.calls == [("fused_moe", (5, 32), True)]
    torch.testing.assert_close(out, _reference(x, w13, w2, tw, ids), rtol=0, atol=0)
    sink, mask = sink_expert_ids(ids, 3)
    assert sink.dtype == torch.int32 and sink[0, 2] == 3 and mask.tolist() == [1, 1, 1, 0]


def test_fused_moe_aiter_boundary_mocked_fake_detects_unshuffled_weights(monkeypatch):
    """The fake is sensitive to the layout: weights declared shuffled but passed as loaded give wrong numbers."""
    fake = FakeAiter().install(monkeypatch)
    x, w13, w2, tw, ids = _experts(seed=5)
    out = fused_moe_aiter(x, w13, w2, tw, ids, weights_shuffled=True)
    assert (out.float() - _reference(x, w13, w2, tw, ids).float()).abs().max() > 1e-1
    with pytest.raises(ValueError, match="weights_shuffled"):
        fused_moe_aiter(x, w13, w2, tw, ids, weights_shuffled=False)


def test_fused_moe_aiter_boundary_mocked_rejects_shapes_aiter_cannot_take(monkeypatch):
    fake = FakeAiter().install(monkeypatch)
    x, w13, w2, tw, ids = _experts(inter=64)
    with pytest.raises(ValueError, match="intermediate size 64"):
        shuffle_moe_weights(w13, w2, shuffle_fn=fake_shuffle)
    x, w13, w2, tw, ids = _experts()
    with pytest.raises(ValueError, match="x:"):
        fused_moe_aiter(x.float(), w13, w2, tw, ids, weights_shuffled=True)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_aiter(x, w13, w2, tw[:2], ids[:2], weights_shuffled=True)
    assert fake.calls == []
    assert fused_moe_aiter(x[:0], w13, w2, tw[:0], ids[:0], weights_shuffled=True).shape == (0, 64)
    assert fake.calls == []


def test_dispatch_prepares_shuffled_weights_and_runs_aiter_on_rocm_boundary_mocked(monkeypatch, rocm):
    fake = FakeAiter().install(monkeypatch)
    x, w13, w2, tw, ids = _experts(seed=7)
    weights = me.prepare_moe_weights(w13, w2)
    assert weights.layout == me.LAYOUT_AITER and torch.equal(weights.w13, fake_shuffle(w13))
    out = me.moe_experts(x, weights, tw, ids)
    torch.testing.assert_close(out, _reference(x, w13, w2, tw, ids), rtol=0, atol=0)
    c = {c.op: c for c in dispatch.chosen_paths()}["moe_experts"]
    assert c.impl == "aiter" and "intermediate 128" in c.reason


@pytest.mark.parametrize("why", ["missing", "shape"])
def test_dispatch_falls_back_to_torch_boundary_mocked(monkeypatch, rocm, why):
    if why == "missing":
        hide_aiter(monkeypatch)
        x, w13, w2, tw, ids = _experts(seed=8)
    else:
        fake = FakeAiter().install(monkeypatch)
        x, w13, w2, tw, ids = _experts(inter=96, seed=8)
    ids[2, 1] = -1
    weights = me.prepare_moe_weights(w13, w2)
    assert weights.layout == me.LAYOUT_PLAIN and weights.w13 is w13
    out = me.moe_experts(x, weights, tw, ids, has_empty_slots=True)
    torch.testing.assert_close(out, _reference(x, w13, w2, tw, ids), rtol=0, atol=0)
    c = {c.op: c for c in dispatch.chosen_paths()}["moe_experts"]
    assert c.impl == "torch"
    assert ("aiter does not import" if why == "missing" else "intermediate size 96") in c.reason
    if why == "shape":
        assert fake.calls == []


def test_moe_experts_gate_and_op_table_row_boundary_mocked(monkeypatch, rocm):
    from sglang_hybrid.boot.gates import op_table
    from sglang_hybrid.platforms import Platform

    fake = FakeAiter().install(monkeypatch)
    op = {e.op: e for e in dispatch.registered_ops()}["moe_experts"]
    cpu = torch.device("cpu")
    choice = op.plan(cpu)
    assert choice.impl == "aiter"
    result = op.gate("aiter", cpu)
    assert result.ok and 0 < result.max_abs_err < result.tolerance, result
    table = op_table(Platform("rocm", "gfx950", 256, "mocked", "MI355X"), [choice])
    assert any(line.split()[:2] == ["moe_experts", "aiter"] for line in table.splitlines()), table

    original = fake.fused_moe
    monkeypatch.setattr(fake, "fused_moe", lambda h, w1, w2, tw, ti, **kw: original(h, w1, w2, torch.ones_like(tw), ti, **kw))
    me.aiter_moe_fns.cache_clear()
    FakeAiter.install(fake, monkeypatch)
    broken = op.gate("aiter", cpu)  # routing weights dropped inside "aiter": the gate must fail
    assert not broken.ok and broken.max_abs_err > broken.tolerance


def test_moe_experts_torch_gate_on_cpu():
    op = {e.op: e for e in dispatch.registered_ops()}["moe_experts"]
    assert op.plan(torch.device("cpu")).impl == "torch"
    r = op.gate("torch", torch.device("cpu"))
    assert r.ok and r.max_abs_err < 1e-5
    with pytest.raises(ValueError, match="impl"):
        op.gate("triton", torch.device("cpu"))
