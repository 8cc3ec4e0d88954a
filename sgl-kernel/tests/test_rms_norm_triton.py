"""The Triton RMSNorm row kernel (the fallback of the aiter path) in the interpreter, against
the plain-torch reference and an FP64 formula."""

import pytest
import torch

from sgl_hybrid_kernel.norm import reference as norm_ref
from sgl_hybrid_kernel.norm.rms_norm_launch import MAX_D, rms_norm_triton


def _fp64(x, w, eps, r=None):
    s = x.double() + (0 if r is None else r.double())
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w.double(), s


@pytest.mark.parametrize("D", [1, 37, 256, 1000])
def test_rms_norm_triton_matches_fp64_fp32(D):
    gen = torch.Generator().manual_seed(D)
    x = 3 * torch.randn(2, 3, D, generator=gen)
    w = torch.randn(D, generator=gen)
    out = rms_norm_triton(x, w, 1e-5)
    assert out.shape == x.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _fp64(x, w, 1e-5)[0], rtol=1e-5, atol=1e-5)


def test_fused_add_rms_norm_triton_strided_rows_and_bf16():
    gen = torch.Generator().manual_seed(1)
    buf = torch.randn(4, 160, generator=gen).to(torch.bfloat16)
    x = buf[:, :96]  # row stride 160: the kernel reads rows through their stride
    r = torch.randn(4, 96, generator=gen).to(torch.bfloat16)
    w = (1 + 0.3 * torch.randn(96, generator=gen)).to(torch.bfloat16)
    x0, r0 = x.clone(), r.clone()
    out, res = rms_norm_triton(x, w, 1e-6, residual=r)
    want, want_res = norm_ref.fused_add_rms_norm(x0, r0, w, 1e-6)
    assert out.dtype == res.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want.float(), rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(res.float(), want_res.float(), rtol=1.6e-2, atol=1e-2)
    assert torch.equal(x, x0) and torch.equal(r, r0)
    ref64, s64 = _fp64(x0, w, 1e-6, r0)
    # within one BF16 unit (2^-7 relative; the interpreter may truncate) of the FP64 values
    assert ((res.double() - s64).abs() <= s64.abs() * 2 ** -7).all()
    assert ((out.double() - ref64).abs() <= ref64.abs() * 2 ** -6 + 1e-3).all()


def test_rms_norm_triton_zero_rows_and_bad_arguments():
    w = torch.ones(8)
    assert rms_norm_triton(torch.empty(0, 8), w, 1e-6).shape == (0, 8)
    with pytest.raises(ValueError, match="last dimension"):
        rms_norm_triton(torch.randn(1, MAX_D + 1), torch.ones(MAX_D + 1), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_triton(torch.randn(2, 8), w, 1e-6, residual=torch.randn(3, 8))


def test_package_exports_the_reference_function_after_the_triton_wrapper_is_imported():
    """``sgl_hybrid_kernel.norm.rms_norm`` stays the reference function: no submodule of that name
    may shadow it once the Triton path has been imported."""
    from sgl_hybrid_kernel.norm import dispatch  # noqa: F401  (imports the Triton wrapper)
    from sgl_hybrid_kernel.norm import rms_norm

    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 8, generator=gen), torch.rand(8, generator=gen)
    assert callable(rms_norm)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
