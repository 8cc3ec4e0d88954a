"""Triton kernels of the group-scan mode of the chunk-64 prefill (issue 4).

The chunk-64 form (``triton_chunk_parallel.py``) is parallel over chunks except for
its state pass, which walks every chunk of a sequence in one program per
(sequence, value head, value tile): with few sequences and heads (B = 1, 12 heads)
that is ~100 programs on a 132-SM part, each 64 chunks long at T = 4,096. The group
scan cuts each sequence into groups of ``L`` chunks and uses that the state pass is
affine in the state: per chunk ``S <- D S + kt^T (u - w S) = (D - kt^T w) S + kt^T u``
(``S`` ``[K, V]``, ``D = diag(e^{G_last})``, ``kt = k e^{G_last - G}``), so a group maps
``S -> A_g S + B_g`` with ``A_g`` ``[K, K]`` and ``B_g`` ``[K, V]``. Three steps:

1. ``chunk_group_summary_kernel`` — parallel over (column tile, group, value head):
   runs the state pass's own recurrence over the group's chunks on the augmented
   state ``[0 | I]`` ``[K, V + K]`` with pseudo-values ``[u | 0]``; the result is
   ``[B_g | A_g]`` (FP32). Columns ``< V`` are ``B_g``, the rest ``A_g``. (The same
   as running the existing state pass on an identity-initialised state batch, without
   storing ``h`` / ``v_new`` and without materialising the augmented inputs.)
2. ``chunk_group_scan_kernel`` — parallel over (value tile, sequence x value head),
   sequential over the sequence's groups: ``S_{g+1} = A_g S_g + B_g`` in FP32 with
   IEEE products, from the slot's initial state (or zeros); stores every group's start
   state ``S_g``.
3. Replay: ``triton_chunk_parallel.chunk_state_kernel`` unchanged, with each group as
   a sequence of its own whose initial state is ``S_g`` — parallel over groups, it
   writes ``h`` / ``v_new`` for the output kernel, the requested checkpoints and each
   group's end state (the last group's is the sequence's final state).

Register budget: the summary kernel holds the state as up to four key blocks like the
state pass, and the scan kernel holds the state as key blocks too and reads ``A_g`` one
``[KD, KD]`` block at a time (compile-gated for gfx942 / gfx950 / sm_90, ``compile_gate.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk_parallel import _dot, _rnorm, _state_advance, _state_load, _state_store, _tile


@triton.jit
def _summary_init(kd, KD: tl.constexpr, o_v, V: tl.constexpr):
    """Key block ``kd`` of the augmented start state ``[0 | I]``: column ``j`` is zero for
    ``j < V`` (``o_v - V`` is negative there) and the identity column ``j - V`` otherwise."""
    o_d = kd + tl.arange(0, KD)
    return tl.where(o_d[:, None] == (o_v - V)[None, :], 1.0, 0.0)


@triton.jit
def _summary_store(base, S, kd, KD: tl.constexpr, K: tl.constexpr, W: tl.constexpr, o_v, m_v):
    o_d = kd + tl.arange(0, KD)
    tl.store(base + o_d[:, None] * W + o_v[None, :], S, mask=(o_d < K)[:, None] & m_v[None, :])


@triton.jit
def chunk_group_summary_kernel(
    k_ptr,  # [N, H, K]
    g_ptr,  # chunk-local cumulative log decay (FP32), [N, HV, K] / [N, HV]
    w_ptr,  # [N, HV, K]
    u_ptr,  # [N, HV, V]
    cu_ptr,  # [S + 1] token offsets
    gidx_ptr,  # [n_summaries, 4]: (sequence, first chunk in the sequence, chunks, group index)
    sum_ptr,  # out [NG, HV, K, V + K] FP32: [B_g | A_g]
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,  # augmented columns per program (a tile may hold B and A columns)
    BT: tl.constexpr,
    KD: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    TF32: tl.constexpr,
):
    tl.static_assert(BK <= 4 * KD, "the state is held as at most four key blocks")
    i_v = tl.program_id(0)
    i_j = tl.program_id(1)
    i_hv = tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_s = tl.load(gidx_ptr + 4 * i_j)
    c0 = tl.load(gidx_ptr + 4 * i_j + 1)
    nc = tl.load(gidx_ptr + 4 * i_j + 2)
    grp = tl.load(gidx_ptr + 4 * i_j + 3).to(tl.int64)
    bos32 = tl.load(cu_ptr + i_s)
    T = tl.load(cu_ptr + i_s + 1) - bos32
    bos = bos32.to(tl.int64)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)  # augmented column
    m_v = o_v < V + K
    m_u = o_v < V
    S0 = _summary_init(0, KD, o_v, V)
    if BK > KD:
        S1 = _summary_init(KD, KD, o_v, V)
    if BK > 2 * KD:
        S2 = _summary_init(2 * KD, KD, o_v, V)
    if BK > 3 * KD:
        S3 = _summary_init(3 * KD, KD, o_v, V)
    for cc in range(0, nc):
        c = c0 + cc
        Tc = T - c * BT
        m_t = o_t < Tc
        tok = o_t
        tokc = tl.minimum(o_t, Tc - 1)
        t0 = bos + c * BT
        kc_ptr = k_ptr + t0 * (H * K)
        wc_ptr = w_ptr + t0 * (HV * K)
        if GATE == 2:
            gc_ptr = g_ptr + t0 * HV
        else:
            gc_ptr = g_ptr + t0 * (HV * K)
        uc_ptr = u_ptr + t0 * (HV * V)
        # [u | 0]: identity columns carry no pseudo-value input.
        vn = tl.load(uc_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None] & m_u[None, :], other=0.0).to(tl.float32)
        vn -= _dot(_tile(wc_ptr, tok, m_t, i_hv, HV, K, 0, KD), S0, TF32)
        if BK > KD:
            vn -= _dot(_tile(wc_ptr, tok, m_t, i_hv, HV, K, KD, KD), S1, TF32)
        if BK > 2 * KD:
            vn -= _dot(_tile(wc_ptr, tok, m_t, i_hv, HV, K, 2 * KD, KD), S2, TF32)
        if BK > 3 * KD:
            vn -= _dot(_tile(wc_ptr, tok, m_t, i_hv, HV, K, 3 * KD, KD), S3, TF32)
        rn = _rnorm(kc_ptr, tok, m_t, i_h, H, K, BK, KD, L2NORM)
        last = tl.minimum(BT - 1, Tc - 1)
        S0 = _state_advance(S0, vn, kc_ptr, gc_ptr, tok, tokc, m_t, last, rn, i_h, i_hv, 0, H, HV, K, KD, GATE, TF32)
        if BK > KD:
            S1 = _state_advance(S1, vn, kc_ptr, gc_ptr, tok, tokc, m_t, last, rn, i_h, i_hv, KD, H, HV, K, KD, GATE, TF32)
        if BK > 2 * KD:
            S2 = _state_advance(S2, vn, kc_ptr, gc_ptr, tok, tokc, m_t, last, rn, i_h, i_hv, 2 * KD, H, HV, K, KD, GATE, TF32)
        if BK > 3 * KD:
            S3 = _state_advance(S3, vn, kc_ptr, gc_ptr, tok, tokc, m_t, last, rn, i_h, i_hv, 3 * KD, H, HV, K, KD, GATE, TF32)
    p = sum_ptr + (grp * HV + i_hv) * K * (V + K)
    _summary_store(p, S0, 0, KD, K, V + K, o_v, m_v)
    if BK > KD:
        _summary_store(p, S1, KD, KD, K, V + K, o_v, m_v)
    if BK > 2 * KD:
        _summary_store(p, S2, 2 * KD, KD, K, V + K, o_v, m_v)
    if BK > 3 * KD:
        _summary_store(p, S3, 3 * KD, KD, K, V + K, o_v, m_v)


@triton.jit
def _scan_dot(a, b, X3: tl.constexpr):
    if X3:
        return tl.dot(a, b, input_precision="tf32x3")
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _scan_row_block(p_sum, i, S0, S1, S2, S3, o_v, m_v, W: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BK: tl.constexpr, KD: tl.constexpr, X3: tl.constexpr):
    """Rows ``i*KD ..`` of ``A_g S + B_g``: key block ``i`` of the next state, from the summary at ``p_sum``."""
    o_i = i * KD + tl.arange(0, KD)
    m_i = o_i < K
    o_j = tl.arange(0, KD)
    acc = tl.load(p_sum + o_i[:, None] * W + o_v[None, :], mask=m_i[:, None] & m_v[None, :], other=0.0)
    acc += _scan_dot(tl.load(p_sum + o_i[:, None] * W + V + o_j[None, :], mask=m_i[:, None] & (o_j < K)[None, :], other=0.0),
                  S0, X3)
    if BK > KD:
        acc += _scan_dot(tl.load(p_sum + o_i[:, None] * W + V + KD + o_j[None, :], mask=m_i[:, None] & (KD + o_j < K)[None, :],
                              other=0.0), S1, X3)
    if BK > 2 * KD:
        acc += _scan_dot(tl.load(p_sum + o_i[:, None] * W + V + 2 * KD + o_j[None, :],
                              mask=m_i[:, None] & (2 * KD + o_j < K)[None, :], other=0.0), S2, X3)
    if BK > 3 * KD:
        acc += _scan_dot(tl.load(p_sum + o_i[:, None] * W + V + 3 * KD + o_j[None, :],
                              mask=m_i[:, None] & (3 * KD + o_j < K)[None, :], other=0.0), S3, X3)
    return acc


@triton.jit
def chunk_group_scan_kernel(
    sum_ptr,  # [NG, HV, K, V + K] FP32 summaries [B_g | A_g] (the last group of a sequence has none)
    start_ptr,  # out [NG, HV, K, V] FP32: each group's start state
    goff_ptr,  # [S + 1] first group of each sequence
    state_ptr,
    state_idx_ptr,
    has_init_ptr,
    s_slot,
    s_h,
    s_k,
    s_v,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    KD: tl.constexpr,  # rows per state key block; BK <= 4 * KD
    X3: tl.constexpr,  # products as three TF32 passes (FP32-level error; sm_90, where IEEE FP32 dots spill) or IEEE
):
    tl.static_assert(BK <= 4 * KD, "the state is held as at most four key blocks")
    i_v = tl.program_id(0)
    i_sh = tl.program_id(1)
    i_s = i_sh // HV
    i_hv = i_sh % HV
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    g0 = tl.load(goff_ptr + i_s)
    g1 = tl.load(goff_ptr + i_s + 1)
    slot = tl.load(state_idx_ptr + i_s).to(tl.int64)
    ld = (slot >= 0) & (tl.load(has_init_ptr + i_s) != 0)
    p_s = state_ptr + slot * s_slot + i_hv * s_h
    S0 = _state_load(p_s, 0, KD, K, s_k, o_v, s_v, m_v, ld)
    S1 = S0
    S2 = S0
    S3 = S0
    if BK > KD:
        S1 = _state_load(p_s, KD, KD, K, s_k, o_v, s_v, m_v, ld)
    if BK > 2 * KD:
        S2 = _state_load(p_s, 2 * KD, KD, K, s_k, o_v, s_v, m_v, ld)
    if BK > 3 * KD:
        S3 = _state_load(p_s, 3 * KD, KD, K, s_k, o_v, s_v, m_v, ld)
    W = V + K
    # Per-group base pointers advance by one group (64-bit from the loaded g0).
    p_start = start_ptr + (g0.to(tl.int64) * HV + i_hv) * K * V
    p_sum = sum_ptr + (g0.to(tl.int64) * HV + i_hv) * K * W
    for g in range(g0, g1):
        _state_store(p_start, S0, 0, KD, K, V, o_v, 1, m_v)
        if BK > KD:
            _state_store(p_start, S1, KD, KD, K, V, o_v, 1, m_v)
        if BK > 2 * KD:
            _state_store(p_start, S2, 2 * KD, KD, K, V, o_v, 1, m_v)
        if BK > 3 * KD:
            _state_store(p_start, S3, 3 * KD, KD, K, V, o_v, 1, m_v)
        if g + 1 < g1:
            # Every block of the next state from the current one, then replace.
            N0 = _scan_row_block(p_sum, 0, S0, S1, S2, S3, o_v, m_v, W, K, V, BK, KD, X3)
            N1 = N0
            N2 = N0
            N3 = N0
            if BK > KD:
                N1 = _scan_row_block(p_sum, 1, S0, S1, S2, S3, o_v, m_v, W, K, V, BK, KD, X3)
            if BK > 2 * KD:
                N2 = _scan_row_block(p_sum, 2, S0, S1, S2, S3, o_v, m_v, W, K, V, BK, KD, X3)
            if BK > 3 * KD:
                N3 = _scan_row_block(p_sum, 3, S0, S1, S2, S3, o_v, m_v, W, K, V, BK, KD, X3)
            S0 = N0
            S1 = N1
            S2 = N2
            S3 = N3
        p_start += HV * K * V
        p_sum += HV * K * W


@triton.jit
def chunk_group_final_kernel(
    start_ptr,  # [NG, HV, K, V] FP32: after the replay, each group's end state
    last_ptr,  # [S] last group of each sequence
    state_ptr,
    state_idx_ptr,
    s_slot,
    s_h,
    s_k,
    s_v,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """Copy each sequence's last-group end state to its slot (none for ``slot < 0``), on the device:
    no host read of the slot indices."""
    i_v = tl.program_id(0)
    i_sh = tl.program_id(1)
    i_s = i_sh // HV
    i_hv = i_sh % HV
    slot = tl.load(state_idx_ptr + i_s).to(tl.int64)
    if slot >= 0:
        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        m = (o_k < K)[:, None] & (o_v < V)[None, :]
        grp = tl.load(last_ptr + i_s).to(tl.int64)
        S = tl.load(start_ptr + (grp * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], mask=m, other=0.0)
        tl.store(state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v,
                 S.to(state_ptr.dtype.element_ty), mask=m)
