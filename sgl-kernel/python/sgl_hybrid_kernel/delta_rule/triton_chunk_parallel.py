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
   in-chunk attention ``Aqk``, built 16 rows at a time; the inverse
   ``M = (I + A)^-1`` by block forward substitution over 16x16 diagonal blocks
   (each inverted by repeated squaring), all with FP32 inputs and accumulation;
   then ``w = M (beta k e^G)`` and ``u = M (beta v)``.
3. ``chunk_state_kernel`` — parallel over (sequence, value head, value tile),
   sequential over chunks: stores the chunk-start state ``h``, the pseudo-values
   ``v_new = u - w h`` and updates ``h <- e^{G_last} h + (k e^{G_last - G})^T v_new``;
   writes requested checkpoints (any 16-token position) and the final state.
4. ``chunk_output_kernel`` — parallel over (chunk, value head, value tile):
   ``o = (q e^G) h + Aqk v_new``.

Decay exponents stay finite: for rows of block ``i`` the reference is ``G`` at the
block's first row ``r``; keys of earlier blocks carry ``exp(G_r - G_s) <= 1`` and
rows carry ``exp(G_t - G_r) <= 1``. Inside the 16x16 diagonal block the same
factorisation needs a bounded gate (KDA safe gate, ``15 * |lower_bound| <= 80``);
otherwise (standard KDA gate) the diagonal block sums ``k_t k_s exp(G_t - G_s)``
over key blocks of ``KB`` channels. GDN (one decay per head) uses the decay matrix.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.triton_chunk import _tril_inverse_16
from sgl_hybrid_kernel.delta_rule.triton_recurrent import _softplus


@triton.jit
def _dot(a, b, TF32: tl.constexpr):
    if TF32:
        return tl.dot(a, b)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _load_qk(ptr, tok, m_t, i_h, o_k, m_k, H: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr):
    x = tl.load(ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _rnorm(ptr, tok, m_t, i_h, o_k, m_k, H: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr):
    """Per-row factor of the L2 norm (1 without it), rows ``tok``."""
    x = tl.load(ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        return tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)
    else:
        return tl.sum(x * 0.0, axis=1) + 1.0


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
    BK: tl.constexpr,
    BT: tl.constexpr,
    GATE: tl.constexpr,
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
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        dtb = tl.load(dt_bias_ptr + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        x = tl.load(f_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32) + dtb[None, :]
        if GATE == 0:
            g = -A_h * _softplus(x)
        else:
            g = lower_bound / (1.0 + tl.exp(-A_h * x))
        g = tl.where(m_tk, g, 0.0)
        tl.store(g_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], tl.cumsum(g, axis=0), mask=m_tk)


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
    cu_ptr,
    cidx_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BVF: tl.constexpr,  # next power of two of V (all value columns at once)
    BT: tl.constexpr,
    BC: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    FACTORIZED: tl.constexpr,
    KB: tl.constexpr,
    KD: tl.constexpr,  # key block of the off-diagonal products
    TF32: tl.constexpr,  # TF32 allowed for Aqk and the w/u products (never for A or its inverse)
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    i_s = tl.load(cidx_ptr + 2 * i_c)
    c = tl.load(cidx_ptr + 2 * i_c + 1)
    bos = tl.load(cu_ptr + i_s).to(tl.int64)
    T = tl.load(cu_ptr + i_s + 1).to(tl.int64) - bos
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    rows = c * BT + o_t
    m_t = rows < T
    tok = bos + rows
    tokc = bos + tl.minimum(rows, T - 1)  # padding rows repeat the last G (their g is 0)

    # The whole-chunk tiles (k_all, G_all: BT x BK) are reloaded where used (L1/L2 hits)
    # instead of living across the block loop: that keeps the kernel free of spills.
    M = tl.zeros([BT, BT], dtype=tl.float32)
    for i in tl.static_range(BT // BC):
        o_ti = i * BC + tl.arange(0, BC)  # chunk-local rows of block i
        r_i = c * BT + o_ti
        m_i = r_i < T
        tok_i = bos + r_i
        tokc_i = bos + tl.minimum(r_i, T - 1)
        beta_i = tl.load(b_ptr + tok_i * HV + i_hv, mask=m_i, other=0.0).to(tl.float32)
        beta_i = tl.where(m_i, 1.0 / (1.0 + tl.exp(-beta_i)), 0.0)
        causal = o_ti[:, None] >= o_t[None, :]
        strict = o_ti[:, None] > o_t[None, :]
        if GATE == 2:
            k_all = _load_qk(k_ptr, tok, m_t, i_h, o_k, m_k, H, K, L2NORM)
            G_all = tl.load(g_ptr + tokc * HV + i_hv)
            k_i = _load_qk(k_ptr, tok_i, m_i, i_h, o_k, m_k, H, K, L2NORM)
            q_i = _load_qk(q_ptr, tok_i, m_i, i_h, o_k, m_k, H, K, L2NORM) * scale
            G_i = tl.load(g_ptr + tokc_i * HV + i_hv)
            D = tl.exp(tl.where(causal, G_i[:, None] - G_all[None, :], float("-inf")))
            Akk = tl.dot(k_i, tl.trans(k_all), input_precision="ieee") * D
            Aq = _dot(q_i, tl.trans(k_all), TF32) * D
        else:
            r0 = bos + tl.minimum(c * BT + i * BC, T - 1)  # the block's first row: reference of the exponents
            if FACTORIZED:
                colmask = o_t < (i + 1) * BC  # earlier blocks and the (bounded) diagonal block
            else:
                colmask = o_t < i * BC  # earlier blocks only
            rn_all = _rnorm(k_ptr, tok, m_t, i_h, o_k, m_k, H, K, L2NORM)
            rn_k = _rnorm(k_ptr, tok_i, m_i, i_h, o_k, m_k, H, K, L2NORM)
            rn_q = _rnorm(q_ptr, tok_i, m_i, i_h, o_k, m_k, H, K, L2NORM)
            Akk = tl.zeros([BC, BT], dtype=tl.float32)
            Aq = tl.zeros([BC, BT], dtype=tl.float32)
            for kd in tl.static_range(0, BK, KD):  # key blocks keep the BT x KD tiles small (no spills)
                o_d = kd + tl.arange(0, KD)
                m_d = o_d < K
                ka = tl.load(k_ptr + (tok[:, None] * H + i_h) * K + o_d[None, :], mask=m_t[:, None] & m_d[None, :], other=0.0).to(tl.float32)
                Ga = tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_d[None, :], mask=m_d[None, :], other=0.0)
                Grd = tl.load(g_ptr + (r0 * HV + i_hv) * K + o_d, mask=m_d, other=0.0)
                kc = ka * rn_all[:, None] * tl.exp(tl.where(colmask[:, None], Grd[None, :] - Ga, float("-inf")))
                Gi = tl.load(g_ptr + (tokc_i[:, None] * HV + i_hv) * K + o_d[None, :], mask=m_d[None, :], other=0.0)
                e = tl.exp(Gi - Grd[None, :])
                ki = tl.load(k_ptr + (tok_i[:, None] * H + i_h) * K + o_d[None, :], mask=m_i[:, None] & m_d[None, :], other=0.0).to(tl.float32)
                qi = tl.load(q_ptr + (tok_i[:, None] * H + i_h) * K + o_d[None, :], mask=m_i[:, None] & m_d[None, :], other=0.0).to(tl.float32)
                Akk += tl.dot(ki * (rn_k[:, None] * e), tl.trans(kc), input_precision="ieee")
                Aq += _dot(qi * ((rn_q * scale)[:, None] * e), tl.trans(kc), TF32)
            if not FACTORIZED:
                # Diagonal block of an unbounded per-channel decay: exact exp(G_t - G_s), t >= s.
                o_c = tl.arange(0, BC)
                cd = o_c[:, None] >= o_c[None, :]
                Ad = tl.zeros([BC, BC], dtype=tl.float32)
                Aqd = tl.zeros([BC, BC], dtype=tl.float32)
                k_rn = rn_k
                q_rn = rn_q
                for kb in tl.static_range(0, BK, KB):
                    o_kb = kb + tl.arange(0, KB)
                    m_b = m_i[:, None] & (o_kb < K)[None, :]
                    kk = tl.load(k_ptr + (tok_i[:, None] * H + i_h) * K + o_kb[None, :], mask=m_b, other=0.0).to(tl.float32)
                    qq = tl.load(q_ptr + (tok_i[:, None] * H + i_h) * K + o_kb[None, :], mask=m_b, other=0.0).to(tl.float32)
                    kk = kk * k_rn[:, None]
                    qq = qq * (q_rn * scale)[:, None]
                    Gb = tl.load(g_ptr + (tokc_i[:, None] * HV + i_hv) * K + o_kb[None, :], mask=(o_kb < K)[None, :], other=0.0)
                    d = tl.exp(tl.where(cd[:, :, None], Gb[:, None, :] - Gb[None, :, :], float("-inf")))
                    Ad += tl.sum(kk[:, None, :] * kk[None, :, :] * d, axis=2)
                    Aqd += tl.sum(qq[:, None, :] * kk[None, :, :] * d, axis=2)
                place = tl.where(o_c[:, None] + i * BC == o_t[None, :], 1.0, 0.0)  # [BC, BT]
                Akk += tl.dot(Ad, place, input_precision="ieee")
                Aq += tl.dot(Aqd, place, input_precision="ieee")
        Akk = tl.where(strict, Akk * beta_i[:, None], 0.0)
        Aq = tl.where(causal, Aq, 0.0)
        tl.store(aqk_ptr + (tok_i[:, None] * HV + i_hv) * BT + o_t[None, :], Aq, mask=m_i[:, None])
        sel = tl.where(o_t[:, None] == o_ti[None, :], 1.0, 0.0)  # [BT, BC]: column/row selector of block i
        A_ii = tl.dot(Akk, sel, input_precision="ieee")
        M_ii = _tril_inverse_16(A_ii, BC)
        # Block forward substitution: M_i = M_ii (E_i - A_{i,<i} M_{<i}); rows >= i*BC of M are still zero.
        Y = tl.where(o_ti[:, None] == o_t[None, :], 1.0, 0.0) - tl.dot(Akk, M, input_precision="ieee")
        M_i = tl.dot(M_ii, Y, input_precision="ieee")
        M += tl.dot(sel, M_i, input_precision="ieee")

    beta_all = tl.load(b_ptr + tok * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    beta_all = tl.where(m_t, 1.0 / (1.0 + tl.exp(-beta_all)), 0.0)
    o_vf = tl.arange(0, BVF)
    m_vf = o_vf < V
    v_all = tl.load(v_ptr + (tok[:, None] * HV + i_hv) * V + o_vf[None, :], mask=m_t[:, None] & m_vf[None, :], other=0.0).to(tl.float32)
    u = _dot(M, v_all * beta_all[:, None], TF32)
    tl.store(u_ptr + (tok[:, None] * HV + i_hv) * V + o_vf[None, :], u.to(u_ptr.dtype.element_ty), mask=m_t[:, None] & m_vf[None, :])
    k_all = _load_qk(k_ptr, tok, m_t, i_h, o_k, m_k, H, K, L2NORM)
    if GATE == 2:
        G_all = tl.load(g_ptr + tokc * HV + i_hv)
        kb_all = k_all * (beta_all * tl.exp(G_all))[:, None]
    else:
        G_all = tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_k[None, :], other=0.0)
        kb_all = k_all * beta_all[:, None] * tl.exp(G_all)
    w = _dot(M, kb_all, TF32)
    tl.store(w_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], w.to(w_ptr.dtype.element_ty), mask=m_t[:, None] & m_k[None, :])


@triton.jit
def chunk_state_kernel(
    k_ptr,  # [N, H, K]
    g_ptr,  # chunk-local cumulative log decay (FP32)
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
    CKPT: tl.constexpr,
    TF32: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_sh = tl.program_id(1)
    i_s = i_sh // HV
    i_hv = i_sh % HV
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_ptr + i_s).to(tl.int64)
    T = tl.load(cu_ptr + i_s + 1).to(tl.int64) - bos
    coff = tl.load(coff_ptr + i_s).to(tl.int64)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    slot = tl.load(state_idx_ptr + i_s).to(tl.int64)
    p_s = state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if slot >= 0:
        if tl.load(has_init_ptr + i_s) != 0:
            S = tl.load(p_s, mask=m_kv, other=0.0).to(tl.float32)
    n_chunks = tl.cdiv(T, BT)
    for c in range(0, n_chunks):
        rows = c * BT + o_t
        m_t = rows < T
        tok = bos + rows
        tokc = bos + tl.minimum(rows, T - 1)
        p_h = h_ptr + ((coff + c) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
        tl.store(p_h, S.to(h_ptr.dtype.element_ty), mask=m_kv)
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        w = tl.load(w_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
        vn = u - _dot(w, S, TF32)
        tl.store(vn_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], vn.to(vn_ptr.dtype.element_ty), mask=m_tv)
        # k and G are loaded where used (checkpoint branch, then the update) so that w, k, G
        # and a checkpoint's tiles are never live together (no spills on sm_90).
        if CKPT:
            for j in range(0, BT // BC):  # a loop, not unrolled: one checkpoint's tiles live at a time
                sub = c * (BT // BC) + j
                cslot = tl.load(ckpt_idx_ptr + i_s * n_sub + sub, mask=sub < n_sub, other=-1).to(tl.int64)
                if cslot >= 0:
                    p = tl.minimum(c * BT + (j + 1) * BC, T)  # state after p tokens
                    pr = bos + p - 1
                    kp = _load_qk(k_ptr, tok, m_t & (rows < p), i_h, o_k, m_k, H, K, L2NORM)
                    if GATE == 2:
                        Gp = tl.load(g_ptr + pr * HV + i_hv)
                        G = tl.load(g_ptr + tokc * HV + i_hv)
                        kp = kp * tl.exp(tl.where(rows < p, Gp - G, float("-inf")))[:, None]
                        Sp = S * tl.exp(Gp) + tl.dot(tl.trans(kp), vn, input_precision="ieee")
                    else:
                        Gp = tl.load(g_ptr + (pr * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
                        G = tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_k[None, :], other=0.0)
                        kp = kp * tl.exp(tl.where((rows < p)[:, None], Gp[None, :] - G, float("-inf")))
                        Sp = S * tl.exp(Gp)[:, None] + tl.dot(tl.trans(kp), vn, input_precision="ieee")
                    p_c = ckpt_ptr + cslot * c_slot + i_hv * c_h + o_k[:, None] * c_k + o_v[None, :] * c_v
                    tl.store(p_c, Sp.to(ckpt_ptr.dtype.element_ty), mask=m_kv)
        last = bos + tl.minimum(c * BT + BT - 1, T - 1)
        k = _load_qk(k_ptr, tok, m_t, i_h, o_k, m_k, H, K, L2NORM)
        if GATE == 2:
            Gl = tl.load(g_ptr + last * HV + i_hv)
            kt = k * tl.exp(Gl - tl.load(g_ptr + tokc * HV + i_hv))[:, None]
            S = S * tl.exp(Gl) + _dot(tl.trans(kt), vn, TF32)
        else:
            Gl = tl.load(g_ptr + (last * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
            kt = k * tl.exp(Gl[None, :] - tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_k[None, :], other=0.0))
            S = S * tl.exp(Gl)[:, None] + _dot(tl.trans(kt), vn, TF32)
    if slot >= 0:
        tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv)


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
):
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
    q = _load_qk(q_ptr, tok, m_t, i_h, o_k, m_k, H, K, L2NORM) * scale
    if GATE == 2:
        qg = q * tl.exp(tl.load(g_ptr + tokc * HV + i_hv))[:, None]
    else:
        qg = q * tl.exp(tl.load(g_ptr + (tokc[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_k[None, :], other=0.0))
    h = tl.load(h_ptr + (i_c.to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0).to(tl.float32)
    aq = tl.load(aqk_ptr + (tok[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
    vn = tl.load(vn_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
    o = _dot(qg, h, TF32) + _dot(aq, vn, TF32)
    tl.store(o_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], o.to(o_ptr.dtype.element_ty), mask=m_tv)
