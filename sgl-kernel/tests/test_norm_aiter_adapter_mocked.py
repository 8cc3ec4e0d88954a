"""RMSNorm's aiter path on CPU, with aiter mocked only at its boundary (``fake_aiter.py``).

The fakes check aiter's argument layout and compute the reference math from the
tensors they receive; the adapter's pre/post processing (flattening, contiguity,
dtype checks, allocation of ``out`` / ``residual_out``, restoring the shape) must
then give exactly the reference result. Also: the dispatcher's capability check,
its fallbacks and the start-up table row.
"""

import pytest
import torch

import sgl_hybrid_kernel.norm.dispatch as nd
from fake_aiter import FakeAiter, hide_aiter
from sgl_hybrid_kernel import dispatch
from sgl_hybrid_kernel.norm import reference as norm_ref
from sgl_hybrid_kernel.norm.aiter_adapter import fused_add_rms_norm_aiter, rms_norm_aiter

BF16 = torch.bfloat16


@pytest.fixture
def rocm(monkeypatch):
    """The dispatcher sees ROCm tensors (the platform mocked); decisions start fresh."""
    monkeypatch.setattr(nd, "device_kind", lambda t: "rocm")
    nd.aiter_rms_norm_fns.cache_clear()
    nd._decide.cache_clear()
    yield
    nd.aiter_rms_norm_fns.cache_clear()
    nd._decide.cache_clear()


def _inputs(shape, dtype=BF16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen).to(dtype)
    r = torch.randn(*shape, generator=gen).to(dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(dtype)
    return x, r, w


def test_rms_norm_aiter_boundary_mocked_flattens_strided_3d_input(monkeypatch):
    fake = FakeAiter().install(monkeypatch)
    x, _, w = _inputs((3, 2, 64))
    x = x.transpose(0, 1)  # [2, 3, 64], not contiguous: the adapter must hand aiter contiguous rows
    out = rms_norm_aiter(x, w, 1e-6, rms_fn=fake.rmsnorm2d_fwd)
    assert fake.calls == [("rmsnorm2d_fwd", (6, 64))]
    assert out.shape == (2, 3, 64) and out.dtype == BF16
    assert torch.equal(out, norm_ref.rms_norm(x, w, 1e-6))


def test_fused_add_rms_norm_aiter_boundary_mocked_matches_reference_and_keeps_inputs(monkeypatch):
    fake = FakeAiter().install(monkeypatch)
    x, r, w = _inputs((5, 96), torch.float16)
    x0, r0 = x.clone(), r.clone()
    out, res = fused_add_rms_norm_aiter(x, r, w, 1e-5, add_fn=fake.rmsnorm2d_fwd_with_add)
    want, want_res = norm_ref.fused_add_rms_norm(x0, r0, w, 1e-5)
    assert torch.equal(out, want) and torch.equal(res, want_res)
    assert torch.equal(x, x0) and torch.equal(r, r0)
    assert fake.calls == [("rmsnorm2d_fwd_with_add", (5, 96))]


def test_rms_norm_aiter_boundary_mocked_adapter_rejects_what_aiter_cannot_take(monkeypatch):
    fake = FakeAiter().install(monkeypatch)
    x, r, w = _inputs((2, 32))
    with pytest.raises(ValueError, match="weight dtype"):
        rms_norm_aiter(x, w.float(), 1e-6, rms_fn=fake.rmsnorm2d_fwd)
    with pytest.raises(ValueError, match="activation dtype"):
        rms_norm_aiter(x.float(), w.float(), 1e-6, rms_fn=fake.rmsnorm2d_fwd)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm_aiter(x, r[:1], w, 1e-6, add_fn=fake.rmsnorm2d_fwd_with_add)
    assert fake.calls == []
    empty = rms_norm_aiter(x[:0], w, 1e-6, rms_fn=fake.rmsnorm2d_fwd)  # zero rows: no call
    assert empty.shape == (0, 32) and fake.calls == []


def test_rms_norm_aiter_boundary_mocked_wrong_return_is_an_error(monkeypatch):
    with pytest.raises(RuntimeError, match="rmsnorm2d_fwd returned"):
        x, _, w = _inputs((2, 32))
        rms_norm_aiter(x, w, 1e-6, rms_fn=lambda a, b, c: a.float())


def test_dispatch_takes_aiter_on_rocm_boundary_mocked(monkeypatch, rocm):
    fake = FakeAiter().install(monkeypatch)
    x, r, w = _inputs((4, 128))
    assert torch.equal(nd.rms_norm(x, w, 1e-6), norm_ref.rms_norm(x, w, 1e-6))
    out, res = nd.fused_add_rms_norm(x, r, w, 1e-6)
    want, want_res = norm_ref.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(out, want) and torch.equal(res, want_res)
    assert [c[0] for c in fake.calls] == ["rmsnorm2d_fwd", "rmsnorm2d_fwd_with_add"]
    rows = {c.op: c for c in dispatch.chosen_paths()}
    assert rows["rms_norm"].impl == "aiter" and "rmsnorm2d_fwd" in rows["rms_norm"].reason
    assert rows["fused_add_rms_norm"].impl == "aiter" and "rmsnorm2d_fwd_with_add" in rows["fused_add_rms_norm"].reason


def test_dispatch_falls_back_to_triton_when_aiter_missing(monkeypatch, rocm):
    hide_aiter(monkeypatch)
    x, r, w = _inputs((3, 48), torch.float32)
    out = nd.rms_norm(x, w, 1e-6)  # Triton kernel (interpreter on CPU)
    torch.testing.assert_close(out, norm_ref.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    c = {c.op: c for c in dispatch.chosen_paths()}["rms_norm"]
    assert c.impl == "triton" and "aiter does not import" in c.reason


def test_dispatch_falls_back_when_weight_dtype_differs_boundary_mocked(monkeypatch, rocm):
    fake = FakeAiter().install(monkeypatch)
    x, r, w = _inputs((3, 48))
    out, res = nd.fused_add_rms_norm(x, r, w.float(), 1e-6)  # FP32 weight, BF16 activations: not aiter
    want, want_res = norm_ref.fused_add_rms_norm(x, r, w.float(), 1e-6)
    # Triton path (interpreter on CPU: its BF16 rounding may differ from torch's by one unit)
    torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(res.float(), want_res.float(), rtol=1e-2, atol=1e-2)
    assert fake.calls == []
    c = {c.op: c for c in dispatch.chosen_paths()}["fused_add_rms_norm"]
    assert c.impl == "triton" and "weight dtype torch.float32" in c.reason


def test_dispatch_uses_torch_beyond_the_triton_contract(monkeypatch, rocm):
    hide_aiter(monkeypatch)
    x, _, w = _inputs((1, 8200), torch.float32)
    assert torch.equal(nd.rms_norm(x, w, 1e-6), norm_ref.rms_norm(x, w, 1e-6))
    c = {c.op: c for c in dispatch.chosen_paths()}["rms_norm"]
    assert c.impl == "torch" and "hidden 8200" in c.reason


def test_rms_norm_gates_and_op_table_row_boundary_mocked(monkeypatch, rocm):
    """The registered plans pick aiter on (mocked) ROCm; the aiter gates pass on the fake and fail
    on a fake that drops the weight; the start-up table prints the rows."""
    from sglang_hybrid.boot.gates import op_table
    from sglang_hybrid.platforms import Platform

    fake = FakeAiter().install(monkeypatch)
    ops = {e.op: e for e in dispatch.registered_ops()}
    cpu = torch.device("cpu")
    choices = [ops[name].plan(cpu) for name in ("rms_norm", "fused_add_rms_norm")]
    assert [c.impl for c in choices] == ["aiter", "aiter"]
    for name in ("rms_norm", "fused_add_rms_norm"):
        result = ops[name].gate("aiter", cpu)
        assert result.ok and 0 < result.max_abs_err < result.tolerance, result
    table = op_table(Platform("rocm", "gfx950", 256, "mocked", "MI355X"), choices)
    assert any(line.split()[:2] == ["rms_norm", "aiter"] for line in table.splitlines()), table
    assert any(line.split()[:2] == ["fused_add_rms_norm", "aiter"] for line in table.splitlines()), table

    monkeypatch.setattr(fake, "rmsnorm2d_fwd", lambda input, weight, eps, *a: norm_ref.rms_norm(input, torch.ones_like(weight), eps))
    nd.aiter_rms_norm_fns.cache_clear()
    FakeAiter.install(fake, monkeypatch)
    assert not ops["rms_norm"].gate("aiter", cpu).ok
