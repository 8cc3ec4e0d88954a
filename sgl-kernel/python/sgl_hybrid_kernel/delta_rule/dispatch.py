"""One dispatch function per gated-delta-rule op (KDA and GDN): Triton or plain torch.

Each picks by device and shape, logs its choice once (``sgl_hybrid_kernel.dispatch``)
and keeps the plain-torch reference for shapes outside a kernel's tested
contract. There is no aiter KDA/GDN kernel (aiter 0.x ships none), so on ROCm
the choice is Triton or torch. On ROCm the chunked prefill is the chunk-64 form
(``triton_chunk_parallel.py``) at the launch parameters of ``chunk_parallel.CHUNK_LAUNCH``
for the device's (arch, CU count), all compile-gated free of spills on gfx942 /
gfx950 (issue 9); the sequential kernel is CUDA-only.

Contract of the Triton kernels (else: torch): key and value head dims <= 256,
``HV % H == 0``, FP32 state pool, CUDA or ROCm device.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
import triton

from sgl_hybrid_kernel.delta_rule.chunk_parallel import device_chunk_launch
from sgl_hybrid_kernel.delta_rule.recurrent import (TOKPREP_MAX_TOKENS_GDN, TOKPREP_MAX_TOKENS_KDA,
                                                   device_value_tile_tuning, lanes_pdl, use_tokprep)
from sgl_hybrid_kernel.delta_rule.triton_recurrent import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.delta_rule.triton_lanes import lanes_v_first
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.platform import device_platform

logger = logging.getLogger(__name__)

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


def choose_recurrent(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"`` for decode / verify, with the reason logged once."""
    kind = device_kind(q)
    if kind == "cpu":
        record_choice("delta_rule_decode", "torch", "CPU tensors: plain-torch reference", log=logger)
        return "torch"
    why = _in_contract(q, v, state)
    if why:
        record_choice("delta_rule_decode", "torch", f"outside the Triton contract: {why}", log=logger)
        return "torch"
    tuning = device_value_tile_tuning(q.device)
    tiles = (f"value tiles tuned for {tuning.name} ({tuning.source})" if tuning.tuned
             else f"no tuned value-tile table for this device: {tuning.name}, {tuning.source}")
    paths = ("verify windows and V-major decode: one-warp per-token kernel (plain and all-modes binaries), except V-major "
             f"plain verify windows with >= {tuning.lanes_per_cu} (GDN below that: 8 columns from {tuning.lanes_narrow_per_cu} "
             f"at 8) and GDN windows of every mode with >= {tuning.lanes_all_modes_per_cu} programs per CU at 16 columns: "
             f"lanes kernel (per-token prologue + 8 key lanes, "
             f"Triton {triton.__version__}, V_FIRST={lanes_v_first()}, programmatic dependent launch={lanes_pdl(q.device)}, "
             f"for plain GDN windows {lanes_pdl(q.device, True, False)}, at 8 columns {lanes_pdl(q.device, True, False, 8)}); "
             "K-major decode: register-tile kernel; on CUDA, KDA's all-modes windows and plain verify windows at 4-8 "
             "columns: gate and beta exponentials / reciprocals without fix-ups (recurrent.use_fast_gate); on CUDA sm_90, "
             "one-warp tiles under 16 columns of the V-major pool: each token's key sums as one reduce-scatter across "
             "the warp (recurrent.use_xred; KDA plain verify then at 4 columns from B=1), and plain GDN verify windows of "
             f"2-{TOKPREP_MAX_TOKENS_GDN} tokens there with every token's norms, gates and betas computed before the "
             f"state's chain (TOKPREP, recurrent.use_tokprep: {use_tokprep(GATE_GDN, 5, True, 1)}) at 4 / 8 / 16 columns, "
             f"and plain KDA windows there of 2-{TOKPREP_MAX_TOKENS_KDA} tokens (per-key decays as one tile first, "
             f"TOKPREP: {use_tokprep(GATE_KDA_SAFE, 4, True, 1)}) at 4 / 8 columns, on the one-warp kernel at every batch)")
    record_choice("delta_rule_decode", f"triton:{tuning.name}", f"{kind}: triton_recurrent ({paths}); {tiles}", log=logger)
    return "triton"


def choose_chunk(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"`` for chunked prefill, with the reason logged once."""
    kind = device_kind(q)
    if kind == "cpu":
        record_choice("delta_rule_prefill", "torch", "CPU tensors: plain-torch reference", log=logger)
        return "torch"
    why = _in_contract(q, v, state)
    if why:
        record_choice("delta_rule_prefill", "torch", f"outside the Triton contract: {why}", log=logger)
        return "torch"
    if kind == "rocm":
        launch = device_chunk_launch(q.device)
        timed = "timed" if launch.tuned else "untimed"
        record_choice("delta_rule_prefill", f"triton:chunk64:{launch.name}",
                      f"rocm: triton_chunk_parallel (chunk 64, FP32 products), launch table {launch.name} "
                      f"({timed}; {launch.source}){_state_tiles(launch)}", log=logger)
        return "triton"
    if q.element_size() == 2:
        launch = device_chunk_launch(q.device)
        timed = "timed" if launch.tuned else "untimed"
        record_choice("delta_rule_prefill", f"triton:chunk64:{launch.name}",
                      f"cuda: triton_chunk_parallel (chunk 64, TF32 products, FP32 inverse), launch table "
                      f"{launch.name} ({timed}; {launch.source}){_state_tiles(launch)}", log=logger)
        return "triton"
    arch = device_platform(q.device).arch
    record_choice("delta_rule_prefill", "triton:bt16-bv32-w8",
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
        from sgl_hybrid_kernel.delta_rule.chunk_parallel import CUMSUM_ROW_LOOP_MIN_TRITON, TRITON_VERSION

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
            ``group_chunks`` the auto size, else ``chunk_group_scan.forced_group_chunks`` (2 groups).

    Auto rule (issue 4): on a GPU, on when the plain state pass's programs
    (sequences x value heads x value tiles) fit at least twice in one wave of the device, a
    sequence has at least ``chunk_group_scan.MIN_CHUNKS`` chunks of 64 tokens, and the
    mode was timed faster than the plain pass on this part
    (``chunk_group_scan.GROUP_SCAN_TIMED``; on the H200 it was not, so auto stays plain
    there); groups from ``chunk_group_scan.auto_group_chunks`` unless ``group_chunks`` is given.
    """
    from sgl_hybrid_kernel.delta_rule.chunk_group_scan import GROUP_SCAN_TIMED, MIN_CHUNKS, auto_group_chunks, forced_group_chunks

    HV, V = v.shape[-2], v.shape[-1]
    plat = device_platform(q.device)
    launch = device_chunk_launch(q.device)
    auto = auto_group_chunks(lens, HV, V, launch.state_bv, plat.num_compute_units) if plat.num_compute_units else None
    if forced:
        n = group_chunks or auto or forced_group_chunks(lens)
        record_choice(GROUP_SCAN_OP, "group_scan", "forced by the caller (group_scan=True)", log=logger)
        return n
    if plat.device == "cpu":
        record_choice(GROUP_SCAN_OP, "plain", "CPU tensors: auto mode needs a compute-unit count", log=logger)
        return None
    if auto is None:
        record_choice(GROUP_SCAN_OP, "plain",
                      f"sequences x value heads x value tiles leave no room for two replay copies in one wave of "
                      f"the {plat.num_compute_units} compute units, or no sequence has {MIN_CHUNKS} chunks", log=logger)
        return None
    faster, evidence = GROUP_SCAN_TIMED.get(launch.name, (False, f"not timed on {launch.name}"))
    if not faster:
        record_choice(GROUP_SCAN_OP, "plain", f"shape qualifies, but the mode is off on this part: {evidence}", log=logger)
        return None
    record_choice(GROUP_SCAN_OP, "group_scan",
                  f"few sequences x value heads for {plat.num_compute_units} compute units and a sequence of >= "
                  f"{MIN_CHUNKS} chunks: summaries + FP32 scan + parallel replay ({evidence})", log=logger)
    return group_chunks or auto
