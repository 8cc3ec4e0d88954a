"""One dispatch function per gated-delta-rule op (KDA and GDN): Triton or plain torch.

Each picks by device and shape, logs its choice once (``sgl_hybrid_kernel.dispatch``)
and keeps the plain-torch reference for shapes outside a kernel's tested
contract. There is no aiter KDA/GDN kernel (aiter 0.x ships none), so on ROCm
the choice is Triton or torch. On ROCm the chunked prefill is the chunk-64 form
(``triton_chunk_parallel.py``) at the launch parameters of ``chunk.parallel.CHUNK_LAUNCH``
for the device's (arch, CU count), all compile-gated free of spills on gfx942 /
gfx950 (issue 9); the sequential kernel is CUDA-only.

Contract of the Triton kernels (else: torch): key and value head dims <= 256,
``HV % H == 0``, FP32 state pool, CUDA or ROCm device.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.chunk.rules import CUMSUM_ROW_LOOP_MIN_TRITON
from sgl_hybrid_kernel.delta_rule.plan import group_scan_choice, plan_chunk, plan_recurrent_for
from sgl_hybrid_kernel.delta_rule.recurrent.rules import (TOKPREP_MAX_TOKENS_GDN, TOKPREP_MAX_TOKENS_KDA, lanes_pdl,
                                                          target_tuning, use_tokprep)
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import TRITON_VERSION
from sgl_hybrid_kernel.delta_rule.recurrent.triton_lanes import lanes_v_first
from sgl_hybrid_kernel.dispatch import KernelChoice, count_call, record_choice, recorded_choice
from sgl_hybrid_kernel.platform import Target

logger = logging.getLogger(__name__)

# The Triton choice recorded per (op, what decides it): a later call with the same key, while that
# choice is still the op's record, is only counted; its reason (the rules, tables and the first
# call's plan) is not rebuilt on every decode / prefill call, nor logged again per shape.
_RECORDED: Dict[Tuple, KernelChoice] = {}


def _already_recorded(key: Tuple) -> bool:
    first = _RECORDED.get(key)
    if first is not None and recorded_choice(key[0]) is first:
        count_call(first.op, first.impl)
        return True
    return False

MAX_HEAD_DIM = 256


def device_kind(t: torch.Tensor) -> str:
    """``"cpu"``, ``"cuda"`` or ``"rocm"`` for the tensor's device."""
    if t.device.type != "cuda":
        return "cpu"
    return "rocm" if torch.version.hip is not None else "cuda"


def _in_contract(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor) -> Optional[str]:
    H, K = q.shape[-2], q.shape[-1]
    HV, V = v.shape[-2], v.shape[-1]
    if K > MAX_HEAD_DIM or V > MAX_HEAD_DIM:
        return f"head dims K={K}, V={V} above {MAX_HEAD_DIM}"
    if HV % H:
        return f"HV={HV} not a multiple of H={H}"
    if state.dtype != torch.float32:
        return f"state dtype {state.dtype} (kernels keep FP32 state)"
    return None


def choose_recurrent(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor, tokens: int = 1,
                     gate_kind: Optional[int] = None, state_layout: str = "vk") -> str:
    """``"triton"`` or ``"torch"`` for decode / verify, with the reason logged once: the tile table, the rules and,
    given ``gate_kind`` (``gate.GATE_*``), the plan (``plan.plan_recurrent``) of this first call's shape (``q``
    ``[B * tokens, H, K]``, ``v`` ``[B * tokens, HV, V]``, ``state`` the pool of ``state_layout``)."""
    kind = device_kind(q)
    if kind == "cpu":
        record_choice("delta_rule_decode", "torch", "CPU tensors: plain-torch reference", log=logger)
        return "torch"
    why = _in_contract(q, v, state)
    if why:
        record_choice("delta_rule_decode", "torch", f"outside the Triton contract: {why}", log=logger)
        return "torch"
    target = Target.of(q.device)
    key = ("delta_rule_decode", target, gate_kind, state_layout)
    if _already_recorded(key):
        return "triton"
    tuning = target_tuning(target)
    tiles = (f"value tiles tuned for {tuning.name} ({tuning.source})" if tuning.tuned
             else f"no tuned value-tile table for this device: {tuning.name}, {tuning.source}")
    paths = ("verify windows and V-major decode: one-warp per-token kernel (plain and all-modes binaries), except V-major "
             f"plain verify windows with >= {tuning.lanes_per_cu} (GDN below that: 8 columns from {tuning.lanes_narrow_per_cu} "
             f"at 8) and GDN windows of every mode with >= {tuning.lanes_all_modes_per_cu} programs per CU at 16 columns: "
             f"lanes kernel (per-token prologue + 8 key lanes, "
             f"Triton {triton.__version__}, V_FIRST={lanes_v_first()}, programmatic dependent launch={lanes_pdl(target)}, "
             f"for plain GDN windows {lanes_pdl(target, True, False)}, at 8 columns {lanes_pdl(target, True, False, 8)}); "
             "K-major decode: register-tile kernel; on CUDA, KDA's all-modes windows and plain verify windows at 4-8 "
             "columns: gate and beta exponentials / reciprocals without fix-ups (recurrent.rules.use_fast_gate); on CUDA "
             "sm_90, one-warp tiles under 16 columns of the V-major pool: each token's key sums as one reduce-scatter "
             "across the warp (recurrent.rules.use_xred; KDA plain verify then at 4 columns from B=1), and plain GDN verify windows of "
             f"2-{TOKPREP_MAX_TOKENS_GDN} tokens there with every token's norms, gates and betas computed before the "
             f"state's chain (TOKPREP, recurrent.rules.use_tokprep: {use_tokprep(GATE_GDN, 5, True, 1)}) at 4 / 8 / 16 columns, "
             f"and plain KDA windows there of 2-{TOKPREP_MAX_TOKENS_KDA} tokens (per-key decays as one tile first, "
             f"TOKPREP: {use_tokprep(GATE_KDA_SAFE, 4, True, 1)}) at 4 / 8 columns, on the one-warp kernel at every batch)")
    first = ""
    if gate_kind is not None:
        try:
            first = "; plan of the first call: " + plan_recurrent_for(q, v, state, tokens, gate_kind, state_layout,
                                                                      target=target).describe()
        except ValueError as exc:  # a shape the wrapper will refuse anyway; the log says why
            first = f"; no plan for the first call ({exc})"
    _RECORDED[key] = record_choice("delta_rule_decode", f"triton:{tuning.name}",
                                   f"{kind}: triton_recurrent ({paths}); {tiles}{first}", log=logger)
    return "triton"


def choose_chunk(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor, gate_kind: Optional[int] = None,
                 lower_bound: Optional[float] = None) -> str:
    """``"triton"`` or ``"torch"`` for chunked prefill, with the reason logged once and, given ``gate_kind``
    (``gate.GATE_*``; ``lower_bound``: KDA's bound), the plan (``plan.plan_chunk``) of one 4,096-token sequence of
    ``q`` ``[N, H, K]`` / ``v`` ``[N, HV, V]``'s heads and dtype."""
    kind = device_kind(q)
    if kind == "cpu":
        record_choice("delta_rule_prefill", "torch", "CPU tensors: plain-torch reference", log=logger)
        return "torch"
    why = _in_contract(q, v, state)
    if why:
        record_choice("delta_rule_prefill", "torch", f"outside the Triton contract: {why}", log=logger)
        return "torch"
    target = Target.of(q.device)
    key = ("delta_rule_prefill", target, kind, q.dtype, v.shape[-2], v.shape[-1], gate_kind, lower_bound)
    if _already_recorded(key):
        return "triton"
    plan = plan_chunk([4096], v.shape[-2], v.shape[-1], GATE_KDA_SAFE if gate_kind is None else gate_kind,
                      -5.0 if gate_kind is None else lower_bound, q.dtype, target)
    shown = "" if gate_kind is None else f"; plan: {plan.describe()}"
    if plan.method == "parallel":
        launch = plan.launch
        timed = "timed" if launch.tuned else "untimed"
        products = "FP32 products" if kind == "rocm" else "TF32 products, FP32 inverse"
        _RECORDED[key] = record_choice("delta_rule_prefill", f"triton:chunk64:{launch.name}",
                                       f"{kind}: triton_chunk_parallel (chunk 64, {products}), launch table "
                                       f"{launch.name} ({timed}; {launch.source}){_state_tiles(launch)}{shown}",
                                       log=logger)
        return "triton"
    arch = target.arch
    _RECORDED[key] = record_choice(
        "delta_rule_prefill", "triton:bt16-bv32-w8",
        f"cuda, FP32 activations: triton_chunk BT=16 BV=32 num_warps=8 (FP32 products; measured on sm90, "
        f"not in the compile gate's spill-free set{'' if arch == 'sm90' else f'; untuned on {arch}'})", log=logger)
    return "triton"


def _state_tiles(launch) -> str:
    """The log's notes on what the launch table changes by batch and gate: the state pass's value tile
    (``pick_state_tile``), where the state pass forms the output (``use_fused_output``), and the KDA ``A``
    programs' form (``intra_aqk_tf32``)."""
    notes = ""
    if launch.state_bv_costs:
        cols = "/".join(str(bv) for bv, _ in launch.state_bv_costs)
        notes += f"; state pass {cols} value columns by batch (16-bit scratch, no checkpoints)"
    if launch.fuse_output_gdn:
        notes += "; GDN: the state pass forms the output"
    if launch.fuse_output_kda_bv:
        cols = "/".join(str(bv) for bv in launch.fuse_output_kda_bv)
        notes += f"; KDA: the state pass forms the output at {cols} value columns"
    if launch.intra_aqk_tf32:
        notes += "; KDA A programs: A 3xTF32, Aqk one TF32 product (bounded gate)"
    if launch.cumsum_row_loop:
        on = TRITON_VERSION >= CUMSUM_ROW_LOOP_MIN_TRITON
        notes += (f"; gate cumsum: {'row loop' if on else 'tl.cumsum'} (Triton "
                  f"{'.'.join(map(str, TRITON_VERSION))}; row loop from {'.'.join(map(str, CUMSUM_ROW_LOOP_MIN_TRITON))})")
    return notes


GROUP_SCAN_OP = "delta_rule_prefill_group_scan"


def choose_group_scan(q: torch.Tensor, v: torch.Tensor, lens: Sequence[int], group_chunks: Optional[int] = None,
                      forced: bool = False) -> Optional[int]:
    """Chunks per group for the chunk-64 prefill's group-scan mode, or ``None`` for the plain state
    pass; the decision is logged once per kind (op ``delta_rule_prefill_group_scan``).

    Args:
        q: ``[N, H, K]``; v: ``[N, HV, V]``; lens: tokens per sequence.
        group_chunks: the caller's group size, used when the mode is on.
        forced: the caller asked for the mode (``group_scan=True``): always on; without
            ``group_chunks`` the auto size, else ``chunk.group_scan.forced_group_chunks`` (2 groups).

    The rule: ``plan.group_scan_choice``.
    """
    n, impl, reason = group_scan_choice(lens, v.shape[-2], v.shape[-1], Target.of(q.device), group_chunks, forced)
    record_choice(GROUP_SCAN_OP, impl, reason, log=logger)
    return n
