"""Host wrapper of the one-launch KDA decode kernel (``triton_fused_decode.py``)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.slot_index import slot_indices
from sgl_hybrid_kernel.kda.triton_fused_decode import kda_fused_decode_kernel

# Persistent per-device workspaces (sum of squares, arrival counters). The
# counters must be zero between calls; the kernel resets them itself, so they
# are zeroed once at allocation and reused by every call and graph replay.
# A workspace outgrown by a larger batch is kept alive (``_RETIRED``): a CUDA
# graph captured with it still reads and writes it on every replay.
_WORKSPACE: Dict[Tuple[str, int], Tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: List[Tuple[torch.Tensor, torch.Tensor]] = []


def _workspace(device: torch.device, rows: int, tiles: int) -> Tuple[torch.Tensor, torch.Tensor]:
    key = (str(device), tiles)
    ws = _WORKSPACE.get(key)
    if ws is None or ws[1].numel() < rows:
        if ws is not None:
            _RETIRED.append(ws)
        n = max(rows, 2 * (ws[1].numel() if ws is not None else 0), 64)
        ws = (torch.zeros(n * tiles, dtype=torch.float32, device=device), torch.zeros(n, dtype=torch.int32, device=device))
        _WORKSPACE[key] = ws
    return ws


def value_tile_for(V: int) -> int:
    """``BV`` the wrapper launches with for value width ``V`` (few, wider tiles: the last tile's row
    normalisation is serial; H200 sweep: 16 is best at B = 1..128)."""
    return min(16, triton.next_power_of_2(V))


def num_warps_for(value_tile: int) -> int:
    """Warps the wrapper launches a ``value_tile``-column tile with (the compile gate builds the same)."""
    return 8 if value_tile >= 32 else (4 if value_tile >= 16 else 2)


def reserve_workspace(device: torch.device, batch: int, num_heads: int, head_v_dim: int,
                      value_tile: Optional[int] = None) -> None:
    """Allocate the workspace for up to ``batch`` requests of ``num_heads`` heads now, outside CUDA-graph
    capture (serving calls it once at model load, for the largest batch a graph is captured for)."""
    bv = value_tile or value_tile_for(head_v_dim)
    _workspace(torch.device(device), batch * num_heads, triton.cdiv(head_v_dim, bv))


def kda_fused_decode(
    mixed_qkv: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    out_gate: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float = 1e-5,
    lower_bound: Optional[float] = None,
    scale: Optional[float] = None,
    state_layout: str = "vk",
    value_tile: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One KDA decode step (conv + L2 norm + gates + recurrence + gated RMSNorm), one launch.

    Args:
        mixed_qkv: ``[B, 2 * H * K + H * V]`` raw q|k|v projections (pre-conv). ``mixed_qkv``, ``f``,
            ``b`` and ``out_gate`` may be row-strided views (a split of a fused projection's output) with a
            unit inner stride; other layouts are copied first.
        conv_state: ``[slots, W - 1, 3 * H * K]`` conv pool (raw rows); updated in place.
        conv_weight: ``[3 * H * K, W]`` depthwise filter.
        f: ``[B, H * K]`` raw forget-gate projection; b: ``[B, H]`` raw beta.
        A_log: ``[H]``; dt_bias: ``[H * K]``; lower_bound: safe-gate bound or ``None``.
        state: FP32 pool ``[slots, H, V, K]`` (``"vk"``, SGLang) or ``[slots, H, K, V]`` (``"kv"``); updated in place.
        state_indices: ``[B]`` slots of both pools, any stride; negative = padding row (zeros out, pools untouched).
        out_gate: ``[B, H * V]`` raw output-gate projection; norm_weight: ``[V]``; eps: RMSNorm epsilon.
        scale: default ``K ** -0.5``; value_tile: ``BV`` override.
        out: optional ``[B, H, V]`` buffer (written in place).

    Returns:
        ``[B, H, V]``: ``rms_norm(o) * norm_weight * sigmoid(out_gate)``.

    Raises:
        ValueError: on inconsistent shapes or an unknown ``state_layout``; on CPU tensors, a slot past
            ``state`` or ``conv_state`` (not checked on a GPU: it would sync).
    """
    B, C = mixed_qkv.shape
    H = A_log.numel()
    K = f.shape[1] // H
    V = norm_weight.numel()
    W = conv_weight.shape[1]
    if C != 2 * H * K + H * V or conv_state.shape[1:] != (W - 1, C) or state_indices.shape[0] != B:
        raise ValueError(
            f"inconsistent shapes: mixed_qkv {tuple(mixed_qkv.shape)}, conv_state {tuple(conv_state.shape)}, "
            f"conv_weight {tuple(conv_weight.shape)}, H={H}, K={K}, V={V}, state_indices {tuple(state_indices.shape)}"
        )
    # The kernel loads ``state_idx_ptr + i``: unit stride (issue 42; no copy when contiguous, delta_rule/slot_index.py).
    state_indices = slot_indices("state_indices", state_indices, ("state", state.shape[0]),
                                 ("conv_state", conv_state.shape[0]))
    if state_layout == "vk":
        s_slot, s_h, s_v, s_k = state.stride()
    elif state_layout == "kv":
        s_slot, s_h, s_k, s_v = state.stride()
    else:
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")
    BV = value_tile or value_tile_for(V)
    NV = triton.cdiv(V, BV)
    sumsq, count = _workspace(mixed_qkv.device, B * H, NV)
    o = out if out is not None else torch.empty((B, H, V), dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    mixed_qkv, f, b, out_gate = (_rows(t, B) for t in (mixed_qkv, f, b, out_gate))
    kda_fused_decode_kernel[(NV, B * H)](
        mixed_qkv, conv_state, conv_weight, f, b, A_log, dt_bias,
        state, state_indices, out_gate, norm_weight, o, sumsq, count,
        K ** -0.5 if scale is None else scale,
        0.0 if lower_bound is None else float(lower_bound),
        eps,
        conv_state.stride(0), conv_state.stride(1),
        mixed_qkv.stride(0), f.stride(0), b.stride(0), out_gate.stride(0),
        s_slot, s_h, s_k, s_v,
        H=H, K=K, V=V, W=W, BK=triton.next_power_of_2(K), BV=BV, NV=NV,
        NVP=triton.next_power_of_2(NV), SAFE_GATE=lower_bound is not None,
        num_warps=num_warps_for(BV),
    )
    return o


def _rows(t: torch.Tensor, B: int) -> torch.Tensor:
    """``t`` as ``[B, n]`` with a unit inner stride: no copy for a row-strided view (the kernel takes the
    row stride), a copy otherwise."""
    if t.dim() != 2:
        t = t.reshape(B, -1)
    return t if t.stride(-1) == 1 else t.contiguous()
