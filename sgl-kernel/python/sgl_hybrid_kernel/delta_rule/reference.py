"""Plain-torch gated delta rule, the oracle shared by KDA and GDN.

For one value head with key dim K and value dim V, state ``S`` ``[K, V]``::

    S   <- decay_t * S            # decay_t = exp(g_t): per channel [K] (KDA) or a scalar (GDN)
    S   <- S + beta_t k_t (v_t - S^T k_t)^T
    o_t  = scale * S^T q_t

Grouped value attention (GVA): ``H`` query/key heads, ``HV = G * H`` value heads;
value head ``j`` reads query/key head ``j // G`` (Gated DeltaNet, Yang et al. 2024;
Qwen3-Next uses 16 k-heads and 32 v-heads).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


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
