"""Fused AttnRes + RMSNorm (Triton interpreter): the persisted running residual is bit-exact with the
unfused ``prefix + addend``; the normalised output matches an FP64 evaluation of the formula and the
unfused reference; the bank row is written only when asked; NaN-prefilled outputs are overwritten."""

import pytest
import torch

from sgl_hybrid_kernel.attn_res import attn_res_rmsnorm, attn_res_rmsnorm_reference
from sgl_hybrid_kernel.attn_res.fused import attn_res_rmsnorm_triton


def _fp64_formula(head, bank, nvb, nw, proj, ow, eps):
    rows = torch.cat([bank[:, :nvb], head.unsqueeze(1)], 1).double()
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps) * nw.double()
    p = (normed @ proj.double().reshape(-1)).softmax(-1)
    mixed = (p.unsqueeze(-1) * rows).sum(1)
    return mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + eps) * ow.double()


def _inputs(gen, T, NB, D, dtype):
    mk = lambda *s: (torch.randn(*s, generator=gen) * 2).to(dtype)  # noqa: E731
    return mk(T, D), mk(T, D), mk(T, NB, D), torch.rand(D, generator=gen) + 0.5, torch.randn(1, D, generator=gen) * 0.3, torch.rand(D, generator=gen) + 0.5


@pytest.mark.parametrize("nvb,with_prefix,write", [(0, True, False), (2, True, True), (4, False, False), (3, True, True)])
def test_fused_matches_formula_and_reference_fp32(nvb, with_prefix, write):
    gen = torch.Generator().manual_seed(nvb * 4 + with_prefix * 2 + write)
    T, NB, D, eps = 3, 4, 96, 1e-6
    prefix, addend, bank, nw, proj, ow = _inputs(gen, T, NB, D, torch.float32)
    prefix = prefix if with_prefix else None
    bank_ref, bank_k = bank.clone(), bank.clone()
    out, head = torch.full((T, D), float("nan")), torch.full((T, D), float("nan"))
    attn_res_rmsnorm_triton(prefix, addend, bank_k, nvb, nw, proj, ow, eps, write_bank=write, out=out, head_out=head)
    ref_out, ref_head = attn_res_rmsnorm_reference(prefix, addend, bank_ref, nvb, nw, proj, ow, eps, write_bank=write)
    assert torch.equal(head, ref_head)
    assert torch.equal(bank_k, bank_ref)  # row nvb written iff asked, nothing else touched
    if write:
        assert torch.equal(bank_k[:, nvb], ref_head)
    torch.testing.assert_close(out.double(), _fp64_formula(ref_head, bank, nvb, nw, proj, ow, eps), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)


def test_running_residual_rounding_is_bit_exact_in_half_precision():
    """FP16 (the interpreter cannot run BF16): head == prefix + addend bit for bit, normed within rounding."""
    gen = torch.Generator().manual_seed(9)
    T, NB, D, eps = 4, 3, 200, 1e-6
    prefix, addend, bank, nw, proj, ow = _inputs(gen, T, NB, D, torch.float16)
    prefix = prefix * 300  # large running sum: the addend's low bits are rounded away
    bank_k = bank.clone()
    out, head = attn_res_rmsnorm_triton(prefix, addend, bank_k, 2, nw, proj, ow, eps, write_bank=True)
    assert torch.equal(head, prefix + addend) and torch.equal(bank_k[:, 2], prefix + addend)
    ref_out, _ = attn_res_rmsnorm_reference(prefix, addend, bank.clone(), 2, nw, proj, ow, eps)
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=4e-3, atol=4e-3)
    assert (head.float() - (prefix.float() + addend.float())).abs().max() > 0  # the rounding is really exercised


def test_dispatch_on_cpu_and_bank_bounds():
    from sgl_hybrid_kernel.dispatch import chosen_paths

    gen = torch.Generator().manual_seed(2)
    prefix, addend, bank, nw, proj, ow = _inputs(gen, 2, 2, 16, torch.float32)
    out, head = attn_res_rmsnorm(prefix, addend, bank, 1, nw, proj, ow, 1e-6)
    ref = attn_res_rmsnorm_reference(prefix, addend, bank, 1, nw, proj, ow, 1e-6)
    assert torch.equal(out, ref[0]) and torch.equal(head, ref[1])
    assert {c.op: c.impl for c in chosen_paths()}["attn_res_rmsnorm"] == "torch"
    with pytest.raises(ValueError, match="num_banked"):
        attn_res_rmsnorm(prefix, addend, bank, 2, nw, proj, ow, 1e-6, write_bank=True)
    with pytest.raises(ValueError, match="num_banked"):
        attn_res_rmsnorm_triton(prefix, addend, bank, 3, nw, proj, ow, 1e-6)
