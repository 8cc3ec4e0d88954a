"""Plain-torch twin of the chunk-64 prefill's group-scan mode (``chunk_group_scan.py``, issue 4).

The state pass of the delta rule is affine in the state (``S`` ``[K, V]`` per value head):
over a group of tokens ``S -> A S + B``. With the chunked WY form
(``kda.reference.kda_chunk``) the summary of a group is two runs of that form:
``B`` = the group from a zero state, ``A`` = the group from the identity ``[K, K]`` with
zero values (the update ``S <- (I - beta k k^T) diag(e^g) S + beta k v^T`` maps the
columns of ``S`` independently, so ``V`` may be replaced by ``K`` columns). An ordered
scan ``S_{g+1} = A_g S_g + B_g`` gives each group's start state; each group then runs
the chunked form from its start state (outputs, checkpoints, end state).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sgl_hybrid_kernel.gdn import reference as gdn_ref
from sgl_hybrid_kernel.kda import reference as kda_ref
from sgl_hybrid_kernel.norm import reference as norm_ref


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
        _, B, _ = kda_ref.kda_chunk(q[sl], k[sl], v[sl], g[sl], beta[sl], scale, None, chunk_size, acc_dtype=acc_dtype)
        zeros = torch.zeros(b - a, HV, K, dtype=v.dtype, device=v.device)
        _, A, _ = kda_ref.kda_chunk(q[sl], k[sl], zeros, g[sl], beta[sl], scale, eye, chunk_size, acc_dtype=acc_dtype)
        starts.append(torch.einsum("hij,hjv->hiv", A, starts[-1]) + B)
    o = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    saved: Dict[int, torch.Tensor] = {}
    final = starts[-1]
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b == a:
            continue
        sl = slice(a, b)
        local = [int(p) - a for p in checkpoints if a < int(p) <= b]
        oi, final, st = kda_ref.kda_chunk(q[sl], k[sl], v[sl], g[sl], beta[sl], scale, starts[i], chunk_size,
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
    g = kda_ref.kda_gate(f, A_log, dt_bias, lower_bound) if gate == "kda" else gdn_ref.gdn_gate(f, A_log, dt_bias)
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
