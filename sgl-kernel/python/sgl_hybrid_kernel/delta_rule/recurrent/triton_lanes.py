"""Triton kernels: decode / verify windows of the gated delta rule with the warp's lanes split between
the key and the value axis, fed by a per-token prologue (issue 4, 2026-11-30, ninth round).

``gated_delta_verify_wide_kernel`` (triton_recurrent.py) puts all 32 lanes of its one warp on the key
axis: every key reduction is a 5-level butterfly per value column, and every value-column program
recomputes its token's L2 norms, gates and sigmoid. On the H200 its verify windows are issue-bound
(Nsight Compute, GDN T=5 B=32: 50.6 M warp instructions, the schedulers busy 67 % of cycles), and
those reductions are ~40 % of the instructions. Here:

* :func:`token_prep_kernel` (one program per token and up to 8 value heads) computes each token's
  inputs once: ``q / |q| * scale`` and ``k / |k|`` (FP32), the log decay ``g`` (per head) or the decay
  ``exp(g)`` (per key channel), ``beta = sigmoid(b)`` and ``beta * (q.k)``; in a deferred-commit window
  it also writes tokens 1..T-1's replay records in the one-warp kernel's format (``k``, ``g``, ``beta``,
  ``v``; FP32), so a window whose batch changes kernels between verify and replay still replays
  correctly (to FP32 rounding).
* :func:`gated_delta_verify_lanes_kernel` keeps the ``[K, BV]`` state slice as a 3-D tile of key
  blocks of ``KC = 4 * KL`` keys: with FP32 state loads of 4 keys per lane, ``KL`` lanes sit on the
  keys and ``32 / KL`` on the value columns, so a key reduction sums ``K / KL`` products in-thread
  and needs ``log2(KL)`` shuffle levels for all of a lane's columns at once. The per-token vectors
  are loaded as broadcasts of that tile (stride 0 along the columns, FP32 like the state), so they
  take the state's register layout without a conversion.

Which of the two non-contiguous axes (key blocks, value columns) the lanes go to is decided by
Triton's coalescing pass, whose tie-break changed between versions: 3.6 orders equal axes by
increasing index, 3.7 and 3.8 by decreasing index. ``V_FIRST`` puts the value axis where the
installed version sends the lanes (``lanes_v_first``); both arrangements compute the same thing.

Three binaries serve the modes (``flags`` at run time within each): ``PLAIN`` (plain windows:
snapshots, deferred commit and replay compiled out), the deferred binary (``SNAPSHOTS`` False: deferred
commit, fused replay of the previous window, :func:`recurrent.replay_commit`) and the all-modes binary
(``SNAPSHOTS`` True: per-token snapshots as well). The deferred binary exists because the snapshot
writes' second pointer tile took the all-modes binary to 215 registers on the H200's Triton 3.6
(8 warps per SM against 12), which cost the deferred window ~11 us at B=32. Verify and replay apply a
token by the same ``_lanes_update`` on the same FP32 values in every binary (the records hold what the
verify consumed: the verify takes ``exp`` of the per-head log decay in this kernel, as the replay does
of the record's; a per-channel decay is computed by the prologue and, for a record, by this kernel, the
same elementwise ``exp`` of the same value), so a replayed state equals the snapshot bit for bit
(checked across the binaries on the H200: ``bench_delta_rule_recurrent.py`` ``deferred_exact``, whose reference
window writes snapshots). The layout and the prologue's values differ from the one-warp kernel's, so
the two kernels agree to FP32 rounding, not bit for bit: every call of one window must take the same
kernel (the wrapper's defaults do).
"""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import (RECORD_STORE_CACHE, STATE_LOAD_EVICTION, STATE_STORE_CACHE, TRITON_VERSION,
                                                          _fold_last, _softplus)

try:  # grid dependency control (programmatic dependent launch, sm_90+); only compiled in with PDL=True
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without it: recurrent.rules.lanes_pdl() then answers False
    gdc_launch_dependents = gdc_wait = None


def lanes_v_first() -> bool:
    """``V_FIRST`` for the installed Triton (see the module docstring): True before 3.7."""
    return TRITON_VERSION < (3, 7)


@triton.jit(do_not_specialize=["flags"])
def token_prep_kernel(
    q_ptr,  # [N, H, K]
    k_ptr,  # [N, H, K]
    v_ptr,  # [N, HV, V]
    f_ptr,  # [N, HV, K] (KDA) or [N, HV] (GDN): raw gate input
    b_ptr,  # [N, HV] raw beta
    A_log_ptr,  # [HV]
    dt_bias_ptr,  # [HV * K] (KDA) or [HV]
    state_idx_ptr,  # [B] slot per request (< 0: padding row, no record)
    qn_ptr,  # out [N, H, K] FP32: q / |q| * scale
    kn_ptr,  # out [N, H, K] FP32: k / |k|
    d_ptr,  # out FP32: GDN [N, HV] log decay g; KDA [N, HV, K] decay exp(g)
    bq_ptr,  # out [N, HV, 2] FP32: beta, beta * (q_hat . k_hat)
    replay_ptr,  # out (flags & 1): [slots, T - 1, HV, K + GK + 1 + V] FP32 records of tokens 1..T-1 (k, g, beta, v)
    scale,
    lower_bound,
    r_slot,
    flags,  # 1: write the replay records
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BVR: tl.constexpr,  # next power of two of V (the record's value row)
    HB: tl.constexpr,  # value heads per program (prep_heads_per_program)
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    PDL: tl.constexpr,  # the lanes kernel is a programmatic dependent launch of this one (recurrent.rules.lanes_pdl)
):
    """One program per (token, ``HB`` value heads): the per-token inputs of
    :func:`gated_delta_verify_lanes_kernel` as ``[HB, K]`` tiles (formulas of
    ``gated_delta_verify_wide_kernel``; gate kinds as in triton_recurrent.py). q / k of a GVA group
    are written by its first value head."""
    if PDL:  # let the lanes kernel start loading its states now; it waits for these outputs (gdc_wait)
        gdc_launch_dependents()
    n = tl.program_id(0)
    o_hv = tl.program_id(1) * HB + tl.arange(0, HB)
    m_h = o_hv < HV
    o_h = o_hv // (HV // H)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_hk = m_h[:, None] & m_k[None, :]
    row = (n * H + o_h)[:, None] * K + o_k[None, :]
    q = tl.load(q_ptr + row, mask=m_hk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + row, mask=m_hk, other=0.0).to(tl.float32)
    if L2NORM:
        q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
        k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
    q = q * scale
    first = m_hk & ((o_hv % (HV // H)) == 0)[:, None]
    tl.store(qn_ptr + row, q, mask=first)
    tl.store(kn_ptr + row, k, mask=first)
    beta = 1.0 / (1.0 + tl.exp(-tl.load(b_ptr + n * HV + o_hv, mask=m_h, other=0.0).to(tl.float32)))
    tl.store(bq_ptr + (n * HV + o_hv) * 2, beta, mask=m_h)
    tl.store(bq_ptr + (n * HV + o_hv) * 2 + 1, beta * tl.sum(q * k, axis=1), mask=m_h)
    A = tl.exp(tl.load(A_log_ptr + o_hv, mask=m_h, other=0.0).to(tl.float32))
    if GATE == 2:  # the scalar log decay: the lanes kernel takes exp of it (as of a record's, bit-exact replay)
        f = tl.load(f_ptr + n * HV + o_hv, mask=m_h, other=0.0).to(tl.float32)
        g = -A * _softplus(f + tl.load(dt_bias_ptr + o_hv, mask=m_h, other=0.0).to(tl.float32))
        tl.store(d_ptr + n * HV + o_hv, g, mask=m_h)
    else:  # per key channel: the decay itself (an exponential per key and column in the lanes kernel would cost)
        hk = o_hv[:, None] * K + o_k[None, :]
        f = tl.load(f_ptr + n * HV * K + hk, mask=m_hk, other=0.0).to(tl.float32)
        f = f + tl.load(dt_bias_ptr + hk, mask=m_hk, other=0.0).to(tl.float32)
        if GATE == 1:
            g = lower_bound / (1.0 + tl.exp(-A[:, None] * f))
        else:
            g = -A[:, None] * _softplus(f)
        tl.store(d_ptr + n * HV * K + hk, tl.exp(g), mask=m_hk)
    t = n % T
    if (flags & 1) != 0 and t > 0:
        slot = tl.load(state_idx_ptr + n // T).to(tl.int64)
        if slot >= 0:
            GK: tl.constexpr = 1 if GATE == 2 else K
            rec = replay_ptr + slot * r_slot + ((t - 1) * HV + o_hv) * (K + GK + 1 + V)  # [HB] record starts
            # streaming stores: only the next window's replay reads them (triton_recurrent.RECORD_STORE_CACHE)
            tl.store(rec[:, None] + o_k[None, :], k, mask=m_hk, cache_modifier=RECORD_STORE_CACHE)
            if GATE == 2:  # the one-warp kernel's record format: log decay, so either kernel can replay it
                tl.store(rec + K, g, mask=m_h, cache_modifier=RECORD_STORE_CACHE)
            else:
                tl.store(rec[:, None] + K + o_k[None, :], g, mask=m_hk, cache_modifier=RECORD_STORE_CACHE)
            tl.store(rec + K + GK, beta, mask=m_h, cache_modifier=RECORD_STORE_CACHE)
            o_r = tl.arange(0, BVR)
            m_hr = m_h[:, None] & (o_r < V)[None, :]
            vr = tl.load(v_ptr + (n * HV + o_hv)[:, None] * V + o_r[None, :], mask=m_hr, other=0.0).to(tl.float32)
            tl.store(rec[:, None] + (K + GK + 1) + o_r[None, :], vr, mask=m_hr, cache_modifier=RECORD_STORE_CACHE)


def prep_heads_per_program(num_v_heads: int, num_tokens: int = 1 << 30, num_compute_units: int = 132) -> int:
    """``HB`` of :func:`token_prep_kernel`: the largest power of two dividing ``num_v_heads``, at most 8
    (Qwen3.8's 48 value heads: 8; Kimi K3 TP8's 12: 4), halved while the grid has fewer than 4 programs
    per compute unit (few tokens: more, smaller programs; H200, 2026-11-30: KDA B=16 / 32 verify 0.5-0.7 µs
    slower with 4 heads per program than with 1)."""
    hb = min(8, num_v_heads & -num_v_heads)
    while hb > 1 and num_tokens * (num_v_heads // hb) < 4 * num_compute_units:
        hb //= 2
    return hb


@triton.jit
def _lanes_sum(x, V_FIRST: tl.constexpr, FOLD: tl.constexpr = True):
    """Sum a state-shaped tile over its two key axes, the in-thread key blocks first: ``[BV]``. ``FOLD``
    (``lanes_fold``) adds the key blocks in index order (``_fold_last``: a chain of FMAs for a sum of products
    under Triton 3.7+ too, whose in-thread reductions are trees); else ``tl.sum``."""
    if FOLD:
        if V_FIRST:  # [BV, KB, KC]
            return tl.sum(_fold_last(tl.permute(x, (0, 2, 1)), x.shape[1]), axis=1)
        else:  # [KB, BV, KC]
            return tl.sum(_fold_last(tl.permute(x, (1, 2, 0)), x.shape[0]), axis=1)
    else:
        if V_FIRST:
            return tl.sum(tl.sum(x, axis=1), axis=1)
        else:
            return tl.sum(tl.sum(x, axis=0), axis=1)


@triton.jit
def _lanes_col(x, V_FIRST: tl.constexpr):
    """A ``[BV]`` column vector broadcast against the state tile."""
    if V_FIRST:
        return x[:, None, None]
    else:
        return x[None, :, None]


@triton.jit
def _lanes_update(S, k, v, d, beta, V_FIRST: tl.constexpr, FOLD: tl.constexpr = True):
    """One token of the delta rule on the state tile: ``k`` (and a per-channel ``d``) are broadcast
    tiles of the state's shape, ``v`` the ``[BV]`` value tile, ``beta`` a scalar. Returns the new
    state, the decayed state ``S'`` and ``err = v - k.S'``. Shared by verify and replay (bit-exact)."""
    Sd = S * d
    err = v - _lanes_sum(Sd * k, V_FIRST, FOLD)
    return Sd + k * _lanes_col(beta * err, V_FIRST), Sd, err


@triton.jit(do_not_specialize=["r_slot", "flags"])
def gated_delta_verify_lanes_kernel(
    qn_ptr,  # [N, H, K] FP32 (token_prep_kernel)
    kn_ptr,  # [N, H, K] FP32
    d_ptr,  # FP32: GDN [N, HV] log decay g; KDA [N, HV, K] decay exp(g) (token_prep_kernel)
    bq_ptr,  # [N, HV, 2] FP32 beta, beta * (q.k)
    v_ptr,  # [N, HV, V]
    o_ptr,  # [N, HV, V] output
    state_ptr,  # V-major pool [slots, HV, V, K], key stride 1
    state_idx_ptr,  # [B] slot per request (< 0: padding row: zero outputs, no state read)
    inter_ptr,  # FLAG_SAVE_INTER: snapshot pool with the state pool's per-slot strides
    inter_idx_ptr,  # [N] snapshot slot per token (< 0: skip)
    replay_prev_ptr,  # FLAG_REPLAY_PREV: the previous window's records
    accept_prev_ptr,  # FLAG_REPLAY_PREV: [B] tokens accepted of the previous window (1..T)
    s_slot,
    s_h,
    s_v: tl.constexpr,
    is_slot,
    r_slot,
    flags,  # FLAG_COMMIT 1 | FLAG_SAVE_INTER 2 | FLAG_DEFERRED 4 | FLAG_REPLAY_PREV 8 (triton_recurrent.py)
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    KL: tl.constexpr,  # lanes on the key axis (key blocks of 4 * KL keys)
    PER_CHANNEL: tl.constexpr,  # decay per key channel (KDA) or per head (GDN)
    V_FIRST: tl.constexpr,  # tile [BV, KB, KC] instead of [KB, BV, KC] (lanes_v_first)
    FOLD: tl.constexpr,  # key blocks summed in index order (lanes_fold: CUDA and the interpreter)
    PLAIN: tl.constexpr,  # compile snapshots, deferred commit and replay out
    SNAPSHOTS: tl.constexpr,  # with PLAIN False: compile the snapshot writes in (FLAG_SAVE_INTER honoured)
    PDL: tl.constexpr,  # launched as a programmatic dependent launch of token_prep_kernel (recurrent.rules.lanes_pdl)
):
    """Decode / verify window of ``T`` tokens for one (request, value head, ``BV`` columns), one warp.
    Needs ``K % (4 * KL) == 0``, ``V % BV == 0`` and a key-contiguous pool (the wrapper checks).
    Token ``t``: ``S' = d_t S``, ``err = v_t - k_t.S'``, ``o_t = q_t.S' + beta_t (q_t.k_t) err``,
    ``S = S' + beta_t k_t err^T``. Deferred commit stores the state after token 0 in the slot (the
    records come from the prologue); the fused replay first applies the previous window's accepted
    records 1..n-1 to the slot's state. With ``PDL`` the kernel is a programmatic dependent launch of the
    prologue: the state load and the replay run while the prologue does, ``gdc_wait`` comes before the
    first read of the prologue's outputs."""
    KC: tl.constexpr = 4 * KL
    KB: tl.constexpr = K // KC
    GK: tl.constexpr = K if PER_CHANNEL else 1
    RW: tl.constexpr = K + GK + 1 + V
    COMMIT = (flags & 1) != 0
    SAVE_INTER = (flags & 2) != 0
    DEFERRED = (flags & 4) != 0
    REPLAY_PREV = (flags & 8) != 0
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    o_c = tl.arange(0, BV)
    o_v = i_v * BV + o_c
    if V_FIRST:
        kidx = tl.arange(0, KB)[None, :, None] * KC + tl.arange(0, KC)[None, None, :] + o_c[:, None, None] * 0
        off = i_hv * s_h + o_v[:, None, None] * s_v + kidx
    else:
        kidx = tl.arange(0, KB)[:, None, None] * KC + tl.arange(0, KC)[None, None, :] + o_c[None, :, None] * 0
        off = i_hv * s_h + o_v[None, :, None] * s_v + kidx

    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    if slot < 0:
        for t in range(T):
            n = i_b * T + t
            tl.store(o_ptr + (n * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty))
        return
    p_s = state_ptr + slot * s_slot + off
    S = tl.load(p_s, eviction_policy=STATE_LOAD_EVICTION).to(tl.float32)
    if not PLAIN:
        if REPLAY_PREV:
            rbase = replay_prev_ptr + slot * r_slot
            for r in range(tl.load(accept_prev_ptr + i_b).to(tl.int32) - 1):
                rec = rbase + (r * HV + i_hv) * RW
                if PER_CHANNEL:
                    dr = tl.exp(tl.load(rec + K + kidx))
                else:
                    dr = tl.exp(tl.load(rec + K))
                S, _, _ = _lanes_update(S, tl.load(rec + kidx), tl.load(rec + K + GK + 1 + o_v), dr, tl.load(rec + K + GK),
                                        V_FIRST, FOLD)
    if PDL:  # everything above reads only what earlier kernels wrote; the prologue's outputs come next
        gdc_wait()
    n = i_b * T
    q = tl.load(qn_ptr + (n * H + i_h) * K + kidx)
    k = tl.load(kn_ptr + (n * H + i_h) * K + kidx)
    if PER_CHANNEL:
        d = tl.load(d_ptr + (n * HV + i_hv) * K + kidx)
    else:
        d = tl.exp(tl.load(d_ptr + n * HV + i_hv))
    beta = tl.load(bq_ptr + (n * HV + i_hv) * 2)
    bqk = tl.load(bq_ptr + (n * HV + i_hv) * 2 + 1)
    v = tl.load(v_ptr + (n * HV + i_hv) * V + o_v).to(tl.float32)
    for t in tl.static_range(T):
        n = i_b * T + t
        if t + 1 < T:  # the next token's loads go out before this token's chain
            qx = tl.load(qn_ptr + ((n + 1) * H + i_h) * K + kidx)
            kx = tl.load(kn_ptr + ((n + 1) * H + i_h) * K + kidx)
            if PER_CHANNEL:
                dx = tl.load(d_ptr + ((n + 1) * HV + i_hv) * K + kidx)
            else:
                dx = tl.exp(tl.load(d_ptr + (n + 1) * HV + i_hv))
            betax = tl.load(bq_ptr + ((n + 1) * HV + i_hv) * 2)
            bqkx = tl.load(bq_ptr + ((n + 1) * HV + i_hv) * 2 + 1)
            vx = tl.load(v_ptr + ((n + 1) * HV + i_hv) * V + o_v).to(tl.float32)
        S, Sd, err = _lanes_update(S, k, v, d, beta, V_FIRST, FOLD)
        o = _lanes_sum(Sd * q, V_FIRST, FOLD) + bqk * err
        tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty))
        if not PLAIN:
            if SNAPSHOTS and SAVE_INTER:
                islot = tl.load(inter_idx_ptr + n).to(tl.int64)
                if islot >= 0:
                    tl.store(inter_ptr + islot * is_slot + off, S.to(inter_ptr.dtype.element_ty),
                             cache_modifier=STATE_STORE_CACHE)
            if t == 0:
                if DEFERRED:
                    tl.store(p_s, S.to(p_s.dtype.element_ty), cache_modifier=STATE_STORE_CACHE)
        if t + 1 < T:
            q, k, d, beta, bqk, v = qx, kx, dx, betax, bqkx, vx
    if COMMIT:
        tl.store(p_s, S.to(p_s.dtype.element_ty), cache_modifier=STATE_STORE_CACHE)
