"""Triton kernel: gated delta rule for decode (T = 1) and speculative verify (T = 1 + drafts).

One program owns one (request, value head, tile of ``BV`` value columns): it keeps
that ``[K, BV]`` slice of the state in registers for all ``T`` tokens, so narrow
tiles (down to 4 columns) give ``B * HV * V / BV`` independent programs and small
batches still fill the GPU (seeds digest, item 10). The gate, ``beta`` and the
Q/K L2 norm are computed in the kernel from raw projections.

The state lives in a pool indexed by slot; any 4-D layout works through strides
(fla's ``[slots, HV, K, V]`` or SGLang's KDA pool ``[slots, HV, V, K]``). A
negative slot marks a padding row: its outputs are written as zeros and no
state is read, so whatever the pool holds there (NaN included) cannot leak.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Gate kinds (constexpr GATE)
GATE_KDA = 0  # per channel: -exp(A_log[h]) * softplus(f + dt_bias[h, k])
GATE_KDA_SAFE = 1  # per channel: lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias[h, k]))
GATE_GDN = 2  # per head: -exp(A_log[h]) * softplus(a + dt_bias[h])


@triton.jit
def _softplus(x):
    return tl.where(x < 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def _delta_update(S, k, v, decay, beta):
    """One token of the delta rule on a ``[BK, BV]`` state slice; ``decay`` is
    ``[BK]`` (per channel) or a scalar. Shared by verify and deferred-commit
    replay so both execute the same FP32 operations in the same order."""
    if decay.shape == k.shape:
        S = S * decay[:, None]
    else:
        S = S * decay
    err = v - tl.sum(S * k[:, None], axis=0)
    return S + (beta * k)[:, None] * err[None, :]


@triton.jit
def _replay_accepted(S, rec_base, n_acc, o_k, o_v, m_k, m_v, T: tl.constexpr, HV: tl.constexpr, i_hv, K: tl.constexpr, V: tl.constexpr, GK: tl.constexpr):
    """Apply tokens 1 .. n_acc - 1 of a deferred verify window from their stored inputs."""
    RW: tl.constexpr = K + GK + 1 + V
    for t in range(1, T):
        if t < n_acc:
            rec = rec_base + ((t - 1) * HV + i_hv) * RW
            k = tl.load(rec + o_k, mask=m_k, other=0.0)
            if GK == 1:
                g = tl.load(rec + K)
            else:
                g = tl.load(rec + K + o_k, mask=m_k, other=0.0)
            beta = tl.load(rec + K + GK)
            v = tl.load(rec + K + GK + 1 + o_v, mask=m_v, other=0.0)
            S = _delta_update(S, k, v, tl.exp(g), beta)
    return S


@triton.jit
def gated_delta_recurrent_kernel(
    q_ptr,  # [N, H, K]   N = B * T tokens, token-major
    k_ptr,  # [N, H, K]
    v_ptr,  # [N, HV, V]
    f_ptr,  # [N, HV, K] (KDA) or [N, HV] (GDN): raw gate input
    b_ptr,  # [N, HV] raw beta (sigmoid applied here)
    o_ptr,  # [N, HV, V] output
    A_log_ptr,  # [HV]
    dt_bias_ptr,  # [HV * K] (KDA) or [HV] (GDN)
    state_ptr,  # state pool, 4-D, strides below
    state_idx_ptr,  # [B] int slot per request (< 0: padding row)
    inter_ptr,  # intermediate-state pool (SAVE_INTER), 4-D
    inter_idx_ptr,  # [N] int slot per token (< 0: do not save)
    replay_ptr,  # DEFERRED: [slots, T - 1, HV, RW] compact per-token inputs
    replay_prev_ptr,  # REPLAY_PREV: the previous window's buffer (the other of a ping-pong pair)
    accept_prev_ptr,  # REPLAY_PREV: [B] tokens accepted of the previous window (1..T)
    scale,
    lower_bound,
    s_slot,
    s_h,
    s_k,
    s_v,
    is_slot,
    is_h,
    is_k,
    is_v,
    r_slot,
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    SAVE_INTER: tl.constexpr,
    COMMIT: tl.constexpr,
    DEFERRED: tl.constexpr,
    REPLAY_PREV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]

    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    if slot < 0:
        for t in range(T):
            n = i_b * T + t
            tl.store(o_ptr + (n * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty), mask=m_v)
        return

    p_s = state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S = tl.load(p_s, mask=m_kv, other=0.0).to(tl.float32)
    if REPLAY_PREV:
        # Deferred commit of the previous window, fused: rebuild its accepted
        # state in registers (the slot holds its token-0 state) before going on.
        GKp: tl.constexpr = 1 if GATE == 2 else K
        S = _replay_accepted(S, replay_prev_ptr + slot * r_slot, tl.load(accept_prev_ptr + i_b), o_k, o_v, m_k, m_v,
                             T, HV, i_hv, K, V, GKp)
    A = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    if GATE == 2:
        dtb = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    else:
        dtb = tl.load(dt_bias_ptr + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)

    for t in range(T):
        n = i_b * T + t
        q = tl.load(q_ptr + (n * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (n * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        if L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        v = tl.load(v_ptr + (n * HV + i_hv) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        beta = tl.load(b_ptr + n * HV + i_hv).to(tl.float32)
        beta = 1.0 / (1.0 + tl.exp(-beta))
        if GATE == 2:
            a = tl.load(f_ptr + n * HV + i_hv).to(tl.float32)
            g = -A * _softplus(a + dtb)
        else:
            f = tl.load(f_ptr + (n * HV + i_hv) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
            if GATE == 0:
                g = -A * _softplus(f + dtb)
            else:
                g = lower_bound / (1.0 + tl.exp(-A * (f + dtb)))
        S = _delta_update(S, k, v, tl.exp(g), beta)
        o = tl.sum(S * (q * scale)[:, None], axis=0)
        tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty), mask=m_v)
        if SAVE_INTER:
            islot = tl.load(inter_idx_ptr + n).to(tl.int64)
            if islot >= 0:
                p_i = inter_ptr + islot * is_slot + i_hv * is_h + o_k[:, None] * is_k + o_v[None, :] * is_v
                tl.store(p_i, S.to(inter_ptr.dtype.element_ty), mask=m_kv)
        if DEFERRED:
            if t == 0:
                # Token 0 is always accepted: commit its state now.
                tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv)
            else:
                # Later tokens: keep only their inputs (k, decay, beta, v tile).
                GK: tl.constexpr = 1 if GATE == 2 else K
                RW: tl.constexpr = K + GK + 1 + V
                rec = replay_ptr + slot * r_slot + ((t - 1) * HV + i_hv) * RW
                if i_v == 0:
                    tl.store(rec + o_k, k, mask=m_k)
                    if GATE == 2:
                        tl.store(rec + K, g)
                    else:
                        tl.store(rec + K + o_k, g, mask=m_k)
                    tl.store(rec + K + GK, beta)
                tl.store(rec + K + GK + 1 + o_v, v, mask=m_v)
    if COMMIT:
        tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv)


@triton.jit
def gated_delta_replay_commit_kernel(
    state_ptr,  # state pool (4-D, strides below); holds the state after token 0
    state_idx_ptr,  # [B] slots (< 0: padding row)
    accept_ptr,  # [B] accepted tokens of the verify window, token 0 included (1..T)
    replay_ptr,  # [slots, T - 1, HV, RW] inputs stored by the DEFERRED verify
    s_slot,
    s_h,
    s_k,
    s_v,
    r_slot,
    T: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
):
    """Rebuild the accepted state: replay tokens 1 .. accept - 1 on the committed
    state of token 0 with the exact operations of the verify kernel (bit-exact)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    n_acc = tl.load(accept_ptr + i_b)
    if slot < 0 or n_acc <= 1:
        return
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    GK: tl.constexpr = K if PER_CHANNEL else 1
    p_s = state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S = tl.load(p_s, mask=m_kv, other=0.0).to(tl.float32)
    S = _replay_accepted(S, replay_ptr + slot * r_slot, n_acc, o_k, o_v, m_k, m_v, T, HV, i_hv, K, V, GK)
    tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv)
