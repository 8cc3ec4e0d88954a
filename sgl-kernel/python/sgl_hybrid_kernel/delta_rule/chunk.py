"""Host wrapper of the Triton chunked prefill: the multi-kernel chunk-64 form
(``chunk_parallel.py``, default) or the single sequential kernel (``triton_chunk.py``)."""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Tuple, Union

import torch
import triton

from sgl_hybrid_kernel.delta_rule.chunk_parallel import gated_delta_chunk_parallel, int32_to_device, seq_plan
from sgl_hybrid_kernel.delta_rule.dispatch import choose_group_scan, device_kind
from sgl_hybrid_kernel.delta_rule.slot_index import slot_indices, unit_stride
from sgl_hybrid_kernel.delta_rule.triton_chunk import gated_delta_chunk_kernel
from sgl_hybrid_kernel.delta_rule.triton_recurrent import GATE_GDN, GATE_KDA, GATE_KDA_SAFE

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
    value_tile: Optional[int] = None,
    num_warps: Optional[int] = None,
    tf32: Optional[bool] = None,
    out: Optional[torch.Tensor] = None,
    method: str = "auto",
    scratch_dtype: Optional[torch.dtype] = None,
    group_scan: Union[bool, str, None] = None,
    group_chunks: Optional[int] = None,
    seq_lens_cpu: Optional[Sequence[int]] = None,
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
        value_tile: ``BV`` (sequential default 32; parallel default: the device's launch table,
            ``chunk_parallel.CHUNK_LAUNCH``); num_warps: sequential default 8 (keeps sm_90 free of
            spills at ``BV`` 32); parallel default: the launch table; tf32: allow TF32 for
            the ``Aqk`` / ``w`` / ``u`` / state products (never the dependency matrix or its
            inverse); ``None`` (default): True for 16-bit activations on CUDA (the configuration
            the compile gate proves spill-free on sm_90), else False.
        method: ``"parallel"`` (four kernels, chunk 64, ``triton_chunk_parallel.py``),
            ``"sequential"`` (one kernel walking each sequence, chunk 16) or ``"auto"``:
            parallel for 16-bit activations with TF32 (measured 3.3x / 1.5x faster than
            sequential on the H200, docs/kernels.md), else sequential (FP32 activations:
            tests and references); on ROCm always parallel, with FP32 products (``tf32``
            ignored; the sequential kernel is not offered there: ValueError).
        scratch_dtype: parallel method only: dtype of its ``w``/``u``/``v_new``/``h``
            intermediates (default: the activations' dtype when 16-bit, else FP32).
        group_scan: state pass of the parallel method in group-scan mode (``chunk_group_scan.py``):
            ``None`` / ``False`` (default): plain; ``True``: on, groups of ``group_chunks`` chunks
            of 64 tokens (default: ``chunk_group_scan.auto_group_chunks`` on a GPU, else two groups per
            longest sequence, ``forced_group_chunks``), and
            ``method`` ``"auto"`` becomes ``"parallel"``; ``"auto"``: on when
            ``dispatch.choose_group_scan`` finds few sequences x heads and long sequences (logged
            once as op ``delta_rule_prefill_group_scan``). Outputs, checkpoints and final states
            equal the plain pass up to rounding.
        seq_lens_cpu: tokens per sequence on the host (e.g. SGLang's ``extend_seq_lens_cpu``), equal
            to ``cu_seqlens[1:] - cu_seqlens[:-1]`` with ``cu_seqlens[0] == 0`` (not checked on the
            device): the call then makes no host sync. Without it the wrapper reads ``cu_seqlens``
            once per call (``.tolist()``, a sync). Either way the chunk / group index tables are
            built once per distinct offsets and device and cached (``chunk_parallel.seq_plan``), so
            repeated calls (every layer of one forward) copy nothing to the device.

    Returns:
        ``o`` ``[N, HV, V]``.

    Raises:
        ValueError: bad ``gate``/layout/``method``/``group_scan``/``group_chunks``, a checkpoint not on
            the chunk grid, ``group_scan`` with ``method="sequential"``, ``seq_lens_cpu`` of another
            length than ``cu_seqlens`` has sequences or summing past ``q``'s tokens, a checkpoint slot
            past ``checkpoint_pool``, or (CPU tensors only: on a GPU it would sync) a slot of
            ``state_indices`` past ``state``. Index tensors may have any stride (made unit-stride here).
    """
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    S = cu_seqlens.numel() - 1
    kind = {"kda": GATE_KDA if lower_bound is None else GATE_KDA_SAFE, "gdn": GATE_GDN}.get(gate)
    if kind is None:
        raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")
    if method not in ("auto", "parallel", "sequential"):
        raise ValueError(f"method must be 'auto', 'parallel' or 'sequential', got {method!r}")
    if group_scan not in (None, False, True, "auto"):
        raise ValueError(f"group_scan must be None, False, True or 'auto', got {group_scan!r}")
    if group_chunks is not None and group_chunks < 1:
        raise ValueError(f"group_chunks must be >= 1, got {group_chunks}")
    if group_scan is True:
        if method == "sequential":
            raise ValueError("group_scan: the group-scan mode belongs to method='parallel', not 'sequential'")
        method = "parallel"

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
    plan = seq_plan(bos, q.device)
    lens = plan.lens
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
        has_initial_state = plan.ones
    # The kernels load index tensors as ``ptr + i``: unit stride (issue 42; no copy when contiguous, slot_index.py).
    state_indices = slot_indices("state_indices", state_indices, ("state", state.shape[0]))
    has_initial_state = unit_stride(has_initial_state.to(torch.int32))
    cu_seqlens = unit_stride(cu_seqlens)
    q, k, v, f, b = (x.contiguous() for x in (q, k, v, f, b))
    rocm = device_kind(q) == "rocm"
    if tf32 is None:
        tf32 = not rocm and q.element_size() == 2
    if method == "auto":
        # ROCm: always the chunk-64 form (the sequential kernel spills on CDNA; issue 9).
        method = "parallel" if rocm or (tf32 and q.element_size() == 2) else "sequential"
    if rocm:
        if method == "sequential":
            raise ValueError("method: 'sequential' is not offered on ROCm (it spills on CDNA); use 'parallel' or 'auto'")
        tf32 = False  # gfx950 has no xf32 matrix instructions; CDNA is compile-gated with FP32 products
    if method == "parallel":
        if scratch_dtype is None and q.element_size() == 2:
            scratch_dtype = q.dtype
        if group_scan is True and group_chunks is None:
            group_chunks = choose_group_scan(q, v, lens, forced=True)
        elif group_scan == "auto":
            group_chunks = choose_group_scan(q, v, lens, group_chunks=group_chunks)
        elif group_scan is not True:
            group_chunks = None
        return gated_delta_chunk_parallel(
            q, k, v, f, b, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state,
            kind, lower_bound, K ** -0.5 if scale is None else scale, l2norm, state_layout, checkpoints,
            checkpoint_pool, plan, value_tile=value_tile, tf32=tf32, scratch_dtype=scratch_dtype, out=out,
            num_warps=num_warps, group_chunks=group_chunks)
    if checkpoints:
        table = [-1] * (S * max_chunks)
        for seq, pos, dst in checkpoints:
            table[seq * max_chunks + triton.cdiv(pos, CHUNK) - 1] = dst
        ckpt_idx = int32_to_device(table, q.device).view(S, max_chunks)
    o = out if out is not None else torch.empty_like(v)
    cp = checkpoint_pool if ckpt_idx is not None else state
    value_tile = value_tile or 32
    gated_delta_chunk_kernel[(triton.cdiv(V, value_tile), S * HV)](
        q, k, v, f, b, o, A_log, dt_bias, cu_seqlens, state, state_indices, has_initial_state,
        cp, ckpt_idx if ckpt_idx is not None else state_indices, max_chunks,
        K ** -0.5 if scale is None else scale, 0.0 if lower_bound is None else float(lower_bound),
        *strides(state), *strides(cp),
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=value_tile, BT=CHUNK,
        GATE=kind, L2NORM=l2norm, CKPT=ckpt_idx is not None, TF32=tf32,
        FACTORIZED=kind == GATE_KDA_SAFE and CHUNK * abs(float(lower_bound)) <= 80.0,
        KB=min(16, triton.next_power_of_2(K)),
        num_warps=8 if num_warps is None else num_warps,
    )
    return o
