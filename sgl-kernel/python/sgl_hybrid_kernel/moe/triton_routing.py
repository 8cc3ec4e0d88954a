"""Triton kernels of the fused MoE routing for small M (seeds digest item 14): two launches.

1. ``moe_gating_topk_kernel``, one program per token: scores (sigmoid or
   softmax), optional correction bias, optional group-limited choice, top-k by
   repeated maximum over one 64-bit key per expert, shared-expert slot,
   renormalisation. The key packs an order-preserving integer image of the
   biased score (ranked like ``torch.nan_to_num``: NaN lowest, then -inf as the
   lowest finite value; -0 as +0) above ``65535 - expert``, so one
   ``max`` gives the best score *and*, among equal scores, the smallest expert
   index; a taken expert's key is set to the int64 minimum. This makes ties and
   non-finite logits deterministic and the ids distinct.
2. ``moe_sorted_layout_kernel``, one program, no sort: each routing entry sets
   its token's bit in its expert's token bitmap (64 tokens per int64 word, an
   atomic OR on a workspace this program zeroes first). An expert's count is the
   popcount of its words, the padded run starts one exclusive prefix sum over
   experts, and entry (token m, expert e)'s place in e's run is the number of
   e's bits below m: runs are ordered by entry index (a stable sort by expert)
   because a token's experts are distinct. Every layout row is written:
   sentinels and ``-1`` block experts first, then (after a barrier) the real
   entries and block owners. This replaced a one-program bitonic sort of all
   ``M * k'`` keys (Kimi K3 M = 64: 2,048 keys).
"""

from __future__ import annotations

import triton
import triton.language as tl

SCORING_SIGMOID = 0
SCORING_SOFTMAX = 1


@triton.jit
def _nan_to_num(x):
    """torch.nan_to_num(x, nan=-inf): NaN -> -inf, +-inf -> +-FLT_MAX (the reference's ranking)."""
    is_num = x == x  # before clamping: min/max may drop a NaN operand
    x = tl.minimum(tl.maximum(x, -3.4028234663852886e38), 3.4028234663852886e38)
    return tl.where(is_num, x, float("-inf"))


@triton.jit
def _ordered_key(x, idx):
    """int64 key: order-preserving image of FP32 ``x`` (no NaN) in the high bits, ``65535 - idx`` low."""
    x = tl.where(x == 0.0, 0.0, x)  # -0 -> +0: equal scores must tie
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered.to(tl.int64) << 16) | (65535 - idx).to(tl.int64)


@triton.jit
def moe_gating_topk_kernel(
    logits_ptr,  # [M, E]
    bias_ptr,  # [E] FP32 (unused without HAS_BIAS)
    weights_ptr,  # [M, KOUT] FP32
    ids_ptr,  # [M, KOUT] int32
    stride_lm,
    stride_wm,
    stride_im,
    routed_scaling_factor,
    shared_weight,
    TOPK: tl.constexpr,
    KPAD: tl.constexpr,
    G: tl.constexpr,
    EG: tl.constexpr,
    GPAD: tl.constexpr,
    EGPAD: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    SCORING: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORM: tl.constexpr,
    SHARED: tl.constexpr,
):
    m = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GPAD)[:, None]
    j = tl.arange(0, EGPAD)[None, :]
    e = g * EG + j
    valid = (g < G) & (j < EG)
    row = logits_ptr + m * stride_lm
    x = tl.load(row + e, mask=valid, other=float("-inf")).to(tl.float32)
    if SCORING == 1:
        x_max = tl.max(tl.max(x, axis=1), axis=0)
        ex = tl.where(valid, tl.exp(x - x_max), 0.0)
        denom = tl.sum(tl.sum(ex, axis=1), axis=0)
        scores = ex / denom
    else:
        scores = tl.sigmoid(x)
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    NEG: tl.constexpr = -9223372036854775807 - 1
    if G > 1:
        c_nn = tl.where(valid, _nan_to_num(choice), float("-inf"))
        m1 = tl.max(c_nn, axis=1)
        if HAS_BIAS and EG >= 2:  # DeepSeek-V3: a group's score is its two best biased scores
            first = tl.min(tl.where(c_nn == m1[:, None], j, EGPAD), axis=1)
            m2 = tl.max(tl.where(j == first[:, None], float("-inf"), c_nn), axis=1)
            gscore = m1 + m2
        else:
            gscore = m1
        gi = tl.arange(0, GPAD)
        gkey = tl.where(gi < G, _ordered_key(_nan_to_num(gscore), gi), NEG)
        keep = gi < 0
        for _ in tl.static_range(TOPK_GROUP):
            best = 65535 - (tl.max(gkey, axis=0) & 0xFFFF)
            keep = keep | (gi == best)
            gkey = tl.where(gi == best, NEG, gkey)
        choice = tl.where(keep[:, None], choice, float("-inf"))
    keys = tl.where(valid, _ordered_key(_nan_to_num(choice), e), NEG)
    slots = tl.arange(0, KPAD)
    ids = tl.zeros([KPAD], tl.int32)
    for k in tl.static_range(TOPK):
        best = (65535 - (tl.max(tl.max(keys, axis=1), axis=0) & 0xFFFF)).to(tl.int32)
        keys = tl.where(e == best, NEG, keys)
        ids = tl.where(slots == k, best, ids)
    # the chosen experts' scores, recomputed from their logits in one gather (not one load per step)
    routed = slots < TOPK
    xb = tl.load(row + ids, mask=routed, other=0.0).to(tl.float32)
    if SCORING == 1:
        w = tl.where(routed, tl.exp(xb - x_max) / denom, 0.0)
    else:
        w = tl.where(routed, tl.sigmoid(xb), 0.0)
    if RENORM:
        w = w / (tl.sum(w, axis=0) + 1e-20)
    w = w * routed_scaling_factor
    if SHARED:
        ids = tl.where(slots == TOPK, G * EG, ids)
        w = tl.where(slots == TOPK, shared_weight, w)
    kmask = slots < TOPK + SHARED
    tl.store(ids_ptr + m * stride_im + slots, ids, mask=kmask)
    tl.store(weights_ptr + m * stride_wm + slots, w, mask=kmask)


@triton.jit
def _popcount64(x):
    """Set bits of each int64 (SWAR; arithmetic shifts are masked, the product wraps modulo 2**64)."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    return ((x * 0x0101010101010101) >> 56).to(tl.int32)


@triton.jit
def moe_sorted_layout_kernel(
    ids_ptr,  # [N] int32 flat routing entries, N = M * KOUT (entry i: token i // KOUT)
    sorted_ids_ptr,  # [CAP] int32
    block_expert_ptr,  # [CAP // BLOCK_SIZE] int32
    num_rows_ptr,  # [1] int32
    bits_ptr,  # [NW * NE_PAD] int64 workspace (any content)
    scratch_ptr,  # [(NW + 1) * NE_PAD] int32 workspace (any content)
    N,
    CAP,
    NUM_EXPERTS,
    NW,
    MAX_BLOCKS_PER_EXPERT,
    KOUT: tl.constexpr,
    NE_PAD: tl.constexpr,
    EB: tl.constexpr,
    FILL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    eidx = tl.arange(0, NE_PAD)
    ii = tl.arange(0, EB)
    # token bitmaps per expert: bit b of word w = token 64 w + b chose the expert
    for w in range(0, NW):
        tl.store(bits_ptr + w * NE_PAD + eidx, tl.zeros([NE_PAD], tl.int64))
    tl.debug_barrier()
    for i0 in range(0, N, EB):
        i = i0 + ii
        ok = i < N
        ex = tl.load(ids_ptr + i, mask=ok, other=0)
        m = i // KOUT
        bit = tl.full([EB], 1, tl.int64) << (m % 64).to(tl.int64)
        tl.atomic_or(bits_ptr + (m // 64) * NE_PAD + ex, bit, mask=ok, sem="relaxed")
    tl.debug_barrier()
    counts = tl.zeros([NE_PAD], tl.int32)
    for w in range(0, NW):
        word = tl.load(bits_ptr + w * NE_PAD + eidx, volatile=True)
        tl.store(scratch_ptr + w * NE_PAD + eidx, counts)  # entries of the expert in earlier words
        counts += _popcount64(word)
    counts = tl.where(eidx < NUM_EXPERTS, counts, 0)
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    start_pad = tl.cumsum(padded, axis=0) - padded
    tl.store(scratch_ptr + NW * NE_PAD + eidx, start_pad)
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    # every row and block first gets its padding value ...
    f = tl.arange(0, FILL)
    for r0 in range(0, CAP, FILL):
        tl.store(sorted_ids_ptr + r0 + f, tl.zeros([FILL], tl.int32) + N, mask=r0 + f < CAP)
        tl.store(block_expert_ptr + r0 + f, tl.zeros([FILL], tl.int32) - 1, mask=(r0 + f) * BLOCK_SIZE < CAP)
    tl.debug_barrier()  # also publishes the workspace to every thread
    # ... then the block owners and real entries overwrite it
    for blk in range(0, MAX_BLOCKS_PER_EXPERT):
        owns = (blk * BLOCK_SIZE < padded) & (eidx < NUM_EXPERTS)
        tl.store(block_expert_ptr + start_pad // BLOCK_SIZE + blk, eidx, mask=owns)
    # entry i (token m, word m // 64, bit m % 64) -> run start + the expert's entries from earlier tokens
    for i0 in range(0, N, EB):
        i = i0 + ii
        ok = i < N
        ex = tl.load(ids_ptr + i, mask=ok, other=0)
        m = i // KOUT
        wi = m // 64
        below = (tl.full([EB], 1, tl.int64) << (m % 64).to(tl.int64)) - 1
        word = tl.load(bits_ptr + wi * NE_PAD + ex, mask=ok, other=0, volatile=True)
        before = tl.load(scratch_ptr + wi * NE_PAD + ex, mask=ok, other=0)
        start = tl.load(scratch_ptr + NW * NE_PAD + ex, mask=ok, other=0)
        tl.store(sorted_ids_ptr + start + before + _popcount64(word & below), i, mask=ok)
