"""Triton kernel: the whole KDA decode step in one launch (seeds digest, item 5).

Per (request, head, tile of ``BV`` value columns) program: short causal conv of
the raw q/k/v rows against the pooled conv window (SiLU), Q/K L2 norm, the
per-channel decay gate and ``beta``, the delta-rule update of the pooled state,
and the gated output RMSNorm written straight into the output buffer.

The RMSNorm needs the whole value row of a head while the recurrence is split
over value tiles (so B = 1 still fills the GPU). Each program stores its
un-normalised tile and its partial sum of squares, then increments a per-head
counter with an acquire-release atomic; the program that arrives last (the
count reaches the number of tiles) normalises the whole row, writes the q/k
conv windows (every tile has read them by then), and resets the counter to 0,
so one persistently zeroed ``[B * H]`` int32 workspace serves every call and
CUDA-graph replay. v-channel conv windows are written by their own tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import STATE_LOAD_EVICTION, STATE_STORE_CACHE


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def kda_fused_decode_kernel(
    x_ptr,  # [B, 3 * H * K] raw q|k|v projections (pre-conv)
    conv_ptr,  # conv pool [slots, W - 1, 3 * H * K] (raw rows, oldest first)
    conv_w_ptr,  # [3 * H * K, W]
    f_ptr,  # [B, H * K] raw forget-gate projection
    b_ptr,  # [B, H] raw beta
    A_log_ptr,  # [H]
    dt_bias_ptr,  # [H * K]
    state_ptr,  # state pool (4-D, strides below)
    state_idx_ptr,  # [B] slots (< 0: padding row)
    gate_ptr,  # [B, H * V] raw output-gate projection
    norm_w_ptr,  # [V]
    out_ptr,  # [B, H, V]
    sumsq_ptr,  # [B * H, NV] FP32 workspace
    count_ptr,  # [B * H] int32 workspace, zero between calls
    scale,
    lower_bound,
    eps,
    c_slot,
    c_row,
    x_row,  # row strides of x, f, b, gate (unit stride inside a row): views of a fused projection need no copy
    f_row,
    b_row,
    g_row,
    s_slot,
    s_h,
    s_k,
    s_v,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    W: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    NVP: tl.constexpr,
    SAFE_GATE: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V

    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    if slot < 0:
        tl.store(out_ptr + (i_b * H + i_h) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty), mask=m_v)
        return

    # ---- short causal conv (+ SiLU) of this head's q, k channels and this tile's v channels
    cq = i_h * K + o_k
    ck = H * K + i_h * K + o_k
    cv = 2 * H * K + i_h * V + o_v
    win = conv_ptr + slot * c_slot
    xq = tl.load(x_ptr + i_b * x_row + cq, mask=m_k, other=0.0).to(tl.float32)
    xk = tl.load(x_ptr + i_b * x_row + ck, mask=m_k, other=0.0).to(tl.float32)
    xv = tl.load(x_ptr + i_b * x_row + cv, mask=m_v, other=0.0).to(tl.float32)
    q = xq * tl.load(conv_w_ptr + cq * W + (W - 1), mask=m_k, other=0.0).to(tl.float32)
    k = xk * tl.load(conv_w_ptr + ck * W + (W - 1), mask=m_k, other=0.0).to(tl.float32)
    v = xv * tl.load(conv_w_ptr + cv * W + (W - 1), mask=m_v, other=0.0).to(tl.float32)
    for j in tl.static_range(W - 1):
        q += tl.load(win + j * c_row + cq, mask=m_k, other=0.0).to(tl.float32) * tl.load(conv_w_ptr + cq * W + j, mask=m_k, other=0.0).to(tl.float32)
        k += tl.load(win + j * c_row + ck, mask=m_k, other=0.0).to(tl.float32) * tl.load(conv_w_ptr + ck * W + j, mask=m_k, other=0.0).to(tl.float32)
        v += tl.load(win + j * c_row + cv, mask=m_v, other=0.0).to(tl.float32) * tl.load(conv_w_ptr + cv * W + j, mask=m_v, other=0.0).to(tl.float32)
    q = _silu(q)
    k = _silu(k)
    v = _silu(v)
    # v channels belong to this tile only: shift their window now.
    for j in tl.static_range(W - 2):
        tl.store(win + j * c_row + cv, tl.load(win + (j + 1) * c_row + cv, mask=m_v, other=0.0), mask=m_v)
    tl.store(win + (W - 2) * c_row + cv, xv.to(conv_ptr.dtype.element_ty), mask=m_v)

    # ---- Q/K L2 norm, gates
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    A = tl.exp(tl.load(A_log_ptr + i_h).to(tl.float32))
    fx = tl.load(f_ptr + i_b * f_row + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    fx += tl.load(dt_bias_ptr + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    if SAFE_GATE:
        g = lower_bound / (1.0 + tl.exp(-A * fx))
    else:
        g = -A * tl.where(fx < 20.0, tl.log(1.0 + tl.exp(fx)), fx)
    beta = tl.load(b_ptr + i_b * b_row + i_h).to(tl.float32)
    beta = 1.0 / (1.0 + tl.exp(-beta))

    # ---- delta-rule update of this [K, BV] slice of the pooled state
    m_kv = m_k[:, None] & m_v[None, :]
    p_s = state_ptr + slot * s_slot + i_h * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S = tl.load(p_s, mask=m_kv, other=0.0, eviction_policy=STATE_LOAD_EVICTION).to(tl.float32) * tl.exp(g)[:, None]
    err = v - tl.sum(S * k[:, None], axis=0)
    S = S + (beta * k)[:, None] * err[None, :]
    tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)
    o = tl.sum(S * q[:, None], axis=0)
    o = tl.where(m_v, o, 0.0)

    # ---- gated RMSNorm over the whole value row: the last tile to finish does it
    row = out_ptr + (i_b * H + i_h) * V
    tl.store(row + o_v, o.to(out_ptr.dtype.element_ty), mask=m_v)
    tl.store(sumsq_ptr + i_bh * NV + i_v, tl.sum(o * o, axis=0))
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + i_bh, 1, sem="acq_rel")
    if arrived == NV - 1:
        tl.debug_barrier()
        o_t = tl.arange(0, NVP)
        total = tl.sum(tl.load(sumsq_ptr + i_bh * NV + o_t, mask=o_t < NV, other=0.0), axis=0)
        rstd = tl.rsqrt(total / V + eps)
        for t in tl.static_range(NV):
            cols = t * BV + tl.arange(0, BV)
            m_c = cols < V
            y = tl.load(row + cols, mask=m_c, other=0.0).to(tl.float32)
            z = tl.load(gate_ptr + i_b * g_row + i_h * V + cols, mask=m_c, other=0.0).to(tl.float32)
            w = tl.load(norm_w_ptr + cols, mask=m_c, other=0.0).to(tl.float32)
            y = y * rstd * w / (1.0 + tl.exp(-z))
            tl.store(row + cols, y.to(out_ptr.dtype.element_ty), mask=m_c)
        for j in tl.static_range(W - 2):
            tl.store(win + j * c_row + cq, tl.load(win + (j + 1) * c_row + cq, mask=m_k, other=0.0), mask=m_k)
            tl.store(win + j * c_row + ck, tl.load(win + (j + 1) * c_row + ck, mask=m_k, other=0.0), mask=m_k)
        tl.store(win + (W - 2) * c_row + cq, xq.to(conv_ptr.dtype.element_ty), mask=m_k)
        tl.store(win + (W - 2) * c_row + ck, xk.to(conv_ptr.dtype.element_ty), mask=m_k)
        tl.atomic_xchg(count_ptr + i_bh, 0)
