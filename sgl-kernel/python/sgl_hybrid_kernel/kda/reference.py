"""Plain-torch references for Kimi Delta Attention (KDA).

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
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.delta_rule.reference import gated_delta_recurrent


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
