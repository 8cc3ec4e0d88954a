"""Host wrapper of the Triton chunked prefill: the multi-kernel chunk-64 form
(``chunk/parallel.py``, default) or the single sequential kernel (``triton_chunk.py``)."""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Tuple, Union

import torch
import triton

from sgl_hybrid_kernel.delta_rule.chunk.parallel import gated_delta_chunk_parallel
from sgl_hybrid_kernel.delta_rule.dispatch import GROUP_SCAN_OP, logger as dispatch_logger
from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides, ChunkPlan, plan_chunk
from sgl_hybrid_kernel.delta_rule.chunk.seq_plan import int32_to_device, seq_plan
from sgl_hybrid_kernel.delta_rule.slot_index import slot_indices, unit_stride
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.platform import Target
from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk import gated_delta_chunk_kernel
from sgl_hybrid_kernel.delta_rule.gate import GATE_KDA_SAFE, gate_kind

CHUNK = 16  # tokens per in-kernel chunk (see triton_chunk.py for why 16)


def gated_delta_chunk_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: Optional[torch.Tensor] = None,
    gate: str = "kda",
    lower_bound: Optional[float] = None,
    scale: Optional[float] = None,
    l2norm: bool = True,
    state_layout: str = "kv",
    checkpoints: Sequence[Tuple[int, int, int]] = (),
    checkpoint_pool: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    seq_lens_cpu: Optional[Sequence[int]] = None,
    plan: Union[ChunkPlan, ChunkOverrides, None] = None,
) -> torch.Tensor:
    """Chunked prefill/extend of packed sequences.

    Args:
        q, k: ``[N, H, K]``; v: ``[N, HV, V]`` (packed tokens of all sequences).
        f: raw gate ``[N, HV, K]`` (``"kda"``) or ``[N, HV]`` (``"gdn"``); b: raw beta ``[N, HV]``.
        A_log, dt_bias, lower_bound, scale, l2norm, state_layout: as the decode wrapper.
        cu_seqlens: ``[S + 1]`` int token offsets.
        state: FP32 pool; ``state_indices`` ``[S]`` slot per sequence (initial state
            read from there when ``has_initial_state[i]``; final state written there).
        checkpoints: ``(sequence, position, checkpoint_slot)`` triples; ``position``
            (tokens into this call) must be a multiple of 16 or the sequence end.
        checkpoint_pool: pool receiving them (same layout).
        seq_lens_cpu: tokens per sequence on the host (e.g. SGLang's ``extend_seq_lens_cpu``), equal
            to ``cu_seqlens[1:] - cu_seqlens[:-1]`` with ``cu_seqlens[0] == 0`` (not checked on the
            device): the call then makes no host sync. Without it the wrapper reads ``cu_seqlens``
            once per call (``.tolist()``, a sync). Either way the chunk / group index tables are
            built once per distinct offsets and device and cached (``chunk.parallel.seq_plan``), so
            repeated calls (every layer of one forward) copy nothing to the device.
        plan: what to launch: a :class:`~sgl_hybrid_kernel.delta_rule.plan.ChunkPlan` (``plan.plan_chunk``) or
            :class:`ChunkOverrides` of the default plan (benchmarks, tests: ``method``, ``tf32``, ``scratch_dtype``,
            ``group_scan``, ``group_chunks``, ``value_tile``, ``num_warps``, ``launch``, ``fuse_output``), or
            ``None``: ``plan_chunk`` for the tensors' device. The default is chunk-64 for 16-bit activations on
            CUDA (TF32 products; measured 3.3x / 1.5x faster than the sequential kernel on the H200) and always on
            ROCm (FP32 products), else the sequential kernel (FP32 activations: tests and references); the
            group-scan mode only where ``plan.group_scan_choice`` finds few sequences x heads and long sequences.

    Returns:
        ``o`` ``[N, HV, V]``.

    Raises:
        ValueError: bad ``gate``/layout, plan overrides outside their contract (``plan.plan_chunk``), a checkpoint
            not on the chunk grid, ``seq_lens_cpu`` of another
            length than ``cu_seqlens`` has sequences or summing past ``q``'s tokens, a checkpoint slot
            past ``checkpoint_pool``, or (CPU tensors only: on a GPU it would sync) a slot of
            ``state_indices`` past ``state``. Index tensors may have any stride (made unit-stride here).
    """
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    S = cu_seqlens.numel() - 1
    kind = gate_kind(gate, lower_bound)
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")

    def strides(t):
        s0, s1, s2, s3 = t.stride()
        return (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)

    if seq_lens_cpu is not None:
        if len(seq_lens_cpu) != S:
            raise ValueError(f"seq_lens_cpu: {len(seq_lens_cpu)} lengths for {S} sequences in cu_seqlens")
        bos = [0, *itertools.accumulate(int(n) for n in seq_lens_cpu)]
        if bos[-1] > N:
            raise ValueError(f"seq_lens_cpu: {bos[-1]} tokens, more than q's {N}")
    else:
        bos = cu_seqlens.tolist()  # one host sync; pass seq_lens_cpu to avoid it
    sp = seq_plan(bos, q.device)
    lens = sp.lens
    max_chunks = max(1, max(triton.cdiv(n, CHUNK) for n in lens) if lens else 1)
    ckpt_idx = None
    if checkpoints:
        if checkpoint_pool is None:
            raise ValueError("checkpoints given without checkpoint_pool")
        for seq, pos, dst in checkpoints:
            if not 1 <= pos <= lens[seq] or (pos % CHUNK and pos != lens[seq]):
                raise ValueError(f"checkpoint position {pos} of sequence {seq} is not on the {CHUNK}-token grid or its end")
            if dst >= checkpoint_pool.shape[0]:
                raise ValueError(f"checkpoints: slot {dst} is outside checkpoint_pool ({checkpoint_pool.shape[0]} slots)")
    if has_initial_state is None:
        has_initial_state = sp.ones
    # The kernels load index tensors as ``ptr + i``: unit stride (issue 42; no copy when contiguous, slot_index.py).
    state_indices = slot_indices("state_indices", state_indices, ("state", state.shape[0]))
    has_initial_state = unit_stride(has_initial_state.to(torch.int32))
    cu_seqlens = unit_stride(cu_seqlens)
    q, k, v, f, b = (x.contiguous() for x in (q, k, v, f, b))
    if not isinstance(plan, ChunkPlan):
        plan = plan_chunk(lens, HV, V, kind, lower_bound, q.dtype, Target.of(q.device), checkpoints=bool(checkpoints),
                          overrides=plan)
    if plan.group_scan_choice is not None:
        record_choice(GROUP_SCAN_OP, *plan.group_scan_choice, log=dispatch_logger)
    if plan.method == "parallel":
        return gated_delta_chunk_parallel(
            q, k, v, f, b, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state,
            kind, lower_bound, K ** -0.5 if scale is None else scale, l2norm, state_layout, checkpoints,
            checkpoint_pool, sp, out=out, plan=plan)
    if checkpoints:
        table = [-1] * (S * max_chunks)
        for seq, pos, dst in checkpoints:
            table[seq * max_chunks + triton.cdiv(pos, CHUNK) - 1] = dst
        ckpt_idx = int32_to_device(table, q.device).view(S, max_chunks)
    o = out if out is not None else torch.empty_like(v)
    cp = checkpoint_pool if ckpt_idx is not None else state
    value_tile, tf32 = plan.value_tile, plan.tf32
    gated_delta_chunk_kernel[(triton.cdiv(V, value_tile), S * HV)](
        q, k, v, f, b, o, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state,
        cp, ckpt_idx if ckpt_idx is not None else state_indices, max_chunks,
        K ** -0.5 if scale is None else scale, 0.0 if lower_bound is None else float(lower_bound),
        *strides(state), *strides(cp),
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=value_tile, BT=CHUNK,
        GATE=kind, L2NORM=l2norm, CKPT=ckpt_idx is not None, TF32=tf32,
        FACTORIZED=kind == GATE_KDA_SAFE and CHUNK * abs(float(lower_bound)) <= 80.0,
        KB=min(16, triton.next_power_of_2(K)),
        num_warps=plan.num_warps,
    )
    return o
