"""Triton kernel: gated delta rule for decode (T = 1) and speculative verify (T = 1 + drafts).

One program owns one (request, value head, tile of ``BV`` value columns): it keeps
that ``[K, BV]`` slice of the state in registers for all ``T`` tokens, so narrow
tiles (down to 4 columns) give ``B * HV * V / BV`` independent programs and small
batches still fill the GPU (seeds digest, item 10). The gate, ``beta`` and the
Q/K L2 norm are computed in the kernel from raw projections.

Latency structure (issue 4, docs/kernels.md): the slot index is loaded first, then all
``T`` tokens' inputs as ``[K, T]`` / ``[T, BV]`` register tiles, so every input load is in
flight with the state load; norms, gates and ``q.k`` of all tokens are computed before the
dependent chain, whose two K-reductions per token both read the decayed state
(``o_t = q.S' + beta (q.k) err``). Launched with one warp, every reduction is a warp
shuffle. The mode (commit, snapshots, deferred, fused replay) is a runtime argument, so
all modes of a window run one binary: deferred replay is bit-exact against snapshots on
a GPU by construction, not by matching compiler layouts across specialisations.

``PRELOAD=False`` (constexpr) loads each token's inputs one token ahead of its chain instead
of all up front: fewer live registers (spill-free at 16 columns, one warp), one memory latency
per token; the default for 4-column GDN windows only (recurrent.recurrent_preload). Plain verify
windows from B = 32 run ``gated_delta_verify_wide_kernel`` (HEAD 7a64a90's per-token loop, 64
columns over 4 warps), measured faster there on the H200 (docs/kernels.md, 2026-11-30).

The state lives in a pool indexed by slot; any 4-D layout works through strides
(fla's ``[slots, HV, K, V]`` or SGLang's KDA pool ``[slots, HV, V, K]``). A
negative slot marks a padding row: its outputs are written as zeros and no
state is read, so whatever the pool holds there (NaN included) cannot leak.
"""

from __future__ import annotations

import triton
import triton.language as tl

# (major, minor) of the installed Triton, for the rules that differ by version (chunk_parallel, recurrent, lanes)
TRITON_VERSION = tuple(int(x) for x in triton.__version__.split(".")[:2])

# Gate kinds (constexpr GATE): sgl_hybrid_kernel.delta_rule.gate (GATE_KDA 0, GATE_KDA_SAFE 1, GATE_GDN 2)

# Mode bits (runtime argument ``flags``)
FLAG_COMMIT = 1  # write the final state back to its slot
FLAG_SAVE_INTER = 2  # write the state after each token to inter_idx's slots
FLAG_DEFERRED = 4  # commit token 0's state, keep tokens 1..T-1's inputs in the replay buffer
FLAG_REPLAY_PREV = 8  # first replay the previous window's accepted prefix from its buffer

# Cache hints for the state pool (and snapshot pool) accesses of every recurrent kernel: a step reads
# and writes each state exactly once, so the load is marked evict-first and the store streaming
# (``.cs``); the next access to a slot is a later step, long after L2 has turned over. On the H200
# (benchmark/kernels/exp_lanes_write.py at tag lab-history-2026-12-07, issue 4) this let the GDN verify window's state write overlap
# its compute: lanes kernel, T=5, B=32, final state written, 79-88 -> 65-74 us; the plain state copy
# was 1-5 % faster. On CDNA Triton lowers them to the non-temporal bits (untested on hardware).
STATE_LOAD_EVICTION = tl.constexpr("evict_first")
STATE_STORE_CACHE = tl.constexpr(".cs")
# A deferred window's replay records (tokens 1..T-1's compact inputs) are read only by the next window's
# replay, after the rest of the model's step: stored streaming (``.cs``) like the states, so their dirty
# lines do not sit in L2 beside the window's state traffic. H200, Triton 3.8 (issue 4, twenty-first round,
# ``2026-12-02-h200-deferred_records_cs.json``): GDN deferred T=5 B=32 70.01 -> 68.12 us, with the previous
# window's replay fused 77.32 -> 75.30.
RECORD_STORE_CACHE = tl.constexpr(".cs")


@triton.jit
def _softplus(x):
    return tl.where(x < 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def _fexp(x, FAST: tl.constexpr):
    """``e^x`` in FP32; ``FAST`` (CUDA): ``ex2.approx.ftz`` of ``x log2 e`` without ``tl.exp``'s denormal
    fix-up (results below ``2^-126`` flush to zero; the same ``ex2.approx`` accuracy otherwise)."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)


@triton.jit
def _frcp(x, FAST: tl.constexpr):
    """``1 / x`` in FP32; ``FAST`` (CUDA): ``rcp.approx.ftz``, the reciprocal ``div.full`` multiplies by, without
    its scaling of divisors above ``2^126``."""
    if FAST:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return 1.0 / x


@triton.jit
def _beta(b, FAST: tl.constexpr):
    """``sigmoid(b)`` in FP32 (``FAST``: :func:`_fexp` / :func:`_frcp` without fix-ups)."""
    if FAST:
        return _frcp(1.0 + _fexp(-b, FAST), FAST)
    else:
        return 1.0 / (1.0 + tl.exp(-b))


@triton.jit
def _log_decay(x, A, lower_bound, GATE: tl.constexpr, FAST: tl.constexpr):
    """The log decay ``g`` of a gate input ``x = f + dt_bias`` (any shape): ``lower_bound * sigmoid(A x)`` for the
    bounded KDA gate (``GATE == 1``; ``FAST``: without fix-ups, bounded gate only), else ``-A softplus(x)``; ``A`` is
    ``e^{A_log}``. The one-warp kernel's per-token chain and its window prep (``TOKPREP``) both use it."""
    if FAST:
        tl.static_assert(GATE == 1, "FAST: the bounded KDA gate")
        return lower_bound * _frcp(1.0 + _fexp(-A * x, FAST), FAST)
    elif GATE == 1:
        return lower_bound / (1.0 + tl.exp(-A * x))
    else:
        return -A * _softplus(x)


@triton.jit
def _lane_xor(x, lane, m: tl.constexpr, XRED: tl.constexpr):
    """``x`` as held by lane ``lane ^ m`` of the warp, element by element, for a ``[32, n]`` FP32 tile whose
    dim 0 is the warp's lanes (what :func:`_xred_pair` builds from the state tile's layout; the compile gate's
    ``shuffle_layout_error`` checks every compiled config). ``XRED == 1`` (CUDA):
    ``shfl.sync.bfly``; ``2``: the same exchange as a gather along dim 0 (the interpreter, and any target,
    much slower: reference for the tests). Issue 4."""
    if XRED == 1:
        tl.static_assert(m == 16 or m == 8 or m == 4 or m == 2 or m == 1, "lane masks 16, 8, 4, 2, 1")
        # the mask as an operand: a constant, which ptxas folds into the instruction's immediate
        y = tl.inline_asm_elementwise("shfl.sync.bfly.b32 $0, $1, $2, 31, -1;", "=r,r,r",
                                      [x.to(tl.int32, bitcast=True), tl.full(x.shape, m, tl.int32)], dtype=tl.int32,
                                      is_pure=True, pack=1)
        return y.to(tl.float32, bitcast=True)
    else:
        return tl.gather(x, tl.broadcast_to(lane ^ m, x.shape), 0)


@triton.jit
def _lane_pick(x, src, XRED: tl.constexpr):
    """Element ``[l, j]`` = ``x[src[j], j]`` for a ``[32, n]`` FP32 tile with dim 0 on the lanes and ``src`` a
    ``[1, n]`` int32 lane per column (``shfl.sync.idx`` under ``XRED == 1``, else a gather). Issue 4."""
    srcb = tl.broadcast_to(src, x.shape)
    if XRED == 1:
        y = tl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, $2, 31, -1;", "=r,r,r",
                                      [x.to(tl.int32, bitcast=True), srcb], dtype=tl.int32, is_pure=True, pack=1)
        return y.to(tl.float32, bitcast=True)
    else:
        return tl.gather(x, srcb, 0)


@triton.jit
def _xred_level(Z, lane, n: tl.constexpr, m: tl.constexpr, XRED: tl.constexpr):
    """One butterfly level (lane mask ``m``) of :func:`_xred_pair` on ``Z`` ``[32, n]``: with ``n > 1`` a
    reduce-scatter step (lanes with bit ``m`` clear keep the even columns and receive their partner's,
    the others the odd ones: ``[32, n / 2]``), else the plain all-reduce step. Issue 4."""
    if n > 1:
        ev, od = tl.split(tl.reshape(Z, [32, n // 2, 2]))
        up = (lane & m) != 0
        return tl.where(up, od, ev) + _lane_xor(tl.where(up, ev, od), lane, m, XRED)
    else:
        return Z + _lane_xor(Z, lane, m, XRED)


@triton.jit
def _lane_bits_col(lane, N: tl.constexpr, TOPB: tl.constexpr):
    """``[32, 1]`` int32 ``0 .. N - 1`` (``N`` a power of two, at most 32): bit ``i`` is the lane's bit ``TOPB - i``,
    the column a reduce-scatter whose first level is lane mask ``1 << TOPB`` leaves in each lane. Issue 4."""
    c = lane * 0
    if N > 1:
        c += (lane >> TOPB) & 1
    if N > 2:
        c += ((lane >> (TOPB - 1)) & 1) << 1
    if N > 4:
        c += ((lane >> (TOPB - 2)) & 1) << 2
    if N > 8:
        c += ((lane >> (TOPB - 3)) & 1) << 3
    if N > 16:
        c += ((lane >> (TOPB - 4)) & 1) << 4
    return c


@triton.jit
def _xred_levels_8421(Z, lane, XRED: tl.constexpr):
    """Lane masks 8, 4, 2, 1 of a reduce-scatter on ``Z [32, N]`` (:func:`_xred_level`): each halves the columns
    while there are two or more, then plain all-reduce steps. Issue 4."""
    N: tl.constexpr = Z.shape[1]
    N4: tl.constexpr = N // 2 if N > 1 else 1
    N2: tl.constexpr = N // 4 if N > 3 else 1
    N1: tl.constexpr = N // 8 if N > 7 else 1
    Z = _xred_level(Z, lane, N, 8, XRED)
    Z = _xred_level(Z, lane, N4, 4, XRED)
    Z = _xred_level(Z, lane, N2, 2, XRED)
    return _xred_level(Z, lane, N1, 1, XRED)


@triton.jit
def _xred_col(lane, BV: tl.constexpr):
    """The value column (``[32, 1]`` int32, ``0 .. BV - 1``) whose sums :func:`_xred_pair` leaves in each lane:
    bit ``i`` of the column is the lane's bit ``8 >> i`` (the reduce-scatter levels 8, 4, 2, 1). Issue 4."""
    return _lane_bits_col(lane, BV, 3)


@triton.jit
def _fold_last(x, N: tl.constexpr):
    """Sum ``x [A, C, N]`` over its in-thread last axis in index order, ``((x0 + x1) + x2) + ...``, so
    that a sum of products compiles to one multiply and a chain of FMAs (N in 1, 2, 4, 8; else tl.sum).
    Triton 3.7+ reduces a thread's own elements as a balanced tree (triton-lang/triton#9220), which turns
    the chain of ``N - 1`` FMAs into ``N / 2`` multiplies, ``N / 2`` FMAs and ``N / 2 - 1`` adds."""
    A: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    if N == 1:
        return tl.reshape(x, [A, C])
    elif N == 2:
        a, b = tl.split(x)
        return a + b
    elif N == 4:
        e, o = tl.split(tl.reshape(x, [A, C, 2, 2]))
        x0, x2 = tl.split(e)
        x1, x3 = tl.split(o)
        return ((x0 + x1) + x2) + x3
    elif N == 8:
        e, o = tl.split(tl.reshape(x, [A, C, 4, 2]))
        e0, e1 = tl.split(tl.reshape(e, [A, C, 2, 2]))
        o0, o1 = tl.split(tl.reshape(o, [A, C, 2, 2]))
        x0, x4 = tl.split(e0)
        x2, x6 = tl.split(e1)
        x1, x5 = tl.split(o0)
        x3, x7 = tl.split(o1)
        return ((((((x0 + x1) + x2) + x3) + x4) + x5) + x6) + x7
    else:
        return tl.sum(x, axis=2)


@triton.jit
def _key_sum(X, SEQ: tl.constexpr):
    """``X [BK, BV]`` summed over the keys: ``[BV]``. ``SEQ`` views the tile as ``[32, BK / 32, BV]`` and adds each
    thread's keys in index order (:func:`_fold_last`), then across the lanes as ``tl.sum`` does. Only for the
    layout :func:`_xred_pair` assumes -- one warp of 32 lanes on the keys, 4 consecutive keys per thread, which
    Triton picks for a 128-key tile of an aligned V-major pool (``recurrent.rules.use_seq_key_sums`` decides on the
    host): there the view costs nothing and a sum of products compiles to a multiply and a chain of FMAs under
    every Triton version (3.7+ would make the thread's part a tree). Under another layout the view would
    convert layouts, and the replay loop's and the verify chain's sums could compile to different groupings
    (no longer bit-exact). Without ``SEQ``: ``tl.sum``."""
    if SEQ:
        return tl.sum(_lane_key_sums(X), axis=0)
    else:
        return tl.sum(X, axis=0)


@triton.jit
def _lane_key_sums(X):
    """``X [BK, BV]`` viewed as ``[32, BK / 32, BV]``: each lane's ``BK / 32`` keys added in index order,
    ``[32, BV]``. The in-thread step of :func:`_key_sum` (``SEQ``) and of :func:`_xred_pair`: one expression, so
    a verify by reduce-scatter and a replay by ``_key_sum`` add alike."""
    BK: tl.constexpr = X.shape[0]
    BV: tl.constexpr = X.shape[1]
    R: tl.constexpr = BK // 32
    return _fold_last(tl.permute(tl.reshape(X, [32, R, BV]), (0, 2, 1)), R)


@triton.jit
def _xred_pair(X, Y, lane, BK: tl.constexpr, BV: tl.constexpr, XRED: tl.constexpr):
    """Key-axis sums of two ``[BK, BV]`` FP32 tiles in the state's layout (32 lanes on the keys, ``BK / 32``
    consecutive keys per thread, every column in each thread: what Triton lays out for ``BK == 128`` on an aligned
    V-major pool, ``recurrent.rules.xred_shape_ok``) as one reduce-scatter instead of ``2 BV``
    all-reduce butterflies: the in-thread partial sums, then lane mask 16 splits ``X`` from ``Y`` and masks
    8, 4, 2, 1 halve the columns while ``BV`` allows (plain all-reduce steps after that). The same
    additions in the same order as :func:`_key_sum` with ``SEQ`` (the thread's keys in index order, then Triton's
    warp reduction: own value plus the lane-mask-16, 8, 4, 2, 1 partner's), so bit-identical; the kernel turns
    ``SEQ`` on wherever ``XRED`` is (under Triton 3.6 also identical to ``tl.sum``, whose in-thread part 3.7+ makes
    a tree). Shuffles per token at 8 columns: 16 + 2 instead
    of 80 (``2 BV x 5``). Returns ``(x, y)`` ``[32, 1]``: the sums of column :func:`_xred_col` in every lane.
    Issue 4 (sixteenth round, docs/kernels.md at tag lab-history-2026-12-07)."""
    tl.static_assert(BK % 32 == 0 and BV <= 16, "XRED: BK a multiple of 32, at most 16 columns")
    Px = _lane_key_sums(X)  # in index order, as _key_sum's SEQ
    Py = _lane_key_sums(Y)
    up = (lane & 16) != 0
    Z = tl.where(up, Py, Px) + _lane_xor(tl.where(up, Px, Py), lane, 16, XRED)
    Z = _xred_levels_8421(Z, lane, XRED)
    W = _lane_xor(Z, lane, 16, XRED)
    return tl.where(up, W, Z), tl.where(up, Z, W)


@triton.jit
def _xred_pair_swapped(X, Y, lane, XRED: tl.constexpr):
    """:func:`_xred_pair` for product tiles the caller built with q and k swapped on the lanes with bit 16 set (``X``
    from k where bit 16 is clear, from q where set; ``Y`` the other): lane mask 16 then adds the partner's ``Y``
    to the lane's ``X`` without selects. The same additions in the same order as :func:`_xred_pair`, so the same
    bits. Returns ``(ks, qs)`` ``[32, 1]``: column :func:`_xred_col`'s ``k.S'`` and ``q.S'``, valid in the lanes with
    bit 16 clear (those :func:`_xred_bcast` reads and the stores write). Issue 4 (twenty-third round)."""
    Z = _lane_key_sums(X) + _lane_xor(_lane_key_sums(Y), lane, 16, XRED)
    Z = _xred_levels_8421(Z, lane, XRED)
    return Z, _lane_xor(Z, lane, 16, XRED)


@triton.jit
def _xred_bcast(e, lane, BK: tl.constexpr, BV: tl.constexpr, XRED: tl.constexpr):
    """``[BK, BV]`` tile whose column ``j`` is column ``j``'s value of ``e`` (``[32, 1]``, laid out as
    :func:`_xred_pair` returns), in the state tile's layout: one ``shfl.sync.idx`` per column from a lane
    holding it (bits of ``j`` on lane bits 8, 4, 2, 1). Issue 4."""
    R: tl.constexpr = BK // 32
    j = tl.arange(0, BV)[None, :]
    src = ((j & 1) << 3) | (((j >> 1) & 1) << 2) | (((j >> 2) & 1) << 1) | ((j >> 3) & 1)
    E = _lane_pick(tl.broadcast_to(e, [32, BV]), src, XRED)
    return tl.reshape(tl.broadcast_to(tl.expand_dims(E, 1), [32, R, BV]), [BK, BV])


@triton.jit
def _xred_norms(q, k, lane, BK: tl.constexpr, XRED: tl.constexpr):
    """``(|k|^2, |q|^2, q.k)`` of two ``[BK]`` FP32 key vectors in the state's key layout (``BK / 32`` consecutive
    keys per lane), each ``[32, 1]`` and equal in every lane: one reduce-scatter (lane mask 16 splits the first two
    pairs, 8 the remaining two, then 4, 2, 1 plain) and three ``shfl.idx`` back, 9 shuffles instead of 15. ``|k|^2``
    and ``|q|^2`` add in ``tl.sum``'s order (bit-identical); ``q.k`` is of the raw vectors. Issue 4."""
    R: tl.constexpr = BK // 32
    q2 = tl.reshape(q, [32, R])
    k2 = tl.reshape(k, [32, R])
    a = tl.sum(k2 * k2, axis=1, keep_dims=True)
    b = tl.sum(q2 * q2, axis=1, keep_dims=True)
    c = tl.sum(q2 * k2, axis=1, keep_dims=True)
    z = a * 0.0
    up = (lane & 16) != 0
    X1 = tl.where(up, b, a) + _lane_xor(tl.where(up, a, b), lane, 16, XRED)
    X2 = tl.where(up, z, c) + _lane_xor(tl.where(up, c, z), lane, 16, XRED)
    u8 = (lane & 8) != 0
    Y = tl.where(u8, X2, X1) + _lane_xor(tl.where(u8, X1, X2), lane, 8, XRED)
    Y = Y + _lane_xor(Y, lane, 4, XRED)
    Y = Y + _lane_xor(Y, lane, 2, XRED)
    Y = Y + _lane_xor(Y, lane, 1, XRED)
    src = tl.arange(0, 4)[None, :] * 8  # lanes 0 / 8 / 16 hold |k|^2 / q.k / |q|^2
    ev, od = tl.split(tl.reshape(_lane_pick(tl.broadcast_to(Y, [32, 4]), src, XRED), [32, 2, 2]))
    kk, qq = tl.split(ev)
    qk, _ = tl.split(od)
    return tl.expand_dims(kk, 1), tl.expand_dims(qq, 1), tl.expand_dims(qk, 1)


@triton.jit
def _lane_scale(x, f, BK: tl.constexpr):
    """``x`` (``[BK]``, the state's key layout) times the per-lane factor ``f`` (``[32, 1]``). Issue 4."""
    return tl.reshape(tl.reshape(x, [32, BK // 32]) * f, [BK])


@triton.jit
def _delta_update(S, k, v, decay, beta, SEQ: tl.constexpr = False):
    """One token of the delta rule on a ``[BK, BV]`` state slice; ``decay`` is
    ``[BK]`` (per channel) or a scalar. Returns the new state, the decayed state ``S'``
    and ``err = v - k.S'`` (key sum: :func:`_key_sum` with ``SEQ``). Shared by verify and
    deferred-commit replay so both execute the same FP32 operations in the same order (bit-exact replay)."""
    if decay.shape == k.shape:
        S = S * decay[:, None]
    else:
        S = S * decay
    err = v - _key_sum(S * k[:, None], SEQ)
    return S + (beta * k)[:, None] * err[None, :], S, err


@triton.jit
def _col(X, o_t, t):
    """Column ``t`` of a ``[R, TP]`` register tile (an exact select: the other terms are zeros)."""
    return tl.sum(tl.where(o_t[None, :] == t, X, 0.0), axis=1)


@triton.jit
def _row(X, o_t, t):
    """Row ``t`` of a ``[TP, C]`` register tile (an exact select)."""
    return tl.sum(tl.where(o_t[:, None] == t, X, 0.0), axis=0)


@triton.jit
def _elem(x, o_t, t):
    """Element ``t`` of a ``[TP]`` register vector."""
    return tl.sum(tl.where(o_t == t, x, 0.0), axis=0)


@triton.jit
def _replay_accepted(S, rec_base, n_acc, o_k, o_v, m_k, m_v, T: tl.constexpr, TP: tl.constexpr, HV: tl.constexpr, i_hv,
                     K: tl.constexpr, V: tl.constexpr, GK: tl.constexpr):
    """Apply tokens 1 .. n_acc - 1 of a deferred verify window from their stored inputs.

    All records are loaded in one go before the chain (masked by ``n_acc``), so the
    replay costs one memory latency, not one per accepted token."""
    RW: tl.constexpr = K + GK + 1 + V
    o_r = tl.arange(0, TP)
    m_r = o_r < tl.minimum(n_acc - 1, T - 1)
    rec = rec_base + (o_r * HV + i_hv) * RW  # [TP] record starts (token r + 1)
    Kr = tl.load(rec[None, :] + o_k[:, None], mask=m_k[:, None] & m_r[None, :], other=0.0)
    if GK == 1:
        Gr = tl.load(rec + K, mask=m_r, other=0.0)
    else:
        Gr = tl.load(rec[None, :] + K + o_k[:, None], mask=m_k[:, None] & m_r[None, :], other=0.0)
    Br = tl.load(rec + K + GK, mask=m_r, other=0.0)
    Vr = tl.load(rec[:, None] + (K + GK + 1) + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.0)
    for r in tl.static_range(T - 1):
        if r + 1 < n_acc:
            if GK == 1:
                d = tl.exp(_elem(Gr, o_r, r))
            else:
                d = tl.exp(_col(Gr, o_r, r))
            S, _, _ = _delta_update(S, _col(Kr, o_r, r), _row(Vr, o_r, r), d, _elem(Br, o_r, r))
    return S


@triton.jit
def _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, n, i_h, i_hv, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                  V: tl.constexpr, o_k, o_v, m_k, m_v, GATE: tl.constexpr):
    """Raw inputs of token row ``n`` (per-token path, ``PRELOAD=False``): q, k ``[BK]``, the v
    tile ``[BV]``, the gate input (``[BK]`` per channel or a scalar for GDN) and beta (scalar)."""
    q = tl.load(q_ptr + (n * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (n * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + (n * HV + i_hv) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + n * HV + i_hv).to(tl.float32)
    if GATE == 2:
        f = tl.load(f_ptr + n * HV + i_hv).to(tl.float32)
    else:
        f = tl.load(f_ptr + (n * HV + i_hv) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    return q, k, v, f, b


@triton.jit
def _gate_params(A_log_ptr, dt_bias_ptr, i_hv, o_k, m_k, K: tl.constexpr, GATE: tl.constexpr):
    """Value head ``i_hv``'s gate parameters: ``exp(A_log)`` (scalar) and ``dt_bias`` (a scalar for
    the per-head gate, ``[BK]`` per key channel otherwise), FP32."""
    A = tl.exp(tl.load(A_log_ptr + i_hv).to(tl.float32))
    if GATE == 2:
        dtb = tl.load(dt_bias_ptr + i_hv).to(tl.float32)
    else:
        dtb = tl.load(dt_bias_ptr + i_hv * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    return A, dtb


@triton.jit
def _verify_per_token(S, p_s, q, k, v, f, b, q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, o_ptr, inter_ptr, inter_idx_ptr, rec_base, i_b,
                      i_h, i_hv, i_v, A, dtb, scale, lower_bound, is_slot, off_i, SAVE_INTER, DEFERRED, COMMIT,
                      T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      o_k, o_v, m_k, m_v, m_kv, GATE: tl.constexpr, L2NORM: tl.constexpr,
                      FAST: tl.constexpr = False, XRED: tl.constexpr = 0, lane=None, m_vs=None,
                      BK: tl.constexpr = 0, BV: tl.constexpr = 0, XNORM: tl.constexpr = False, SEQ: tl.constexpr = False):
    """Steps 2 and 3 of the kernel with per-token inputs (``PRELOAD=False``): only the next
    token's raw inputs are in flight beside the current token's (loaded one token ahead), so a
    16-column one-warp tile keeps the ``[K, BV]`` state slice, its decayed copy and two tokens'
    vectors in registers without spilling. Same FP32 formulas as the preloaded path
    (``o_t = q.S' + beta (q.k) err``); the deferred path's records are written per token.
    ``off_i``: the ``[BK, BV]`` element offsets of this tile inside a snapshot slot. ``q, k, v, f, b``:
    token 0's raw inputs (:func:`_token_inputs`), loaded by the calling kernel (a verify window's right
    after the slot index, ahead of the padding-row branch that waits for it).

    ``XRED`` (1: CUDA shuffles, 2: gathers; :func:`_xred_pair`): the two key-axis sums of a token as one
    reduce-scatter, so each lane ends with one column's ``k.S'`` and ``q.S'``; ``o_v`` / ``m_v`` are then
    ``[32, 1]`` (that column, its bound), ``v`` is loaded in that form, ``err`` goes back to every column
    by :func:`_xred_bcast`, and ``m_vs`` (one lane per column) masks the stores of ``o`` and of the
    deferred records' ``v``. Same FP32 operations in the same order as ``XRED == 0``. ``XNORM`` (the all-modes
    binary with ``XRED``): ``|k|^2``, ``|q|^2`` and ``q.k`` as one reduce-scatter too (:func:`_xred_norms`): states
    bit-identical, ``o`` equal to FP32 rounding (``q.k`` from the raw vectors). H200, 2026-12-02
    (``2026-12-02-h200-verify_xnorm_{1,2}.json``): KDA T=4 snapshot windows B = 1 / 2 / 4 / 8 3.82 / 4.34 / 5.73-5.83 /
    9.23-9.24 -> 3.62 / 4.13-4.14 / 5.61-5.75 / 9.14-9.16 us, while plain windows were 3-4 % slower with it (B = 1 / 2
    3.03 / 3.48-3.49 -> 3.15 / 3.61), so the plain binary keeps three butterflies."""
    GK: tl.constexpr = 1 if GATE == 2 else K
    RW: tl.constexpr = K + GK + 1 + V
    for t in tl.static_range(T):
        n = i_b * T + t
        if t + 1 < T:
            # next token's loads go out before this token's dependent chain
            qn, kn, vn, fn, bn = _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, n + 1, i_h, i_hv, H, HV, K, V, o_k, o_v,
                                               m_k, m_v, GATE)
        if XNORM:
            # |k|^2, |q|^2 and q.k as one reduce-scatter too (_xred_norms); q.k from the raw vectors
            kk, qq, qkr = _xred_norms(q, k, lane, BK, XRED)
            if L2NORM:
                rq = tl.rsqrt(qq + 1e-6)
                rk = tl.rsqrt(kk + 1e-6)
                q = _lane_scale(q, rq, BK)
                k = _lane_scale(k, rk, BK)
                qkn = qkr * rq * rk * scale
            else:
                qkn = qkr * scale
        elif L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        q = q * scale
        # FAST: the same MUFU operations without their range fix-ups, equal results wherever no operand or result
        # is denormal or above 2^126 (KDA's bounded gate, GATE == 1, only)
        b = _beta(b, FAST)
        g = _log_decay(f + dtb, A, lower_bound, GATE, FAST)
        d = _fexp(g, FAST)
        if XRED:
            if XNORM:
                qk = qkn
            else:
                qk = tl.sum(q * k, axis=0)
            if GATE == 2:
                Sd = S * d
            else:
                Sd = S * d[:, None]
            ks, qs = _xred_pair(Sd * k[:, None], Sd * q[:, None], lane, BK, BV, XRED)
            err = v - ks
            S = Sd + (b * k)[:, None] * _xred_bcast(err, lane, BK, BV, XRED)
            o = qs + (b * qk) * err
            tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty), mask=m_vs)
        else:
            qk = tl.sum(q * k, axis=0)
            S, Sd, err = _delta_update(S, k, v, d, b, SEQ)
            o = _key_sum(Sd * q[:, None], SEQ) + (b * qk) * err
            tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty), mask=m_v)
        if SAVE_INTER:
            islot = tl.load(inter_idx_ptr + n).to(tl.int64)
            if islot >= 0:
                tl.store(inter_ptr + islot * is_slot + off_i, S.to(inter_ptr.dtype.element_ty), mask=m_kv,
                         cache_modifier=STATE_STORE_CACHE)
        if t == 0:
            if DEFERRED:
                tl.store(p_s, S.to(p_s.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)
        else:
            if DEFERRED:
                rec = rec_base + ((t - 1) * HV + i_hv) * RW
                if i_v == 0:
                    tl.store(rec + o_k, k, mask=m_k, cache_modifier=RECORD_STORE_CACHE)
                    if GATE == 2:
                        tl.store(rec + K, g, cache_modifier=RECORD_STORE_CACHE)
                    else:
                        tl.store(rec + K + o_k, g, mask=m_k, cache_modifier=RECORD_STORE_CACHE)
                    tl.store(rec + K + GK, b, cache_modifier=RECORD_STORE_CACHE)
                if XRED:
                    tl.store(rec + K + GK + 1 + o_v, v, mask=m_vs, cache_modifier=RECORD_STORE_CACHE)
                else:
                    tl.store(rec + K + GK + 1 + o_v, v, mask=m_v, cache_modifier=RECORD_STORE_CACHE)
        if t + 1 < T:
            q, k, v, f, b = qn, kn, vn, fn, bn
    if COMMIT:
        tl.store(p_s, S.to(p_s.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)


@triton.jit
def _half_cols(X, D: tl.constexpr, odd: tl.constexpr):
    """The even (or ``odd``) columns of a ``[D, N]`` tile whose columns are in every thread: ``[D, N / 2]`` by one
    split (register renaming). Issue 4."""
    a, b = tl.split(tl.reshape(X, [D, X.shape[1] // 2, 2]))
    if odd:
        return b
    else:
        return a


@triton.jit
def _take_col(X, j: tl.constexpr):
    """Column ``j`` of a ``[D, N]`` tile whose ``N`` (a power of two, at most 32) columns are in every thread:
    ``[D, 1]``, by halving splits (:func:`_half_cols`, bit 0 of ``j`` first). Issue 4."""
    D: tl.constexpr = X.shape[0]
    N: tl.constexpr = X.shape[1]
    if N >= 2:
        X = _half_cols(X, D, (j & 1) != 0)
    if N >= 4:
        X = _half_cols(X, D, (j & 2) != 0)
    if N >= 8:
        X = _half_cols(X, D, (j & 4) != 0)
    if N >= 16:
        X = _half_cols(X, D, (j & 8) != 0)
    if N >= 32:
        X = _half_cols(X, D, (j & 16) != 0)
    return tl.reshape(X, [D, 1])


@triton.jit
def _scatter_col(lane, NS: tl.constexpr):
    """The column of a ``[32, NS]`` tile whose sum :func:`_sums_scatter` leaves in each lane (``[32, 1]`` int32):
    bit ``i`` of the column is the lane's bit ``16 >> i``. Issue 4."""
    return _lane_bits_col(lane, NS, 4)


@triton.jit
def _sums_scatter(Z, lane, XRED: tl.constexpr):
    """Sums over the warp's lanes of every column of ``Z`` ``[32, NS]`` (``NS`` a power of two, 2 to 32), as one
    reduce-scatter: lane masks 16, 8, 4, 2, 1 halve the columns while there are two or more (``NS - 1``
    exchanges instead of ``5 NS``), plain all-reduce steps after that. Returns ``[32, 1]``: the sum of column
    :func:`_scatter_col` in each lane. Issue 4."""
    Z = _xred_level(Z, lane, Z.shape[1], 16, XRED)
    return _xred_levels_8421(Z, lane, XRED)


@triton.jit
def _key_bcast(e, BK: tl.constexpr):
    """``[BK]`` in the state's key layout (``BK / 32`` keys per lane) holding lane ``l``'s value of ``e``
    (``[32, 1]``) on that lane's keys (register copies). Issue 4."""
    return tl.reshape(tl.broadcast_to(e, [32, BK // 32]), [BK])


@triton.jit
def _verify_window_prep(q_ptr, k_ptr, f_ptr, b_ptr, i_b, i_h, i_hv, A, dtb, lane, T: tl.constexpr, H: tl.constexpr,
                        HV: tl.constexpr, K: tl.constexpr, o_k, m_k, BK: tl.constexpr, L2NORM: tl.constexpr,
                        XRED: tl.constexpr, GATE: tl.constexpr = 2, lower_bound=0.0, FAST: tl.constexpr = False):
    """The per-head scalars of every token of a GDN window at once (``TOKPREP``), before the state's chain: the
    norms' and ``q.k``'s key sums of all ``T`` tokens as one reduce-scatter (:func:`_sums_scatter`, ``3 T`` sums,
    ``NS - 1`` shuffles) with one ``rsqrt`` per lane; the per-head gate and beta of token ``t`` computed in lane
    ``t`` (one exponential chain for the window, not one per token); both broadcast back by ``shfl.idx``.
    Returns ``(R, G, QT, KT)``: ``R [32, NS]`` with columns ``t`` / ``T + t`` / ``2 T + t`` = ``|q_t|^-1`` / ``|k_t|^-1``
    / raw ``q_t.k_t`` (``1`` / ``1`` / ``q_t.k_t`` without ``L2NORM``), ``G [32, 2 TG]`` with columns ``t`` /
    ``TG + t`` = the decay ``e^{g_t}`` / ``beta_t``, the same in every lane (take with :func:`_take_col`), and
    ``QT``, ``KT`` ``[BK, TG]``: the raw FP32 q and k, token ``t`` in column ``t``, in the state's key layout
    (every column in every thread, so taking one is register renaming). ``2 <= T <= 10``.

    With a per-channel gate (KDA, ``GATE`` 0 or 1) ``G`` is ``[32, TG]``, beta only (column ``t``), and a fifth
    tile ``DT`` ``[BK, TG]`` holds every token's per-key decays ``e^{g_t}`` in the state's key layout (the same
    formulas as :func:`_verify_per_token`, ``FAST`` included); with GDN's per-head gate ``DT`` is ``KT`` (unused).
    Issue 4 (twenty-second round, docs/kernels.md at tag lab-history-2026-12-07; KDA: twenty-third round)."""
    tl.static_assert(T >= 2 and T <= 10, "TOKPREP: windows of 2 to 10 tokens")
    R_: tl.constexpr = BK // 32
    NS: tl.constexpr = 8 if 3 * T <= 8 else (16 if 3 * T <= 16 else 32)
    TG: tl.constexpr = 2 if T <= 2 else (4 if T <= 4 else (8 if T <= 8 else 16))
    col = tl.arange(0, NS)[None, :]
    tcol = tl.arange(0, TG)[None, :]
    Z = tl.zeros([32, NS], dtype=tl.float32)
    QT = tl.zeros([BK, TG], dtype=tl.float32)
    KT = tl.zeros([BK, TG], dtype=tl.float32)
    for t in tl.static_range(T):
        n = i_b * T + t
        qr = tl.load(q_ptr + (n * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        kr = tl.load(k_ptr + (n * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        QT = tl.where(tcol == t, qr[:, None], QT)
        KT = tl.where(tcol == t, kr[:, None], KT)
        qa = tl.reshape(qr, [32, R_])
        ka = tl.reshape(kr, [32, R_])
        if L2NORM:
            Z = tl.where(col == t, tl.sum(qa * qa, axis=1, keep_dims=True), Z)
            Z = tl.where(col == T + t, tl.sum(ka * ka, axis=1, keep_dims=True), Z)
        Z = tl.where(col == 2 * T + t, tl.sum(qa * ka, axis=1, keep_dims=True), Z)
    Y = _sums_scatter(Z, lane, XRED)
    if L2NORM:
        norm = _scatter_col(lane, NS) < 2 * T
        Y = tl.where(norm, tl.rsqrt(tl.where(norm, Y, 1.0) + 1e-6), Y)
    else:
        Y = tl.where(_scatter_col(lane, NS) < 2 * T, 1.0, Y)
    j = tl.arange(0, NS)[None, :]
    src = ((j & 1) << 4) | (((j >> 1) & 1) << 3) | (((j >> 2) & 1) << 2) | (((j >> 3) & 1) << 1) | ((j >> 4) & 1)
    R = _lane_pick(tl.broadcast_to(Y, [32, NS]), src, XRED)
    # beta (and GDN's per-head decay): token t's in lane t
    mt = lane < T
    bl = tl.load(b_ptr + (i_b * T + lane) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    betal = _beta(bl, FAST)
    if GATE == 2:
        fl = tl.load(f_ptr + (i_b * T + lane) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
        dl = tl.exp(_log_decay(fl + dtb, A, 0.0, GATE, False))
        jg = tl.arange(0, 2 * TG)[None, :]
        G = _lane_pick(tl.where(jg < TG, dl, betal), jg % TG, XRED)
        DT = KT
    else:
        # KDA: every token's per-key decays as one [BK, TG] tile (no dependence on the state)
        FT = tl.zeros([BK, TG], dtype=tl.float32)
        for t in tl.static_range(T):
            fr = tl.load(f_ptr + ((i_b * T + t) * HV + i_hv) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
            FT = tl.where(tcol == t, fr[:, None], FT)
        DT = _fexp(_log_decay(FT + dtb[:, None], A, lower_bound, GATE, FAST), FAST)
        G = _lane_pick(tl.broadcast_to(betal, [32, TG]), tl.arange(0, TG)[None, :], XRED)
    return R, G, QT, KT, DT


@triton.jit
def _verify_plain_prepped(S, p_s, v, q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, o_ptr, i_b, i_h, i_hv, A, dtb, scale, COMMIT,
                          T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, o_k, o_v,
                          m_k, m_v, m_kv, L2NORM: tl.constexpr, XRED: tl.constexpr, lane, m_vs, BK: tl.constexpr,
                          BV: tl.constexpr, GATE: tl.constexpr = 2, lower_bound=0.0, FAST: tl.constexpr = False):
    """A plain GDN window (``PLAIN``, ``XRED``, ``TOKPREP``) with every token's norms, ``q.k``, decay and beta from
    :func:`_verify_window_prep`, so each token's step is the state's work only: the decay, the raw ``k.S'`` and
    ``q.S'`` as one reduce-scatter (:func:`_xred_pair`) scaled by ``|k|^-1`` / ``|q|^-1 scale`` in each lane's
    column, the update with ``beta |k|^-1 k``, and ``o_t = q.S' + beta (q.k) err``. The same formulas as
    :func:`_verify_per_token`, with the norms applied after the key sums and summed in another order, so the
    outputs and the final state equal the per-token path's to FP32 rounding (a plain window is never replayed).
    ``v``: token 0's value column; q and k come from the prep's register tiles, the next token's ``v`` is loaded
    one token ahead. A per-channel gate (KDA, ``GATE`` 0 / 1) decays by the prep's ``DT`` column of the token. The
    products' q and k trade places on the lanes with bit 16 set from 4 columns (:func:`_xred_pair_swapped`: the
    reduce-scatter's first level without selects; the same bits, sm_90 T=5 8-column binary 1,664 -> 1,616 instructions,
    16 columns 168 -> 146 registers; at 2 columns the swapped tiles would go through shared memory).
    Issue 4 (twenty-second round; KDA: twenty-third round)."""
    TG: tl.constexpr = 2 if T <= 2 else (4 if T <= 4 else (8 if T <= 8 else 16))
    R, G, QT, KT, DT = _verify_window_prep(q_ptr, k_ptr, f_ptr, b_ptr, i_b, i_h, i_hv, A, dtb, lane, T, H, HV, K, o_k,
                                           m_k, BK, L2NORM, XRED, GATE, lower_bound, FAST)
    swap = tl.reshape(tl.broadcast_to((lane & 16) != 0, [32, BK // 32]), [BK])  # the products' roles per lane
    for t in tl.static_range(T):
        n = i_b * T + t
        if t + 1 < T:
            vn = tl.load(v_ptr + ((n + 1) * HV + i_hv) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        q = tl.reshape(_take_col(QT, t), [BK])
        k = tl.reshape(_take_col(KT, t), [BK])
        rq = _take_col(R, t) * scale
        rk = _take_col(R, T + t)
        if GATE == 2:
            beta = _take_col(G, TG + t)
            Sd = S * _key_bcast(_take_col(G, t), BK)[:, None]
        else:
            beta = _take_col(G, t)
            Sd = S * tl.reshape(_take_col(DT, t), [BK])[:, None]
        bqk = beta * (_take_col(R, 2 * T + t) * rq * rk)
        if BV >= 4:
            ks, qs = _xred_pair_swapped(Sd * tl.where(swap, q, k)[:, None], Sd * tl.where(swap, k, q)[:, None], lane,
                                        XRED)
        else:  # 2 columns: the swapped products' tiles would convert layouts through shared memory
            ks, qs = _xred_pair(Sd * k[:, None], Sd * q[:, None], lane, BK, BV, XRED)
        err = v - ks * rk  # valid (at least) in the lanes with bit 16 clear, the only ones read (bcast) or stored
        S = Sd + _lane_scale(k, beta * rk, BK)[:, None] * _xred_bcast(err, lane, BK, BV, XRED)
        o = qs * rq + bqk * err
        tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty), mask=m_vs)
        if t + 1 < T:
            v = vn
    if COMMIT:
        tl.store(p_s, S.to(p_s.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)


@triton.jit(do_not_specialize=["r_slot", "flags"])
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
    flags,  # FLAG_* bits
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    TP: tl.constexpr = 1 if T == 1 else (2 if T == 2 else (4 if T <= 4 else (8 if T <= 8 else 16)))
    TPR: tl.constexpr = 1 if T <= 2 else (2 if T == 3 else (4 if T <= 5 else (8 if T <= 9 else 16)))  # >= T - 1
    # Runtime mode bits (not constexpr, so verify, snapshots, deferred and fused replay run one
    # binary: same register layouts, same reduction order, hence bit-exact against each other).
    COMMIT = (flags & 1) != 0  # FLAG_COMMIT
    SAVE_INTER = (flags & 2) != 0  # FLAG_SAVE_INTER
    DEFERRED = (flags & 4) != 0  # FLAG_DEFERRED
    REPLAY_PREV = (flags & 8) != 0  # FLAG_REPLAY_PREV
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, TP)
    m_k = o_k < K
    m_v = o_v < V
    m_t = o_t < T
    m_kv = m_k[:, None] & m_v[None, :]
    m_kt = m_k[:, None] & m_t[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    n_t = i_b * T + o_t  # [TP] token rows of this request

    # 1. The slot (the state load waits on it), then every token's inputs as [BK, TP] /
    #    [TP, BV] tiles (token 0's alone without PRELOAD): none depends on the slot, so all are in flight together.
    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    if not PRELOAD:  # see _verify_per_token
        q0, k0, v0, f0, b0 = _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, i_b * T, i_h, i_hv, H, HV, K, V, o_k, o_v, m_k,
                                           m_v, GATE)
    n_prev = tl.load(accept_prev_ptr + i_b, mask=REPLAY_PREV, other=1).to(tl.int32)  # 1: nothing to replay
    if PRELOAD:
        Q = tl.load(q_ptr + (n_t[None, :] * H + i_h) * K + o_k[:, None], mask=m_kt, other=0.0).to(tl.float32)
        Kt = tl.load(k_ptr + (n_t[None, :] * H + i_h) * K + o_k[:, None], mask=m_kt, other=0.0).to(tl.float32)
        # values as [TP, BV] (tokens on dim 0): a token's row then has the state's column layout
        Vt = tl.load(v_ptr + (n_t[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
        beta = tl.load(b_ptr + n_t * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        if GATE == 2:
            Fg = tl.load(f_ptr + n_t * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
        else:
            Fg = tl.load(f_ptr + (n_t[None, :] * HV + i_hv) * K + o_k[:, None], mask=m_kt, other=0.0).to(tl.float32)
        islots = tl.load(inter_idx_ptr + n_t, mask=m_t & SAVE_INTER, other=-1).to(tl.int64)
    A, dtb = _gate_params(A_log_ptr, dt_bias_ptr, i_hv, o_k, m_k, K, GATE)

    if slot < 0:
        tl.store(o_ptr + (n_t[:, None] * HV + i_hv) * V + o_v[None, :], tl.zeros([TP, BV], dtype=tl.float32).to(o_ptr.dtype.element_ty),
                 mask=m_tv)
        return

    p_s = state_ptr + slot * s_slot + i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    S = tl.load(p_s, mask=m_kv, other=0.0, eviction_policy=STATE_LOAD_EVICTION).to(tl.float32)
    # Deferred commit of the previous window, fused: rebuild its accepted state in
    # registers (the slot holds its token-0 state) before going on (n_prev = 1: no-op).
    GKp: tl.constexpr = 1 if GATE == 2 else K
    S = _replay_accepted(S, replay_prev_ptr + slot * r_slot, n_prev, o_k, o_v, m_k, m_v, T, TPR, HV, i_hv, K, V, GKp)

    if PRELOAD:
        # 2. Per-token math that does not depend on the state, for all tokens at once.
        if L2NORM:
            Q = Q * tl.rsqrt(tl.sum(Q * Q, axis=0) + 1e-6)[None, :]
            Kt = Kt * tl.rsqrt(tl.sum(Kt * Kt, axis=0) + 1e-6)[None, :]
        Q = Q * scale
        beta = 1.0 / (1.0 + tl.exp(-beta))
        if GATE == 2:
            G = -A * _softplus(Fg + dtb)
        elif GATE == 0:
            G = -A * _softplus(Fg + dtb[:, None])
        else:
            G = lower_bound / (1.0 + tl.exp(-A * (Fg + dtb[:, None])))
        D = tl.exp(G)
        qk = tl.sum(Q * Kt, axis=0)  # [TP] q_t . k_t, for o_t = q_t.S' + beta_t (q_t.k_t) err_t
        if DEFERRED:
            # Tokens 1..T-1 keep only their inputs (k, gate, beta, v tile); written up front.
            GK: tl.constexpr = 1 if GATE == 2 else K
            RW: tl.constexpr = K + GK + 1 + V
            m_r = (o_t >= 1) & m_t
            rec = replay_ptr + slot * r_slot + ((o_t - 1) * HV + i_hv) * RW  # [TP]
            if i_v == 0:
                tl.store(rec[None, :] + o_k[:, None], Kt, mask=m_k[:, None] & m_r[None, :], cache_modifier=RECORD_STORE_CACHE)
                if GATE == 2:
                    tl.store(rec + K, G, mask=m_r, cache_modifier=RECORD_STORE_CACHE)
                else:
                    tl.store(rec[None, :] + K + o_k[:, None], G, mask=m_k[:, None] & m_r[None, :],
                             cache_modifier=RECORD_STORE_CACHE)
                tl.store(rec + K + GK, beta, mask=m_r, cache_modifier=RECORD_STORE_CACHE)
            tl.store(rec[:, None] + (K + GK + 1) + o_v[None, :], Vt, mask=m_r[:, None] & m_v[None, :],
                     cache_modifier=RECORD_STORE_CACHE)

        # 3. The dependent chain: one decay, two K-reductions on the decayed state, one update.
        O = tl.zeros([TP, BV], dtype=tl.float32)
        for t in tl.static_range(T):
            k = _col(Kt, o_t, t)
            q = _col(Q, o_t, t)
            b_t = _elem(beta, o_t, t)
            if GATE == 2:
                d = _elem(D, o_t, t)
            else:
                d = _col(D, o_t, t)
            S, Sd, err = _delta_update(S, k, _row(Vt, o_t, t), d, b_t)
            # o_t = q.S_t = q.S' + beta (q.k) err: both K-reductions read S', none waits for the update
            o = tl.sum(Sd * q[:, None], axis=0) + (b_t * _elem(qk, o_t, t)) * err
            O = tl.where(o_t[:, None] == t, o[None, :], O)  # kept in the state's column layout; one store below
            islot = tl.sum(tl.where(o_t == t, islots, 0), axis=0)
            if islot >= 0:
                p_i = inter_ptr + islot * is_slot + i_hv * is_h + o_k[:, None] * is_k + o_v[None, :] * is_v
                tl.store(p_i, S.to(inter_ptr.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)
            if t == 0:
                if DEFERRED:
                    # Token 0 is always accepted: commit its state now.
                    tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)
        if COMMIT:
            tl.store(p_s, S.to(state_ptr.dtype.element_ty), mask=m_kv, cache_modifier=STATE_STORE_CACHE)
        tl.store(o_ptr + (n_t[:, None] * HV + i_hv) * V + o_v[None, :], O.to(o_ptr.dtype.element_ty), mask=m_tv)
    else:
        _verify_per_token(S, p_s, q0, k0, v0, f0, b0, q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, o_ptr, inter_ptr, inter_idx_ptr,
                          replay_ptr + slot * r_slot, i_b, i_h, i_hv, i_v, A, dtb, scale, lower_bound, is_slot,
                          i_hv * is_h + o_k[:, None] * is_k + o_v[None, :] * is_v, SAVE_INTER, DEFERRED, COMMIT,
                          T, H, HV, K, V, o_k, o_v, m_k, m_v, m_kv, GATE, L2NORM)


@triton.jit
def _replay_records(S, rec_base, n_acc, i_hv, o_k, o_v, m_k, m_v, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    GK: tl.constexpr, FAST: tl.constexpr = False, SEQ: tl.constexpr = False):
    """Apply tokens 1 .. n_acc - 1 of a deferred window from their records, one record per
    iteration of a runtime loop (no record tiles held in registers)."""
    RW: tl.constexpr = K + GK + 1 + V
    for r in range(n_acc - 1):
        rec = rec_base + (r * HV + i_hv) * RW
        k = tl.load(rec + o_k, mask=m_k, other=0.0)
        if GK == 1:
            d = _fexp(tl.load(rec + K), FAST)
        else:
            d = _fexp(tl.load(rec + K + o_k, mask=m_k, other=0.0), FAST)
        S, _, _ = _delta_update(S, k, tl.load(rec + K + GK + 1 + o_v, mask=m_v, other=0.0), d, tl.load(rec + K + GK), SEQ)
    return S


@triton.jit(do_not_specialize=["r_slot", "flags"])
def gated_delta_verify_wide_kernel(
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
    inter_ptr,  # intermediate-state pool (FLAG_SAVE_INTER), 4-D, the state pool's per-slot strides
    inter_idx_ptr,  # [N] int slot per token (< 0: do not save)
    replay_ptr,  # FLAG_DEFERRED: [slots, T - 1, HV, RW] records of tokens 1..T-1
    replay_prev_ptr,  # FLAG_REPLAY_PREV: the previous window's records (the other buffer of a ping-pong pair)
    accept_prev_ptr,  # FLAG_REPLAY_PREV: [B] tokens accepted of the previous window (1..T)
    scale,
    lower_bound,
    s_slot,
    s_h,
    s_k: tl.constexpr,  # the tile's two strides are compile-time constants: per-element addresses
    s_v: tl.constexpr,  # then fold into immediate offsets (sm_90: 255 -> 128-168 registers)
    is_slot,
    is_h,
    is_k,
    is_v,
    r_slot,
    flags,  # FLAG_* bits
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    L2NORM: tl.constexpr,
    PLAIN: tl.constexpr,
    FAST: tl.constexpr = False,  # bounded KDA gate, CUDA: gate / beta MUFU ops without fix-ups (recurrent.rules.use_fast_gate)
    XRED: tl.constexpr = 0,  # key sums as one reduce-scatter (_xred_pair; 1: CUDA shuffles, 2: gathers; recurrent.rules.use_xred)
    SEQ: tl.constexpr = False,  # key sums via _key_sum's in-order view (recurrent.rules.use_seq_key_sums; on wherever XRED is)
    TOKPREP: tl.constexpr = False,  # plain windows with XRED: every token's norms, gates, betas first (recurrent.rules.use_tokprep)
):
    """Decode and verify windows in every mode -- plain, snapshots, deferred commit, fused replay --
    in the lean per-token form: no per-token input tiles in registers, the previous window's
    records replayed one per iteration of a runtime loop, each token's inputs loaded one token
    ahead of its chain (:func:`_verify_per_token`; loading them in the token's own iteration, HEAD
    7a64a90's loop, was slower in every row of the H200 sweeps). The mode is the runtime ``flags``
    argument, as in :func:`gated_delta_recurrent_kernel`, so every mode of a window (and
    :func:`recurrent.replay_commit`) runs one binary and a deferred replay equals the snapshot
    path bit for bit. One warp per program (H200, 2026-11-30: 1.3-1.5x faster than HEAD's loop
    at 4 warps / 64 columns and than the register-tile form of :func:`gated_delta_recurrent_kernel`,
    whose tiles cost 160-255 registers). Same arguments and padding rule as that kernel.

    ``PLAIN`` (constexpr) compiles the snapshot, deferred and replay paths out, for plain verify
    windows (``flags`` then only says whether to commit): straight-line code whose next-token
    loads the compiler hoists, 1.3-1.6x faster on the H200 than the all-modes binary. A plain
    window's outputs then equal the all-modes binary's to FP32 rounding, not bit for bit; nothing
    replays a plain window.

    ``XRED`` (V-major pool, ``s_k == 1``, one warp): each token's two key-axis sums as one
    reduce-scatter across the warp (:func:`_xred_pair`), bit-identical to :func:`_key_sum` with ``SEQ``.
    ``SEQ`` (also on wherever ``XRED`` is): every key sum of verify and replay through :func:`_key_sum`'s
    in-order view, so the thread's part stays a chain of FMAs under Triton 3.7+ (issue 4, nineteenth round)."""
    COMMIT = (flags & 1) != 0  # FLAG_COMMIT
    SAVE_INTER = (flags & 2) != 0  # FLAG_SAVE_INTER
    DEFERRED = (flags & 4) != 0  # FLAG_DEFERRED
    REPLAY_PREV = (flags & 8) != 0  # FLAG_REPLAY_PREV
    GK: tl.constexpr = 1 if GATE == 2 else K
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
    if XRED:
        # V-major pool, one warp, a 128-key tile, an aligned pool (recurrent.rules.xred_shape_ok): the state tile's layout
        # then puts the 32 lanes on the keys, BK / 32 consecutive keys per thread, which _xred_pair's lane arithmetic
        # assumes (the compile gate checks the compiled layouts)
        tl.static_assert(s_k == 1, "XRED: key stride 1 (V-major pool)")
        tl.static_assert(XRED != 1 or BK == 128, "XRED=1: a 128-key tile (recurrent.xred_shape_ok)")
        lane = tl.arange(0, 32)[:, None]
        o_vt = i_v * BV + _xred_col(lane, BV)  # [32, 1]: each lane's column
        m_vt = o_vt < V
        m_vs = m_vt & ((lane & (16 | (16 // BV - 1))) == 0)  # one lane per column
    else:
        lane = None
        o_vt = o_v
        m_vt = m_v
        m_vs = m_v
    # key sums through _key_sum's in-order view: the host's answer (recurrent.rules.use_seq_key_sums), and always with
    # XRED, whose reduce-scatter adds in that order (a replay must add as its verify did)
    SEQK: tl.constexpr = SEQ or XRED != 0

    # The slot index first (the state load waits on it). A verify window then issues token 0's raw inputs
    # and the head's gate parameters before the padding-row branch waits for the index, so its per-token
    # chain can start as soon as the state arrives; decode issues them after the state load, as before
    # (H200, 2026-12-01, 2026-12-01-h200-early_inputs.json: KDA verify T=4 B = 1..8 3-6 % faster, KDA
    # decode B = 1..32 1-3 % slower with the early issue; GDN unchanged either way).
    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    if T > 1:
        q0, k0, v0, f0, b0 = _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, i_b * T, i_h, i_hv, H, HV, K, V, o_k, o_vt, m_k,
                                           m_vt, GATE)
        A, dtb = _gate_params(A_log_ptr, dt_bias_ptr, i_hv, o_k, m_k, K, GATE)
    if slot < 0:
        for t in range(T):
            n = i_b * T + t
            tl.store(o_ptr + (n * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty), mask=m_v)
        return

    # one offset tile for the state slot and the snapshot slots (same per-slot layout, checked by
    # the wrapper): a second per-element pointer tile would be hoisted out of the token loop and
    # cost ~90 registers on sm_90
    off = i_hv * s_h + o_k[:, None] * s_k + o_v[None, :] * s_v
    p_s = state_ptr + slot * s_slot + off
    S = tl.load(p_s, mask=m_kv, other=0.0, eviction_policy=STATE_LOAD_EVICTION).to(tl.float32)
    if T == 1:
        q0, k0, v0, f0, b0 = _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, i_b * T, i_h, i_hv, H, HV, K, V, o_k, o_vt, m_k,
                                           m_vt, GATE)
        A, dtb = _gate_params(A_log_ptr, dt_bias_ptr, i_hv, o_k, m_k, K, GATE)
    if PLAIN:
        SAVE_INTER = False
        DEFERRED = False
    elif REPLAY_PREV:
        # deferred commit of the previous window, fused: the slot holds its token-0 state
        S = _replay_records(S, replay_prev_ptr + slot * r_slot, tl.load(accept_prev_ptr + i_b).to(tl.int32), i_hv, o_k, o_v,
                            m_k, m_v, HV, K, V, GK, FAST, SEQK)
    if TOKPREP:
        tl.static_assert(PLAIN and XRED != 0 and T > 1, "TOKPREP: plain windows with XRED")
        _verify_plain_prepped(S, p_s, v0, q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, o_ptr, i_b, i_h, i_hv, A, dtb, scale,
                              COMMIT, T, H, HV, K, V, o_k, o_vt, m_k, m_vt, m_kv, L2NORM, XRED, lane, m_vs, BK, BV, GATE,
                              lower_bound, FAST)
    else:
        _verify_per_token(S, p_s, q0, k0, v0, f0, b0, q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, o_ptr, inter_ptr, inter_idx_ptr,
                          replay_ptr + slot * r_slot, i_b, i_h, i_hv, i_v, A, dtb, scale, lower_bound, is_slot, off, SAVE_INTER,
                          DEFERRED, COMMIT, T, H, HV, K, V, o_k, o_vt, m_k, m_vt, m_kv, GATE, L2NORM, FAST, XRED, lane, m_vs, BK,
                          BV, XRED != 0 and not PLAIN, SEQK)
