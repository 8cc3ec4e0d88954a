"""FP8 W8A16 linear layer with per-output-channel scales (issue 6, seeds digest item 15).

Oracles: the plain-torch reference (codes widened exactly, FP64 sums) for the
Triton kernel under the interpreter, and the unquantised FP64 matmul for the
quantiser, with the rounding bound of e4m3 stated in ``fp8_weight_error_bound``:
``|y_fp8 - y| <= |x| @ bound^T`` elementwise (plus FP32 summation slack).
"""

import pytest
import torch

from sgl_hybrid_kernel.dispatch import chosen_paths
from sgl_hybrid_kernel.fp8_linear import (
    fp8_dtype_for,
    fp8_linear,
    fp8_linear_reference,
    fp8_weight_error_bound,
    quantize_fp8_per_channel,
    triton_fp8_type,
)
from sgl_hybrid_kernel.fp8_linear.linear import default_tile, fp8_linear_triton
from sgl_hybrid_kernel.platform import DevicePlatform

FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def _weights(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    # Rows with different magnitudes (per-channel scales matter), a few tiny entries (subnormal range).
    w = torch.randn(n, k, generator=g) * torch.exp(torch.randn(n, 1, generator=g))
    w[:, :3] *= 1e-4
    return w


@pytest.mark.parametrize("dtype", FP8)
def test_quantiser_stays_within_the_e4m3_rounding_bound(dtype):
    w = _weights(40, 96, 0)
    codes, scale = quantize_fp8_per_channel(w, dtype)
    assert codes.dtype == dtype and scale.shape == (40,) and scale.dtype == torch.float32
    deq = codes.double() * scale.double()[:, None]
    err = (deq - w.double()).abs()
    bound = fp8_weight_error_bound(w, scale, dtype)
    assert bool((err <= bound * (1 + 1e-6)).all())
    assert float((err / bound).max()) > 0.5  # the bound is tight, not vacuous
    # Each row's largest magnitude maps to the format's maximum (up to the FP32 division).
    top = codes.float().abs().amax(1)
    torch.testing.assert_close(top, torch.full_like(top, torch.finfo(dtype).max), rtol=2 ** -3, atol=0)


def test_quantiser_zero_row_and_bad_inputs():
    w = torch.zeros(3, 8)
    w[1] = torch.arange(8.0)
    codes, scale = quantize_fp8_per_channel(w)
    assert scale[0] == 1.0 and scale[2] == 1.0 and codes[0].float().abs().sum() == 0
    assert float(scale[1]) == pytest.approx(7 / 448)
    with pytest.raises(ValueError, match="weight"):
        quantize_fp8_per_channel(torch.zeros(8))
    with pytest.raises(ValueError, match="NaN"):
        quantize_fp8_per_channel(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="fp8_dtype"):
        quantize_fp8_per_channel(w, torch.float16)
    with pytest.raises(ValueError, match="input channels"):
        fp8_linear_reference(torch.zeros(2, 7), codes, scale)
    with pytest.raises(ValueError, match="scale"):
        fp8_linear_reference(torch.zeros(2, 8), codes, scale[:2])


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("M,N,K,tile", [
    (1, 48, 96, (16, 32, 32, 4)),   # decode row; N not a multiple of BLOCK_N (clamped channels)
    (5, 64, 80, (16, 64, 32, 4)),   # 5 verify rows; K tail (EVEN_K=False)
    (19, 40, 64, (16, 32, 64, 4)),  # two row tiles, the second partial
])
def test_triton_kernel_matches_reference_in_interpreter(dtype, M, N, K, tile):
    w = _weights(N, K, M)
    codes, scale = quantize_fp8_per_channel(w, dtype)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(K))
    got = fp8_linear_triton(x, codes, scale, tile=tile)
    want = fp8_linear_reference(x.double(), codes, scale)
    assert got.shape == (M, N) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # Against the unquantised product: inside the stated rounding bound, and not equal to it.
    exact = x.double() @ w.double().t()
    bound = x.double().abs() @ fp8_weight_error_bound(w, scale, dtype).t()
    slack = 1e-5 * (x.double().abs() @ w.double().abs().t())  # FP32 sums
    assert bool(((got.double() - exact).abs() <= bound + slack).all())
    assert float((got.double() - exact).abs().max()) > 0


def test_triton_kernel_batched_leading_dims_and_default_tile():
    w = _weights(32, 64, 3)
    codes, scale = quantize_fp8_per_channel(w)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1))
    got = fp8_linear_triton(x, codes, scale)
    torch.testing.assert_close(got, fp8_linear_reference(x, codes, scale), rtol=1e-5, atol=1e-5)
    assert default_tile(5, 320, 10240) == (16, 32, 128, 4)
    assert default_tile(5, 10240, 320) == (16, 64, 64, 4)
    assert default_tile(300, 10240, 320) == (64, 64, 64, 8)


def test_residual_projection_shapes_relative_error():
    """10,240 -> 320 -> 10,240 (Qwen3.8-Flash-Next) with the reference: the FP8 error of each
    projection's output is about 2-3 % RMS of the output for Gaussian weights (bound: 4 %)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 10240, generator=g)
    for n, k in ((320, 10240), (10240, 320)):
        w = torch.randn(n, k, generator=g) * k ** -0.5
        codes, scale = quantize_fp8_per_channel(w)
        xi = x if k == 10240 else torch.randn(4, 320, generator=g)
        y = fp8_linear_reference(xi, codes, scale)
        exact = xi.double() @ w.double().t()
        rel = float((y.double() - exact).norm() / exact.norm())
        assert 0.005 < rel < 0.04, rel


def test_dispatch_on_cpu_uses_reference_and_records_it():
    w = _weights(16, 32, 9)
    codes, scale = quantize_fp8_per_channel(w)
    x = torch.randn(3, 32)
    torch.testing.assert_close(fp8_linear(x, codes, scale), fp8_linear_reference(x, codes, scale), rtol=0, atol=0)
    choice = {c.op: c for c in chosen_paths()}["fp8_linear"]
    assert choice.impl == "torch" and "CPU" in choice.reason


def test_fp8_flavour_per_platform():
    assert fp8_dtype_for(DevicePlatform("rocm", "gfx942", 304)) == torch.float8_e4m3fnuz
    assert fp8_dtype_for(DevicePlatform("rocm", "gfx950", 256)) == torch.float8_e4m3fn
    assert fp8_dtype_for(DevicePlatform("cuda", "sm90", 132)) == torch.float8_e4m3fn
    assert fp8_dtype_for(DevicePlatform("cpu")) == torch.float8_e4m3fn
    assert triton_fp8_type(torch.float8_e4m3fnuz) == "fp8e4b8" and triton_fp8_type(torch.float8_e4m3fn) == "fp8e4nv"
    with pytest.raises(ValueError, match="dtype"):
        triton_fp8_type(torch.bfloat16)
