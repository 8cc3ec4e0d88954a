"""Triton kernel: one AttnRes read fused with its RMSNorm, one program per token row.

The program forms the running residual ``head = prefix + addend`` in FP32 and
stores it rounded once to the activation dtype (the same rounding as the unfused
``prefix + addend``: bit-exact), optionally also into the bank's next row. It then
streams the ``nvb`` banked rows and the head once each with an online softmax
over their scores ``score_r = rrms(row_r) * sum(row_r * cw)`` (``cw = score norm
weight * projection``, FP32): the mixture stays in FP32 registers and is RMS-
normalised and scaled by the output norm weight before its single store
(seeds digest item 6: AttnRes + RMSNorm fusion).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attn_res_rmsnorm_kernel(
    prefix_ptr,  # [T, D] (unused without HAS_PREFIX)
    addend_ptr,  # [T, D]
    bank_ptr,  # [T, NB, D]
    cw_ptr,  # [D] FP32: score norm weight * score projection
    norm_w_ptr,  # [D] output RMSNorm weight
    out_ptr,  # [T, D] normalised mixture
    head_ptr,  # [T, D] running residual (may alias nothing else)
    NVB,
    eps,
    stride_pt,
    stride_at,
    stride_bt,
    stride_bb,
    stride_ot,
    stride_ht,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    WRITE_BANK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    dmask = offs < D
    head = tl.load(addend_ptr + t * stride_at + offs, mask=dmask, other=0.0).to(tl.float32)
    if HAS_PREFIX:
        head += tl.load(prefix_ptr + t * stride_pt + offs, mask=dmask, other=0.0).to(tl.float32)
    head_q = head.to(head_ptr.dtype.element_ty)  # the persisted rounding
    tl.store(head_ptr + t * stride_ht + offs, head_q, mask=dmask)
    if WRITE_BANK:
        tl.store(bank_ptr + t * stride_bt + NVB * stride_bb + offs, head_q, mask=dmask)
    head = head_q.to(tl.float32)
    cw = tl.load(cw_ptr + offs, mask=dmask, other=0.0)

    # the head row first: it is always present, so the running max starts finite
    m = tl.rsqrt(tl.sum(head * head, axis=0) / D + eps) * tl.sum(head * cw, axis=0)
    total = 1.0
    mixed = head
    for r in range(0, NVB):
        row = tl.load(bank_ptr + t * stride_bt + r * stride_bb + offs, mask=dmask, other=0.0).to(tl.float32)
        score = tl.rsqrt(tl.sum(row * row, axis=0) / D + eps) * tl.sum(row * cw, axis=0)
        m_new = tl.maximum(m, score)
        alpha = tl.exp(m - m_new)
        w = tl.exp(score - m_new)
        mixed = mixed * alpha + w * row
        total = total * alpha + w
        m = m_new
    mixed = mixed / total
    rrms = tl.rsqrt(tl.sum(mixed * mixed, axis=0) / D + eps)
    nw = tl.load(norm_w_ptr + offs, mask=dmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_ot + offs, (mixed * rrms * nw).to(out_ptr.dtype.element_ty), mask=dmask)
