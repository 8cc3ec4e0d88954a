"""Triton kernel: chunked prefill of the gated delta rule (KDA per-channel or GDN per-head decay).

One program owns one (sequence, value head, tile of ``BV`` value columns) and walks
its sequence chunk by chunk (``BT`` tokens), keeping the ``[K, BV]`` state slice in
registers. Inside a chunk, with ``G`` the in-chunk cumulative log decay (relative to
the chunk start, so ``exp(-G) <= exp(BT * |g|max)`` stays finite in FP32 for
``BT = 16`` and the KDA safe gate's bound of -5):

    A   = strict_tril((k*e^G) (k*e^-G)^T) * beta        [BT, BT]
    U   = (I + A)^-1 beta (v - (k*e^G) S0)               delta-rule pseudo-values (WY form)
    o   = (q*e^G) S0 + tril((q*e^G)(k*e^-G)^T) U
    S   = e^{G_last} S0 + (k*e^{G_last-G})^T U

That factorisation needs a bounded decay (the KDA "safe" gate, ``lower_bound``
with ``BT * |lower_bound| <= 80``). A per-head decay (GDN) uses the decay matrix
``exp(G_t - G_s)`` instead, and an unbounded per-channel decay (standard KDA gate)
sums ``k_t k_s exp(G_t - G_s)`` over key-dimension blocks of ``KB`` channels;
both only ever exponentiate non-positive numbers.

``(I + A)^-1`` of the nilpotent ``A`` is the product ``(I - A)(I + A^2)(I + A^4)(I + A^8)``
(four 16x16 products), computed with FP32 inputs and accumulation
(``input_precision="ieee"``); the other products may use the matrix units' TF32.

Sequences are packed (``cu_seqlens``); each starts from its pool slot's state (or
zeros) and writes its final state back to that slot. Requested checkpoints (the
state after a chunk-aligned number of tokens) are written to a checkpoint pool.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import _softplus


@triton.jit
def _tril_inverse_16(A, BT: tl.constexpr):
    """(I + A)^-1 for strictly lower-triangular A [BT, BT] (BT <= 16) by repeated squaring."""
    r = tl.arange(0, BT)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    inv = eye - A
    P = tl.dot(A, A, input_precision="ieee")
    inv = tl.dot(inv, eye + P, input_precision="ieee")
    P = tl.dot(P, P, input_precision="ieee")
    inv = tl.dot(inv, eye + P, input_precision="ieee")
    P = tl.dot(P, P, input_precision="ieee")
    inv = tl.dot(inv, eye + P, input_precision="ieee")
    return inv


@triton.jit
def gated_delta_chunk_kernel(
    q_ptr,  # [N, H, K] packed tokens
    k_ptr,  # [N, H, K]
    v_ptr,  # [N, HV, V]
    f_ptr,  # raw gate: [N, HV, K] (KDA) or [N, HV] (GDN)
    b_ptr,  # [N, HV] raw beta
    o_ptr,  # [N, HV, V]
    A_log_ptr,
    dt_bias_ptr,
    cu_ptr,  # [S + 1] sequence starts
    state_ptr,  # pool (4-D, strides)
    state_idx_ptr,  # [S] slot per sequence (< 0: start from zeros, do not write back)
    has_init_ptr,  # [S] int: 1 = read the slot's state, 0 = start from zeros
    ckpt_ptr,  # checkpoint pool (4-D, strides)
    ckpt_idx_ptr,  # [S, max_chunks] checkpoint slot after chunk c (< 0: none)
    max_chunks,
    scale,
    lower_bound,
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
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    CKPT: tl.constexpr,
    TF32: tl.constexpr,
    FACTORIZED: tl.constexpr,
    KB: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_sh = tl.program_id(1)
    i_s = i_sh // HV
    i_hv = i_sh % HV
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_ptr + i_s).to(tl.int64)
    eos = tl.load(cu_ptr + i_s + 1).to(tl.int64)
    T = eos - bos
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    causal = o_t[:, None] >= o_t[None, :]
    strict = o_t[:, None] > o_t[None, :]

    slot = tl.load(state_idx_ptr + i_s).to(tl.int64)
    p_s = state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if slot >= 0:
        if tl.load(has_init_ptr + i_s) != 0:
            S = tl.load(p_s, mask=m_kv, other=0.0).to(tl.float32)
    A_h = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    if GATE == 2:
        dtb = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    else:
        dtb = tl.load(dt_bias_ptr + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)

    n_chunks = tl.cdiv(T, BT)
    for c in range(0, n_chunks):
        rows = c * BT + o_t
        m_t = rows < T
        tok = bos + rows
        m_tk = m_t[:, None] & m_k[None, :]
        q = tl.load(q_ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
        if L2NORM:
            q_rn = tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)
            k_rn = tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)
            q = q * q_rn[:, None]
            k = k * k_rn[:, None]
        q = q * scale
        v = tl.load(v_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0).to(tl.float32)
        beta = tl.load(b_ptr + tok * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        beta = tl.where(m_t, 1.0 / (1.0 + tl.exp(-beta)), 0.0)
        if GATE == 2:
            a = tl.load(f_ptr + tok * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
            gr = tl.where(m_t, -A_h * _softplus(a + dtb), 0.0)
            g = gr[:, None] + tl.zeros([BT, BK], dtype=tl.float32)
        else:
            f = tl.load(f_ptr + (tok[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
            x = f + dtb[None, :]
            if GATE == 0:
                g = -A_h * _softplus(x)
            else:
                g = lower_bound / (1.0 + tl.exp(-A_h * x))
            g = tl.where(m_tk, g, 0.0)
        G = tl.cumsum(g, axis=0)  # [BT, BK], <= 0, chunk-local
        eG = tl.exp(G)
        kg = k * eG
        qg = q * eG
        if FACTORIZED:
            # Bounded per-channel decay: exp(-G) <= exp(BT * |lower_bound|) is finite.
            kinv = k * tl.exp(-G)
            A = tl.dot(kg, tl.trans(kinv), input_precision="ieee")
            Aqk = tl.dot(qg, tl.trans(kinv), input_precision="ieee")
        elif GATE == 2:
            # One decay per head: A = (k k^T) * exp(G_t - G_s), exponent <= 0 where kept.
            Gr = tl.cumsum(gr, axis=0)  # [BT]
            D = tl.exp(tl.where(causal, Gr[:, None] - Gr[None, :], float("-inf")))
            A = tl.dot(k, tl.trans(k), input_precision="ieee") * D
            Aqk = tl.dot(q, tl.trans(k), input_precision="ieee") * D
        else:
            # Unbounded per-channel decay: sum_k k_t k_s exp(G_t - G_s) one K-block at a time.
            A = tl.zeros([BT, BT], dtype=tl.float32)
            Aqk = tl.zeros([BT, BT], dtype=tl.float32)
            for kb in tl.static_range(0, BK, KB):
                o_kb = kb + tl.arange(0, KB)
                m_tb = m_t[:, None] & (o_kb < K)[None, :]
                kk = tl.load(k_ptr + (tok[:, None] * H + i_h) * K + o_kb[None, :], mask=m_tb, other=0.0).to(tl.float32)
                qq = tl.load(q_ptr + (tok[:, None] * H + i_h) * K + o_kb[None, :], mask=m_tb, other=0.0).to(tl.float32)
                if L2NORM:
                    kk = kk * k_rn[:, None]
                    qq = qq * q_rn[:, None]
                qq = qq * scale
                ff = tl.load(f_ptr + (tok[:, None] * HV + i_hv) * K + o_kb[None, :], mask=m_tb, other=0.0).to(tl.float32)
                dtb_b = tl.load(dt_bias_ptr + i_hv * K + o_kb, mask=o_kb < K, other=0.0).to(tl.float32)
                gb = tl.where(m_tb, -A_h * _softplus(ff + dtb_b[None, :]), 0.0)
                Gb = tl.cumsum(gb, axis=0)  # [BT, KB]
                d = Gb[:, None, :] - Gb[None, :, :]  # [BT, BT, KB]
                d = tl.exp(tl.where(causal[:, :, None], d, float("-inf")))
                A += tl.sum(kk[:, None, :] * kk[None, :, :] * d, axis=2)
                Aqk += tl.sum(qq[:, None, :] * kk[None, :, :] * d, axis=2)
        A = tl.where(strict, A * beta[:, None], 0.0)
        Aqk = tl.where(causal, Aqk, 0.0)
        Ainv = _tril_inverse_16(A, BT)
        if TF32:
            R = v - tl.dot(kg, S)
        else:
            R = v - tl.dot(kg, S, input_precision="ieee")
        U = tl.dot(Ainv, R * beta[:, None], input_precision="ieee")
        if TF32:
            o = tl.dot(qg, S) + tl.dot(Aqk, U)
        else:
            o = tl.dot(qg, S, input_precision="ieee") + tl.dot(Aqk, U, input_precision="ieee")
        tl.store(o_ptr + (tok[:, None] * HV + i_hv) * V + o_v[None, :], o.to(o_ptr.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
        G_last = tl.sum(g, axis=0)  # [BK]; padded rows add zero
        k_tail = k * tl.exp(G_last[None, :] - G)
        if TF32:
            S = S * tl.exp(G_last)[:, None] + tl.dot(tl.trans(k_tail), U)
        else:
            S = S * tl.exp(G_last)[:, None] + tl.dot(tl.trans(k_tail), U, input_precision="ieee")
        if CKPT:
            cslot = tl.load(ckpt_idx_ptr + i_s * max_chunks + c).to(tl.int64)
            if cslot >= 0:
                p_c = ckpt_ptr + cslot * c_slot + i_hv * c_h + o_k[:, None] * c_k + o_v[None, :] * c_v
                tl.store(p_c, S.to(ckpt_ptr.dtype.element_ty), mask=m_kv)
    if slot >= 0:
        tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv)
