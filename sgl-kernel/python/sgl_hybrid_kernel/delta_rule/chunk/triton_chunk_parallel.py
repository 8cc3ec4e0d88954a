"""Triton kernels: multi-kernel chunked prefill of the gated delta rule (chunk 64).

The single-kernel form (``triton_chunk.py``) walks all chunks of a sequence in one
program. This form splits the work the standard way (WY / UT transform, e.g. Yang
et al. 2024 "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", sec. 3; Gated DeltaNet / KDA chunked forms), so only a cheap pass is
sequential over chunks (issue 4):

1. ``chunk_gate_cumsum_kernel`` — parallel over (chunk, value head): log decay
   ``g`` from the raw gate and its chunk-local cumulative sum ``G`` (FP32).
2. ``chunk_intra_kernel`` — parallel over (chunk, value head): the ``BT x BT``
   dependency matrix ``A = strict_tril(beta_t k_t^T exp(G_t - G_s) k_s)`` and the
   in-chunk attention ``Aqk``, built 16 rows at a time and summed over key blocks of
   ``KD`` channels; the inverse ``M = (I + A)^-1`` by block forward substitution over
   16x16 diagonal blocks (each inverted by repeated squaring), all with FP32 inputs
   and accumulation (``APREC``: FP32 FMA products, or on CUDA ``"tf32x3"``, each FP32
   operand split into TF32 high + low parts on the tensor cores with FP32 accumulation,
   the sm_90 table's choice: in-chunk kernel 1.7x faster on the H200, issue 4);
   then ``w = M (beta k e^G)`` (by key blocks of ``KD``),
   ``u = M (beta v)`` (by value blocks of ``BV``) and the decayed keys of the state
   update ``kg = k e^{G_last - G}`` (exponents <= 0), so the sequential pass reads one
   tile per key block instead of recomputing norms and decays on every value tile.
   Split form (the sm_90 table, issue 4): ``chunk_intra_a_kernel`` (grid (chunk, value head,
   16-row block): ``A`` / ``Aqk`` as 16x16 blocks ``j <= i`` only, light 2-warp programs),
   ``chunk_intra_inv_kernel`` (the ten 16x16 blocks of the inverse, written over ``A``) and
   ``chunk_intra_solve_kernel`` (``w``, ``u``, ``kg`` from the stored FP32 inverse); on sm_90 the
   ``A`` programs run as ``chunk_intra_arow_kernel`` (key blocks outside the column blocks,
   ``[k; q]`` stacked into one 32-row operand, the diagonal 16x16 inverses computed there).
3. ``chunk_state_kernel`` — parallel over (sequence, value head, value tile),
   sequential over chunks: stores the chunk-start state ``h``, the pseudo-values
   ``v_new = u - w h`` and updates ``h <- e^{G_last} h + kg^T v_new``;
   writes requested checkpoints (any 16-token position) and the final state. The
   ``[K, BV]`` state is held as up to four key blocks of ``KD`` rows (``S0..S3``), so
   only one block of ``w`` and ``kg`` is live at a time; the chunk loop's loads do not
   depend on the state, so ``STAGES > 1`` keeps the next chunks' tiles in flight.
4. ``chunk_output_kernel`` — parallel over (chunk, value head, value tile):
   ``o = (q e^G) h + Aqk v_new``.

Decay exponents stay finite: for rows of block ``i`` the reference is ``G`` at the
block's first row ``r``; keys of earlier blocks carry ``exp(G_r - G_s) <= 1`` and
rows carry ``exp(G_t - G_r) <= 1``. Inside the 16x16 diagonal block the same
factorisation needs a bounded gate (KDA safe gate, ``15 * |lower_bound| <= 80``);
otherwise (standard KDA gate) the diagonal block sums ``k_t k_s exp(G_t - G_s)``
over key blocks of ``KB`` channels. GDN (one decay per head) uses the decay matrix.

Register budget (issue 9, ``compile_gate``): no ``[BT, K]`` tile is ever whole in
registers; every K-wide product runs over key blocks of ``KD`` channels (loops, not
unrolled), which keeps all four kernels free of spills on gfx942, gfx950 and sm_90
at the launch parameters of ``chunk.parallel.LAUNCH``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk import _tril_inverse_16
from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import _fexp, _frcp, _softplus


@triton.jit
def _chunk_start(cu_ptr, cidx_ptr, i_c, BT: tl.constexpr):
    """``(t0, T)`` of global chunk ``i_c`` (``cidx`` row: sequence, chunk in sequence): its first
    token as an int64 scalar and the tokens from there to its sequence's end (int32)."""
    i_s = tl.load(cidx_ptr + 2 * i_c)
    c = tl.load(cidx_ptr + 2 * i_c + 1)
    return tl.load(cu_ptr + i_s).to(tl.int64) + c * BT, tl.load(cu_ptr + i_s + 1) - tl.load(cu_ptr + i_s) - c * BT


@triton.jit
def _dot(a, b, TF32: tl.constexpr):
    if TF32:
        return tl.dot(a, b)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _tile(ptr, tok, m_t, i_h, H: tl.constexpr, K: tl.constexpr, kd, KD: tl.constexpr):
    """``[rows, KD]`` FP32 tile of a token-major ``[N, H, K]`` tensor: rows ``tok``, head ``i_h``,
    channels ``kd .. kd + KD - 1`` (zeros outside ``m_t`` and past ``K``)."""
    o_d = kd + tl.arange(0, KD)
    return tl.load(ptr + (tok[:, None] * H + i_h) * K + o_d[None, :], mask=m_t[:, None] & (o_d < K)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _rnorm(ptr, tok, m_t, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, KD: tl.constexpr, L2NORM: tl.constexpr):
    """Per-row L2-norm factor ``rsqrt(sum x^2 + 1e-6)`` of rows ``tok`` (1 without ``L2NORM``),
    summed over key blocks of ``KD`` channels."""
    ss = tok.to(tl.float32) * 0.0
    if L2NORM:
        for kd in range(0, BK, KD):
            x = _tile(ptr, tok, m_t, i_h, H, K, kd, KD)
            ss += tl.sum(x * x, axis=1)
        return tl.rsqrt(ss + 1e-6)
    else:
        return ss + 1.0


@triton.jit
def _load_qk(ptr, tok, m_t, i_h, o_k, m_k, H: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr):
    x = tl.load(ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _gate_row(f_ptr, bos, row, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV: tl.constexpr, K: tl.constexpr,
              GATE: tl.constexpr, FAST_EXP: tl.constexpr):
    """The activated per-channel gate ``[BK]`` of chunk row ``row`` (0 past the sequence end; the row is
    clamped, so the load needs no row mask)."""
    x = tl.load(f_ptr + ((bos + tl.minimum(row, T - 1)) * HV + i_hv) * K + o_k, mask=m_k, other=0.0).to(tl.float32) + dtb
    if GATE == 0:
        g = -A_h * _softplus(x)
    elif FAST_EXP:
        g = lower_bound * _frcp(1.0 + _fexp(-A_h * x, FAST_EXP), FAST_EXP)
    else:
        g = lower_bound / (1.0 + tl.exp(-A_h * x))
    return tl.where(row < T, g, 0.0)


@triton.jit
def _gate_row_store(g_ptr, acc, bos, row, T, i_hv, o_k, m_k, HV: tl.constexpr, K: tl.constexpr):
    tl.store(g_ptr + ((bos + row) * HV + i_hv) * K + o_k, acc, mask=m_k & (row < T))
    return acc


@triton.jit
def chunk_gate_cumsum_kernel(
    f_ptr,  # raw gate [N, HV, K] (KDA) or [N, HV] (GDN)
    A_log_ptr,
    dt_bias_ptr,
    g_ptr,  # out: chunk-local cumulative log decay, FP32, same shape as f
    cu_ptr,
    cidx_ptr,  # [NC, 2] (sequence, chunk in sequence)
    lower_bound,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,  # channels per program (the gate is independent per channel)
    BT: tl.constexpr,
    GATE: tl.constexpr,
    FAST_EXP: tl.constexpr = False,  # CUDA, bounded KDA gate: exponential / reciprocal without fix-ups (cumsum_fast_exp)
    ROW_LOOP: tl.constexpr = False,  # per-channel gates: the scan as a running sum over the chunk's rows (cumsum_row_loop)
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_s = tl.load(cidx_ptr + 2 * i_c)
    c = tl.load(cidx_ptr + 2 * i_c + 1)
    bos = tl.load(cu_ptr + i_s).to(tl.int64)
    T = tl.load(cu_ptr + i_s + 1).to(tl.int64) - bos
    rows = c * BT + tl.arange(0, BT)
    m_t = rows < T
    tok = bos + rows
    A_h = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    if GATE == 2:
        dtb = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
        a = tl.load(f_ptr + tok * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        g = tl.where(m_t, -A_h * _softplus(a + dtb), 0.0)
        tl.store(g_ptr + tok * HV + i_hv, tl.cumsum(g, axis=0), mask=m_t)
    else:
        o_k = tl.program_id(2) * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        dtb = tl.load(dt_bias_ptr + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        if ROW_LOOP:  # 8 rows' loads issued together (a store may alias a later load), then their running sums
            acc = tl.zeros([BK], dtype=tl.float32)
            for r0 in tl.static_range(0, BT, 8):
                g0 = _gate_row(f_ptr, bos, c * BT + r0 + 0, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g1 = _gate_row(f_ptr, bos, c * BT + r0 + 1, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g2 = _gate_row(f_ptr, bos, c * BT + r0 + 2, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g3 = _gate_row(f_ptr, bos, c * BT + r0 + 3, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g4 = _gate_row(f_ptr, bos, c * BT + r0 + 4, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g5 = _gate_row(f_ptr, bos, c * BT + r0 + 5, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g6 = _gate_row(f_ptr, bos, c * BT + r0 + 6, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                g7 = _gate_row(f_ptr, bos, c * BT + r0 + 7, T, i_hv, o_k, m_k, dtb, A_h, lower_bound, HV, K, GATE, FAST_EXP)
                acc = _gate_row_store(g_ptr, acc + g0, bos, c * BT + r0 + 0, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g1, bos, c * BT + r0 + 1, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g2, bos, c * BT + r0 + 2, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g3, bos, c * BT + r0 + 3, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g4, bos, c * BT + r0 + 4, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g5, bos, c * BT + r0 + 5, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g6, bos, c * BT + r0 + 6, T, i_hv, o_k, m_k, HV, K)
                acc = _gate_row_store(g_ptr, acc + g7, bos, c * BT + r0 + 7, T, i_hv, o_k, m_k, HV, K)
            return
        x = tl.load(f_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32) + dtb[None, :]
        if GATE == 0:
            g = -A_h * _softplus(x)
        else:
            if FAST_EXP:
                g = lower_bound * _frcp(1.0 + _fexp(-A_h * x, FAST_EXP), FAST_EXP)
            else:
                g = lower_bound / (1.0 + tl.exp(-A_h * x))
        g = tl.where(m_tk, g, 0.0)
        tl.store(g_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], tl.cumsum(g, axis=0), mask=m_tk)


@triton.jit
def _intra_rows(q_ptr, k_ptr, b_ptr, g_ptr, i, T, o_t, m_t, tok, tokc, rn_all, i_h, i_hv, scale,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
                BC: tl.constexpr, GATE: tl.constexpr, L2NORM: tl.constexpr, FACTORIZED: tl.constexpr,
                KB: tl.constexpr, KD: tl.constexpr, TF32: tl.constexpr, APREC: tl.constexpr):
    """Rows ``i*BC .. i*BC + BC - 1`` of one chunk (pointers rebased to its first token, rows
    chunk-local): ``Akk`` = strict rows of ``A`` (scaled by beta, FP32 inputs and accumulation via
    ``APREC``) and ``Aq`` = causal rows of the in-chunk attention (``[BC, BT]`` each), with the
    block's rows ``o_ti``, tokens ``tok_i`` and row mask ``m_i``."""
    o_ti = i * BC + tl.arange(0, BC)  # chunk-local rows of block i
    m_i = o_ti < T
    tok_i = o_ti
    tokc_i = tl.minimum(o_ti, T - 1)
    beta_i = tl.load(b_ptr + tok_i * HV + i_hv, mask=m_i, other=0.0).to(tl.float32)
    beta_i = tl.where(m_i, 1.0 / (1.0 + tl.exp(-beta_i)), 0.0)
    causal = o_ti[:, None] >= o_t[None, :]
    strict = o_ti[:, None] > o_t[None, :]
    rn_k = _rnorm(k_ptr, tok_i, m_i, i_h, H, K, BK, KD, L2NORM)
    rn_q = _rnorm(q_ptr, tok_i, m_i, i_h, H, K, BK, KD, L2NORM) * scale
    Akk = tl.zeros([BC, BT], dtype=tl.float32)
    Aq = tl.zeros([BC, BT], dtype=tl.float32)
    if GATE == 2:
        for kd in range(0, BK, KD):
            ka = _tile(k_ptr, tok, m_t, i_h, H, K, kd, KD) * rn_all[:, None]
            ki = _tile(k_ptr, tok_i, m_i, i_h, H, K, kd, KD) * rn_k[:, None]
            qi = _tile(q_ptr, tok_i, m_i, i_h, H, K, kd, KD) * rn_q[:, None]
            Akk += tl.dot(ki, tl.trans(ka), input_precision=APREC)
            Aq += _dot(qi, tl.trans(ka), TF32)
        G_all = tl.load(g_ptr + tokc * HV + i_hv)
        G_i = tl.load(g_ptr + tokc_i * HV + i_hv)
        D = tl.exp(tl.where(causal, G_i[:, None] - G_all[None, :], float("-inf")))
        Akk = Akk * D
        Aq = Aq * D
    else:
        r0 = tl.minimum(i * BC, T - 1)  # the block's first row: reference of the exponents
        if FACTORIZED:
            colmask = o_t < (i + 1) * BC  # earlier blocks and the (bounded) diagonal block
        else:
            colmask = o_t < i * BC  # earlier blocks only
        for kd in range(0, BK, KD):
            o_d = kd + tl.arange(0, KD)
            Grd = tl.load(g_ptr + (r0 * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
            Ga = _tile(g_ptr, tokc, m_t | ~m_t, i_hv, HV, K, kd, KD)
            kc = _tile(k_ptr, tok, m_t, i_h, H, K, kd, KD) * rn_all[:, None]
            kc = kc * tl.exp(tl.where(colmask[:, None], Grd[None, :] - Ga, float("-inf")))
            e = tl.exp(_tile(g_ptr, tokc_i, m_i | ~m_i, i_hv, HV, K, kd, KD) - Grd[None, :])
            ki = _tile(k_ptr, tok_i, m_i, i_h, H, K, kd, KD) * (rn_k[:, None] * e)
            qi = _tile(q_ptr, tok_i, m_i, i_h, H, K, kd, KD) * (rn_q[:, None] * e)
            Akk += tl.dot(ki, tl.trans(kc), input_precision=APREC)
            Aq += _dot(qi, tl.trans(kc), TF32)
        if not FACTORIZED:
            # Diagonal block of an unbounded per-channel decay: exact exp(G_t - G_s), t >= s.
            o_c = tl.arange(0, BC)
            cd = o_c[:, None] >= o_c[None, :]
            Ad = tl.zeros([BC, BC], dtype=tl.float32)
            Aqd = tl.zeros([BC, BC], dtype=tl.float32)
            for kb in range(0, BK, KB):
                kk = _tile(k_ptr, tok_i, m_i, i_h, H, K, kb, KB) * rn_k[:, None]
                qq = _tile(q_ptr, tok_i, m_i, i_h, H, K, kb, KB) * rn_q[:, None]
                Gb = _tile(g_ptr, tokc_i, m_i | ~m_i, i_hv, HV, K, kb, KB)
                d = tl.exp(tl.where(cd[:, :, None], Gb[:, None, :] - Gb[None, :, :], float("-inf")))
                Ad += tl.sum(kk[:, None, :] * kk[None, :, :] * d, axis=2)
                Aqd += tl.sum(qq[:, None, :] * kk[None, :, :] * d, axis=2)
            place = tl.where(o_c[:, None] + i * BC == o_t[None, :], 1.0, 0.0)  # [BC, BT]
            Akk += tl.dot(Ad, place, input_precision=APREC)
            Aq += tl.dot(Aqd, place, input_precision=APREC)
    Akk = tl.where(strict, Akk * beta_i[:, None], 0.0)
    Aq = tl.where(causal, Aq, 0.0)
    return Akk, Aq, o_ti, tok_i, m_i


@triton.jit
def _solve_step(M, Akk, A_ii, o_t, o_ti, sel, BC: tl.constexpr, APREC: tl.constexpr):
    """One step of the block forward substitution of ``M = (I + A)^-1`` for block row ``o_ti``:
    ``M_i = M_ii (E_i - A_{i,<i} M_{<i})`` with ``M_ii = (I + A_ii)^-1`` (16x16, repeated squaring,
    IEEE); rows ``>= o_ti[0]`` of ``M`` are still zero on entry. Returns ``M`` with block row i placed."""
    M_ii = _tril_inverse_16(A_ii, BC)
    Y = tl.where(o_ti[:, None] == o_t[None, :], 1.0, 0.0) - tl.dot(Akk, M, input_precision=APREC)
    M_i = tl.dot(M_ii, Y, input_precision=APREC)
    return M + tl.dot(sel, M_i, input_precision=APREC)


@triton.jit
def chunk_intra_kernel(
    q_ptr,  # [N, H, K]
    k_ptr,  # [N, H, K]
    v_ptr,  # [N, HV, V]
    b_ptr,  # [N, HV] raw beta
    g_ptr,  # [N, HV, K] / [N, HV] chunk-local cumulative log decay (FP32)
    aqk_ptr,  # out [N, HV, BT] in-chunk attention row (FP32)
    w_ptr,  # out [N, HV, K]
    u_ptr,  # out [N, HV, V]
    kg_ptr,  # out [N, HV, K] decayed keys of the state update, k e^{G_last - G}
    cu_ptr,
    cidx_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,  # value columns per block of the u product
    BT: tl.constexpr,
    BC: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    FACTORIZED: tl.constexpr,
    KB: tl.constexpr,
    KD: tl.constexpr,  # key block of every K-wide product
    TF32: tl.constexpr,  # TF32 allowed for Aqk and the w/u products (A and its inverse: APREC, never plain TF32)
    APREC: tl.constexpr = "ieee",  # products building A and its block inverse: "ieee" (FMA) or "tf32x3"
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    # Pointers rebased to the chunk's first token (64-bit scalars); rows below are chunk-local
    # int32 (bos = c = 0), so no tile of 64-bit offsets is ever live (fewer registers).
    t0, T = _chunk_start(cu_ptr, cidx_ptr, i_c, BT)
    q_ptr = q_ptr + t0 * (H * K)
    k_ptr = k_ptr + t0 * (H * K)
    v_ptr = v_ptr + t0 * (HV * V)
    b_ptr = b_ptr + t0 * HV
    aqk_ptr = aqk_ptr + t0 * (HV * BT)
    w_ptr = w_ptr + t0 * (HV * K)
    u_ptr = u_ptr + t0 * (HV * V)
    kg_ptr = kg_ptr + t0 * (HV * K)
    if GATE == 2:
        g_ptr = g_ptr + t0 * HV
    else:
        g_ptr = g_ptr + t0 * (HV * K)
    bos = 0
    c = 0
    o_t = tl.arange(0, BT)
    rows = c * BT + o_t
    m_t = rows < T
    tok = bos + rows
    tokc = bos + tl.minimum(rows, T - 1)  # padding rows repeat the last G (their g is 0)
    rn_all = _rnorm(k_ptr, tok, m_t, i_h, H, K, BK, KD, L2NORM)

    # Chunk tiles are reloaded per key block where used (L1/L2 hits) instead of living
    # across the block loop: no [BT, K] tile is ever whole in registers.
    M = tl.zeros([BT, BT], dtype=tl.float32)
    for i in range(0, BT // BC):
        Akk, Aq, o_ti, tok_i, m_i = _intra_rows(q_ptr, k_ptr, b_ptr, g_ptr, i, T, o_t, m_t, tok, tokc, rn_all, i_h, i_hv,
                                                scale, H, HV, K, BK, BT, BC, GATE, L2NORM, FACTORIZED, KB, KD, TF32, APREC)
        tl.store(aqk_ptr + (tok_i[:, None] * HV + i_hv) * BT + o_t[None, :], Aq, mask=m_i[:, None])
        sel = tl.where(o_t[:, None] == o_ti[None, :], 1.0, 0.0)  # [BT, BC]: column/row selector of block i
        A_ii = tl.dot(Akk, sel, input_precision=APREC)
        M = _solve_step(M, Akk, A_ii, o_t, o_ti, sel, BC, APREC)

    _wu_tail(M, k_ptr, v_ptr, b_ptr, g_ptr, w_ptr, u_ptr, kg_ptr, bos, T, c, tok, tokc, m_t, rn_all, i_h, i_hv,
             0, V, 0, BK, H, HV, K, V, BV, BT, GATE, KD, TF32)


@triton.jit
def _block_pair(q_ptr, k_ptr, g_ptr, i, j, T, i_h, i_hv, scale,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
                GATE: tl.constexpr, L2NORM: tl.constexpr, KD: tl.constexpr, TF32: tl.constexpr, APREC: tl.constexpr):
    """``[BC, BC]`` block (row block ``i``, column block ``j <= i``; for ``j == i`` only with a
    bounded gate or GDN) of ``k_t^T e^{G_t - G_s} k_s`` and ``scale q_t^T e^{G_t - G_s} k_s`` for
    one chunk, unmasked, summed over key blocks of ``KD``. KDA: exponents split at the first row
    ``r`` of block ``i`` (``e^{G_t - G_r} <= 1``, ``e^{G_r - G_s} <= 1`` for ``s < r``; bounded
    inside the diagonal block). The L2-norm factors of rows and columns are applied to the
    accumulated block (their squares summed in the same key-block loop)."""
    o_ti = i * BC + tl.arange(0, BC)
    o_tj = j * BC + tl.arange(0, BC)
    m_i = o_ti < T
    m_j = o_tj < T
    tokc_i = tl.minimum(o_ti, T - 1)
    tokc_j = tl.minimum(o_tj, T - 1)
    r0 = tl.minimum(i * BC, T - 1)
    Akk = tl.zeros([BC, BC], dtype=tl.float32)
    Aq = tl.zeros([BC, BC], dtype=tl.float32)
    ssk = tl.zeros([BC], dtype=tl.float32)
    ssq = tl.zeros([BC], dtype=tl.float32)
    ssj = tl.zeros([BC], dtype=tl.float32)
    for kd in range(0, BK, KD):
        ki = _tile(k_ptr, o_ti, m_i, i_h, H, K, kd, KD)
        qi = _tile(q_ptr, o_ti, m_i, i_h, H, K, kd, KD)
        kj = _tile(k_ptr, o_tj, m_j, i_h, H, K, kd, KD)
        if L2NORM:
            ssk += tl.sum(ki * ki, axis=1)
            ssq += tl.sum(qi * qi, axis=1)
            ssj += tl.sum(kj * kj, axis=1)
        if GATE != 2:
            o_d = kd + tl.arange(0, KD)
            Grd = tl.load(g_ptr + (r0 * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
            e = tl.exp(_tile(g_ptr, tokc_i, m_i | ~m_i, i_hv, HV, K, kd, KD) - Grd[None, :])
            ki = ki * e
            qi = qi * e
            kj = kj * tl.exp(Grd[None, :] - _tile(g_ptr, tokc_j, m_j | ~m_j, i_hv, HV, K, kd, KD))
        Akk += tl.dot(ki, tl.trans(kj), input_precision=APREC)
        Aq += _dot(qi, tl.trans(kj), TF32)
    if L2NORM:
        rk = tl.rsqrt(ssk + 1e-6)
        rq = tl.rsqrt(ssq + 1e-6) * scale
        rj = tl.rsqrt(ssj + 1e-6)
    else:
        rk = ssk + 1.0
        rq = ssq + scale
        rj = ssj + 1.0
    Akk = Akk * (rk[:, None] * rj[None, :])
    Aq = Aq * (rq[:, None] * rj[None, :])
    if GATE == 2:
        D = tl.exp(tl.where(o_ti[:, None] >= o_tj[None, :],
                            tl.load(g_ptr + tokc_i * HV + i_hv)[:, None] - tl.load(g_ptr + tokc_j * HV + i_hv)[None, :],
                            float("-inf")))
        Akk = Akk * D
        Aq = Aq * D
    return Akk, Aq


@triton.jit
def _block_diag_exact(q_ptr, k_ptr, g_ptr, i, T, i_h, i_hv, scale,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
                      L2NORM: tl.constexpr, KD: tl.constexpr, KB: tl.constexpr):
    """Diagonal ``[BC, BC]`` block ``i`` of an unbounded per-channel decay: exact
    ``e^{G_t - G_s}`` (``t >= s``) summed over key blocks of ``KB`` channels (FP32 FMA)."""
    o_ti = i * BC + tl.arange(0, BC)
    m_i = o_ti < T
    tokc_i = tl.minimum(o_ti, T - 1)
    rn_k = _rnorm(k_ptr, o_ti, m_i, i_h, H, K, BK, KD, L2NORM)
    rn_q = _rnorm(q_ptr, o_ti, m_i, i_h, H, K, BK, KD, L2NORM) * scale
    o_c = tl.arange(0, BC)
    cd = o_c[:, None] >= o_c[None, :]
    Ad = tl.zeros([BC, BC], dtype=tl.float32)
    Aqd = tl.zeros([BC, BC], dtype=tl.float32)
    for kb in range(0, BK, KB):
        kk = _tile(k_ptr, o_ti, m_i, i_h, H, K, kb, KB) * rn_k[:, None]
        qq = _tile(q_ptr, o_ti, m_i, i_h, H, K, kb, KB) * rn_q[:, None]
        Gb = _tile(g_ptr, tokc_i, m_i | ~m_i, i_hv, HV, K, kb, KB)
        d = tl.exp(tl.where(cd[:, :, None], Gb[:, None, :] - Gb[None, :, :], float("-inf")))
        Ad += tl.sum(kk[:, None, :] * kk[None, :, :] * d, axis=2)
        Aqd += tl.sum(qq[:, None, :] * kk[None, :, :] * d, axis=2)
    return Ad, Aqd


@triton.jit
def _a_rows_start(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, cu_ptr, cidx_ptr, H: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr):
    """``(T, q, k, beta, G, Aqk, A pointers)`` of this program's chunk (``program_id(0)``) for the
    ``A`` / ``Aqk`` kernels: tokens from its start to its sequence's end, pointers at its first token."""
    t0, T = _chunk_start(cu_ptr, cidx_ptr, tl.program_id(0), BT)
    if GATE == 2:
        g_ptr = g_ptr + t0 * HV
    else:
        g_ptr = g_ptr + t0 * (HV * K)
    return (T, q_ptr + t0 * (H * K), k_ptr + t0 * (H * K), b_ptr + t0 * HV, g_ptr, aqk_ptr + t0 * (HV * BT),
            a_ptr + t0 * (HV * BT))


@triton.jit
def chunk_intra_a_kernel(
    q_ptr,  # [N, H, K]
    k_ptr,  # [N, H, K]
    b_ptr,  # [N, HV] raw beta
    g_ptr,  # [N, HV, K] / [N, HV] chunk-local cumulative log decay (FP32)
    aqk_ptr,  # out [N, HV, BT] in-chunk attention row (FP32)
    a_ptr,  # out [N, HV, BT] strict rows of A (beta-scaled, FP32)
    cu_ptr,
    cidx_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    FACTORIZED: tl.constexpr,
    KB: tl.constexpr,
    KD: tl.constexpr,
    TF32: tl.constexpr,
    APREC: tl.constexpr = "ieee",
):
    """Split in-chunk step, part 1: grid (chunks, HV, BT / BC); program ``i`` builds the 16 rows
    ``i*BC ..`` of ``A`` (strict, beta-scaled) and ``Aqk`` (causal) as ``[BC, BC]`` blocks
    ``j <= i`` only (no upper-triangle work; blocks ``j > i`` are stored as zeros), FP32 inputs and
    accumulation for ``A`` (``APREC``). Light programs (few registers), so several share an SM.
    ``A`` goes to an FP32 scratch read by :func:`chunk_intra_solve_kernel`."""
    i_hv = tl.program_id(1)
    i = tl.program_id(2)
    i_h = i_hv // (HV // H)
    T, q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr = _a_rows_start(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, cu_ptr,
                                                                  cidx_ptr, H, HV, K, BT, GATE)
    o_c = tl.arange(0, BC)
    o_ti = i * BC + o_c
    m_i = o_ti < T
    beta_i = tl.load(b_ptr + o_ti * HV + i_hv, mask=m_i, other=0.0).to(tl.float32)
    beta_i = tl.where(m_i, 1.0 / (1.0 + tl.exp(-beta_i)), 0.0)
    row = (o_ti[:, None] * HV + i_hv) * BT + o_c[None, :]  # + column block offset j * BC
    for j in range(0, i):
        Akk, Aq = _block_pair(q_ptr, k_ptr, g_ptr, i, j, T, i_h, i_hv, scale, H, HV, K, BK, BC, GATE, L2NORM, KD, TF32, APREC)
        tl.store(aqk_ptr + row + j * BC, Aq, mask=m_i[:, None])
        tl.store(a_ptr + row + j * BC, Akk * beta_i[:, None], mask=m_i[:, None])
    if GATE == 2 or FACTORIZED:
        Akk, Aq = _block_pair(q_ptr, k_ptr, g_ptr, i, i, T, i_h, i_hv, scale, H, HV, K, BK, BC, GATE, L2NORM, KD, TF32, APREC)
    else:
        Akk, Aq = _block_diag_exact(q_ptr, k_ptr, g_ptr, i, T, i_h, i_hv, scale, H, HV, K, BK, BC, L2NORM, KD, KB)
    tl.store(aqk_ptr + row + i * BC, tl.where(o_c[:, None] >= o_c[None, :], Aq, 0.0), mask=m_i[:, None])
    tl.store(a_ptr + row + i * BC, tl.where(o_c[:, None] > o_c[None, :], Akk * beta_i[:, None], 0.0), mask=m_i[:, None])
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    for j in range(i + 1, BT // BC):
        tl.store(aqk_ptr + row + j * BC, zero, mask=m_i[:, None])
        tl.store(a_ptr + row + j * BC, zero, mask=m_i[:, None])


@triton.jit
def chunk_intra_solve_kernel(
    k_ptr,  # [N, H, K]
    v_ptr,  # [N, HV, V]
    b_ptr,  # [N, HV] raw beta
    g_ptr,  # chunk-local cumulative log decay (FP32)
    a_ptr,  # [N, HV, BT] strict rows of A (chunk_intra_a_kernel); with INV the rows of M (FP32 or 16-bit)
    w_ptr,  # out [N, HV, K]
    u_ptr,  # out [N, HV, V]
    kg_ptr,  # out [N, HV, K]
    cu_ptr,
    cidx_ptr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    KD: tl.constexpr,
    TF32: tl.constexpr,
    APREC: tl.constexpr = "ieee",
    INV: tl.constexpr = False,  # a_ptr already holds the finished inverse M (chunk_intra_inv_kernel)
    LOWP: tl.constexpr = 0,  # w / u products with M and their right operands rounded to the scratch dtype (_rdot)
):
    """Split in-chunk step, part 2: grid (chunks, HV); ``M = (I + A)^-1`` by the same block forward
    substitution as the fused kernel (diagonal blocks read straight from the FP32 ``A``), or with
    ``INV`` read as computed by :func:`chunk_intra_inv_kernel`; then ``w``, ``u`` and ``kg``
    (:func:`_wu_tail`)."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    t0, T = _chunk_start(cu_ptr, cidx_ptr, i_c, BT)
    k_ptr = k_ptr + t0 * (H * K)
    v_ptr = v_ptr + t0 * (HV * V)
    b_ptr = b_ptr + t0 * HV
    a_ptr = a_ptr + t0 * (HV * BT)
    w_ptr = w_ptr + t0 * (HV * K)
    u_ptr = u_ptr + t0 * (HV * V)
    kg_ptr = kg_ptr + t0 * (HV * K)
    if GATE == 2:
        g_ptr = g_ptr + t0 * HV
    else:
        g_ptr = g_ptr + t0 * (HV * K)
    o_t = tl.arange(0, BT)
    m_t = o_t < T
    tokc = tl.minimum(o_t, T - 1)
    o_c = tl.arange(0, BC)
    if INV:
        M = tl.load(a_ptr + (o_t[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
    else:
        M = _solve_rows(a_ptr, o_t, o_c, T, i_hv, HV, BT, BC, APREC)
    rn_all = _rnorm(k_ptr, o_t, m_t, i_h, H, K, BK, KD, L2NORM)
    _wu_tail(M, k_ptr, v_ptr, b_ptr, g_ptr, w_ptr, u_ptr, kg_ptr, 0, T, 0, o_t, tokc, m_t, rn_all, i_h, i_hv,
             0, V, 0, BK, H, HV, K, V, BV, BT, GATE, KD, TF32, LOWP)


@triton.jit
def _solve_rows(a_ptr, o_t, o_c, T, i_hv, HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, APREC: tl.constexpr):
    """``M = (I + A)^-1`` ``[BT, BT]`` from the strict rows of ``A`` at ``a_ptr`` (block forward
    substitution, :func:`_solve_step`)."""
    M = tl.zeros([BT, BT], dtype=tl.float32)
    for i in range(0, BT // BC):
        o_ti = i * BC + o_c
        m_i = o_ti < T
        Akk = tl.load(a_ptr + (o_ti[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_i[:, None], other=0.0)
        A_ii = tl.load(a_ptr + (o_ti[:, None] * HV + i_hv) * BT + (i * BC + o_c)[None, :], mask=m_i[:, None], other=0.0)
        sel = tl.where(o_t[:, None] == o_ti[None, :], 1.0, 0.0)
        M = _solve_step(M, Akk, A_ii, o_t, o_ti, sel, BC, APREC)
    return M


@triton.jit
def _ablk(a_ptr, i, j, o_c, T, i_hv, HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """``[BC, BC]`` block (row block ``i``, column block ``j``) of the ``[BT, BT]`` rows at ``a_ptr``."""
    r = i * BC + o_c
    return tl.load(a_ptr + (r[:, None] * HV + i_hv) * BT + (j * BC + o_c)[None, :], mask=(r < T)[:, None], other=0.0)


@triton.jit
def _sblk(a_ptr, X, i, j, o_c, T, i_hv, HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    r = i * BC + o_c
    tl.store(a_ptr + (r[:, None] * HV + i_hv) * BT + (j * BC + o_c)[None, :], X.to(a_ptr.dtype.element_ty),
             mask=(r < T)[:, None])


@triton.jit
def _sblk_row(a_ptr, X0, X1, X2, X3, i, o_c, T, i_hv, HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Store row block ``i`` of the ``[BT, BT]`` rows at ``a_ptr`` as its four ``[BC, BC]`` blocks."""
    _sblk(a_ptr, X0, i, 0, o_c, T, i_hv, HV, BT, BC)
    _sblk(a_ptr, X1, i, 1, o_c, T, i_hv, HV, BT, BC)
    _sblk(a_ptr, X2, i, 2, o_c, T, i_hv, HV, BT, BC)
    _sblk(a_ptr, X3, i, 3, o_c, T, i_hv, HV, BT, BC)


@triton.jit
def chunk_intra_inv_kernel(
    a_ptr,  # in: [N, HV, BT] strict rows of A (FP32)
    m_ptr,  # out: [N, HV, BT] rows of M = (I + A)^-1: FP32 (may be a_ptr: in place) or the 16-bit scratch dtype
    cu_ptr,
    cidx_ptr,
    HV: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    APREC: tl.constexpr = "ieee",
    DIAG_INV: tl.constexpr = False,  # the diagonal blocks at a_ptr already hold M_ii (chunk_intra_arow_kernel)
    CHAIN: tl.constexpr = False,  # APREC "tf32x3" as chained TF32 products on operands split once (_block_inverse)
    STREAM: tl.constexpr = 0,  # (DIAG_INV, CHAIN) M blocks stored once formed; A blocks loaded first (2) or by row block (1)
):
    """Split in-chunk step, inverse only (BT = 4 BC): grid (chunks, HV); all ten ``[BC, BC]`` blocks of
    the lower triangle of ``M = (I + A)^-1`` as separate small products (light programs, few warps):
    ``M_ii = (I + A_ii)^-1`` (repeated squaring, IEEE; read as stored with ``DIAG_INV``),
    ``M_ij = -M_ii sum_{j<=l<i} A_il M_lj`` (``APREC``: FP32 inputs and accumulation); every block is
    read before any is written, except with ``STREAM`` (each ``M`` block stored once formed; with ``STREAM == 1`` a
    row block's ``A`` blocks are read after the earlier rows' stores, none at a position already written)."""
    tl.static_assert(BT == 4 * BC, "the inverse kernel is written for four diagonal blocks")
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    t0, T = _chunk_start(cu_ptr, cidx_ptr, i_c, BT)
    a_ptr = a_ptr + t0 * (HV * BT)
    m_ptr = m_ptr + t0 * (HV * BT)
    o_c = tl.arange(0, BC)
    tl.static_assert(STREAM == 0 or (DIAG_INV and CHAIN), "STREAM: diagonal inverses read as stored, chained merges")
    if STREAM:  # DIAG_INV and CHAIN: each M block stored once formed; STREAM 2: every block loaded first,
        # 1: a row block's blocks loaded when it starts (after the earlier rows' stores, which may alias them)
        z = tl.zeros([BC, BC], dtype=tl.float32)
        M00 = _ablk(a_ptr, 0, 0, o_c, T, i_hv, HV, BT, BC)
        A10 = _ablk(a_ptr, 1, 0, o_c, T, i_hv, HV, BT, BC)
        M11 = _ablk(a_ptr, 1, 1, o_c, T, i_hv, HV, BT, BC)
        if STREAM == 2:
            A20 = _ablk(a_ptr, 2, 0, o_c, T, i_hv, HV, BT, BC)
            A21 = _ablk(a_ptr, 2, 1, o_c, T, i_hv, HV, BT, BC)
            M22 = _ablk(a_ptr, 2, 2, o_c, T, i_hv, HV, BT, BC)
            A30 = _ablk(a_ptr, 3, 0, o_c, T, i_hv, HV, BT, BC)
            A31 = _ablk(a_ptr, 3, 1, o_c, T, i_hv, HV, BT, BC)
            A32 = _ablk(a_ptr, 3, 2, o_c, T, i_hv, HV, BT, BC)
            M33 = _ablk(a_ptr, 3, 3, o_c, T, i_hv, HV, BT, BC)
        _sblk_row(m_ptr, M00, z, z, z, 0, o_c, T, i_hv, HV, BT, BC)
        M10 = _dot3(-M11, _dot3(A10, M00, z), z)
        _sblk_row(m_ptr, M10, M11, z, z, 1, o_c, T, i_hv, HV, BT, BC)
        if STREAM == 1:
            A20 = _ablk(a_ptr, 2, 0, o_c, T, i_hv, HV, BT, BC)
            A21 = _ablk(a_ptr, 2, 1, o_c, T, i_hv, HV, BT, BC)
            M22 = _ablk(a_ptr, 2, 2, o_c, T, i_hv, HV, BT, BC)
        M21 = _dot3(-M22, _dot3(A21, M11, z), z)
        M20 = _dot3(-M22, _dot3(A21, M10, _dot3(A20, M00, z)), z)
        _sblk_row(m_ptr, M20, M21, M22, z, 2, o_c, T, i_hv, HV, BT, BC)
        if STREAM == 1:
            A30 = _ablk(a_ptr, 3, 0, o_c, T, i_hv, HV, BT, BC)
            A31 = _ablk(a_ptr, 3, 1, o_c, T, i_hv, HV, BT, BC)
            A32 = _ablk(a_ptr, 3, 2, o_c, T, i_hv, HV, BT, BC)
            M33 = _ablk(a_ptr, 3, 3, o_c, T, i_hv, HV, BT, BC)
        _sblk(m_ptr, _dot3(-M33, _dot3(A32, M22, z), z), 3, 2, o_c, T, i_hv, HV, BT, BC)
        _sblk(m_ptr, _dot3(-M33, _dot3(A32, M21, _dot3(A31, M11, z)), z), 3, 1, o_c, T, i_hv, HV, BT, BC)
        _sblk(m_ptr, _dot3(-M33, _dot3(A32, M20, _dot3(A31, M10, _dot3(A30, M00, z))), z), 3, 0, o_c, T, i_hv, HV, BT, BC)
        _sblk(m_ptr, M33, 3, 3, o_c, T, i_hv, HV, BT, BC)
        return
    M00, M10, M11, M20, M21, M22, M30, M31, M32, M33 = _block_inverse(
        _ablk(a_ptr, 0, 0, o_c, T, i_hv, HV, BT, BC), _ablk(a_ptr, 1, 0, o_c, T, i_hv, HV, BT, BC),
        _ablk(a_ptr, 1, 1, o_c, T, i_hv, HV, BT, BC), _ablk(a_ptr, 2, 0, o_c, T, i_hv, HV, BT, BC),
        _ablk(a_ptr, 2, 1, o_c, T, i_hv, HV, BT, BC), _ablk(a_ptr, 2, 2, o_c, T, i_hv, HV, BT, BC),
        _ablk(a_ptr, 3, 0, o_c, T, i_hv, HV, BT, BC), _ablk(a_ptr, 3, 1, o_c, T, i_hv, HV, BT, BC),
        _ablk(a_ptr, 3, 2, o_c, T, i_hv, HV, BT, BC), _ablk(a_ptr, 3, 3, o_c, T, i_hv, HV, BT, BC), BC, APREC, DIAG_INV,
        CHAIN)
    _store_lower(m_ptr, M00, M10, M11, M20, M21, M22, M30, M31, M32, M33, o_c, T, i_hv, HV, BT, BC)


@triton.jit
def _dot3_split(ah, al, b, acc):
    """``acc + (ah + al) b`` as three chained TF32 tensor-core products, ``a`` given split
    (:func:`_tf32_split`) and ``b`` split here: ``lo hi + hi lo + hi hi`` with FP32 accumulation, i.e.
    Triton's ``tf32x3`` without its per-product re-split, NaN mask and separate add."""
    bh, bl = _tf32_split(b)
    acc = tl.dot(al, bh, acc, input_precision="tf32")
    acc = tl.dot(ah, bl, acc, input_precision="tf32")
    return tl.dot(ah, bh, acc, input_precision="tf32")


@triton.jit
def _dot3(a, b, acc):
    """``acc + a b`` by :func:`_dot3_split`, ``a`` split here too."""
    ah, al = _tf32_split(a)
    return _dot3_split(ah, al, b, acc)


@triton.jit
def _tril_inverse_16_x3(A, BC: tl.constexpr):
    """``(I + A)^-1`` for a strictly lower-triangular ``[BC, BC]`` block (``BC <= 16``, FP32) as
    ``(I - A)(I + A^2)(I + A^4)(I + A^8)``: :func:`triton_chunk._tril_inverse_16`'s repeated squaring with
    each of the six products as three chained TF32 tensor-core products (:func:`_dot3`, FP32 accumulation)
    instead of FP32 FMA; ``X (I + P)`` is formed as ``X + X P``."""
    r = tl.arange(0, BC)
    inv = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - A
    P = _dot3(A, A, tl.zeros([BC, BC], dtype=tl.float32))
    inv = _dot3(inv, P, inv)
    P = _dot3(P, P, tl.zeros([BC, BC], dtype=tl.float32))
    inv = _dot3(inv, P, inv)
    P = _dot3(P, P, tl.zeros([BC, BC], dtype=tl.float32))
    return _dot3(inv, P, inv)


@triton.jit
def _block_inverse(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, BC: tl.constexpr, APREC: tl.constexpr,
                   DIAG_INV: tl.constexpr = False, CHAIN: tl.constexpr = False):
    """The ten lower ``[BC, BC]`` blocks of ``M = (I + A)^-1`` (``BT = 4 BC``) from those of the strictly
    lower ``A``: ``M_ii = (I + A_ii)^-1`` (repeated squaring, IEEE; with ``DIAG_INV`` the diagonal
    arguments already are ``M_ii``), ``M_ij = -M_ii sum_{j<=l<i} A_il M_lj`` (``APREC``: FP32 inputs and
    accumulation)."""
    if DIAG_INV:
        M00, M11, M22, M33 = A00, A11, A22, A33
    else:
        M00 = _tril_inverse_16(A00, BC)
        M11 = _tril_inverse_16(A11, BC)
        M22 = _tril_inverse_16(A22, BC)
        M33 = _tril_inverse_16(A33, BC)
    if CHAIN:  # APREC "tf32x3": the sums accumulate in the products (negation is exact)
        z = tl.zeros([BC, BC], dtype=tl.float32)
        M10 = _dot3(-M11, _dot3(A10, M00, z), z)
        M21 = _dot3(-M22, _dot3(A21, M11, z), z)
        M32 = _dot3(-M33, _dot3(A32, M22, z), z)
        M20 = _dot3(-M22, _dot3(A21, M10, _dot3(A20, M00, z)), z)
        M31 = _dot3(-M33, _dot3(A32, M21, _dot3(A31, M11, z)), z)
        M30 = _dot3(-M33, _dot3(A32, M20, _dot3(A31, M10, _dot3(A30, M00, z))), z)
        return M00, M10, M11, M20, M21, M22, M30, M31, M32, M33
    M10 = -tl.dot(M11, tl.dot(A10, M00, input_precision=APREC), input_precision=APREC)
    M21 = -tl.dot(M22, tl.dot(A21, M11, input_precision=APREC), input_precision=APREC)
    M32 = -tl.dot(M33, tl.dot(A32, M22, input_precision=APREC), input_precision=APREC)
    M20 = -tl.dot(M22, tl.dot(A20, M00, input_precision=APREC) + tl.dot(A21, M10, input_precision=APREC),
                  input_precision=APREC)
    M31 = -tl.dot(M33, tl.dot(A31, M11, input_precision=APREC) + tl.dot(A32, M21, input_precision=APREC),
                  input_precision=APREC)
    M30 = -tl.dot(M33, tl.dot(A30, M00, input_precision=APREC) + tl.dot(A31, M10, input_precision=APREC)
                  + tl.dot(A32, M20, input_precision=APREC), input_precision=APREC)
    return M00, M10, M11, M20, M21, M22, M30, M31, M32, M33


@triton.jit
def _store_lower(a_ptr, X00, X10, X11, X20, X21, X22, X30, X31, X32, X33, o_c, T, i_hv,
                 HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Store ten lower ``[BC, BC]`` blocks as the ``[BT, BT]`` rows at ``a_ptr`` (upper blocks as zeros)."""
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    _sblk_row(a_ptr, X00, zero, zero, zero, 0, o_c, T, i_hv, HV, BT, BC)
    _sblk_row(a_ptr, X10, X11, zero, zero, 1, o_c, T, i_hv, HV, BT, BC)
    _sblk_row(a_ptr, X20, X21, X22, zero, 2, o_c, T, i_hv, HV, BT, BC)
    _sblk_row(a_ptr, X30, X31, X32, X33, 3, o_c, T, i_hv, HV, BT, BC)


@triton.jit
def _ab_rows(q_ptr, k_ptr, g_ptr, i, kd, T, i_h, i_hv, H: tl.constexpr, HV: tl.constexpr,
             K: tl.constexpr, KD: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr, FAST: tl.constexpr,
             JOIN: tl.constexpr = False):
    """Row block ``i`` over channels ``kd ..`` for :func:`chunk_intra_arow_kernel`: ``X = [k; q]``
    (``[2 BC, KD]``, zero past the chunk; ``k`` and ``q`` stacked so that one product gives a block of
    ``A`` and of ``Aqk`` with ``M = 32``: a 16-row product on two warps holds and computes each block
    twice) times the row factor ``e^{G_t - G_r}`` (``r``: the block's first row; exponent in
    ``[-15 |lb|, 0]``), the sums of squares of ``X``'s rows (before the factor) and ``G_r`` (``[KD]``;
    KDA only). GDN: no factor (its decay matrix is applied to the finished blocks)."""
    o_r = tl.arange(0, 2 * BC)
    o_t = i * BC + (o_r % BC)
    m = o_t < T
    o_d = kd + tl.arange(0, KD)
    if JOIN:  # k and q as two [BC, KD] tiles, then stacked: each load keeps its 16-byte contiguity
        o_b = i * BC + tl.arange(0, BC)
        X = tl.reshape(tl.permute(tl.join(_tile(k_ptr, o_b, o_b < T, i_h, H, K, kd, KD),
                                          _tile(q_ptr, o_b, o_b < T, i_h, H, K, kd, KD)), (2, 0, 1)), (2 * BC, KD))
    else:  # one [2 BC, KD] load through a per-row pointer select (Triton 3.8 loses the rows' contiguity)
        base = tl.where(o_r < BC, k_ptr, q_ptr)
        X = tl.load(base[:, None] + ((o_t * H + i_h) * K)[:, None] + o_d[None, :], mask=m[:, None] & (o_d < K)[None, :],
                    other=0.0).to(tl.float32)
    ss = tl.sum(X * X, axis=1)
    if GATE == 2:
        return X, ss, o_d
    else:
        Gr = tl.load(g_ptr + (tl.minimum(i * BC, T - 1) * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
        G = _tile(g_ptr, tl.minimum(o_t, T - 1), m | ~m, i_hv, HV, K, kd, KD)
        return X * _fexp(G - Gr[None, :], FAST), ss, Gr


@triton.jit
def _ab_cols(k_ptr, g_ptr, j, kd, T, i_h, i_hv, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
             KD: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr, FAST: tl.constexpr, DIRECT: tl.constexpr = False):
    """Column block ``j`` over channels ``kd ..``: ``k_s e^{E - G_s}`` (``[BC, KD]``; ``E``: ``G`` at the
    block's last row, exponent in ``[-15 |lb|, 0]``; GDN: ``k_s``), ``E`` (``[KD]``) and the sums of
    squares of the raw ``k_s``. ``DIRECT``: the raw ``k_s`` and the ``[BC, KD]`` tile ``G_s`` instead
    (:func:`_ab_acc` then exponentiates ``G_r - G_s`` per pair)."""
    o_c = j * BC + tl.arange(0, BC)
    k = _tile(k_ptr, o_c, o_c < T, i_h, H, K, kd, KD)
    ss = tl.sum(k * k, axis=1)
    o_d = kd + tl.arange(0, KD)
    if GATE == 2:
        return k, o_d, ss
    elif DIRECT:
        return k, _tile(g_ptr, tl.minimum(o_c, T - 1), o_c >= 0, i_hv, HV, K, kd, KD), ss
    else:
        E = tl.load(g_ptr + (tl.minimum(j * BC + BC - 1, T - 1) * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
        G = _tile(g_ptr, tl.minimum(o_c, T - 1), o_c >= 0, i_hv, HV, K, kd, KD)
        return k * _fexp(E[None, :] - G, FAST), E, ss


@triton.jit
def _tf32_split(x):
    """``x = hi + lo`` (FP32) with ``hi`` exact in TF32 (the low 13 mantissa bits cleared), so a TF32
    tensor-core product of ``hi`` loses nothing and one of ``lo`` (``|lo| < 2^-10 |x|``) only bits below about
    ``2^-20 |x|``."""
    hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _ab_acc(X, Xh, Xl, kt, Gr, E, GATE: tl.constexpr, APREC: tl.constexpr, FAST: tl.constexpr,
            DIRECT: tl.constexpr = False):
    """Add one key block to block pair ``(i, j)`` (``[2 BC, BC]``: ``A`` rows over ``Aqk`` rows): rows
    ``Xh + Xl`` of block ``i`` times columns ``k_s e^{G_r - G_s} = (k_s e^{E_j - G_s}) e^{G_r - E_j}`` of
    block ``j`` (per channel: ``G_r - E_j <= 0`` for ``j < i``; in ``[0, 15 |lb|]`` on the diagonal),
    so the pair itself exponentiates only a ``[KD]`` vector. ``APREC == "tf32x3"``: ``Xh`` / ``Xl`` are
    the row block's TF32 high / low parts (split once per key block, :func:`_tf32_split`), the
    columns are split here, and the three TF32 products ``lo hi + hi lo + hi hi`` accumulate straight
    into ``X`` (Triton's own ``tf32x3`` re-splits both operands per product and adds its result to
    ``X`` afterwards). ``"tf32"`` (GDN with 16-bit inputs, every operand exact in TF32): one product.
    Else one product of ``Xh`` with ``APREC``. ``DIRECT`` (``E``: the column block's ``[BC, KD]`` tile
    ``G_s``): the columns as ``k_s e^{G_r - G_s}`` in one exponential per element (exponent at most
    ``15 |lb|`` on the diagonal; for ``j < i`` it is negative, and where it underflows the true term
    ``e^{G_t - G_s} <= e^{G_r - G_s}`` is below ``1e-38`` too)."""
    if GATE == 2:
        c = tl.trans(kt)
    elif DIRECT:
        c = tl.trans(kt * _fexp(Gr[None, :] - E, FAST))
    else:
        c = tl.trans(kt * _fexp(Gr - E, FAST)[None, :])
    if APREC == "tf32x3":
        return _dot3_split(Xh, Xl, c, X)
    else:
        return tl.dot(Xh, c, X, input_precision=APREC)


@triton.jit
def _ab_row_factors(b_ptr, o_t, m_i, i_hv, HV: tl.constexpr, sk, sq, scale, L2NORM: tl.constexpr):
    """Row factors of a row block's ``A`` (``rsqrt(|k|^2 + 1e-6) x sigmoid(beta)``) and ``Aqk``
    (``rsqrt(|q|^2 + 1e-6) x scale``) from the rows' sums of squares ``sk`` / ``sq`` (``[BC]``, FP32)."""
    beta = tl.load(b_ptr + o_t * HV + i_hv, mask=m_i, other=0.0).to(tl.float32)
    beta = tl.where(m_i, 1.0 / (1.0 + tl.exp(-beta)), 0.0)
    if L2NORM:
        return tl.rsqrt(sk + 1e-6) * beta, tl.rsqrt(sq + 1e-6) * scale
    else:
        return beta, sq * 0.0 + scale


@triton.jit
def _ab_acc_splitq(XA, XQ, kh, kl, qx, kt, Gr, E, FAST: tl.constexpr, DIRECT: tl.constexpr):
    """One key block of pair ``(i, j)`` for :func:`_arow_block_splitq`: the columns as in :func:`_ab_acc`
    (KDA), ``XA += (kh + kl) c`` as three TF32 products (:func:`_dot3_split`), ``XQ += qx c`` as one."""
    if DIRECT:
        c = tl.trans(kt * _fexp(Gr[None, :] - E, FAST))
    else:
        c = tl.trans(kt * _fexp(Gr - E, FAST)[None, :])
    XQ = tl.dot(qx, c, XQ, input_precision="tf32")
    return _dot3_split(kh, kl, c, XA), XQ


@triton.jit
def _ab_store(X, i, j: tl.constexpr, rk_i, rq_i, sc_j, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV: tl.constexpr,
              BT: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr, L2NORM: tl.constexpr, DIAG_INV: tl.constexpr,
              A_UPPER: tl.constexpr = True, Q_UPPER: tl.constexpr = True):
    """Finish and store block pair ``(i, j)`` of a stacked ``[2 BC, BC]`` accumulator: ``A`` (row factor
    ``rk_i`` = norm x beta) and ``Aqk`` (``rq_i`` = norm x scale) times the column norms (from the
    sums of squares ``sc_j``), GDN's decay matrix, masked strict / causal by token (blocks ``j > i``: as
    :func:`_ab_store_pair` says); with ``DIAG_INV`` the diagonal block is stored as ``(I + A_ii)^-1`` (repeated squaring:
    FP32 FMA products, or 3xTF32 ones with ``DIAG_INV == 2``, :func:`_tril_inverse_16_x3`)."""
    Akk, Aq = tl.split(tl.permute(tl.reshape(X, (2, BC, BC)), (1, 2, 0)))
    _ab_store_pair(Akk, Aq, i, j, rk_i, rq_i, sc_j, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, GATE, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)


@triton.jit
def _ab_store_pair(Akk, Aq, i, j: tl.constexpr, rk_i, rq_i, sc_j, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV: tl.constexpr,
                   BT: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr, L2NORM: tl.constexpr, DIAG_INV: tl.constexpr,
                   A_UPPER: tl.constexpr = True, Q_UPPER: tl.constexpr = True):
    """:func:`_ab_store` of the two ``[BC, BC]`` halves, ``A`` rows ``Akk`` and ``Aqk`` rows ``Aq``. Blocks
    above the diagonal (``j > i``) are stored as zeros only for a reader of whole rows: ``A_UPPER`` (no
    inverse launch) / ``Q_UPPER`` (the state pass that forms the output; the output step loads causal
    blocks only)."""
    if j <= i:
        if L2NORM:
            rc = tl.rsqrt(sc_j + 1e-6)
        else:
            rc = sc_j * 0.0 + 1.0
        o_c = tl.arange(0, BC)
        t = i * BC + o_c
        s = j * BC + o_c
        Akk = Akk * rk_i[:, None] * rc[None, :]
        Aq = Aq * rq_i[:, None] * rc[None, :]
        if GATE == 2:
            gi = tl.load(g_ptr + tl.minimum(t, T - 1) * HV + i_hv)
            gj = tl.load(g_ptr + tl.minimum(s, T - 1) * HV + i_hv)
            D = tl.exp(tl.where(t[:, None] >= s[None, :], gi[:, None] - gj[None, :], float("-inf")))
            Akk = Akk * D
            Aq = Aq * D
        _sblk(aqk_ptr, tl.where(t[:, None] >= s[None, :], Aq, 0.0), i, j, o_c, T, i_hv, HV, BT, BC)
        Akk = tl.where(t[:, None] > s[None, :], Akk, 0.0)
        if DIAG_INV:
            if i == j:
                if DIAG_INV == 2:
                    Akk = _tril_inverse_16_x3(Akk, BC)
                else:
                    Akk = _tril_inverse_16(Akk, BC)
        _sblk(a_ptr, Akk, i, j, o_c, T, i_hv, HV, BT, BC)
    else:
        if A_UPPER:
            _sblk(a_ptr, tl.zeros([BC, BC], dtype=tl.float32), i, j, tl.arange(0, BC), T, i_hv, HV, BT, BC)
        if Q_UPPER:
            _sblk(aqk_ptr, tl.zeros([BC, BC], dtype=tl.float32), i, j, tl.arange(0, BC), T, i_hv, HV, BT, BC)


@triton.jit
def chunk_intra_arow_kernel(
    q_ptr,  # [N, H, K]
    k_ptr,  # [N, H, K]
    b_ptr,  # [N, HV] raw beta
    g_ptr,  # [N, HV, K] / [N, HV] chunk-local cumulative log decay (FP32)
    aqk_ptr,  # out [N, HV, BT] in-chunk attention row (FP32)
    a_ptr,  # out [N, HV, BT] strict rows of A (beta-scaled, FP32)
    cu_ptr,
    cidx_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    KD: tl.constexpr,
    APREC: tl.constexpr = "ieee",
    DIAG_INV: tl.constexpr = False,  # store the diagonal block as (I + A_ii)^-1 (for chunk_intra_inv_kernel's DIAG_INV); 2: by 3xTF32 products
    FAST_EXP: tl.constexpr = False,  # CUDA: _fexp without the denormal fix-up
    ROWSPEC: tl.constexpr = False,  # one code path per row block (ChunkLaunch.intra_a_rowspec)
    DIRECT: tl.constexpr = False,  # column factors e^{G_r - G_s} per pair (ChunkLaunch.intra_a_direct)
    rq_ptr=None,  # out [N, HV] FP32 q's row factor (RQ; None otherwise: no argument compiled)
    RQ: tl.constexpr = False,  # GDN: store q's row factor for the state pass that forms the output (FUSE_O)
    SPLITQ: tl.constexpr = False,  # KDA tf32x3: Aqk as its own single TF32 product (ChunkLaunch.intra_aqk_tf32)
    qeg_ptr=None,  # out [N, HV, K] q e^G (raw q; scratch dtype) for the fused KDA output (SPLITQ with RQ)
    A_UPPER: tl.constexpr = True,  # store A's blocks above the diagonal as zeros (False: the inverse launch reads below only)
    Q_UPPER: tl.constexpr = True,  # the same for Aqk (False: read by the output step, which loads causal blocks only)
    JOIN: tl.constexpr = False,  # stacked form: k and q loaded as two tiles and joined (ChunkLaunch.intra_a_join)
):
    """Split in-chunk step, part 1, stacked form (``intra_a_stacked``, issue 4): grid (chunks, HV, BT / BC);
    program ``i`` builds rows ``i*BC ..`` of ``A`` and ``Aqk`` as :func:`chunk_intra_a_kernel` does, with
    the key blocks of ``KD`` channels in the outer loop: the row block's ``[k; q]`` (stacked into one
    ``[2 BC, KD]`` operand) and its decays are loaded and exponentiated once per key block for every
    column block ``j <= i``; each column block carries ``e^{E_j - G_s}`` (``E_j``: ``G`` at its last
    row) and each pair only a ``[KD]`` vector ``e^{G_r - E_j}``. Bounded KDA gate (``15 |lower_bound|
    <= 80``) or GDN; the unbounded gate keeps :func:`chunk_intra_a_kernel`. Every product with ``APREC``
    (FP32 inputs and accumulation for ``A``; ``Aqk`` in the same product). ``RQ`` (GDN): also each row's
    ``rsqrt(|q|^2 + 1e-6) x scale x e^G``, the factor the fused output (:func:`chunk_state_kernel` with
    ``FUSE_O``) applies to its ``q h_c`` rows. ``SPLITQ`` (KDA, ``APREC == "tf32x3"``): ``k`` and ``q`` are
    not stacked; ``A`` takes the three TF32 products and ``Aqk`` one (:func:`_arow_block_splitq`); with ``RQ``
    it writes ``q e^G`` (raw q) and q's row factor ``rsqrt(|q|^2 + 1e-6) x scale`` for the fused KDA output."""
    tl.static_assert(not RQ or GATE == 2 or SPLITQ, "q's row factor: the fused GDN output, or KDA's with SPLITQ")
    tl.static_assert(not SPLITQ or (GATE != 2 and APREC == "tf32x3"), "SPLITQ: the KDA gate with tf32x3 products")
    i_hv = tl.program_id(1)
    i = tl.program_id(2)
    i_h = i_hv // (HV // H)
    if RQ:
        t0r, _Tr = _chunk_start(cu_ptr, cidx_ptr, tl.program_id(0), BT)
        rq_ptr = rq_ptr + t0r * HV
        if SPLITQ:
            qeg_ptr = qeg_ptr + t0r * (HV * K)
    T, q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr = _a_rows_start(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, cu_ptr,
                                                                  cidx_ptr, H, HV, K, BT, GATE)
    if ROWSPEC:
        # one specialised copy per row block: the column-block tests are static, and nothing is
        # re-staged across the (now absent) branches
        if i == 0:
            _arow_block(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, 0, H, HV, K, BK, BT, BC, GATE,
                        L2NORM, KD, APREC, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, RQ, SPLITQ, qeg_ptr, A_UPPER, Q_UPPER, JOIN)
        elif i == 1:
            _arow_block(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, 1, H, HV, K, BK, BT, BC, GATE,
                        L2NORM, KD, APREC, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, RQ, SPLITQ, qeg_ptr, A_UPPER, Q_UPPER, JOIN)
        elif i == 2:
            _arow_block(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, 2, H, HV, K, BK, BT, BC, GATE,
                        L2NORM, KD, APREC, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, RQ, SPLITQ, qeg_ptr, A_UPPER, Q_UPPER, JOIN)
        else:
            _arow_block(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, 3, H, HV, K, BK, BT, BC, GATE,
                        L2NORM, KD, APREC, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, RQ, SPLITQ, qeg_ptr, A_UPPER, Q_UPPER, JOIN)
    else:
        _arow_block(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, i, H, HV, K, BK, BT, BC, GATE,
                    L2NORM, KD, APREC, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, RQ, SPLITQ, qeg_ptr, A_UPPER, Q_UPPER, JOIN)


@triton.jit
def _arow_block(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, i, H: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, GATE: tl.constexpr,
                L2NORM: tl.constexpr, KD: tl.constexpr, APREC: tl.constexpr, DIAG_INV: tl.constexpr,
                FAST_EXP: tl.constexpr, DIRECT: tl.constexpr, rq_ptr, RQ: tl.constexpr, SPLITQ: tl.constexpr = False,
                qeg_ptr=None, A_UPPER: tl.constexpr = True, Q_UPPER: tl.constexpr = True, JOIN: tl.constexpr = False):
    """Body of :func:`chunk_intra_arow_kernel` for row block ``i`` (a program id, or a literal, which
    makes every ``i >= j`` test below static)."""
    if SPLITQ:
        _arow_block_splitq(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, i, H, HV, K, BK, BT, BC,
                           L2NORM, KD, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, qeg_ptr, RQ, A_UPPER, Q_UPPER)
    else:
        _arow_block_stacked(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, i, H, HV, K, BK, BT, BC,
                            GATE, L2NORM, KD, APREC, DIAG_INV, FAST_EXP, DIRECT, rq_ptr, RQ, A_UPPER, Q_UPPER, JOIN)


@triton.jit
def _arow_block_splitq(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, i, H: tl.constexpr,
                       HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                       L2NORM: tl.constexpr, KD: tl.constexpr, DIAG_INV: tl.constexpr, FAST_EXP: tl.constexpr,
                       DIRECT: tl.constexpr, rq_ptr, qeg_ptr, QEG: tl.constexpr, A_UPPER: tl.constexpr,
                       Q_UPPER: tl.constexpr):
    """Row block ``i`` of ``A`` and ``Aqk`` (KDA, bounded gate, ``tf32x3``) with ``k`` and ``q`` as two
    ``[BC, KD]`` operands instead of one stacked ``[2 BC, KD]``: the row factor ``e^{G_t - G_r}`` is
    exponentiated once for both (the stacked rows repeat ``G``), the row split of :func:`_tf32_split`
    covers ``k`` only, and ``Aqk`` is one TF32 product (``A``: three, FP32 inputs and accumulation as
    the issue asks of the dependency matrix). ``Aqk`` only feeds the output step, which rounds it to the
    BF16 scratch (``output_lowp``) before its product, and fla builds it with one TF32 product too.
    ``QEG`` (the fused KDA output): also ``q e^G = (q e^{G_t - G_r}) e^{G_r}`` (raw q, in ``qeg_ptr``'s
    dtype; the key-block loop has both factors) and q's row factor ``rsqrt(|q|^2 + 1e-6) x scale`` (FP32,
    ``rq_ptr``), which the state pass (``FUSE_O``) applies to its ``(q e^G) h_c`` rows. (Normalising
    ``q e^G`` here instead, in a second pass over q and G once the norms are known, cost the H200 more in
    these programs than the row factor costs the state pass.) Issue 4 (twelfth round)."""
    zb = tl.zeros([BC, BC], dtype=tl.float32)
    A0, A1, A2, A3 = zb, zb, zb, zb
    Q0, Q1, Q2, Q3 = zb, zb, zb, zb
    zc = tl.zeros([BC], dtype=tl.float32)
    c0, c1, c2, c3 = zc, zc, zc, zc
    sk, sq = zc, zc
    o_t = i * BC + tl.arange(0, BC)
    m_i = o_t < T
    for kd in range(0, BK, KD):
        o_d = kd + tl.arange(0, KD)
        kr = _tile(k_ptr, o_t, m_i, i_h, H, K, kd, KD)
        qr = _tile(q_ptr, o_t, m_i, i_h, H, K, kd, KD)
        sk += tl.sum(kr * kr, axis=1)
        sq += tl.sum(qr * qr, axis=1)
        Gr = tl.load(g_ptr + (tl.minimum(i * BC, T - 1) * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
        ef = _fexp(_tile(g_ptr, tl.minimum(o_t, T - 1), m_i | ~m_i, i_hv, HV, K, kd, KD) - Gr[None, :], FAST_EXP)
        kh, kl = _tf32_split(kr * ef)
        qx = qr * ef
        if QEG:
            tl.store(qeg_ptr + (o_t[:, None] * HV + i_hv) * K + o_d[None, :],
                     (qx * _fexp(Gr, FAST_EXP)[None, :]).to(qeg_ptr.dtype.element_ty), mask=m_i[:, None] & (o_d < K)[None, :])
        kt, E, sc = _ab_cols(k_ptr, g_ptr, 0, kd, T, i_h, i_hv, H, HV, K, KD, BC, 1, FAST_EXP, DIRECT)
        c0 += sc
        A0, Q0 = _ab_acc_splitq(A0, Q0, kh, kl, qx, kt, Gr, E, FAST_EXP, DIRECT)
        if i >= 1:
            kt, E, sc = _ab_cols(k_ptr, g_ptr, 1, kd, T, i_h, i_hv, H, HV, K, KD, BC, 1, FAST_EXP, DIRECT)
            c1 += sc
            A1, Q1 = _ab_acc_splitq(A1, Q1, kh, kl, qx, kt, Gr, E, FAST_EXP, DIRECT)
        if i >= 2:
            kt, E, sc = _ab_cols(k_ptr, g_ptr, 2, kd, T, i_h, i_hv, H, HV, K, KD, BC, 1, FAST_EXP, DIRECT)
            c2 += sc
            A2, Q2 = _ab_acc_splitq(A2, Q2, kh, kl, qx, kt, Gr, E, FAST_EXP, DIRECT)
        if i >= 3:
            kt, E, sc = _ab_cols(k_ptr, g_ptr, 3, kd, T, i_h, i_hv, H, HV, K, KD, BC, 1, FAST_EXP, DIRECT)
            c3 += sc
            A3, Q3 = _ab_acc_splitq(A3, Q3, kh, kl, qx, kt, Gr, E, FAST_EXP, DIRECT)
    rk, rq = _ab_row_factors(b_ptr, o_t, m_i, i_hv, HV, sk, sq, scale, L2NORM)
    _ab_store_pair(A0, Q0, i, 0, rk, rq, c0, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, 1, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    _ab_store_pair(A1, Q1, i, 1, rk, rq, c1, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, 1, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    _ab_store_pair(A2, Q2, i, 2, rk, rq, c2, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, 1, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    _ab_store_pair(A3, Q3, i, 3, rk, rq, c3, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, 1, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    if QEG:
        tl.store(rq_ptr + o_t * HV + i_hv, rq, mask=m_i)


@triton.jit
def _arow_block_stacked(q_ptr, k_ptr, b_ptr, g_ptr, aqk_ptr, a_ptr, T, i_h, i_hv, scale, i, H: tl.constexpr,
                        HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                        GATE: tl.constexpr, L2NORM: tl.constexpr, KD: tl.constexpr, APREC: tl.constexpr,
                        DIAG_INV: tl.constexpr, FAST_EXP: tl.constexpr, DIRECT: tl.constexpr, rq_ptr, RQ: tl.constexpr,
                        A_UPPER: tl.constexpr, Q_UPPER: tl.constexpr, JOIN: tl.constexpr = False):
    """The stacked ``[k; q]`` body of :func:`_arow_block`."""
    z = tl.zeros([2 * BC, BC], dtype=tl.float32)
    X0, X1, X2, X3 = z, z, z, z
    zc = tl.zeros([BC], dtype=tl.float32)
    c0, c1, c2, c3 = zc, zc, zc, zc
    sr = tl.zeros([2 * BC], dtype=tl.float32)
    # GDN with 16-bit q / k: every operand is a raw input, exact in TF32, so one TF32 product is exact
    PREC: tl.constexpr = "tf32" if (APREC == "tf32x3" and GATE == 2 and q_ptr.dtype.element_ty.primitive_bitwidth == 16
                                    and k_ptr.dtype.element_ty.primitive_bitwidth == 16) else APREC
    for kd in range(0, BK, KD):
        Xr, ss, Gr = _ab_rows(q_ptr, k_ptr, g_ptr, i, kd, T, i_h, i_hv, H, HV, K, KD, BC, GATE, FAST_EXP, JOIN)
        sr += ss
        if PREC == "tf32x3":
            Xh, Xl = _tf32_split(Xr)
        else:
            Xh, Xl = Xr, Xr
        kt, E, sc = _ab_cols(k_ptr, g_ptr, 0, kd, T, i_h, i_hv, H, HV, K, KD, BC, GATE, FAST_EXP, DIRECT)
        c0 += sc
        X0 = _ab_acc(X0, Xh, Xl, kt, Gr, E, GATE, PREC, FAST_EXP, DIRECT)
        if i >= 1:
            kt, E, sc = _ab_cols(k_ptr, g_ptr, 1, kd, T, i_h, i_hv, H, HV, K, KD, BC, GATE, FAST_EXP, DIRECT)
            c1 += sc
            X1 = _ab_acc(X1, Xh, Xl, kt, Gr, E, GATE, PREC, FAST_EXP, DIRECT)
        if i >= 2:
            kt, E, sc = _ab_cols(k_ptr, g_ptr, 2, kd, T, i_h, i_hv, H, HV, K, KD, BC, GATE, FAST_EXP, DIRECT)
            c2 += sc
            X2 = _ab_acc(X2, Xh, Xl, kt, Gr, E, GATE, PREC, FAST_EXP, DIRECT)
        if i >= 3:
            kt, E, sc = _ab_cols(k_ptr, g_ptr, 3, kd, T, i_h, i_hv, H, HV, K, KD, BC, GATE, FAST_EXP, DIRECT)
            c3 += sc
            X3 = _ab_acc(X3, Xh, Xl, kt, Gr, E, GATE, PREC, FAST_EXP, DIRECT)
    sk, sq = tl.split(tl.permute(tl.reshape(sr, (2, BC)), (1, 0)))
    o_t = i * BC + tl.arange(0, BC)
    m_i = o_t < T
    rk, rq = _ab_row_factors(b_ptr, o_t, m_i, i_hv, HV, sk, sq, scale, L2NORM)
    if RQ:
        tl.store(rq_ptr + o_t * HV + i_hv, rq * tl.exp(tl.load(g_ptr + o_t * HV + i_hv, mask=m_i, other=0.0)), mask=m_i)
    _ab_store(X0, i, 0, rk, rq, c0, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, GATE, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    _ab_store(X1, i, 1, rk, rq, c1, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, GATE, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    _ab_store(X2, i, 2, rk, rq, c2, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, GATE, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)
    _ab_store(X3, i, 3, rk, rq, c3, g_ptr, aqk_ptr, a_ptr, T, i_hv, HV, BT, BC, GATE, L2NORM, DIAG_INV, A_UPPER, Q_UPPER)


@triton.jit
def _wu_tail(M, k_ptr, v_ptr, b_ptr, g_ptr, w_ptr, u_ptr, kg_ptr, bos, T, c, tok, tokc, m_t, rn_all, i_h, i_hv,
             v_lo, v_hi, k_lo, k_hi, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
             BV: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr, KD: tl.constexpr, TF32: tl.constexpr,
             LOWP: tl.constexpr = 0):
    """``u = M (beta v)`` for value columns ``v_lo .. v_hi`` (blocks of ``BV``), ``w = M (beta k e^G)``
    and ``kg = k e^{G_last - G}`` for key channels ``k_lo .. k_hi`` (blocks of ``KD``) of one chunk."""
    beta_all = tl.load(b_ptr + tok * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    beta_all = tl.where(m_t, 1.0 / (1.0 + tl.exp(-beta_all)), 0.0)
    for v0 in range(v_lo, v_hi, BV):
        vb = _tile(v_ptr, tok, m_t, i_hv, HV, V, v0, BV)
        u = _rdot(M, vb * beta_all[:, None], u_ptr.dtype.element_ty, TF32, LOWP)
        o_v = v0 + tl.arange(0, BV)
        tl.store(u_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], u.to(u_ptr.dtype.element_ty), mask=m_t[:, None] & (o_v < V)[None, :])
    tokl = bos + tl.minimum(c * BT + BT - 1, T - 1)  # the chunk's last row: reference of the state update
    if GATE == 2:
        Gc = tl.load(g_ptr + tokc * HV + i_hv)
        rb = rn_all * beta_all * tl.exp(Gc)
        rl = rn_all * tl.exp(tl.load(g_ptr + tokl * HV + i_hv) - Gc)  # exponent <= 0
    else:
        rb = rn_all * beta_all
        rl = rn_all
    for kd in range(k_lo, k_hi, KD):
        o_d = kd + tl.arange(0, KD)
        kt = _tile(k_ptr, tok, m_t, i_h, H, K, kd, KD)
        if GATE != 2:
            Gt = _tile(g_ptr, tokc, m_t | ~m_t, i_hv, HV, K, kd, KD)
            Gl = tl.load(g_ptr + (tokl * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
            kb = kt * rb[:, None] * tl.exp(Gt)
            kg = kt * rl[:, None] * tl.exp(Gl[None, :] - Gt)  # exponent <= 0
        else:
            kb = kt * rb[:, None]
            kg = kt * rl[:, None]
        w = _rdot(M, kb, w_ptr.dtype.element_ty, TF32, LOWP)
        m_td = m_t[:, None] & (o_d < K)[None, :]
        tl.store(w_ptr + (tok[:, None] * HV + i_hv) * K + o_d[None, :], w.to(w_ptr.dtype.element_ty), mask=m_td)
        tl.store(kg_ptr + (tok[:, None] * HV + i_hv) * K + o_d[None, :], kg.to(kg_ptr.dtype.element_ty), mask=m_td)


@triton.jit
def _pool_block(base, kd, KD: tl.constexpr, K: tl.constexpr, s_k, o_v, s_v, m_v):
    """Pointers and mask of rows ``kd .. kd + KD - 1`` of a ``[K, BV]`` state tile at ``base``."""
    o_d = kd + tl.arange(0, KD)
    return base + o_d[:, None] * s_k + o_v[None, :] * s_v, (o_d < K)[:, None] & m_v[None, :]


@triton.jit
def _state_load(base, kd, KD: tl.constexpr, K: tl.constexpr, s_k, o_v, s_v, m_v, on):
    p, m = _pool_block(base, kd, KD, K, s_k, o_v, s_v, m_v)
    return tl.load(p, mask=m & on, other=0.0).to(tl.float32)


@triton.jit
def _state_store(base, S, kd, KD: tl.constexpr, K: tl.constexpr, s_k, o_v, s_v, m_v):
    p, m = _pool_block(base, kd, KD, K, s_k, o_v, s_v, m_v)
    tl.store(p, S.to(base.dtype.element_ty), mask=m)


@triton.jit
def _state_advance(S, vn, k_ptr, g_ptr, tok, tokc, m_t, last, rn, i_h, i_hv, kd,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, KD: tl.constexpr, GATE: tl.constexpr, TF32: tl.constexpr):
    """Key block ``kd`` of ``S <- e^{G_last} S + (k e^{G_last - G})^T v_new`` over one chunk."""
    k = _tile(k_ptr, tok, m_t, i_h, H, K, kd, KD) * rn[:, None]
    if GATE == 2:
        Gl = tl.load(g_ptr + last * HV + i_hv)
        kt = k * tl.exp(Gl - tl.load(g_ptr + tokc * HV + i_hv))[:, None]
        return S * tl.exp(Gl) + _dot(tl.trans(kt), vn, TF32)
    else:
        o_d = kd + tl.arange(0, KD)
        Gl = tl.load(g_ptr + (last * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
        kt = k * tl.exp(Gl[None, :] - _tile(g_ptr, tokc, m_t | ~m_t, i_hv, HV, K, kd, KD))
        return S * tl.exp(Gl)[:, None] + _dot(tl.trans(kt), vn, TF32)


@triton.jit
def _decay_last(gc_ptr, last, i_hv, kd, HV: tl.constexpr, K: tl.constexpr, KD: tl.constexpr, GATE: tl.constexpr):
    """``e^{G_last}`` of key block ``kd`` (``[KD, 1]``; a scalar for GDN), ``G_last`` at chunk row ``last``."""
    if GATE == 2:
        return tl.exp(tl.load(gc_ptr + last * HV + i_hv))
    else:
        o_d = kd + tl.arange(0, KD)
        return tl.exp(tl.load(gc_ptr + (last * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0))[:, None]


@triton.jit
def _tile_raw(ptr, tok, m_t, i_h, H: tl.constexpr, K: tl.constexpr, kd, KD: tl.constexpr):
    """``_tile`` in the stored dtype (converted where used: half the registers for a BF16 scratch)."""
    o_d = kd + tl.arange(0, KD)
    return tl.load(ptr + (tok[:, None] * H + i_h) * K + o_d[None, :], mask=m_t[:, None] & (o_d < K)[None, :], other=0.0)


@triton.jit
def _rdot(a, b, dt: tl.constexpr, TF32: tl.constexpr, LOWP: tl.constexpr):
    """Product with FP32 accumulation for the chunk steps whose operands may be rounded to the
    16-bit scratch dtype ``dt`` (``state_lowp``, ``intra_solve_lowp``, ``output_lowp``). ``LOWP``
    0 or an FP32 ``dt``: FP32 operands through ``_dot``; 1: both operands rounded to ``dt``, one
    BF16 tensor-core product (as fla's state pass, recompute of w / u and output step); 2: the same
    rounding multiplied as FP32 (what the CPU interpreter runs: its BF16 ``tl.dot`` multiplies raw
    bits, checked with triton 3.8)."""
    if LOWP == 1 and dt != tl.float32:
        return tl.dot(a.to(dt), b.to(dt))
    elif LOWP == 2 and dt != tl.float32:
        return _dot(a.to(dt).to(tl.float32), b.to(dt).to(tl.float32), TF32)
    else:
        return _dot(a.to(tl.float32), b.to(tl.float32), TF32)


@triton.jit
def _state_at(S, vn, k_ptr, g_ptr, tok, tokc, m_t, rows, p, pr, rn, i_h, i_hv, kd,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, KD: tl.constexpr, GATE: tl.constexpr, TF32: tl.constexpr):
    """Key block ``kd`` of the state after the first ``p`` tokens of the chunk (row ``pr``), with the
    products of the running state (TF32 when ``TF32``), so a checkpoint equals the final state of
    the same prefix."""
    kp = _tile(k_ptr, tok, m_t & (rows < p), i_h, H, K, kd, KD) * rn[:, None]
    if GATE == 2:
        Gp = tl.load(g_ptr + pr * HV + i_hv)
        kp = kp * tl.exp(tl.where(rows < p, Gp - tl.load(g_ptr + tokc * HV + i_hv), float("-inf")))[:, None]
        return S * tl.exp(Gp) + _dot(tl.trans(kp), vn, TF32)
    else:
        o_d = kd + tl.arange(0, KD)
        Gp = tl.load(g_ptr + (pr * HV + i_hv) * K + o_d, mask=o_d < K, other=0.0)
        G = _tile(g_ptr, tokc, m_t | ~m_t, i_hv, HV, K, kd, KD)
        kp = kp * tl.exp(tl.where((rows < p)[:, None], Gp[None, :] - G, float("-inf")))
        return S * tl.exp(Gp)[:, None] + _dot(tl.trans(kp), vn, TF32)


# n_sub (16-token sub-chunks of the longest sequence) changes with the batch; only the checkpoint table is
# indexed by it, so it is not specialised on divisibility (one binary instead of one per class, each compiled
# on first sight while serving: five compiles of about 1.2 s in the first H200 system benchmark)
@triton.jit(do_not_specialize=["n_sub"])
def chunk_state_kernel(
    k_ptr,  # [N, H, K] (read only for checkpoints)
    g_ptr,  # chunk-local cumulative log decay (FP32)
    kg_ptr,  # [N, HV, K] decayed keys k e^{G_last - G} (chunk_intra_kernel)
    w_ptr,  # [N, HV, K]
    u_ptr,  # [N, HV, V]
    vn_ptr,  # out [N, HV, V] pseudo-values v_new
    h_ptr,  # out [NC, HV, K, V] chunk-start states
    cu_ptr,
    coff_ptr,  # [S] first global chunk of each sequence
    state_ptr,
    state_idx_ptr,
    has_init_ptr,
    ckpt_ptr,
    ckpt_idx_ptr,  # [S, n_sub] checkpoint slot after 16-token sub-chunk j (< 0: none)
    n_sub,
    s_slot,
    s_h,
    s_k,
    s_v,
    c_slot,
    c_h,
    c_k,
    c_v,
    q_ptr,  # [N, H, K] GDN's q / [N, HV, K] KDA's q e^G (the A programs' QEG); read only with FUSE_O
    rq_ptr,  # [N, HV] FP32 q's row factor (chunk_intra_arow_kernel with RQ; read only with FUSE_O)
    aqk_ptr,  # [N, HV, BT] (read only with FUSE_O)
    o_ptr,  # out [N, HV, V] (only with FUSE_O)
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    KD: tl.constexpr,  # rows per state key block; BK <= 4 * KD
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    CKPT: tl.constexpr,
    TF32: tl.constexpr,
    STAGES: tl.constexpr = 1,  # software-pipelining stages of the chunk loop (next chunks' w / kg / u in flight)
    EARLY: tl.constexpr = True,  # issue the step's loads before its stores
    LOWP: tl.constexpr = 0,  # state products with the state / v_new rounded to the scratch dtype (_rdot)
    FUSE_O: tl.constexpr = False,  # GDN: also form the output; no h / v_new stored
):
    """Step [3]: the chunk-start states ``h_c`` and ``v_new = u - w h_c`` per (sequence, value head,
    value tile), walking the chunks in order. ``FUSE_O`` (no checkpoints; issue 4): also step [4],
    ``o = rq (q h_c) + Aqk v_new`` with q's row factor ``rq`` (norm x scale x ``e^G``, written by the
    stacked ``A`` programs; KDA: ``q e^G`` in place of ``q`` and ``rq`` = norm x scale, both from the
    ``A`` programs with ``SPLITQ``), from the state in registers, with ``h_c`` and ``v_new`` rounded to the
    scratch dtype as the output step would read them back; neither goes through memory."""
    tl.static_assert(BK <= 4 * KD, "the state is held as at most four key blocks")
    tl.static_assert(not FUSE_O or not CKPT, "the fused output: no checkpoints")
    # the fused output's q operand: GDN's q ([N, H, K]; rq carries e^G) or KDA's q e^G ([N, HV, K])
    QH: tl.constexpr = H if GATE == 2 else HV
    i_v = tl.program_id(0)
    i_sh = tl.program_id(1)
    i_s = i_sh // HV
    i_hv = i_sh % HV
    i_h = i_hv // (HV // H)
    bos32 = tl.load(cu_ptr + i_s)
    T = tl.load(cu_ptr + i_s + 1) - bos32  # int32 token count
    bos = bos32.to(tl.int64)
    coff = tl.load(coff_ptr + i_s).to(tl.int64)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    slot = tl.load(state_idx_ptr + i_s).to(tl.int64)
    p_s = state_ptr + slot * s_slot + i_hv * s_h
    ld = (slot >= 0) & (tl.load(has_init_ptr + i_s) != 0)
    S0 = _state_load(p_s, 0, KD, K, s_k, o_v, s_v, m_v, ld)
    if BK > KD:
        S1 = _state_load(p_s, KD, KD, K, s_k, o_v, s_v, m_v, ld)
    if BK > 2 * KD:
        S2 = _state_load(p_s, 2 * KD, KD, K, s_k, o_v, s_v, m_v, ld)
    if BK > 3 * KD:
        S3 = _state_load(p_s, 3 * KD, KD, K, s_k, o_v, s_v, m_v, ld)
    n_chunks = tl.cdiv(T, BT)
    for c in tl.range(0, n_chunks, num_stages=STAGES):
        # Chunk-local rows (int32) against per-chunk base pointers (64-bit scalars):
        # no tile of 64-bit offsets is ever live.
        Tc = T - c * BT  # tokens of this sequence from the chunk start on
        rows = o_t
        m_t = rows < Tc
        tok = o_t
        tokc = tl.minimum(o_t, Tc - 1)
        t0 = bos + c * BT
        kc_ptr = k_ptr + t0 * (H * K)
        wc_ptr = w_ptr + t0 * (HV * K)
        kgc_ptr = kg_ptr + t0 * (HV * K)
        if GATE == 2:
            gc_ptr = g_ptr + t0 * HV
        else:
            gc_ptr = g_ptr + t0 * (HV * K)
        uc_ptr = u_ptr + t0 * (HV * V)
        vnc_ptr = vn_ptr + t0 * (HV * V)
        p_h = h_ptr + ((coff + c) * HV + i_hv) * K * V
        if FUSE_O:
            qc_ptr = q_ptr + t0 * (QH * K)
            i_q = i_h if GATE == 2 else i_hv
            oc_ptr = o_ptr + t0 * (HV * V)
            # whole rows (the A programs store Aqk's zero blocks above the diagonal for this pass: a block-causal
            # mask here cost the H200 more than those stores, 1,069 -> 1,117 us at B=8 T=16K)
            aq = tl.load(aqk_ptr + t0 * (HV * BT) + (tok[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
            rq = tl.load(rq_ptr + t0 * HV + tok * HV + i_hv, mask=m_t, other=0.0)
            q0 = _tile_raw(qc_ptr, tok, m_t, i_q, QH, K, 0, KD)
            if BK > KD:
                q1 = _tile_raw(qc_ptr, tok, m_t, i_q, QH, K, KD, KD)
            if BK > 2 * KD:
                q2 = _tile_raw(qc_ptr, tok, m_t, i_q, QH, K, 2 * KD, KD)
            if BK > 3 * KD:
                q3 = _tile_raw(qc_ptr, tok, m_t, i_q, QH, K, 3 * KD, KD)
        last = tl.minimum(BT - 1, Tc - 1)
        # EARLY: every load of the step before its first store (stores may alias loads, so a
        # load after one waits for it): one memory round trip per chunk, not one per block.
        # With checkpoints kg is loaded after them (fewer live registers across that loop).
        u = tl.load(uc_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        if EARLY:
            w0 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, 0, KD)
            if BK > KD:
                w1 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, KD, KD)
            if BK > 2 * KD:
                w2 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, 2 * KD, KD)
            if BK > 3 * KD:
                w3 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, 3 * KD, KD)
        if EARLY and not CKPT:
            kg0 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, 0, KD)
            d0 = _decay_last(gc_ptr, last, i_hv, 0, HV, K, KD, GATE)
            if BK > KD:
                kg1 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, KD, KD)
                d1 = _decay_last(gc_ptr, last, i_hv, KD, HV, K, KD, GATE)
            if BK > 2 * KD:
                kg2 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, 2 * KD, KD)
                d2 = _decay_last(gc_ptr, last, i_hv, 2 * KD, HV, K, KD, GATE)
            if BK > 3 * KD:
                kg3 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, 3 * KD, KD)
                d3 = _decay_last(gc_ptr, last, i_hv, 3 * KD, HV, K, KD, GATE)
        if not FUSE_O:
            _state_store(p_h, S0, 0, KD, K, V, o_v, 1, m_v)
        if not EARLY:
            w0 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, 0, KD)
        vn = u.to(tl.float32) - _rdot(w0, S0, w0.dtype, TF32, LOWP)
        if BK > KD:
            if not FUSE_O:
                _state_store(p_h, S1, KD, KD, K, V, o_v, 1, m_v)
            if not EARLY:
                w1 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, KD, KD)
            vn -= _rdot(w1, S1, w1.dtype, TF32, LOWP)
        if BK > 2 * KD:
            if not FUSE_O:
                _state_store(p_h, S2, 2 * KD, KD, K, V, o_v, 1, m_v)
            if not EARLY:
                w2 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, 2 * KD, KD)
            vn -= _rdot(w2, S2, w2.dtype, TF32, LOWP)
        if BK > 3 * KD:
            if not FUSE_O:
                _state_store(p_h, S3, 3 * KD, KD, K, V, o_v, 1, m_v)
            if not EARLY:
                w3 = _tile_raw(wc_ptr, tok, m_t, i_hv, HV, K, 3 * KD, KD)
            vn -= _rdot(w3, S3, w3.dtype, TF32, LOWP)
        if FUSE_O:  # o = rq (q h_c) + Aqk v_new, h_c / v_new rounded to the scratch dtype as stored for step [4]
            dt = vn_ptr.dtype.element_ty
            o = _rdot(q0, S0, dt, TF32, LOWP)
            if BK > KD:
                o += _rdot(q1, S1, dt, TF32, LOWP)
            if BK > 2 * KD:
                o += _rdot(q2, S2, dt, TF32, LOWP)
            if BK > 3 * KD:
                o += _rdot(q3, S3, dt, TF32, LOWP)
            o = o * rq[:, None] + _rdot(aq, vn, dt, TF32, LOWP)
            tl.store(oc_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], o.to(o_ptr.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        else:
            tl.store(vnc_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], vn.to(vn_ptr.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        if CKPT:
            rn = _rnorm(kc_ptr, tok, m_t, i_h, H, K, BK, KD, L2NORM)
            for j in range(0, BT // BC):  # a loop, not unrolled: one checkpoint's tiles live at a time
                sub = c * (BT // BC) + j
                cslot = tl.load(ckpt_idx_ptr + i_s * n_sub + sub, mask=sub < n_sub, other=-1).to(tl.int64)
                if cslot >= 0:
                    p = tl.minimum((j + 1) * BC, Tc)  # state after p tokens of the chunk
                    pr = p - 1
                    p_c = ckpt_ptr + cslot * c_slot + i_hv * c_h
                    Sp = _state_at(S0, vn, kc_ptr, gc_ptr, tok, tokc, m_t, rows, p, pr, rn, i_h, i_hv, 0, H, HV, K, KD, GATE, TF32)
                    _state_store(p_c, Sp, 0, KD, K, c_k, o_v, c_v, m_v)
                    if BK > KD:
                        Sp = _state_at(S1, vn, kc_ptr, gc_ptr, tok, tokc, m_t, rows, p, pr, rn, i_h, i_hv, KD, H, HV, K, KD, GATE, TF32)
                        _state_store(p_c, Sp, KD, KD, K, c_k, o_v, c_v, m_v)
                    if BK > 2 * KD:
                        Sp = _state_at(S2, vn, kc_ptr, gc_ptr, tok, tokc, m_t, rows, p, pr, rn, i_h, i_hv, 2 * KD, H, HV, K, KD, GATE, TF32)
                        _state_store(p_c, Sp, 2 * KD, KD, K, c_k, o_v, c_v, m_v)
                    if BK > 3 * KD:
                        Sp = _state_at(S3, vn, kc_ptr, gc_ptr, tok, tokc, m_t, rows, p, pr, rn, i_h, i_hv, 3 * KD, H, HV, K, KD, GATE, TF32)
                        _state_store(p_c, Sp, 3 * KD, KD, K, c_k, o_v, c_v, m_v)
        if not (EARLY and not CKPT):
            kg0 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, 0, KD)
            d0 = _decay_last(gc_ptr, last, i_hv, 0, HV, K, KD, GATE)
            if BK > KD:
                kg1 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, KD, KD)
                d1 = _decay_last(gc_ptr, last, i_hv, KD, HV, K, KD, GATE)
            if BK > 2 * KD:
                kg2 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, 2 * KD, KD)
                d2 = _decay_last(gc_ptr, last, i_hv, 2 * KD, HV, K, KD, GATE)
            if BK > 3 * KD:
                kg3 = _tile_raw(kgc_ptr, tok, m_t, i_hv, HV, K, 3 * KD, KD)
                d3 = _decay_last(gc_ptr, last, i_hv, 3 * KD, HV, K, KD, GATE)
        # S <- e^{G_last} S + kg^T v_new, key block by key block
        S0 = S0 * d0 + _rdot(tl.trans(kg0), vn, kg0.dtype, TF32, LOWP)
        if BK > KD:
            S1 = S1 * d1 + _rdot(tl.trans(kg1), vn, kg1.dtype, TF32, LOWP)
        if BK > 2 * KD:
            S2 = S2 * d2 + _rdot(tl.trans(kg2), vn, kg2.dtype, TF32, LOWP)
        if BK > 3 * KD:
            S3 = S3 * d3 + _rdot(tl.trans(kg3), vn, kg3.dtype, TF32, LOWP)
    if slot >= 0:
        _state_store(p_s, S0, 0, KD, K, s_k, o_v, s_v, m_v)
        if BK > KD:
            _state_store(p_s, S1, KD, KD, K, s_k, o_v, s_v, m_v)
        if BK > 2 * KD:
            _state_store(p_s, S2, 2 * KD, KD, K, s_k, o_v, s_v, m_v)
        if BK > 3 * KD:
            _state_store(p_s, S3, 3 * KD, KD, K, s_k, o_v, s_v, m_v)


@triton.jit
def chunk_output_kernel(
    q_ptr,  # [N, H, K]
    g_ptr,
    aqk_ptr,  # [N, HV, BT]
    vn_ptr,  # [N, HV, V]
    h_ptr,  # [NC, HV, K, V]
    o_ptr,  # out [N, HV, V]
    cu_ptr,
    cidx_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    TF32: tl.constexpr,
    LOWP: tl.constexpr = 0,  # products with q e^G and Aqk rounded to the scratch dtype (_rdot)
    KD: tl.constexpr = 128,  # key block of the (q e^G) h_c product (BK: one block)
    BC: tl.constexpr = 16,  # Aqk's column blocks: those above the diagonal are not read
):
    """Step [4]: ``o = (q e^G) h_c + Aqk v_new`` for one chunk, head and ``BV`` value columns."""
    i_v = tl.program_id(0)
    i_c = tl.program_id(1)
    i_hv = tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_s = tl.load(cidx_ptr + 2 * i_c)
    c = tl.load(cidx_ptr + 2 * i_c + 1)
    bos = tl.load(cu_ptr + i_s).to(tl.int64)
    T = tl.load(cu_ptr + i_s + 1).to(tl.int64) - bos
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    rows = c * BT + o_t
    m_t = rows < T
    tok = bos + rows
    tokc = bos + tl.minimum(rows, T - 1)
    m_tv = m_t[:, None] & m_v[None, :]
    if KD >= BK:  # one key block, straight-line (the CDNA entries; a one-trip loop was 1.8x slower on the H200)
        q = _load_qk(q_ptr, tok, m_t, i_h, o_k, m_k, H, K, L2NORM) * scale
        if GATE == 2:
            qg = q * tl.exp(tl.load(g_ptr + tokc * HV + i_hv))[:, None]
        else:
            qg = q * tl.exp(tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_k[None, :], other=0.0))
        h = tl.load(h_ptr + (i_c.to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                    mask=m_k[:, None] & m_v[None, :], other=0.0)
        oq = _rdot(qg, h, h.dtype, TF32, LOWP)
    else:
        oq = _output_kblocks(q_ptr, g_ptr, h_ptr, tok, tokc, m_t, i_c, i_h, i_hv, o_v, m_v, scale, H, HV, K, V, BK, BV, BT, KD,
                             GATE, L2NORM, TF32, LOWP)
    # causal 16-column blocks only: the stacked A programs do not store Aqk's blocks above the diagonal
    aq = tl.load(aqk_ptr + (tok[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_t[:, None] & (o_t[None, :] // BC <= o_t[:, None] // BC),
                 other=0.0)
    vn = tl.load(vn_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0.0)
    o = oq + _rdot(aq, vn, vn.dtype, TF32, LOWP)
    tl.store(o_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], o.to(o_ptr.dtype.element_ty), mask=m_tv)


@triton.jit
def _output_kblocks(q_ptr, g_ptr, h_ptr, tok, tokc, m_t, i_c, i_h, i_hv, o_v, m_v, scale,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, BT: tl.constexpr, KD: tl.constexpr, GATE: tl.constexpr, L2NORM: tl.constexpr,
                    TF32: tl.constexpr, LOWP: tl.constexpr):
    """``(q e^G) h_c`` (L2-normalised, scaled q) over key blocks of ``KD`` (software-pipelined by the
    launch's stages); the rows' norm factor, scale and GDN scalar decay commute with the product
    and are applied to the accumulated ``[BT, BV]`` block."""
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    ss = tl.zeros([BT], dtype=tl.float32)
    h_base = h_ptr + (i_c.to(tl.int64) * HV + i_hv) * K * V
    for kd in range(0, BK, KD):
        o_d = kd + tl.arange(0, KD)
        m_d = o_d < K
        x = tl.load(q_ptr + (tok[:, None] * H + i_h) * K + o_d[None, :], mask=m_t[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        if L2NORM:
            ss += tl.sum(x * x, axis=1)
        if GATE != 2:
            x = x * tl.exp(tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_d[None, :], mask=m_d[None, :], other=0.0))
        hb = tl.load(h_base + o_d[:, None] * V + o_v[None, :], mask=m_d[:, None] & m_v[None, :], other=0.0)
        acc += _rdot(x, hb, hb.dtype, TF32, LOWP)
    if L2NORM:
        rs = tl.rsqrt(ss + 1e-6) * scale
    else:
        rs = ss + scale
    if GATE == 2:
        rs = rs * tl.exp(tl.load(g_ptr + tokc * HV + i_hv))
    return acc * rs[:, None]
