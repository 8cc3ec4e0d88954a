"""Triton FP8 W8A16 GEMM: ``out = (x @ W_fp8^T) * scale`` with a per-output-channel scale.

One program per ``BLOCK_M x BLOCK_N`` output tile walks ``K`` in steps of
``BLOCK_K``: it loads an activation tile (BF16 serving, FP32 in CPU tests), an
e4m3 weight tile read transposed ``[BLOCK_K, BLOCK_N]`` from the row-major
``[N, K]`` codes, widens the codes to the activation dtype (exact) and
accumulates ``tl.dot`` in FP32. The per-channel scale multiplies the finished
accumulator once, before the single rounding to the output dtype.

Rows past ``M`` and channels past ``N`` are clamped to the last valid one for
the loads (their results are never stored), so the K loop carries no per-element
masks unless ``K`` is not a multiple of ``BLOCK_K`` (``EVEN_K=False``): on CDNA
the masks of a 2-D tile live in scalar registers and spilled them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp8_w8a16_linear_kernel(
    x_ptr,  # [M, K] activations, row stride stride_xm, unit column stride
    w_ptr,  # [N, K] FP8 e4m3 codes (fp8e4nv / fp8e4b8), row stride stride_wn
    scale_ptr,  # [N] FP32 per-output-channel scales
    out_ptr,  # [M, N], row stride stride_om
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no masks in the K loop
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    chans = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_rows = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    w_cols = w_ptr + chans[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_rows + k0)
            w = tl.load(w_cols + k0)
        else:
            x = tl.load(x_rows + k0, mask=(k0 + offs_k)[None, :] < K, other=0.0)
            w = tl.load(w_cols + k0, mask=(k0 + offs_k)[:, None] < K, other=0.0)
        acc = tl.dot(x, w.to(x.dtype), acc)
    s = tl.load(scale_ptr + chans)
    acc = acc * s[None, :]
    o_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])
