"""Pieces shared by our KDA and GDN kernel classes behind upstream's linear-attention
kernel interface (``kda_kernel.py``, ``gdn_kernel.py``).

* :func:`plan_track_snapshots` turns upstream's prefix-cache track request
  (``track_state`` ``[B, HV, V, K]`` FP32, ``track_chunk_idx`` ``[B]``: ``c >= 0``
  asks for the state after ``c * 64`` tokens of this extend, ``-1`` none) into
  the ``(sequence, position, row)`` checkpoints our chunk kernel writes;
* :func:`verify_chain` is the speculative (chain, top-k 1) verify of both gates:
  the committed state is read and *not* written, the state after each draft
  token goes to upstream's scratch ``intermediate_states_buffer``
  ``[rows, steps, HV, V, K]`` at row ``intermediate_state_indices[b]`` (issue 4),
  or, with ``replay_buffer`` (GDN's deferred commit, ``gdn_deferred.py``; seeds
  digest item 12), token 0's state into the slot and records of the rest.

Triton on CUDA/ROCm within the kernels' contract (``delta_rule/dispatch.py``),
the plain-torch reference otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from sgl_hybrid_kernel.delta_rule.dispatch import choose_recurrent
from sgl_hybrid_kernel.delta_rule.gate import gate_kind
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton
from sgl_hybrid_kernel.delta_rule.naive import deferred_verify_torch, gated_delta_recurrent, gdn_gate, kda_gate
from sgl_hybrid_kernel.delta_rule.slot_index import slot_indices
from sgl_hybrid_kernel.norm.reference import l2_norm

MAMBA_CHUNK = 64  # upstream's track grid (mamba_chunk_size)


_FORWARD_EXTEND_LENS: "contextvars.ContextVar[Optional[Sequence[int]]]" = contextvars.ContextVar(
    "sgl_hybrid_forward_extend_lens", default=None)


@contextlib.contextmanager
def forward_extend_lengths(seq_lens_cpu: Optional[Sequence[int]]) -> Iterator[None]:
    """Make the current forward's host extend lengths (upstream's ``forward_batch.extend_seq_lens_cpu``)
    visible to :func:`extend_lengths` for the duration of one backend call: upstream's GDN backend
    calls the kernel's ``extend`` without them, so ``HybridGDNAttnBackend.forward_extend`` sets them
    here around its call (issue 4: no read of ``query_start_loc`` per layer)."""
    token = _FORWARD_EXTEND_LENS.set(seq_lens_cpu)
    try:
        yield
    finally:
        _FORWARD_EXTEND_LENS.reset(token)


def extend_lengths(cu: torch.Tensor, seq_lens_cpu: Optional[Sequence[int]] = None) -> List[int]:
    """Host list of the extend lengths: ``seq_lens_cpu`` (upstream's ``extend_seq_lens_cpu``; when not
    given, the lengths set by :func:`forward_extend_lengths` for the current backend call) when it
    matches ``cu`` (``[B + 1]`` cumulative starts) in count, read without touching the device; else one
    read of ``cu`` (a device sync on a GPU)."""
    if seq_lens_cpu is None:
        seq_lens_cpu = _FORWARD_EXTEND_LENS.get()
    if seq_lens_cpu is not None and len(seq_lens_cpu) == cu.numel() - 1:
        return [int(n) for n in seq_lens_cpu]
    return (cu[1:] - cu[:-1]).tolist()


def initial_state_flags(extend_prefix_lens: Optional[torch.Tensor], batch: int, device: torch.device) -> torch.Tensor:
    """``[B]`` int32 on ``device``: 1 where a sequence starts from its slot's state (a cached or
    previous prefix, ``extend_prefix_lens > 0``), 0 where it starts from zeros; all ones without
    prefix lengths. Built on the device: no host read of the prefix lengths."""
    if extend_prefix_lens is None:
        return torch.ones(batch, dtype=torch.int32, device=device)
    return (extend_prefix_lens[:batch] > 0).to(device=device, dtype=torch.int32)


_TRACK_HOST: list = [None, None]  # [weakref to the last track_chunk_idx read, its host list]


def track_chunks_on_host(track_chunk_idx: torch.Tensor) -> List[int]:
    """``track_chunk_idx.tolist()``, read once per forward pass: every linear-attention layer of a
    forward gets the same metadata tensor, so the later layers reuse the first one's host list
    instead of each waiting for the device (one synchronisation per forward, not per layer)."""
    ref, host = _TRACK_HOST
    if ref is not None and ref() is track_chunk_idx:
        return host
    host = track_chunk_idx.tolist()
    _TRACK_HOST[0], _TRACK_HOST[1] = weakref.ref(track_chunk_idx), host
    return host


def plan_track_snapshots(track_state: Optional[torch.Tensor], track_chunk_idx: Optional[torch.Tensor],
                         ssm_states: torch.Tensor, cache_indices: torch.Tensor,
                         has_init: torch.Tensor) -> List[Tuple[int, int, int]]:
    """Checkpoints ``(sequence, token position, track row)`` for ``c > 0``; rows with
    ``c == 0`` (the state the extend starts from) are filled here on the device: the slot's state
    where ``has_init`` (:func:`initial_state_flags`, ``[B]`` on the device), zeros otherwise. The
    chunk indices are read on the host once per forward (:func:`track_chunks_on_host`).

    Returns ``[]`` when no tracking was requested.
    """
    if track_state is None or track_chunk_idx is None:
        return []
    chunks = track_chunks_on_host(track_chunk_idx)
    rows = [i for i, c in enumerate(chunks) if c == 0]
    if rows:
        idx = torch.tensor(rows, dtype=torch.long, device=track_state.device)
        slots = cache_indices.to(device=track_state.device).index_select(0, idx).long()
        start = ssm_states.index_select(0, slots).to(track_state.dtype)
        keep = has_init.to(device=track_state.device).index_select(0, idx).bool().view(-1, *[1] * (start.dim() - 1))
        track_state.index_copy_(0, idx, torch.where(keep, start, torch.zeros_like(start)))
    return [(i, c * MAMBA_CHUNK, i) for i, c in enumerate(chunks) if c > 0]


def _gate(f, A_log, dt_bias, gate, lower_bound):
    if gate == "kda":
        return kda_gate(f, A_log.reshape(-1), dt_bias, lower_bound)
    return gdn_gate(f, A_log.reshape(-1), dt_bias.reshape(-1))


def verify_chain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *,
                 A_log: torch.Tensor, dt_bias: torch.Tensor, ssm_states: torch.Tensor, cache_indices: torch.Tensor,
                 query_start_loc: Optional[torch.Tensor], intermediate_states_buffer: torch.Tensor,
                 intermediate_state_indices: torch.Tensor, cache_steps: int, gate: str,
                 lower_bound: Optional[float] = None, force_triton: bool = False,
                 replay_buffer: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Chain verify in upstream's ``target_verify`` layouts.

    Args:
        q, k: ``[1, B*T, H, K]``; v: ``[1, B*T, HV, V]`` (``T = cache_steps`` tokens per request).
        a: raw gate ``[B*T, HV*K]`` (KDA) or ``[B*T, HV]`` (GDN); b: raw beta ``[.., HV]``.
        ssm_states: FP32 pool ``[slots, HV, V, K]``, read only; ``cache_indices`` ``[B]``
            (negative = padding row: zero output, nothing written).
        intermediate_states_buffer: ``[rows, steps >= T, HV, V, K]``; ``intermediate_state_indices``
            ``[>= B]`` row per request (negative = not saved).
        gate: ``"kda"`` or ``"gdn"``; lower_bound: KDA safe-gate bound.
        replay_buffer: deferred commit (``gdn_deferred.py``): FP32 ``[slots, T - 1, HV, K + GK + 1 + V]``
            indexed by the state slot; the state after token 0 is written to the slot and tokens 1..T-1 keep
            only their inputs there (``intermediate_states_buffer`` is then not written). ``None``: snapshots.

    Returns:
        ``[1, B*T, HV, V]`` in ``v.dtype``.

    Raises:
        ValueError: token count not ``B * cache_steps``, or a CPU ``query_start_loc`` not uniform, or a CPU
            ``cache_indices`` / ``intermediate_state_indices`` entry past its pool (GPU ones are not read on the
            host: no sync, CUDA-graph capture safe). Index tensors may have any stride.
    """
    _, N, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    T, B = int(cache_steps), cache_indices.shape[0]
    if N != B * T:
        raise ValueError(f"cache_steps={T}: expected {B} * {T} tokens, got {N}")
    # Uniform windows are checked where that costs no device sync: a GPU ``query_start_loc`` is not
    # read on the host (a ``.cpu()`` here would sync every layer and fail inside upstream's CUDA-graph
    # capture of target_verify, whose windows are uniform by construction: 1 + drafts each).
    if (query_start_loc is not None and query_start_loc.device.type == "cpu"
            and not torch.equal(query_start_loc.long()[: B + 1], torch.arange(B + 1, dtype=torch.long) * T)):
        raise ValueError("query_start_loc: sgl_hybrid verify takes the same number of tokens per request")
    q2, k2, v2 = q[0], k[0], v[0]
    f = a.reshape(N, HV, K) if gate == "kda" else a.reshape(N, HV)
    beta = b.reshape(N, HV)
    buf = intermediate_states_buffer
    steps = buf.shape[1]
    # Any stride (upstream hands out columns of its tables): the kernel wrapper makes ``cache_indices``
    # unit-stride, ``rows`` is rebuilt below; range-checked by name on CPU only (a GPU check would sync).
    cache_indices = slot_indices("cache_indices", cache_indices, ("ssm_states", ssm_states.shape[0]))
    rows = slot_indices("intermediate_state_indices", intermediate_state_indices[:B],
                        ("intermediate_states_buffer", buf.shape[0])).to(torch.long)
    if replay_buffer is not None:
        if force_triton or choose_recurrent(q2, v2, ssm_states, T, gate_kind(gate, lower_bound)) == "triton":
            o = gated_delta_recurrent_triton(q2, k2, v2, f, beta, A_log.reshape(-1), dt_bias.reshape(-1), ssm_states,
                                             cache_indices, T, gate, lower_bound, state_layout="vk", commit=False,
                                             replay_buffer=replay_buffer)
        else:
            o = deferred_verify_torch(q2, k2, v2, f, beta, A_log.reshape(-1), dt_bias.reshape(-1), ssm_states,
                                      cache_indices, replay_buffer, T, gate, lower_bound, "vk")
        return o.unsqueeze(0)
    if force_triton or choose_recurrent(q2, v2, ssm_states, T, gate_kind(gate, lower_bound)) == "triton":
        t = torch.arange(T, device=rows.device)
        inter_idx = torch.where(rows[:, None] >= 0, rows[:, None] * steps + t[None, :], -1).reshape(-1).to(torch.int32)
        o = gated_delta_recurrent_triton(q2, k2, v2, f, beta, A_log.reshape(-1), dt_bias.reshape(-1), ssm_states,
                                         cache_indices, T, gate, lower_bound, state_layout="vk", commit=False,
                                         inter_state=buf.flatten(0, 1), inter_indices=inter_idx)
        return o.unsqueeze(0)
    g = _gate(f, A_log, dt_bias, gate, lower_bound)
    o = torch.zeros_like(v2)
    for i, slot in enumerate(cache_indices.tolist()):
        if slot < 0:
            continue
        sl = slice(i * T, (i + 1) * T)
        oi, _, saved = gated_delta_recurrent(l2_norm(q2[sl]), l2_norm(k2[sl]), v2[sl], g[sl], torch.sigmoid(beta[sl].float()),
                                             initial_state=ssm_states[slot].transpose(-1, -2).float(),
                                             save_positions=range(1, T + 1))
        o[sl] = oi
        row = int(rows[i])
        if row >= 0:
            for t_, S in enumerate(saved):
                buf[row, t_] = S.transpose(-1, -2).to(buf.dtype)
    return o.unsqueeze(0)
