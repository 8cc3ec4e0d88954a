"""Triton kernel merging partial attention results by their LSE (split-KV and DCP).

One program per (row, head). The maximum LSE is taken first, then each part is
weighted by ``exp(lse_i - max)``; parts with ``lse_i = -inf`` get weight 0 and
their (possibly unwritten) outputs are never read into the sum, so an empty
part cannot inject a NaN. An all-empty row stores ``(0, -inf)``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_partials_kernel(
    part_ptr,  # partial outputs, element (r, h, s, d) at r*stride_pr + h*stride_ph + s*stride_ps + d
    part_lse_ptr,  # partial LSE, (r, h, s) at r*stride_lr + h*stride_lh + s*stride_ls (natural log)
    out_ptr,  # [R, H, DV]
    lse_out_ptr,  # [R, H] FP32
    S,
    stride_pr,
    stride_ph,
    stride_ps,
    stride_lr,
    stride_lh,
    stride_ls,
    stride_or,
    stride_oh,
    stride_lor,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    lse_base = part_lse_ptr + r * stride_lr + h * stride_lh
    offs_s = tl.arange(0, BLOCK_S)
    m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, S, BLOCK_S):
        ls = tl.load(lse_base + (s0 + offs_s) * stride_ls, mask=s0 + offs_s < S, other=float("-inf"))
        m = tl.maximum(m, ls)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    offs_d = tl.arange(0, BLOCK_DV)
    dmask = offs_d < DV
    acc = tl.zeros([BLOCK_DV], tl.float32)
    total = 0.0
    part_base = part_ptr + r * stride_pr + h * stride_ph
    for s in range(0, S):
        ls = tl.load(lse_base + s * stride_ls)
        w = tl.where(ls == float("-inf"), 0.0, tl.exp(ls - m_safe))
        o = tl.load(part_base + s * stride_ps + offs_d, mask=dmask, other=0.0).to(tl.float32)
        acc += tl.where(w > 0.0, w * o, 0.0)  # an empty part's output is never trusted (NaN-safe)
        total += w
    has = total > 0.0
    out = tl.where(has, acc / tl.where(has, total, 1.0), 0.0)
    tl.store(out_ptr + r * stride_or + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=dmask)
    lse = tl.where(has, m_safe + tl.log(tl.where(has, total, 1.0)), float("-inf"))
    tl.store(lse_out_ptr + r * stride_lor + h, lse)
