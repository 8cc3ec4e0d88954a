"""Host wrapper of the Triton decode / verify kernels (``triton_recurrent.py``, ``triton_lanes.py``,
``triton_window.py``): launches what a :class:`~sgl_hybrid_kernel.delta_rule.plan.RecurrentPlan` says."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Union

import torch
import triton

from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, gate_kind
from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides, RecurrentPlan, plan_recurrent_for
from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import (
    FLAG_COMMIT,
    FLAG_DEFERRED,
    FLAG_REPLAY_PREV,
    FLAG_SAVE_INTER,
    gated_delta_recurrent_kernel,
    gated_delta_verify_wide_kernel,
)
from sgl_hybrid_kernel.delta_rule.recurrent.triton_lanes import gated_delta_verify_lanes_kernel, token_prep_kernel
from sgl_hybrid_kernel.delta_rule.slot_index import slot_indices, unit_stride
from sgl_hybrid_kernel.delta_rule.recurrent.triton_window import gated_delta_window_kernel


def gated_delta_recurrent_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    tokens_per_request: int = 1,
    gate: str = "kda",
    lower_bound: Optional[float] = None,
    scale: Optional[float] = None,
    l2norm: bool = True,
    state_layout: str = "kv",
    commit: bool = True,
    inter_state: Optional[torch.Tensor] = None,
    inter_indices: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    replay_buffer: Optional[torch.Tensor] = None,
    replay_prev: Optional[torch.Tensor] = None,
    accept_prev: Optional[torch.Tensor] = None,
    plan: Union[RecurrentPlan, RecurrentOverrides, None] = None,
) -> torch.Tensor:
    """Decode / verify step of the gated delta rule for a batch.

    Args:
        q, k: ``[N, H, K]``; v: ``[N, HV, V]`` with ``N = B * T``, token-major.
        f: raw gate input, ``[N, HV, K]`` (``gate="kda"``) or ``[N, HV]`` (``gate="gdn"``).
        b: raw beta ``[N, HV]`` (sigmoid applied in the kernel).
        A_log: ``[HV]``; dt_bias: ``[HV * K]`` (KDA) or ``[HV]`` (GDN).
        state: pool ``[slots, HV, K, V]`` (``state_layout="kv"``, fla) or
            ``[slots, HV, V, K]`` (``"vk"``, SGLang's KDA pool); FP32.
        state_indices: ``[B]`` slot per request; negative = padding row (zeros out).
        tokens_per_request: ``T`` (1 decode, 1 + drafts for verify).
        gate: ``"kda"`` or ``"gdn"``; lower_bound: KDA safe gate bound (``None`` = standard gate).
        scale: default ``K ** -0.5``; l2norm: L2-normalise q and k in the kernel.
        commit: write the final state back to its slot (verify passes ``False``).
        inter_state, inter_indices: optional pool (same layout) and ``[N]`` slots
            receiving the state after each token (``-1`` = skip).
        out: optional ``[N, HV, V]`` output buffer.
        replay_buffer: deferred commit (seeds digest, item 12): FP32
            ``[slots, T - 1, HV, K + GK + 1 + V]`` (``GK`` = K for KDA, 1 for GDN).
            The state after token 0 is committed to its slot and tokens 1..T-1
            keep only their inputs here; :func:`replay_commit` later rebuilds the
            accepted state. Implies ``commit=False`` for the rest of the window.
        replay_prev, accept_prev: fused deferred commit: the previous window's
            replay buffer (use a ping-pong pair: never the same tensor as
            ``replay_buffer``) and its ``[B]`` accepted-token counts; the kernel
            rebuilds that window's accepted state in registers before this step,
            so no separate commit pass touches the state.
        plan: what to launch: a :class:`~sgl_hybrid_kernel.delta_rule.plan.RecurrentPlan` made for this call's
            shape (``plan.plan_recurrent`` / ``plan_recurrent_for``), or :class:`RecurrentOverrides` of the default
            plan (benchmarks, tests), or ``None``: ``plan_recurrent_for`` for the tensors' device. Every call of one
            window (verify, the next window's fused replay, :func:`replay_commit`) must run the same kernel and
            tile for the replay to be bit-exact; the defaults do.

    Returns:
        ``o`` ``[N, HV, V]`` in ``v.dtype``.

    Index tensors (``state_indices``, ``inter_indices``, ``accept_prev``) may have any stride: the wrapper
    makes them unit-stride (no copy when contiguous; ``slot_index.py``).

    Raises:
        ValueError: bad ``gate``/``state_layout`` or inconsistent shapes, a ``plan`` made for another shape or
            overrides outside a kernel's contract (``plan.plan_recurrent``); on CPU tensors, a slot of
            ``state_indices`` / ``inter_indices`` past its pool (not checked on a GPU: it would sync).
    """
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    T = int(tokens_per_request)
    if not 1 <= T <= 16:
        raise ValueError(f"tokens_per_request must be in 1..16, got {T}")
    if N % T != 0 or HV % H != 0:
        raise ValueError(f"N={N} must be a multiple of tokens_per_request={T} and HV={HV} of H={H}")
    B = N // T
    if state_indices.shape[0] != B:
        raise ValueError(f"state_indices has {state_indices.shape[0]} entries for {B} requests")
    kind = gate_kind(gate, lower_bound)
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")

    def strides(t):
        s0, s1, s2, s3 = t.stride()
        return (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)

    # The kernels load every index tensor as ``ptr + i``: unit stride (a strided column would read other
    # requests' slots, issue 42); no copy when already contiguous, range-checked only on CPU (slot_index.py).
    slot_pools = [(name, t.shape[0]) for name, t in (("state", state), ("replay_buffer", replay_buffer),
                                                     ("replay_prev", replay_prev)) if t is not None]
    state_indices = slot_indices("state_indices", state_indices, *slot_pools)
    if inter_state is not None:
        if inter_indices is None:
            raise ValueError("inter_state given without inter_indices")
        inter_indices = slot_indices("inter_indices", inter_indices.to(state_indices.dtype),
                                     ("inter_state", inter_state.shape[0]))
    if accept_prev is not None:
        accept_prev = unit_stride(accept_prev.to(state_indices.dtype))
    q, k, v, f, b = (x.contiguous() for x in (q, k, v, f, b))
    o = out if out is not None else torch.empty_like(v)
    fused_replay = replay_prev is not None
    if fused_replay and (accept_prev is None or (replay_buffer is not None and replay_prev.data_ptr() == replay_buffer.data_ptr())):
        raise ValueError("replay_prev needs accept_prev and must be a different buffer from replay_buffer (ping-pong)")
    save = inter_state is not None
    deferred = replay_buffer is not None
    if deferred:
        commit = False
        rw = K + (1 if kind == GATE_GDN else K) + 1 + V
        if tuple(replay_buffer.shape[1:]) != (T - 1, HV, rw) or replay_buffer.dtype != torch.float32:
            raise ValueError(f"replay_buffer must be FP32 [slots, {T - 1}, {HV}, {rw}], got {tuple(replay_buffer.shape)}")
    if deferred and fused_replay and replay_buffer.stride(0) != replay_prev.stride(0):
        raise ValueError("replay_buffer and replay_prev must have the same layout (ping-pong pair)")
    flags = ((FLAG_COMMIT if commit else 0) | (FLAG_SAVE_INTER if save else 0) | (FLAG_DEFERRED if deferred else 0)
             | (FLAG_REPLAY_PREV if fused_replay else 0))
    # Index tensors share state_indices' dtype and stand-ins replace absent buffers, so every mode
    # of a (shape, dtype, tile) launches the same binary (bit-exact replay, triton_recurrent.py).
    idx_dtype = state_indices.dtype
    if not isinstance(plan, RecurrentPlan):
        plan = plan_recurrent_for(q, v, state, T, kind, state_layout, inter_state if save else None,
                                  plain=not (save or deferred or fused_replay), overrides=plan)
    elif plan.shape != (B, T, H, HV, K, V, kind, state_layout, not (save or deferred or fused_replay)):
        raise ValueError(f"plan: made for (B, T, H, HV, K, V, gate kind, layout, plain) = {plan.shape}, "
                         f"this call is {(B, T, H, HV, K, V, kind, state_layout, not (save or deferred or fused_replay))}")
    scale = K ** -0.5 if scale is None else scale
    lb = 0.0 if lower_bound is None else float(lower_bound)
    BV = plan.value_tile
    if plan.kernel == "window":
        gated_delta_window_kernel[(triton.cdiv(V, BV), B * HV)](
            q, k, v, f, b, o, A_log, dt_bias, state, state_indices,
            replay_buffer if deferred else state,
            replay_prev if fused_replay else state,
            accept_prev.to(idx_dtype) if fused_replay else state_indices,
            scale, lb, *strides(state),
            replay_buffer.stride(0) if deferred else (replay_prev.stride(0) if fused_replay else 0),
            T=T, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, GATE=kind, L2NORM=l2norm,
            COMMIT=commit, DEFERRED=deferred, REPLAY_PREV=fused_replay,
            DOT_PREC=plan.dot_precision, num_warps=plan.num_warps,
        )
        return o
    plain = not (save or deferred or fused_replay)
    if plan.kernel in ("one_warp", "lanes") and save and strides(inter_state)[1:] != strides(state)[1:]:
        raise ValueError(f"inter_state: the verify kernel needs the state pool's per-slot strides "
                         f"{strides(state)[1:]}, got {strides(inter_state)[1:]} (make it contiguous like the pool)")
    if plan.kernel == "lanes":
        _launch_lanes(q, k, v, f, b, o, A_log, dt_bias, state, state_indices, inter_state if save else None,
                      inter_indices.to(idx_dtype) if save else None, replay_buffer if deferred else None,
                      replay_prev if fused_replay else None, accept_prev.to(idx_dtype) if fused_replay else None,
                      scale, lb, flags, T, kind, l2norm, plain, plan)
        return o
    if plan.kernel == "one_warp":
        kernel = gated_delta_verify_wide_kernel
        extra = dict(PLAIN=plain, FAST=plan.fast, XRED=plan.xred, SEQ=plan.seq, TOKPREP=plan.tokprep)
    else:
        kernel = gated_delta_recurrent_kernel
        extra = dict(PRELOAD=plan.preload)
    grid = (triton.cdiv(V, BV), B * HV)
    kernel[grid](
        q, k, v, f, b, o,
        A_log, dt_bias,
        state, state_indices,
        inter_state if save else state, inter_indices.to(idx_dtype) if save else state_indices,
        replay_buffer if deferred else state,
        replay_prev if fused_replay else state,
        accept_prev.to(idx_dtype) if fused_replay else state_indices,
        scale,
        lb,
        *strides(state),
        *(strides(inter_state) if save else strides(state)),
        replay_buffer.stride(0) if deferred else (replay_prev.stride(0) if fused_replay else 0),
        flags,
        T=T, H=H, HV=HV, K=K, V=V,
        BK=triton.next_power_of_2(K), BV=BV,
        GATE=kind, L2NORM=l2norm, **extra,
        num_warps=plan.num_warps,
    )
    return o


def _launch_lanes(q, k, v, f, b, o, A_log, dt_bias, state, state_indices, inter_state, inter_indices, replay_buffer,
                  replay_prev, accept_prev, scale, lower_bound, flags, T, kind, l2norm, plain, plan: RecurrentPlan):
    """The per-token prologue and the lanes kernel (``triton_lanes.py``) for one step, as ``plan`` says."""
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    B = N // T
    BV, KL, hb, pdl = plan.value_tile, plan.key_lanes, plan.prep_heads, plan.pdl
    per_channel = kind != GATE_GDN
    dev = q.device
    qn, kn = (torch.empty(N, H, K, device=dev, dtype=torch.float32) for _ in range(2))
    dec = torch.empty((N, HV, K) if per_channel else (N, HV), device=dev, dtype=torch.float32)
    bq = torch.empty(N, HV, 2, device=dev, dtype=torch.float32)
    token_prep_kernel[(N, HV // hb)](
        q, k, v, f, b, A_log, dt_bias, state_indices, qn, kn, dec, bq,
        replay_buffer if replay_buffer is not None else bq, scale, lower_bound,
        replay_buffer.stride(0) if replay_buffer is not None else 0, 1 if replay_buffer is not None else 0,
        T=T, H=H, HV=HV, K=K, V=V, BK=K, BVR=triton.next_power_of_2(V), HB=hb, GATE=kind, L2NORM=l2norm, PDL=pdl,
        num_warps=plan.prep_warps,
    )
    s0, s1, s2, _ = state.stride()
    gated_delta_verify_lanes_kernel[(V // BV, B * HV)](
        qn, kn, dec, bq, v, o, state, state_indices,
        inter_state if inter_state is not None else state,
        inter_indices if inter_indices is not None else state_indices,
        replay_prev if replay_prev is not None else bq,
        accept_prev if accept_prev is not None else state_indices,
        s0, s1, s2, inter_state.stride(0) if inter_state is not None else s0,
        replay_prev.stride(0) if replay_prev is not None else 0, flags,
        T=T, H=H, HV=HV, K=K, V=V, BV=BV, KL=KL, PER_CHANNEL=per_channel, V_FIRST=plan.v_first,
        FOLD=plan.fold, PLAIN=plain,
        SNAPSHOTS=not plain and inter_state is not None, PDL=pdl, num_warps=plan.num_warps, num_stages=plan.num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )



def replay_commit(
    state: torch.Tensor,
    state_indices: torch.Tensor,
    accept_lens: torch.Tensor,
    replay_buffer: torch.Tensor,
    head_k_dim: int,
    gate: str = "gdn",
    state_layout: str = "kv",
    *,
    num_k_heads: Optional[int] = None,
    activation_dtype: torch.dtype = torch.bfloat16,
    lower_bound: Optional[float] = None,
    l2norm: bool = True,
    plan: Union[RecurrentPlan, RecurrentOverrides, None] = None,
) -> None:
    """Deferred commit: rebuild each request's accepted state in place (seeds digest item 12).

    Runs the verify kernel itself with the previous window replayed and a window of
    neutral tokens (gate input and beta at -inf: decay exactly 1, update exactly 0), so
    the replay executes in the same compiled binary as the verify that wrote the buffer
    and as a verify writing every snapshot: the rebuilt state equals that snapshot bit
    for bit on a GPU too (register layouts, hence reduction order, are the binary's).
    That holds when the arguments below match the verify call's; else the result is
    still correct to FP32 rounding.

    Args:
        state: the pool the verify wrote token 0's state into (same layout flag).
        state_indices: ``[B]`` slots (negative = padding).
        accept_lens: ``[B]`` accepted tokens of the window, token 0 included (1..T).
        replay_buffer: the buffer the DEFERRED verify filled, ``[slots, T - 1, HV, RW]``.
        head_k_dim: ``K``; gate: ``"kda"`` or ``"gdn"``.
        num_k_heads: the verify's q/k heads ``H`` (``None``: ``HV``);
        activation_dtype: its q/k/v/gate/beta dtype; lower_bound, l2norm: its arguments.
        plan: the verify call's ``plan`` (``None``: the same default; a :class:`RecurrentPlan` must be the
            deferred verify's, made for this window's shape).
            With ``form="chunk"`` overrides the replay runs the chunk-form window kernel, equal to the recurrent
            replay to FP32 rounding, not bit for bit.

    Raises:
        ValueError: ``gate`` unknown or the buffer's row width does not fit ``head_k_dim``.
    """
    if gate not in ("kda", "gdn"):
        raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")
    B = state_indices.shape[0]
    _, Tm1, HV, rw = replay_buffer.shape
    K = head_k_dim
    gk = K if gate == "kda" else 1
    V = rw - K - gk - 1
    if V <= 0:
        raise ValueError(f"replay_buffer rows of {rw} floats do not fit head_k_dim={K} ({gate})")
    T, H = Tm1 + 1, num_k_heads or HV
    q, v, f, b, A_log, dt_bias, out = _neutral_window(B * T, H, HV, K, V, gate, state.device, activation_dtype)
    gated_delta_recurrent_triton(q, q, v, f, b, A_log, dt_bias, state, state_indices, T, gate, lower_bound, l2norm=l2norm,
                                 state_layout=state_layout, commit=True, out=out, replay_prev=replay_buffer,
                                 accept_prev=accept_lens, plan=plan)


_NEUTRAL: "OrderedDict[tuple, tuple]" = OrderedDict()
_NEUTRAL_KEEP = 8  # windows kept (one per batch size a server commits at, most recent first)


def _neutral_window(N, H, HV, K, V, gate, device, dtype):
    """The neutral tokens of :func:`replay_commit` (gate input and beta at -inf, zero q / k / v) and a scratch
    output, made once per shape and kept (they are only read; the output is never read): a replay per decode
    step allocates and fills nothing."""
    key = (N, H, HV, K, V, gate, str(device), dtype)
    hit = _NEUTRAL.get(key)
    if hit is not None:
        _NEUTRAL.move_to_end(key)
        return hit
    q = torch.zeros(N, H, K, device=device, dtype=dtype)
    v = torch.zeros(N, HV, V, device=device, dtype=dtype)
    f = torch.full((N, HV) if gate == "gdn" else (N, HV, K), float("-inf"), device=device, dtype=dtype)
    b = torch.full((N, HV), float("-inf"), device=device, dtype=dtype)
    A_log = torch.zeros(HV, device=device)
    dt_bias = torch.zeros(HV if gate == "gdn" else HV * K, device=device)
    _NEUTRAL[key] = hit = (q, v, f, b, A_log, dt_bias, torch.empty_like(v))
    while len(_NEUTRAL) > _NEUTRAL_KEEP:
        _NEUTRAL.popitem(last=False)
    return hit
