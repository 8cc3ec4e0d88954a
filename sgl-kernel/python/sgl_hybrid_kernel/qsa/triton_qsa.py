"""Triton QSA attention: the sparse path (selected compressed blocks) and the exact dense special case.

One kernel, two walks (``SPARSE`` constexpr), grid ``(query groups, KV heads, splits)``:

* sparse: a program is one query row x the ``G`` query heads of one KV head; it
  walks the row's selected blocks ``BLOCK_N // RATIO`` at a time, expanding each
  block id to its ``RATIO`` positions (``-1`` ids and positions past the row's
  causal limit are masked).
* dense: a program is all ``T`` rows of one request (e.g. 5 verification
  positions) x ``G`` heads packed into one tile (12 x 5 = 60 rows of 64), walking
  the page table densely over the causal prefix: each K/V tile is read once and
  shared by the request's verification queries (seeds digest item 13); the page ids
  of tile i + 1 are read during iteration i, so the K/V copies of the next tiles are
  in flight while tile i is computed. Few
  requests x KV heads leave the GPU idle, so the prefix is split into
  ``NUM_SPLITS`` partitions (grid axis 2) whose FP32 partials are merged by their LSE
  in a second launch (``qsa_merge_kernel``: one ``[heads, partitions, DV]`` load per
  program, or ``dcp.triton_merge``); the sparse walk can split its selection list the same way.

Online softmax in base 2, FP32 accumulators; ``(0, -inf)`` for a row that sees nothing. FP32 inputs
are multiplied in FP32 (``input_precision="ieee"``: TF32, Triton's CUDA default, failed the 1e-4
boot gate on the H200 at 2e-3); BF16 / FP16 inputs use the tensor cores (MMA / WGMMA) as before.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def qsa_attention_kernel(
    q_ptr,  # [N, Hq, D]
    k_ptr,  # [slots, Hkv, D]
    v_ptr,  # [slots, Hkv, DV]
    page_table_ptr,  # [B, max_pages] int32
    kv_lens_ptr,  # [B] int32
    qo_indptr_ptr,  # [B + 1] int32
    row_req_ptr,  # [N] int32: request of each query row (sparse walk)
    idx_ptr,  # [N, NB] int32 block ids (sparse walk)
    o_ptr,  # [N, Hq, (S,) DV]: output, or per-split partials when NUM_SPLITS > 1
    lse_ptr,  # [N, Hq, (S)] FP32
    sm_scale,
    NB,
    NUM_SPLITS,
    stride_qn,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_pt,
    stride_in,
    stride_on,
    stride_oh,
    stride_os,
    stride_ln,
    stride_lh,
    stride_ls,
    G: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    RATIO: tl.constexpr,
    TPP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if SPARSE:
        n0 = pid
        b = tl.load(row_req_ptr + pid)
        q_start = tl.load(qo_indptr_ptr + b)
        T = tl.load(qo_indptr_ptr + b + 1) - q_start
        t_first = n0 - q_start
    else:
        b = pid
        q_start = tl.load(qo_indptr_ptr + b)
        T = tl.load(qo_indptr_ptr + b + 1) - q_start
        n0 = q_start
        t_first = 0
    kv_len = tl.load(kv_lens_ptr + b)
    rows = tl.arange(0, BLOCK_M)
    t_loc = t_first + rows // G
    head = kvh * G + rows % G
    row_ok = (rows < TPP * G) & (t_loc < T)
    limit = kv_len - T + t_loc
    n_row = (q_start + t_loc).to(tl.int64)
    offs_d = tl.arange(0, D)
    offs_v = tl.arange(0, DV)
    q = tl.load(q_ptr + n_row[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    pt_row = page_table_ptr + b.to(tl.int64) * stride_pt
    if SPARSE:
        hi = NB * RATIO  # slots of the selection list
    else:
        hi = tl.maximum(kv_len - T + tl.minimum(T, TPP), 0)  # positions the last row of the tile sees
    # split-KV: partition `split` of NUM_SPLITS takes whole BLOCK_N tiles of [0, hi)
    split_len = tl.cdiv(tl.cdiv(hi, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, hi)
    if SPARSE:
        page_next = offs_n  # unused: the sparse walk reads its pages inside the loop
    else:
        # dense: the page ids of tile i + 1 are read in iteration i (a loop-carried register), so the
        # K/V copies' addresses no longer wait on a load of their own iteration and the software
        # pipeliner keeps NUM_STAGES - 1 K/V tiles in flight instead of one (issue 5)
        page_next = tl.load(pt_row + (lo + offs_n) // PAGE_SIZE, mask=lo + offs_n < hi, other=0)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + offs_n
        if SPARSE:
            blk = tl.load(idx_ptr + n0.to(tl.int64) * stride_in + j // RATIO, mask=j < hi, other=-1)
            pos = blk * RATIO + j % RATIO
            pvalid = (blk >= 0) & (pos < kv_len)
            page = tl.load(pt_row + pos // PAGE_SIZE, mask=pvalid, other=0)
        else:
            pos = j
            pvalid = pos < hi
            page = page_next
            page_next = tl.load(pt_row + (j + BLOCK_N) // PAGE_SIZE, mask=j + BLOCK_N < hi, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        k = tl.load(k_ptr + slot[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :], mask=pvalid[:, None], other=0.0)
        v = tl.load(v_ptr + slot[:, None] * stride_vs + kvh * stride_vh + offs_v[None, :], mask=pvalid[:, None], other=0.0)
        # "ieee": FP32 operands (the boot gate's) as FP32 products, not TF32 (Triton's CUDA default, ~1e-3
        # off against the gate's 1e-4); BF16 / FP16 operands take the tensor cores whatever the precision says
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * qk_scale
        visible = pvalid[None, :] & (pos[None, :] <= limit[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision="ieee")
        m_i = m_new
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = tl.where(has[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(has, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_row = o_ptr + n_row * stride_on + head * stride_oh + split * stride_os
    tl.store(o_row[:, None] + offs_v[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + n_row * stride_ln + head * stride_lh + split * stride_ls, lse, mask=row_ok)


@triton.jit
def qsa_merge_kernel(
    part_ptr,  # [N, Hq, S, DV] FP32 partials (last two dims contiguous)
    part_lse_ptr,  # [N, Hq, S] FP32 (natural log)
    o_ptr,  # [N, Hq, DV]
    lse_ptr,  # [N, Hq] FP32
    Hq,
    S,
    stride_pn,
    stride_ph,
    stride_ln,
    stride_lh,
    stride_on,
    stride_oh,
    stride_lon,
    DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """LSE merge of the dense walk's ``S`` partitions: one program per (row, ``BLOCK_H`` heads), every
    partial of the block read in one ``[BLOCK_H, BLOCK_S, DV]`` load; empty partitions (``-inf``) weigh 0 and
    their outputs are never read into the sum; an all-empty row stores ``(0, -inf)``."""
    n = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < Hq
    offs_s = tl.arange(0, BLOCK_S)
    offs_v = tl.arange(0, DV)
    ls = tl.load(part_lse_ptr + n * stride_ln + hs[:, None] * stride_lh + offs_s[None, :], mask=hm[:, None] & (offs_s < S)[None, :],
                 other=float("-inf"))
    m = tl.max(ls, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(ls == float("-inf"), 0.0, tl.exp(ls - m_safe[:, None]))  # [BLOCK_H, S]
    part = tl.load(part_ptr + n * stride_pn + hs[:, None, None] * stride_ph + offs_s[None, :, None] * DV
                   + offs_v[None, None, :], mask=(w > 0.0)[:, :, None], other=0.0)
    acc = tl.sum(part * w[:, :, None], axis=1)
    total = tl.sum(w, axis=1)
    has = total > 0.0
    t_safe = tl.where(has, total, 1.0)
    out = tl.where(has[:, None], acc / t_safe[:, None], 0.0)
    tl.store(o_ptr + n * stride_on + hs[:, None] * stride_oh + offs_v[None, :], out.to(o_ptr.dtype.element_ty),
             mask=hm[:, None])
    tl.store(lse_ptr + n * stride_lon + hs, tl.where(has, m_safe + tl.log(t_safe), float("-inf")), mask=hm)
