"""Triton split-KV MLA attention over a paged latent cache (absorbed form).

Grid ``(B, query blocks x head blocks, NUM_SPLITS)``. A program holds ``BLOCK_M``
query rows, packed as ``(token, head)`` pairs: ``TPP = BLOCK_M // HB`` tokens of one
request times ``HB`` heads (decode with 12 heads: 12 rows of a 16-row tile; the
padding rows exist only in registers, never in memory). It walks its share of
the request's key range (split ``s`` of ``NUM_SPLITS``, whole ``BLOCK_N`` tiles)
with an online softmax in base 2, reading each latent tile once and using it
both as the key (``[R | rope]`` against ``[q_lat | q_pe]``) and as the value
(first ``R`` columns). A row sees positions ``<= kv_len - T + t`` (causal for
verify / extend, the whole history for decode); with ``CAUSAL=False`` every row
sees all ``kv_len`` positions (a rank's prefix shard of an extend under DCP).

It writes the partial output (normalised over the split's keys) and the split's
natural-log LSE; an empty split writes ``(0, -inf)``. With ``NUM_SPLITS == 1`` the
caller passes the final output and LSE as the "partials" (split stride 0) and
no merge is launched. FP8 caches: tiles are converted to the query dtype for the
dot products; the per-tensor ``kv_scale`` multiplies the scores and the output. FP32 inputs (the boot
gates') are multiplied in FP32 (``input_precision="ieee"``, not Triton's TF32 default on CUDA, which is
~1e-3 off against the gate's 1e-4); BF16 / FP16 inputs use the tensor cores as before.

Source: DeepSeek-V2 (2024) absorbed MLA; split-KV ("flash decoding") and the
LSE merge as in seeds digest item 8 (16 partitions for long single requests).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mla_split_kv_kernel(
    q_ptr,  # [N, H, R + P]
    kv_ptr,  # cache rows [slots, R + P] (row stride stride_kv)
    page_table_ptr,  # [B, max_pages] int32
    kv_lens_ptr,  # [B] int32
    qo_indptr_ptr,  # [B + 1] int32
    part_ptr,  # [N, H, NUM_SPLITS, R] (split stride may be 0 when NUM_SPLITS == 1)
    part_lse_ptr,  # [N, H, NUM_SPLITS] FP32
    sm_scale,
    kv_scale,
    H,
    NUM_SPLITS,
    stride_qt,
    stride_qh,
    stride_kv,
    stride_pt,
    stride_pn,
    stride_ph,
    stride_ps,
    stride_ln,
    stride_lh,
    stride_ls,
    R: tl.constexpr,
    P: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RC: tl.constexpr,
    RV: tl.constexpr,
    CAUSAL: tl.constexpr = True,
):
    b = tl.program_id(0)
    pid_mh = tl.program_id(1)
    split = tl.program_id(2)
    TPP: tl.constexpr = BLOCK_M // HB
    NV: tl.constexpr = R // RV
    n_hblocks = tl.cdiv(H, HB)
    tb = pid_mh // (n_hblocks * NV)
    hb = (pid_mh // NV) % n_hblocks
    v0 = (pid_mh % NV) * RV
    q_start = tl.load(qo_indptr_ptr + b)
    T = tl.load(qo_indptr_ptr + b + 1) - q_start
    if tb * TPP >= T:
        return
    kv_len = tl.load(kv_lens_ptr + b)

    rows = tl.arange(0, BLOCK_M)
    t_loc = tb * TPP + rows // HB
    head = hb * HB + rows % HB
    row_ok = (rows < TPP * HB) & (t_loc < T) & (head < H)
    if CAUSAL:
        limit = kv_len - T + t_loc  # last visible position per row (inclusive)
        kv_hi = kv_len - T + tl.minimum(T, (tb + 1) * TPP)  # keys any row of this block may see
    else:
        limit = kv_len - 1 + t_loc * 0
        kv_hi = kv_len
    kv_hi = tl.maximum(kv_hi, 0)
    split_len = tl.cdiv(tl.cdiv(kv_hi, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, kv_hi)

    offs_r = tl.arange(0, R)
    offs_p = tl.arange(0, P)
    q_row = q_ptr + (q_start + t_loc).to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh
    if RC == R:
        q_lat = tl.load(q_row[:, None] + offs_r[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_row[:, None] + R + offs_p[None, :], mask=row_ok[:, None], other=0.0)
    qk_scale = sm_scale * kv_scale * 1.4426950408889634  # base-2 softmax

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, RV], tl.float32)
    offs_v = v0 + tl.arange(0, RV)
    offs_n = tl.arange(0, BLOCK_N)
    pt_row = page_table_ptr + b.to(tl.int64) * stride_pt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        pvalid = pos < end
        page = tl.load(pt_row + pos // PAGE_SIZE, mask=pvalid, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        kv_row = kv_ptr + slot * stride_kv
        kpe = tl.load(kv_row[:, None] + R + offs_p[None, :], mask=pvalid[:, None], other=0.0).to(q_pe.dtype)
        s = tl.dot(q_pe, tl.trans(kpe), input_precision="ieee")
        if RC == R:
            c_all = tl.load(kv_row[:, None] + offs_r[None, :], mask=pvalid[:, None], other=0.0).to(q_pe.dtype)
            s += tl.dot(q_lat, tl.trans(c_all), input_precision="ieee")
        else:
            # Score in R-chunks (query chunk re-read from L1): on CDNA a 512-deep
            # dot with 16-row operands keeps the whole depth per wave and spills.
            offs_c = tl.arange(0, RC)
            for k0 in tl.static_range(0, R, RC):
                q_c = tl.load(q_row[:, None] + k0 + offs_c[None, :], mask=row_ok[:, None], other=0.0)
                c_c = tl.load(kv_row[:, None] + k0 + offs_c[None, :], mask=pvalid[:, None], other=0.0).to(q_pe.dtype)
                s += tl.dot(q_c, tl.trans(c_c), input_precision="ieee")
        if RC == R and RV == R:
            c = c_all
        else:  # value columns of this program (a cache hit: the tile was just read)
            c = tl.load(kv_row[:, None] + offs_v[None, :], mask=pvalid[:, None], other=0.0).to(q_pe.dtype)
        s = s * qk_scale
        visible = pvalid[None, :] & (pos[None, :] <= limit[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision="ieee")
        m_i = m_new

    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    o = tl.where(has[:, None], acc * (kv_scale / l_safe)[:, None], 0.0)
    lse = tl.where(has, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    nrow = (q_start + t_loc).to(tl.int64)
    part_row = part_ptr + nrow * stride_pn + head.to(tl.int64) * stride_ph + split * stride_ps
    tl.store(part_row[:, None] + offs_v[None, :], o.to(part_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(part_lse_ptr + nrow * stride_ln + head.to(tl.int64) * stride_lh + split * stride_ls, lse, mask=row_ok & (v0 == 0))
