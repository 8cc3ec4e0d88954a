"""The plain-torch oracle of the gated delta rule (KDA and GDN), in one file (issue 43): the recurrence, KDA's
and GDN's gates and forms, the group-scan mode's reference, and the raw-input twins of the Triton wrappers
(:func:`decode_torch`, :func:`prefill_torch`; the CPU path and the boot gates' second implementation).

The shared recurrence (KDA and GDN):

    Plain-torch gated delta rule, the oracle shared by KDA and GDN.

    For one value head with key dim K and value dim V, state ``S`` ``[K, V]``::

        S   <- decay_t * S            # decay_t = exp(g_t): per channel [K] (KDA) or a scalar (GDN)
        S   <- S + beta_t k_t (v_t - S^T k_t)^T
        o_t  = scale * S^T q_t

    Grouped value attention (GVA): ``H`` query/key heads, ``HV = G * H`` value heads;
    value head ``j`` reads query/key head ``j // G`` (Gated DeltaNet, Yang et al. 2024;
    Qwen3-Next uses 16 k-heads and 32 v-heads).

KDA: per-channel gate, recurrent and chunked (WY) forms:

    Plain-torch references for Kimi Delta Attention (KDA).

    KDA is a gated delta rule with a *per-channel* decay (Kimi Linear tech report,
    2025; fla ``ops/kda``). For one head with key dim K and value dim V, state
    ``S`` is ``[K, V]`` and for every token ``t``::

        S  <- diag(exp(g_t)) S                       # per-channel decay, g_t <= 0 (log space)
        S  <- S + beta_t k_t (v_t - S^T k_t)^T        # delta-rule correction
        o_t = scale * S^T q_t                         # read out after the update

    Tensor layout is token-major, one sequence at a time (the caller loops over a
    varlen batch): ``q, k, g`` ``[T, H, K]``, ``v`` ``[T, H, V]``, ``beta`` ``[T, H]``,
    state ``[H, K, V]`` (fla's layout; SGLang's KDA pool stores ``[H, V, K]``, the
    transpose). ``q``/``k`` are expected L2-normalised already.

GDN: per-head gate, recurrent form:

    Plain-torch references for Gated DeltaNet (GDN) as used by Qwen3-Next / Qwen3.8.

    Decay per value head ``g = -exp(A_log) * softplus(a + dt_bias)`` (natural log,
    <= 0), ``beta = sigmoid(b)``; the recurrence is
    :func:`gated_delta_recurrent` with a
    scalar decay.

The chunk-64 prefill's group-scan mode:

    Plain-torch twin of the chunk-64 prefill's group-scan mode (``chunk/group_scan.py``, issue 4).

    The state pass of the delta rule is affine in the state (``S`` ``[K, V]`` per value head):
    over a group of tokens ``S -> A S + B``. With the chunked WY form
    (:func:`kda_chunk`) the summary of a group is two runs of that form:
    ``B`` = the group from a zero state, ``A`` = the group from the identity ``[K, K]`` with
    zero values (the update ``S <- (I - beta k k^T) diag(e^g) S + beta k v^T`` maps the
    columns of ``S`` independently, so ``V`` may be replaced by ``K`` columns). An ordered
    scan ``S_{g+1} = A_g S_g + B_g`` gives each group's start state; each group then runs
    the chunked form from its start state (outputs, checkpoints, end state).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.norm import reference as norm_ref


# ---------------------------------------------------------------- the shared recurrence (KDA and GDN)

def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    acc_dtype: torch.dtype = torch.float32,
    save_positions: Sequence[int] = (),
) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor]]:
    """Token-by-token gated delta rule over one sequence.

    Args:
        q, k: ``[T, H, K]`` (already L2-normalised if the model does so).
        v: ``[T, HV, V]`` with ``HV % H == 0``.
        g: log-space decay, ``[T, HV, K]`` (per channel, KDA) or ``[T, HV]`` (per head, GDN).
        beta: ``[T, HV]`` in (0, 1).
        scale: default ``K ** -0.5``.
        initial_state: ``[HV, K, V]`` or ``None`` (zeros).
        acc_dtype: ``torch.float64`` for an FP64 oracle.
        save_positions: token counts ``p`` (1..T) after which to return the state.

    Returns:
        ``(o [T, HV, V] in v.dtype, final_state [HV, K, V] acc_dtype, [state after p for p in save_positions])``.

    Raises:
        ValueError: on inconsistent shapes.
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != T or HV % H != 0:
        raise ValueError(f"q/k must be [T, H, K] and v [T, HV, V] with HV % H == 0; got {q.shape}, {k.shape}, {v.shape}")
    if g.shape not in ((T, HV, K), (T, HV)):
        raise ValueError(f"g must be [T, HV, K] or [T, HV]; got {tuple(g.shape)}")
    if beta.shape != (T, HV):
        raise ValueError(f"beta must be [T, HV]; got {tuple(beta.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (HV, K, V):
        raise ValueError(f"initial_state must be [HV, K, V] = [{HV}, {K}, {V}]; got {tuple(initial_state.shape)}")
    if scale is None:
        scale = K ** -0.5
    G = HV // H
    qf = q.to(acc_dtype).repeat_interleave(G, dim=1)
    kf = k.to(acc_dtype).repeat_interleave(G, dim=1)
    vf, bf = v.to(acc_dtype), beta.to(acc_dtype)
    decay = g.to(acc_dtype).exp()
    if decay.dim() == 2:
        decay = decay.unsqueeze(-1).expand(T, HV, K)
    S = torch.zeros(HV, K, V, dtype=acc_dtype, device=q.device)
    if initial_state is not None:
        S = S + initial_state.to(acc_dtype)
    o = torch.empty(T, HV, V, dtype=acc_dtype, device=q.device)
    want = {int(p) for p in save_positions}
    saved = {}
    for t in range(T):
        S = S * decay[t].unsqueeze(-1)
        err = vf[t] - torch.einsum("hk,hkv->hv", kf[t], S)
        S = S + torch.einsum("hk,hv->hkv", kf[t] * bf[t].unsqueeze(-1), err)
        o[t] = torch.einsum("hk,hkv->hv", qf[t] * scale, S)
        if t + 1 in want:
            saved[t + 1] = S.clone()
    return o.to(v.dtype), S, [saved[int(p)] for p in save_positions]


# ---------------------------------------------------------------- KDA: per-channel gate, recurrent and chunked (WY) forms

def kda_gate(
    f: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: Optional[torch.Tensor] = None,
    lower_bound: Optional[float] = None,
) -> torch.Tensor:
    """Per-channel log-space decay of KDA.

    Args:
        f: ``[..., H, K]`` raw forget-gate projection (any float dtype).
        A_log: ``H`` elements (any shape), per-head log decay scale.
        dt_bias: ``H * K`` elements or ``None``.
        lower_bound: ``None`` for the standard gate
            ``-exp(A_log) * softplus(f + dt_bias)``; a negative float for the
            "safe" gate ``lower_bound * sigmoid(exp(A_log) * (f + dt_bias))``
            (Kimi K3 checkpoints use -5.0).

    Returns:
        ``g`` ``[..., H, K]`` FP32, natural-log decay per channel (<= 0).
    """
    H, K = f.shape[-2:]
    x = f.float()
    if dt_bias is not None:
        x = x + dt_bias.float().reshape(H, K)
    a = A_log.float().reshape(H, 1).exp()
    if lower_bound is None:
        return -a * F.softplus(x)
    return lower_bound * torch.sigmoid(a * x)


def _check(q, k, v, g, beta, initial_state):
    if q.dim() != 3 or k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"q, k, g must all be [T, H, K]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(g.shape)}")
    T, H, K = q.shape
    if v.dim() != 3 or v.shape[:2] != (T, H):
        raise ValueError(f"v must be [T, H, V] with T={T}, H={H}; got {tuple(v.shape)}")
    if beta.shape != (T, H):
        raise ValueError(f"beta must be [T, H] = [{T}, {H}]; got {tuple(beta.shape)}")
    V = v.shape[-1]
    if initial_state is not None and tuple(initial_state.shape) != (H, K, V):
        raise ValueError(f"initial_state must be [H, K, V] = [{H}, {K}, {V}]; got {tuple(initial_state.shape)}")


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    acc_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token KDA recurrence (decode, and the oracle for everything else).

    Args:
        q, k: ``[T, H, K]`` (L2-normalised), ``v``: ``[T, H, V]``,
        g: ``[T, H, K]`` log-space decay (:func:`kda_gate`), beta: ``[T, H]`` in (0, 1).
        scale: output scale, default ``K ** -0.5``.
        initial_state: ``[H, K, V]`` or ``None`` (zeros).
        acc_dtype: accumulation dtype (``torch.float64`` for an FP64 oracle).

    Returns:
        ``(o, final_state)``: ``o`` ``[T, H, V]`` in ``v.dtype``; ``final_state``
        ``[H, K, V]`` in ``acc_dtype``.

    Raises:
        ValueError: shape mismatch.
    """
    _check(q, k, v, g, beta, initial_state)
    o, S, _ = gated_delta_recurrent(q, k, v, g, beta, scale, initial_state, acc_dtype)
    return o, S


def _kda_one_chunk(qf, kf, vf, gf, bf, S0, scale):
    """One chunk of the exact chunked form (all inputs already in the acc dtype).

    With G the in-chunk cumulative log decay, the delta-rule pseudo-values U
    solve the unit-lower-triangular system ``(I + A) U = diag(beta) (V - (K*e^G) S0)``
    where ``A[t, s] = beta_t sum_k k_t k_s e^{G_t - G_s}`` for ``s < t``
    (the WY form of DeltaNet, Yang et al. 2024). Decay ratios are formed as
    ``exp(G_t - G_s)`` with ``s <= t`` only, so nothing overflows.
    """
    C = qf.shape[0]
    G = gf.cumsum(0)  # [C, H, K]
    diff = G.unsqueeze(1) - G.unsqueeze(0)  # [t, s, H, K] = G_t - G_s
    causal = torch.ones(C, C, dtype=torch.bool, device=qf.device).tril()
    strict = causal.clone()
    strict.fill_diagonal_(False)
    decay = torch.where(causal[:, :, None, None], diff, diff.new_full((), float("-inf"))).exp()
    kg = kf * G.exp()
    rhs = bf.unsqueeze(-1) * (vf - torch.einsum("chk,hkv->chv", kg, S0))  # [C, H, V]
    A = torch.einsum("thk,shk,tshk->hts", kf, kf, decay) * bf.t().unsqueeze(-1)
    A = A * strict.unsqueeze(0)
    eye = torch.eye(C, dtype=qf.dtype, device=qf.device).unsqueeze(0)
    U = torch.linalg.solve_triangular(eye + A, rhs.transpose(0, 1), upper=False, unitriangular=True)  # [H, C, V]
    Aqk = torch.einsum("thk,shk,tshk->hts", qf, kf, decay)  # causal incl. diagonal
    o = torch.einsum("chk,hkv->chv", qf * G.exp(), S0) + torch.einsum("hts,hsv->thv", Aqk, U)
    G_last = G[-1]  # [H, K]
    k_tail = kf * (G_last.unsqueeze(0) - G).exp()  # [C, H, K]
    S = S0 * G_last.exp().unsqueeze(-1) + torch.einsum("shk,hsv->hkv", k_tail, U)
    return o * scale, S


def kda_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    chunk_size: int = 64,
    checkpoints: Iterable[int] = (),
    acc_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor, Dict[int, torch.Tensor]]:
    """Chunked KDA prefill over one sequence, equal to :func:`kda_recurrent`.

    Args:
        q, k, v, g, beta, scale, initial_state, acc_dtype: as :func:`kda_recurrent`.
        chunk_size: tokens per chunk (64 as in fla / SGLang).
        checkpoints: positions ``p`` (1 <= p <= T, in tokens of this call)
            after which the state is returned; chunks are split there so each
            checkpoint is exact.

    Returns:
        ``(o, final_state, states)`` where ``states[p]`` is the ``[H, K, V]``
        state after the first ``p`` tokens (``acc_dtype``).

    Raises:
        ValueError: shape mismatch, ``chunk_size < 1`` or a checkpoint outside ``[1, T]``.
    """
    _check(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    T, H, K = q.shape
    V = v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    cps = sorted(set(int(p) for p in checkpoints))
    if cps and (cps[0] < 1 or cps[-1] > T):
        raise ValueError(f"checkpoints must lie in [1, {T}], got {cps}")
    bounds = sorted(set(range(chunk_size, T, chunk_size)) | set(cps) | {T})
    qf, kf, vf, gf, bf = (t.to(acc_dtype) for t in (q, k, v, g, beta))
    S = q.new_zeros(H, K, V, dtype=acc_dtype)
    if initial_state is not None:
        S = S + initial_state.to(acc_dtype)
    o = torch.empty(T, H, V, dtype=acc_dtype, device=q.device)
    states: Dict[int, torch.Tensor] = {}
    start = 0
    for end in bounds:
        sl = slice(start, end)
        o[sl], S = _kda_one_chunk(qf[sl], kf[sl], vf[sl], gf[sl], bf[sl], S, scale)
        if end in cps:
            states[end] = S.clone()
        start = end
    return o.to(v.dtype), S, states


# ---------------------------------------------------------------- GDN: per-head gate, recurrent form

def gdn_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """``[..., HV]`` raw gate -> ``[..., HV]`` FP32 log decay ``-exp(A_log) * softplus(a + dt_bias)``."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())


def gdn_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    acc_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GDN over one sequence: ``q, k`` ``[T, H, K]``, ``v`` ``[T, HV, V]``, ``g, beta`` ``[T, HV]``.

    Returns ``(o [T, HV, V], final_state [HV, K, V])``.
    """
    o, S, _ = gated_delta_recurrent(q, k, v, g, beta, scale, initial_state, acc_dtype)
    return o, S


# ---------------------------------------------------------------- the chunk-64 prefill's group-scan mode

def group_scan_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    group_tokens: int,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    chunk_size: int = 64,
    checkpoints: Sequence[int] = (),
    acc_dtype: torch.dtype = torch.float32,
) -> Tuple[torch.Tensor, torch.Tensor, Dict[int, torch.Tensor], List[torch.Tensor]]:
    """Group-scan prefill of one sequence.

    Args:
        q, k: ``[T, HV, K]`` (L2-normalised, already repeated to the value heads);
            v: ``[T, HV, V]``; g: log decay ``[T, HV, K]``; beta: ``[T, HV]`` in (0, 1).
        group_tokens: tokens per group (> 0; the last group may be shorter).
        initial_state: ``[HV, K, V]`` or ``None`` (zeros).
        scale: default ``K ** -0.5``; chunk_size: tokens per chunk of the WY form.
        checkpoints: positions ``p`` (1..T) after which to return the state.
        acc_dtype: arithmetic dtype (the scan is done in it; FP32 at least).

    Returns:
        ``(o [T, HV, V], final_state [HV, K, V], {p: state}, [start state of each group])``.

    Raises:
        ValueError: ``group_tokens < 1`` or a checkpoint outside ``[1, T]``.
    """
    if group_tokens < 1:
        raise ValueError(f"group_tokens must be >= 1, got {group_tokens}")
    T, HV, K = q.shape
    V = v.shape[-1]
    if any(not 1 <= int(p) <= T for p in checkpoints):
        raise ValueError(f"checkpoints must lie in [1, {T}], got {list(checkpoints)}")
    bounds = list(range(0, T, group_tokens)) + [T] if T else [0, 0]
    S = torch.zeros(HV, K, V, dtype=acc_dtype, device=q.device)
    if initial_state is not None:
        S = S + initial_state.to(acc_dtype)
    eye = torch.eye(K, dtype=acc_dtype, device=q.device).expand(HV, K, K).contiguous()
    starts = [S]
    for a, b in zip(bounds[:-2], bounds[1:-1]):  # every group but the last: summary, then one scan step
        sl = slice(a, b)
        _, B, _ = kda_chunk(q[sl], k[sl], v[sl], g[sl], beta[sl], scale, None, chunk_size, acc_dtype=acc_dtype)
        zeros = torch.zeros(b - a, HV, K, dtype=v.dtype, device=v.device)
        _, A, _ = kda_chunk(q[sl], k[sl], zeros, g[sl], beta[sl], scale, eye, chunk_size, acc_dtype=acc_dtype)
        starts.append(torch.einsum("hij,hjv->hiv", A, starts[-1]) + B)
    o = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    saved: Dict[int, torch.Tensor] = {}
    final = starts[-1]
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b == a:
            continue
        sl = slice(a, b)
        local = [int(p) - a for p in checkpoints if a < int(p) <= b]
        oi, final, st = kda_chunk(q[sl], k[sl], v[sl], g[sl], beta[sl], scale, starts[i], chunk_size,
                                          checkpoints=local, acc_dtype=acc_dtype)
        o[sl] = oi
        saved.update({p + a: s for p, s in st.items()})
    return o, final, saved, starts


def prefill_group_scan_torch(q, k, v, f, b, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state=None,
                             gate: str = "kda", lower_bound: Optional[float] = None, state_layout: str = "vk",
                             group_chunks: int = 4, chunk_size: int = 64,
                             checkpoints: Sequence[Tuple[int, int, int]] = (),
                             checkpoint_pool: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Packed-batch twin of ``gated_delta_chunk_triton(..., group_scan=True, group_chunks=...)``.

    Args: as ``delta_rule.ops.prefill_torch`` (raw gate ``f``, raw beta ``b``, FP32 pool, slot per
    sequence, ``slot < 0``: no final state written), plus ``group_chunks`` chunks of ``chunk_size``
    tokens per group and ``checkpoints`` ``(sequence, position, slot)`` written to ``checkpoint_pool``.

    Returns:
        ``o`` ``[N, HV, V]``; final states and checkpoints written in place.

    Raises:
        ValueError: bad ``gate``/``state_layout``, or checkpoints without ``checkpoint_pool``.
    """
    if gate not in ("kda", "gdn"):
        raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")
    if checkpoints and checkpoint_pool is None:
        raise ValueError("checkpoints given without checkpoint_pool")
    G = v.shape[1] // q.shape[1]
    g = kda_gate(f, A_log, dt_bias, lower_bound) if gate == "kda" else gdn_gate(f, A_log, dt_bias)
    beta = torch.sigmoid(b.float())
    o = torch.empty_like(v)
    bounds = cu_seqlens.tolist()

    def put(pool, slot, S):
        pool[slot] = (S if state_layout == "kv" else S.transpose(-1, -2)).to(pool.dtype)

    for i, slot in enumerate(state_indices.tolist()):
        sl = slice(bounds[i], bounds[i + 1])
        resume = slot >= 0 and (has_initial_state is None or bool(has_initial_state[i]))
        s0 = None
        if resume:
            s0 = state[slot] if state_layout == "kv" else state[slot].transpose(-1, -2)
        qi = norm_ref.l2_norm(q[sl]).repeat_interleave(G, 1)
        ki = norm_ref.l2_norm(k[sl]).repeat_interleave(G, 1)
        gi = g[sl] if g.dim() == 3 else g[sl].unsqueeze(-1).expand_as(qi)
        want = [(p, d) for (s, p, d) in checkpoints if s == i]
        oi, S, saved, _ = group_scan_sequence(qi, ki, v[sl], gi, beta[sl], group_chunks * chunk_size,
                                              initial_state=None if s0 is None else s0.float(), chunk_size=chunk_size,
                                              checkpoints=[p for p, _ in want])
        o[sl] = oi
        for p, d in want:
            put(checkpoint_pool, d, saved[p])
        if slot >= 0:
            put(state, slot, S)
    return o


# ---------------------------------------------------------------- raw-input twins of the Triton wrappers

def _gate(f, A_log, dt_bias, gate, lower_bound):
    if gate == "kda":
        return kda_gate(f, A_log, dt_bias, lower_bound)
    if gate == "gdn":
        return gdn_gate(f, A_log, dt_bias)
    raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")


def _slot_state(state, slot, state_layout):
    return state[slot] if state_layout == "kv" else state[slot].transpose(-1, -2)


def _store_state(state, slot, S, state_layout):
    state[slot] = (S if state_layout == "kv" else S.transpose(-1, -2)).to(state.dtype)


def _windows(q, k, f, b, A_log, dt_bias, state_indices, T, gate, lower_bound):
    """The gates (log decay ``g``, ``beta`` after the sigmoid) of all ``N = B * T`` tokens, and per request that is
    not padding (slot >= 0) ``(slot, its token slice, L2-normalised q and k of those tokens)``."""
    g = _gate(f, A_log, dt_bias, gate, lower_bound)
    beta = torch.sigmoid(b.float())
    windows = []
    for i, slot in enumerate(state_indices.tolist()):
        if slot >= 0:
            sl = slice(i * T, (i + 1) * T)
            windows.append((slot, sl, norm_ref.l2_norm(q[sl]), norm_ref.l2_norm(k[sl])))
    return g, beta, windows


def decode_torch(q, k, v, f, b, A_log, dt_bias, state, state_indices, tokens_per_request: int = 1, gate: str = "kda",
                 lower_bound: Optional[float] = None, state_layout: str = "vk") -> torch.Tensor:
    """Plain-torch twin of ``gated_delta_recurrent_triton`` (commit, no extras): what CPU serving runs.

    Args and layouts as the Triton wrapper: ``q, k`` ``[N, H, K]``, ``v`` ``[N, HV, V]``,
    ``N = B * T`` request-major; raw ``f`` (``[N, HV, K]`` KDA, ``[N, HV]`` GDN) and ``b``;
    FP32 pool ``[slots, HV, V, K]`` (``"vk"``) or ``[slots, HV, K, V]`` (``"kv"``); slot < 0 = padding.

    Returns:
        ``o`` ``[N, HV, V]`` (zeros on padding rows); the pool is updated in place.
    """
    T = int(tokens_per_request)
    H, HV = q.shape[1], v.shape[1]
    g, beta, windows = _windows(q, k, f, b, A_log, dt_bias, state_indices, T, gate, lower_bound)
    o = torch.zeros_like(v)
    for slot, sl, qi, ki in windows:
        s0 = _slot_state(state, slot, state_layout)
        if gate == "kda" and H == HV:
            oi, S = kda_recurrent(qi, ki, v[sl], g[sl], beta[sl], initial_state=s0)
        else:
            oi, S, _ = gated_delta_recurrent(qi, ki, v[sl], g[sl], beta[sl], initial_state=s0)
        o[sl] = oi
        _store_state(state, slot, S, state_layout)
    return o


def _record_width(gate: str, K: int, V: int) -> Tuple[int, int]:
    gk = K if gate == "kda" else 1
    return gk, K + gk + 1 + V


def deferred_verify_torch(q, k, v, f, b, A_log, dt_bias, state, state_indices, replay_buffer,
                          tokens_per_request: int, gate: str = "gdn", lower_bound: Optional[float] = None,
                          state_layout: str = "vk") -> torch.Tensor:
    """Plain-torch twin of the deferred-commit verify (``gated_delta_recurrent_triton(..., commit=False,
    replay_buffer=...)``; seeds digest item 12, issue 41).

    Per request: the state after token 0 (always accepted in a chain verify) is committed to its slot, and
    tokens 1..T-1 keep only their inputs in ``replay_buffer[slot, t - 1, hv]`` =
    ``[k (L2-normalised, K) | g (log decay: K floats KDA, 1 GDN) | beta (after the sigmoid, 1) | v (V)]``,
    the kernel's record layout; :func:`replay_commit_torch` rebuilds the accepted state from them.

    Args:
        q, k ``[N, H, K]``, v ``[N, HV, V]`` (``N = B * T``), raw ``f`` / ``b``, ``A_log``, ``dt_bias``, ``state``
            (FP32 pool, ``state_layout``), ``state_indices`` ``[B]`` (negative: padding row, zero output,
            nothing written) as :func:`decode_torch`.
        replay_buffer: FP32 ``[slots, T - 1, HV, K + GK + 1 + V]``, indexed by the state slot.
        tokens_per_request: ``T`` (1 + drafts).

    Returns:
        ``o`` ``[N, HV, V]`` in ``v.dtype`` (the verify's outputs for all ``T`` tokens).

    Raises:
        ValueError: ``replay_buffer`` of another shape or dtype.
    """
    T = int(tokens_per_request)
    K = q.shape[2]
    HV, V = v.shape[1], v.shape[2]
    _, rw = _record_width(gate, K, V)
    if replay_buffer.dtype != torch.float32 or tuple(replay_buffer.shape[1:]) != (T - 1, HV, rw):
        raise ValueError(f"replay_buffer must be FP32 [slots, {T - 1}, {HV}, {rw}], got "
                         f"{tuple(replay_buffer.shape)} {replay_buffer.dtype}")
    g, beta, windows = _windows(q, k, f, b, A_log, dt_bias, state_indices, T, gate, lower_bound)
    o = torch.zeros_like(v)
    for slot, sl, qi, ki in windows:
        oi, _, saved = gated_delta_recurrent(qi, ki, v[sl], g[sl], beta[sl],
                                             initial_state=_slot_state(state, slot, state_layout), save_positions=[1])
        o[sl] = oi
        _store_state(state, slot, saved[0], state_layout)
        if T > 1:
            replay_buffer[slot] = deferred_records(ki[1:], g[sl][1:], beta[sl][1:], v[sl][1:])
    return o


def deferred_records(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The replay records of a deferred window's tokens 1..T-1, in the kernel's layout (``FLAG_DEFERRED``).

    Args:
        k: ``[T - 1, H, K]`` L2-normalised keys; g: log decay ``[T - 1, HV, K]`` (KDA) or ``[T - 1, HV]`` (GDN);
        beta: ``[T - 1, HV]`` after the sigmoid; v: ``[T - 1, HV, V]``.

    Returns:
        FP32 ``[T - 1, HV, K + GK + 1 + V]``: per value head ``[k of its key head | g | beta | v]``.
    """
    n, HV = v.shape[0], v.shape[1]
    kk = k.float().repeat_interleave(HV // k.shape[1], dim=1)
    return torch.cat([kk, g.float().reshape(n, HV, -1), beta.float().reshape(n, HV, 1), v.float()], dim=-1)


def replay_commit_torch(state, state_indices, accept_lens, replay_buffer, head_k_dim: int, gate: str = "gdn",
                        state_layout: str = "vk") -> None:
    """Plain-torch twin of ``recurrent.wrapper.replay_commit``: apply tokens ``1 .. accept_lens[i] - 1`` of a
    deferred window from their records (:func:`deferred_verify_torch`) to the state in slot
    ``state_indices[i]``, in place, with the update of :func:`gated_delta_recurrent`.

    Args:
        state: FP32 pool holding each request's state after token 0; ``state_indices`` ``[B]`` (negative: skip);
        accept_lens: ``[B]`` accepted tokens of the window, token 0 included (``<= 1``: nothing to replay);
        replay_buffer: ``[slots, T - 1, HV, K + GK + 1 + V]``; head_k_dim: ``K``.

    Raises:
        ValueError: ``gate`` unknown, a record width that does not fit ``head_k_dim``, or an accepted count
            above ``T``.
    """
    if gate not in ("kda", "gdn"):
        raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")
    _, Tm1, HV, rw = replay_buffer.shape
    K = int(head_k_dim)
    gk = K if gate == "kda" else 1
    V = rw - K - gk - 1
    if V <= 0:
        raise ValueError(f"replay_buffer rows of {rw} floats do not fit head_k_dim={K} ({gate})")
    for slot, n in zip(state_indices.tolist(), accept_lens.tolist()):
        if n > Tm1 + 1:
            raise ValueError(f"accept_lens: {n} accepted tokens in a window of {Tm1 + 1}")
        if slot < 0 or n <= 1:
            continue
        kk, gg, bb, vv = replay_buffer[slot, : n - 1].float().split([K, gk, 1, V], dim=-1)
        S = _slot_state(state, slot, state_layout).float()
        for t in range(n - 1):
            S = S * gg[t].exp().unsqueeze(-1)
            err = vv[t] - torch.einsum("hk,hkv->hv", kk[t], S)
            S = S + torch.einsum("hk,hv->hkv", kk[t] * bb[t], err)
        _store_state(state, slot, S, state_layout)


def _chunked_fp64(q, k, v, g, beta, s0, chunk_size):
    """The chunked WY form in FP64, for grouped value heads and per-head decay too."""
    G = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(G, 1), k.repeat_interleave(G, 1)
    if g.dim() == 2:
        g = g.unsqueeze(-1).expand_as(q)
    o, S, _ = kda_chunk(q, k, v, g, beta, initial_state=s0, chunk_size=chunk_size, acc_dtype=torch.float64)
    return o, S


def prefill_torch(q, k, v, f, b, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state=None,
                  gate: str = "kda", lower_bound: Optional[float] = None, state_layout: str = "vk",
                  chunk_size: int = 64) -> torch.Tensor:
    """Plain-torch twin of ``gated_delta_chunk_triton`` (no checkpoints): the chunked WY form
    (:func:`kda_chunk`) per packed sequence, in FP32.

    Args: as the Triton wrapper; ``chunk_size`` tokens per chunk (CPU serving uses 64).

    Returns:
        ``o`` ``[N, HV, V]``; each sequence's final state is written to its slot.
    """
    G = v.shape[1] // q.shape[1]
    g = _gate(f, A_log, dt_bias, gate, lower_bound)
    beta = torch.sigmoid(b.float())
    o = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_indices.tolist()):
        sl = slice(bounds[i], bounds[i + 1])
        resume = has_initial_state is None or bool(has_initial_state[i])
        s0 = _slot_state(state, slot, state_layout).float() if resume else None
        qi = norm_ref.l2_norm(q[sl]).repeat_interleave(G, 1)
        ki = norm_ref.l2_norm(k[sl]).repeat_interleave(G, 1)
        gi = g[sl] if g.dim() == 3 else g[sl].unsqueeze(-1).expand_as(qi)
        oi, S, _ = kda_chunk(qi, ki, v[sl], gi, beta[sl], initial_state=s0, chunk_size=chunk_size)
        o[sl] = oi
        _store_state(state, slot, S, state_layout)
    return o
