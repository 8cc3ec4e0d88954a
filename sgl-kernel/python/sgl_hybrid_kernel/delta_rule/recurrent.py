"""Host wrapper of the Triton decode / verify kernel (``triton_recurrent.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.triton_recurrent import (
    GATE_GDN,
    GATE_KDA,
    GATE_KDA_SAFE,
    gated_delta_recurrent_kernel,
    gated_delta_replay_commit_kernel,
)
from sgl_hybrid_kernel.platform import device_platform


@dataclass(frozen=True)
class ValueTileTuning:
    """Parameters of :func:`pick_value_tile`, measured on one (arch, compute-unit count).

    ``num_compute_units`` SMs / CUs and ``waves``: decode narrows the tile until
    ``B * HV * V / BV`` programs fill ``waves`` waves of the device. ``tuned`` is
    False for the default built for a device no sweep has measured.
    """

    name: str
    num_compute_units: int
    waves: int = 2
    tuned: bool = True
    source: str = ""


# Tuned tables, keyed by (arch, compute units): a table measured on one part
# must not silently apply to a part with a different CU count (issue 9).
VALUE_TILE_TUNED: Dict[Tuple[str, int], ValueTileTuning] = {
    ("sm90", 132): ValueTileTuning("sm90x132", 132, 2, True, "H200 sweep 2026-11-29, benchmark/kernels/sweep_value_tile.py"),
}
# What tests and benchmarks on the CPU interpreter use (no device to ask).
INTERPRETER_TUNING = VALUE_TILE_TUNED[("sm90", 132)]


def value_tile_tuning(arch: Optional[str], num_compute_units: Optional[int]) -> ValueTileTuning:
    """The tuned entry for ``(arch, num_compute_units)``, else the documented default:
    the H200 rules with the wave target taken from this device's own CU count, marked
    ``tuned=False`` (the start-up table says so)."""
    entry = VALUE_TILE_TUNED.get((arch, num_compute_units))
    if entry is not None:
        return entry
    cus = int(num_compute_units or INTERPRETER_TUNING.num_compute_units)
    return ValueTileTuning(f"default({arch}x{cus})", cus, 2, False, "untuned: H200 rules, 2 waves of this device's CUs")


def device_value_tile_tuning(device: torch.device) -> ValueTileTuning:
    """:func:`value_tile_tuning` for a tensor's device (CPU tensors: the interpreter's table)."""
    plat = device_platform(device)
    if plat.device == "cpu":
        return INTERPRETER_TUNING
    return value_tile_tuning(*plat.key)


def pick_value_tile(
    batch: int,
    num_v_heads: int,
    head_v_dim: int,
    tokens: int = 1,
    state_layout: str = "vk",
    tuning: Optional[ValueTileTuning] = None,
) -> int:
    """Columns per program, from the H200 sweep (benchmark/kernels/sweep_value_tile.py, docs/kernels.md).

    * State stored V-major (``"vk"``, SGLang's KDA pool): a column is a contiguous
      K-vector, so narrow tiles stay coalesced; go narrow until ``B * HV * V / BV``
      programs reach ``tuning.waves`` waves of ``tuning.num_compute_units`` (H200:
      2 waves of 132 SMs, B=1: 4 columns), wider for verify windows (T > 1), whose
      per-token reductions favour fewer, wider programs.
    * State stored K-major (``"kv"``, fla): a tile reads ``BV`` contiguous floats
      per row, so tiles below 32 columns waste memory transactions.

    ``tuning`` defaults to :data:`INTERPRETER_TUNING` (the H200 table); the
    wrappers pass the tensor device's entry (:func:`device_value_tile_tuning`).
    """
    tuning = tuning or INTERPRETER_TUNING
    vmax = triton.next_power_of_2(head_v_dim)
    if state_layout == "kv":
        return min(64 if batch * num_v_heads >= 512 else 32, vmax)
    if tokens > 1:
        return min(4 if batch == 1 else 64, vmax)
    bv = 32
    while bv > 4 and batch * num_v_heads * triton.cdiv(head_v_dim, bv) < tuning.waves * tuning.num_compute_units:
        bv //= 2
    return min(bv, vmax)


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
    value_tile: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    replay_buffer: Optional[torch.Tensor] = None,
    replay_prev: Optional[torch.Tensor] = None,
    accept_prev: Optional[torch.Tensor] = None,
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
        value_tile: ``BV`` override (power of two).
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

    Returns:
        ``o`` ``[N, HV, V]`` in ``v.dtype``.

    Raises:
        ValueError: bad ``gate``/``state_layout`` or inconsistent shapes.
    """
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    T = int(tokens_per_request)
    if N % T != 0 or HV % H != 0:
        raise ValueError(f"N={N} must be a multiple of tokens_per_request={T} and HV={HV} of H={H}")
    B = N // T
    if state_indices.shape[0] != B:
        raise ValueError(f"state_indices has {state_indices.shape[0]} entries for {B} requests")
    if gate == "kda":
        kind = GATE_KDA if lower_bound is None else GATE_KDA_SAFE
    elif gate == "gdn":
        kind = GATE_GDN
    else:
        raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")

    def strides(t):
        s0, s1, s2, s3 = t.stride()
        return (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)

    q, k, v, f, b = (x.contiguous() for x in (q, k, v, f, b))
    o = out if out is not None else torch.empty_like(v)
    BV = value_tile or pick_value_tile(B, HV, V, T, state_layout, device_value_tile_tuning(q.device))
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
    grid = (triton.cdiv(V, BV), B * HV)
    gated_delta_recurrent_kernel[grid](
        q, k, v, f, b, o,
        A_log, dt_bias,
        state, state_indices,
        inter_state if save else state, inter_indices if save else state_indices,
        replay_buffer if deferred else state,
        replay_prev if fused_replay else state,
        accept_prev if fused_replay else state_indices,
        K ** -0.5 if scale is None else scale,
        0.0 if lower_bound is None else float(lower_bound),
        *strides(state),
        *(strides(inter_state) if save else strides(state)),
        replay_buffer.stride(0) if deferred else (replay_prev.stride(0) if fused_replay else 0),
        T=T, H=H, HV=HV, K=K, V=V,
        BK=triton.next_power_of_2(K), BV=BV,
        GATE=kind, L2NORM=l2norm, SAVE_INTER=save, COMMIT=commit, DEFERRED=deferred, REPLAY_PREV=fused_replay,
        num_warps=_num_warps(BV),
    )
    return o


def _num_warps(bv: int) -> int:
    return 4 if bv >= 16 else 2


def replay_commit(
    state: torch.Tensor,
    state_indices: torch.Tensor,
    accept_lens: torch.Tensor,
    replay_buffer: torch.Tensor,
    head_k_dim: int,
    gate: str = "gdn",
    state_layout: str = "kv",
    value_tile: Optional[int] = None,
) -> None:
    """Deferred commit: rebuild each request's accepted state in place.

    Args:
        state: the pool the verify wrote token 0's state into (same layout flag).
        state_indices: ``[B]`` slots (negative = padding).
        accept_lens: ``[B]`` accepted tokens of the window, token 0 included (1..T).
        replay_buffer: the buffer the DEFERRED verify filled.
        head_k_dim: ``K``; gate: ``"kda"`` or ``"gdn"``.
        value_tile: must equal the verify call's ``BV`` for bit-exact replay
            (``None`` picks the same default as the verify did for the same batch).
    """
    B = state_indices.shape[0]
    _, Tm1, HV, rw = replay_buffer.shape
    K = head_k_dim
    gk = K if gate == "kda" else 1
    V = rw - K - gk - 1
    if state_layout == "kv":
        s = state.stride()
    else:
        s0, s1, s2, s3 = state.stride()
        s = (s0, s1, s3, s2)
    BV = value_tile or pick_value_tile(B, HV, V, Tm1 + 1, state_layout, device_value_tile_tuning(state.device))
    gated_delta_replay_commit_kernel[(triton.cdiv(V, BV), B * HV)](
        state, state_indices, accept_lens, replay_buffer, *s, replay_buffer.stride(0),
        T=Tm1 + 1, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, PER_CHANNEL=gate == "kda",
        num_warps=_num_warps(BV),
    )
