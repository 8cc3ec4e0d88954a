"""Triton kernel: a verify window of the gated delta rule in chunk (matrix) form.

The recurrent kernel (``triton_recurrent.py``) walks the ``T`` tokens of a window one after
another: every token's two K-reductions wait for the previous token's update. Here the
window is solved as one chunk (the WY / UT form of Yang et al., "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length", 2024, and Gated DeltaNet, 2025),
so the state is touched by four independent matrix products and no token waits on another
once the state has arrived (issue 4: verify within 1.25x of decode; deferred GDN verify).

For one (request, value head) with window positions ``p = 0 .. P-1``, log decays ``g_p``
(per channel for KDA, per head for GDN), cumulative ``G_p = g_0 + .. + g_p`` and
``Gamma_p = exp(G_p)``, the recurrence ``S_p = D_p S_{p-1} + beta_p k_p err_p^T`` equals::

    u    = L^{-1} diag(beta) (V - Khat S0)          Khat_p = k_p * Gamma_p
    L    = I + diag(beta) M,  M_ps = sum_c k_p[c] k_s[c] Gamma_p[c] / Gamma_s[c]   (s < p)
    o_p  = Qhat_p S0 + sum_{s <= p} P_ps u_s,       P_ps = sum_c q_p[c] k_s[c] Gamma_p[c] / Gamma_s[c]
    S_e  = Gamma_e S0 + sum_{s <= e} (k_s * Gamma_e / Gamma_s) u_s^T      (state after position e)

``L^{-1}`` and ``P`` depend only on the window's inputs, so they are computed while the state
load is in flight; the ratios ``Gamma_p / Gamma_s`` are taken as ``exp(G_p - G_s)`` with
``s <= p`` (never above 1: no overflow for any gate). Products run through ``tl.dot``
(``DOT_PREC``: ``"ieee"`` is FP32 FMA on NVIDIA and FP32 MFMA on CDNA; ``"tf32x3"`` is
split-TF32 on NVIDIA tensor cores). Not bit-exact against the recurrent form (a different
summation order): checked against an FP64 recurrence (issue 4's "matrix-core variant").

Modes (constexpr): ``COMMIT`` writes the state after the last token; ``DEFERRED`` writes the
state after token 0 and keeps tokens 1..T-1's inputs in the replay buffer (same record
layout as the recurrent kernel: ``k, g, beta, v``); ``REPLAY_PREV`` first applies the previous
window's accepted records: they become the window's first ``T - 1`` positions (records
beyond the accepted count are neutral: ``k = 0, g = 0, beta = 0``), so a fused deferred
verify is one chunk of ``2T - 1`` positions. Window positions are padded to ``TP = 16``
(the smallest ``tl.dot`` tile) with neutral tokens. Per-token snapshots are not served here
(the recurrent kernel's ``inter_state`` mode).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import RECORD_STORE_CACHE, _elem, _row, _softplus


@triton.jit
def gated_delta_window_kernel(
    q_ptr,  # [N, H, K]   N = B * T tokens, token-major
    k_ptr,  # [N, H, K]
    v_ptr,  # [N, HV, V]
    f_ptr,  # [N, HV, K] (KDA) or [N, HV] (GDN): raw gate input
    b_ptr,  # [N, HV] raw beta (sigmoid applied here)
    o_ptr,  # [N, HV, V] output
    A_log_ptr,  # [HV]
    dt_bias_ptr,  # [HV * K] (KDA) or [HV] (GDN)
    state_ptr,  # state pool, 4-D, strides below
    state_idx_ptr,  # [B] slot per request (< 0: padding row)
    replay_ptr,  # DEFERRED: [slots, T - 1, HV, RW] records of tokens 1..T-1
    replay_prev_ptr,  # REPLAY_PREV: the previous window's records
    accept_prev_ptr,  # REPLAY_PREV: [B] tokens accepted of the previous window (1..T)
    scale,
    lower_bound,
    s_slot,
    s_h,
    s_k,
    s_v,
    r_slot,
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,  # 0 KDA, 1 KDA safe (lower bound), 2 GDN (per head)
    L2NORM: tl.constexpr,
    COMMIT: tl.constexpr,
    DEFERRED: tl.constexpr,
    REPLAY_PREV: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    TP: tl.constexpr = 16
    OFF: tl.constexpr = T - 1 if REPLAY_PREV else 0  # window position of this step's token 0
    GK: tl.constexpr = 1 if GATE == 2 else K
    RW: tl.constexpr = K + GK + 1 + V
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_p = tl.arange(0, TP)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    t_new = o_p - OFF
    m_new = (o_p >= OFF) & (t_new < T)
    n_t = i_b * T + t_new  # token rows (valid where m_new)
    m_pk = m_new[:, None] & m_k[None, :]
    m_pv = m_new[:, None] & m_v[None, :]

    # 1. Slot, then every input tile: nothing below waits for the state until step 3.
    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    Q = tl.load(q_ptr + (n_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32)
    Kw = tl.load(k_ptr + (n_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32)
    Vw = tl.load(v_ptr + (n_t[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_pv, other=0.0).to(tl.float32)
    braw = tl.load(b_ptr + n_t * HV + i_hv, mask=m_new, other=0.0).to(tl.float32)
    A = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    if GATE == 2:
        fraw = tl.load(f_ptr + n_t * HV + i_hv, mask=m_new, other=0.0).to(tl.float32)
        dtb = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
        G = tl.where(m_new, -A * _softplus(fraw + dtb), 0.0)  # [TP]
    else:
        fraw = tl.load(f_ptr + (n_t[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32)
        dtb = tl.load(dt_bias_ptr + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        if GATE == 0:
            G = -A * _softplus(fraw + dtb[None, :])
        else:
            G = lower_bound / (1.0 + tl.exp(-A * (fraw + dtb[None, :])))
        G = tl.where(m_pk, G, 0.0)  # [TP, BK]
    if L2NORM:
        Q = Q * tl.rsqrt(tl.sum(Q * Q, axis=1) + 1e-6)[:, None]
        Kw = Kw * tl.rsqrt(tl.sum(Kw * Kw, axis=1) + 1e-6)[:, None]
    Q = Q * scale
    beta = tl.where(m_new, 1.0 / (1.0 + tl.exp(-braw)), 0.0)

    if slot < 0:
        tl.store(o_ptr + (n_t[:, None] * HV + i_hv) * V + o_v[None, :], tl.zeros([TP, BV], dtype=tl.float32).to(o_ptr.dtype.element_ty),
                 mask=m_pv)
        return

    if DEFERRED:
        # tokens 1..T-1 keep their processed inputs (k, log decay, beta, v tile) for the replay
        m_r = m_new & (t_new >= 1)
        rec = replay_ptr + slot * r_slot + ((t_new - 1) * HV + i_hv) * RW  # [TP]
        if i_v == 0:
            tl.store(rec[:, None] + o_k[None, :], Kw, mask=m_r[:, None] & m_k[None, :], cache_modifier=RECORD_STORE_CACHE)
            if GATE == 2:
                tl.store(rec + K, G, mask=m_r, cache_modifier=RECORD_STORE_CACHE)
            else:
                tl.store(rec[:, None] + K + o_k[None, :], G, mask=m_r[:, None] & m_k[None, :], cache_modifier=RECORD_STORE_CACHE)
            tl.store(rec + K + GK, beta, mask=m_r, cache_modifier=RECORD_STORE_CACHE)
        tl.store(rec[:, None] + (K + GK + 1) + o_v[None, :], Vw, mask=m_r[:, None] & m_v[None, :],
                 cache_modifier=RECORD_STORE_CACHE)

    p_s = state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S0 = tl.load(p_s, mask=m_kv, other=0.0).to(tl.float32)

    if REPLAY_PREV:
        # the previous window's accepted tokens 1..n_prev-1 at positions 0..n_prev-2
        n_prev = tl.load(accept_prev_ptr + i_b).to(tl.int32)
        m_rp = o_p < tl.minimum(n_prev - 1, T - 1)
        recp = replay_prev_ptr + slot * r_slot + (o_p * HV + i_hv) * RW
        Kw += tl.load(recp[:, None] + o_k[None, :], mask=m_rp[:, None] & m_k[None, :], other=0.0)
        if GATE == 2:
            G += tl.load(recp + K, mask=m_rp, other=0.0)
        else:
            G += tl.load(recp[:, None] + K + o_k[None, :], mask=m_rp[:, None] & m_k[None, :], other=0.0)
        beta += tl.load(recp + K + GK, mask=m_rp, other=0.0)
        Vw += tl.load(recp[:, None] + (K + GK + 1) + o_v[None, :], mask=m_rp[:, None] & m_v[None, :], other=0.0)

    # 2. Window matrices (independent of the state).
    Gc = tl.cumsum(G, axis=0)
    causal = o_p[:, None] >= o_p[None, :]  # [TP(p), TP(s)]: s <= p
    if GATE == 2:
        Ed = tl.exp(tl.where(causal, Gc[:, None] - Gc[None, :], float("-inf")))  # Gamma_p / Gamma_s, s <= p
        KK = tl.dot(Kw, tl.trans(Kw), input_precision=DOT_PREC)
        QK = tl.dot(Q, tl.trans(Kw), input_precision=DOT_PREC)
        M = KK * Ed
        Pm = QK * Ed
        Gam = tl.exp(Gc)
        Khat = Kw * Gam[:, None]
        Qhat = Q * Gam[:, None]
        g_end = tl.sum(G, axis=0)
    else:
        M = tl.zeros([TP, TP], dtype=tl.float32)
        Pm = tl.zeros([TP, TP], dtype=tl.float32)
        for s in tl.static_range(OFF + T):
            ks = _row(Kw, o_p, s)
            gs = _row(Gc, o_p, s)
            E = tl.exp(tl.where((o_p >= s)[:, None], Gc - gs[None, :], 0.0))  # [TP, BK]
            Ks = E * ks[None, :]
            M = tl.where(o_p[None, :] == s, tl.sum(Kw * Ks, axis=1)[:, None], M)
            Pm = tl.where(o_p[None, :] == s, tl.sum(Q * Ks, axis=1)[:, None], Pm)
        Pm = tl.where(causal, Pm, 0.0)
        Gam = tl.exp(Gc)
        Khat = Kw * Gam
        Qhat = Q * Gam
        g_end = tl.sum(G, axis=0)  # [BK]
    M = tl.where(o_p[:, None] > o_p[None, :], M, 0.0)
    # W = (I + diag(beta) M)^{-1} diag(beta), rows by forward substitution
    X = tl.where(o_p[:, None] == o_p[None, :], 1.0, 0.0)
    for p in tl.static_range(1, OFF + T):
        m_row = _row(M, o_p, p)  # [TP] over s (zero for s >= p)
        row = tl.where(o_p == p, 1.0, 0.0) - _elem(beta, o_p, p) * tl.sum(m_row[:, None] * X, axis=0)
        X = tl.where(o_p[:, None] == p, row[None, :], X)
    W = X * beta[None, :]

    # 3. State products.
    R = Vw - tl.dot(Khat, S0, input_precision=DOT_PREC)  # [TP, BV]
    U = tl.dot(W, R, input_precision=DOT_PREC)  # [TP, BV] = beta-scaled errors
    O = tl.dot(Qhat, S0, input_precision=DOT_PREC) + tl.dot(Pm, U, input_precision=DOT_PREC)
    tl.store(o_ptr + (n_t[:, None] * HV + i_hv) * V + o_v[None, :], O.to(o_ptr.dtype.element_ty), mask=m_pv)
    if COMMIT:
        if GATE == 2:
            Kt_end = Kw * tl.exp(g_end - Gc)[:, None]
            S_end = S0 * tl.exp(g_end) + tl.dot(tl.trans(Kt_end), U, input_precision=DOT_PREC)
        else:
            Kt_end = Kw * tl.exp(g_end[None, :] - Gc)
            S_end = S0 * tl.exp(g_end)[:, None] + tl.dot(tl.trans(Kt_end), U, input_precision=DOT_PREC)
        tl.store(p_s, S_end.to(p_s.dtype.element_ty), mask=m_kv)
    if DEFERRED:
        # state after this step's token 0 (window position OFF): always accepted, committed now
        m_e = o_p <= OFF
        if GATE == 2:
            g0 = _elem(Gc, o_p, OFF)
            K0 = tl.where(m_e[:, None], Kw * tl.exp(tl.where(m_e, g0 - Gc, 0.0))[:, None], 0.0)
            S_0 = S0 * tl.exp(g0) + tl.dot(tl.trans(K0), U, input_precision=DOT_PREC)
        else:
            g0 = _row(Gc, o_p, OFF)
            K0 = tl.where(m_e[:, None], Kw * tl.exp(tl.where(m_e[:, None], g0[None, :] - Gc, 0.0)), 0.0)
            S_0 = S0 * tl.exp(g0)[:, None] + tl.dot(tl.trans(K0), U, input_precision=DOT_PREC)
        tl.store(p_s, S_0.to(p_s.dtype.element_ty), mask=m_kv)
