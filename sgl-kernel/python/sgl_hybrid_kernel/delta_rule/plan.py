"""Plans of the gated delta rule's Triton kernels: the one place where a kernel, its tile and its modes are
chosen (issue 43).

A plan is a pure function of the computation's shapes and a :class:`~sgl_hybrid_kernel.platform.Target`
(vendor, arch, compute units, interpreter, Triton version), read from the per-architecture tables beside the
rules (``recurrent/tiles.json``; the chunk-64 launch table ``chunk/launch.json``). The wrappers take a plan
(``plan=``) or make the default one; the dispatcher logs it; the compile gate and the benchmarks enumerate
plans; ``docs/kernels.md``'s dispatch table is generated from them (:func:`dispatch_table_markdown`).

Design after fla's op folders (an op's wrappers take only what describes the computation) and FlashInfer's
kernel registry (a table row is a promise the compile gate checks); no code from either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

from sgl_hybrid_kernel.delta_rule.chunk import group_scan as gs
from sgl_hybrid_kernel.delta_rule.chunk import rules as chunk_rules
from sgl_hybrid_kernel.delta_rule.chunk.rules import ChunkLaunch
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.delta_rule.recurrent import rules
from sgl_hybrid_kernel.delta_rule.recurrent.triton_lanes import lanes_v_first, prep_heads_per_program
from sgl_hybrid_kernel.platform import Target

RECURRENT_KERNELS = ("one_warp", "register", "lanes", "window")


@dataclass(frozen=True)
class RecurrentOverrides:
    """Experiment overrides of a decode / verify plan (benchmarks, tests, replays that must repeat a verify's
    choices); ``None`` everywhere = the served default. Each field as :func:`plan_recurrent` documents it."""

    value_tile: Optional[int] = None
    num_warps: Optional[int] = None
    preload: Optional[bool] = None
    wide: Optional[bool] = None
    form: Optional[str] = None
    dot_precision: Optional[str] = None
    key_lanes: Optional[int] = None
    num_stages: Optional[int] = None
    xred: Optional[int] = None
    tokprep: Optional[bool] = None


@dataclass(frozen=True)
class RecurrentPlan:
    """What one decode / verify step launches.

    Attributes:
        shape: ``(B, T, H, HV, K, V, gate_kind, state_layout, plain)`` the plan was made for; the wrapper
            refuses a plan of another shape (``ValueError``).
        kernel: ``"one_warp"`` (``triton_recurrent.gated_delta_verify_wide_kernel``), ``"register"``
            (``gated_delta_recurrent_kernel``), ``"lanes"`` (``triton_lanes.token_prep_kernel`` +
            ``gated_delta_verify_lanes_kernel``) or ``"window"`` (``triton_window.gated_delta_window_kernel``).
        value_tile: value columns per program; num_warps: warps per program (the lanes kernel's).
        table: the tile table's name (``recurrent/tiles.json`` row or ``default(<arch>x<CUs>)``).
        fast, xred, seq, tokprep: one-warp kernel modes (``FAST``, ``XRED``, ``SEQ``, ``TOKPREP``).
        preload: register-tile kernel's ``PRELOAD``.
        key_lanes, pdl, fold, v_first, prep_heads, prep_warps, num_stages: the lanes pair's ``KL``, programmatic
            dependent launch, ``FOLD``, ``V_FIRST``, the prologue's ``HB`` and warps, the lanes kernel's stages.
        dot_precision: the window kernel's ``tl.dot`` input precision.
    """

    shape: Tuple
    kernel: str
    value_tile: int
    num_warps: int
    table: str
    fast: bool = False
    xred: int = 0
    seq: bool = False
    tokprep: bool = False
    preload: bool = False
    key_lanes: int = 0
    pdl: bool = False
    fold: bool = False
    v_first: bool = False
    prep_heads: int = 1
    prep_warps: int = 1
    num_stages: int = 1
    dot_precision: str = "ieee"

    def describe(self) -> str:
        """One line for logs and tables, e.g. ``one_warp BV=4 w1 XRED SEQ [sm90x132]``."""
        modes = {"one_warp": [("FAST", self.fast), (f"XRED{self.xred}", self.xred), ("SEQ", self.seq),
                              ("TOKPREP", self.tokprep)],
                 "register": [("PRELOAD", self.preload)],
                 "lanes": [(f"KL{self.key_lanes}", True), ("PDL", self.pdl), ("FOLD", self.fold)],
                 "window": [(self.dot_precision, True)]}[self.kernel]
        on = " ".join(name for name, flag in modes if flag)
        return f"{self.kernel} BV={self.value_tile} w{self.num_warps}{' ' + on if on else ''} [{self.table}]"


def plan_recurrent(batch: int, tokens: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                   gate_kind: int, state_layout: str, target: Target, *, plain: bool = True, snapshots: bool = False,
                   key_stride: int = 1, state_fp32: bool = True, pools_aligned: bool = True,
                   state_aligned: bool = True, overrides: Optional[RecurrentOverrides] = None) -> RecurrentPlan:
    """The kernel, tile and modes of one decode / verify step (the rules: ``recurrent/rules.py``, docs/kernels.md
    "Decode and verify tile rules").

    Args:
        batch, tokens: ``B`` requests of ``T`` tokens (``T`` in 1..16); num_k_heads, num_v_heads: ``H``, ``HV``;
            head_k_dim, head_v_dim: ``K``, ``V``.
        gate_kind: ``gate.GATE_KDA`` / ``GATE_KDA_SAFE`` / ``GATE_GDN``.
        state_layout: ``"vk"`` (``[slots, HV, V, K]``) or ``"kv"``.
        target: what the plan is for (:meth:`Target.of` a device).
        plain: no snapshots, deferred commit or fused replay (the ``PLAIN`` binary); snapshots: per-token states
            are written (``inter_state``).
        key_stride: the pool's key-axis stride in elements; state_fp32: the pool is FP32.
        pools_aligned: :func:`recurrent.rules.xred_aligned` of the pool and the snapshot pool; state_aligned: of the
            pool alone (``SEQ`` must answer alike with and without snapshots).
        overrides: :class:`RecurrentOverrides` (``None``: the served default). ``value_tile`` (power of two);
            ``num_warps``; ``preload`` (register kernel; given alone it selects that kernel); ``wide`` (the one-warp
            kernel, ``False``: the register kernel); ``form`` (``"recurrent"`` or ``"chunk"``: the window kernel,
            T <= 8, no snapshots); ``dot_precision`` (window); ``key_lanes`` (V-major: the lanes kernel with that
            many key lanes, 0: the one-warp kernel); ``num_stages`` (lanes); ``xred`` (0 / 1 / 2, one-warp);
            ``tokprep`` (one-warp plain windows with ``xred``).

    Returns:
        :class:`RecurrentPlan`.

    Raises:
        ValueError: ``tokens`` outside 1..16, unknown ``state_layout`` / ``form``, or overrides outside a kernel's
            contract (``xred`` with the register or lanes kernel or off its shape rule, ``tokprep`` off plain
            ``xred`` windows of 2-10 tokens, ``form="chunk"`` with snapshots or T > 8, lanes off their shapes).
    """
    o = overrides or RecurrentOverrides()
    B, T, H, HV, K, V = batch, int(tokens), num_k_heads, num_v_heads, head_k_dim, head_v_dim
    if not 1 <= T <= 16:
        raise ValueError(f"tokens must be in 1..16, got {T}")
    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout must be 'kv' or 'vk', got {state_layout!r}")
    shape = (B, T, H, HV, K, V, gate_kind, state_layout, plain)
    tuning = rules.target_tuning(target)
    per_channel = gate_kind != GATE_GDN
    form = o.form or "recurrent"
    if form == "chunk":
        if snapshots or T > 8:
            raise ValueError(f"form='chunk' serves windows of T <= 8 without inter_state (T={T}, inter_state={snapshots})")
        return RecurrentPlan(shape, "window", o.value_tile or rules.window_value_tile(B, HV, V),
                             o.num_warps or rules.window_num_warps(target), tuning.name,
                             dot_precision=o.dot_precision or rules.window_dot_precision(target))
    if form != "recurrent":
        raise ValueError(f"form must be 'recurrent', 'chunk' or None, got {form!r}")
    wide = o.wide
    if wide is None:
        wide = o.preload is None and rules.use_wide_verify(B, T, state_layout)
    if not wide:
        if o.xred:
            raise ValueError(f"xred={o.xred} is a mode of the one-warp kernel (wide=True); this call runs the register-tile "
                             f"kernel")
        bv = o.value_tile or rules.pick_value_tile(B, HV, V, T, state_layout, tuning, per_channel)
        return RecurrentPlan(shape, "register", bv, o.num_warps or rules.recurrent_num_warps(bv, T, state_layout),
                             tuning.name,
                             preload=rules.recurrent_preload(bv, T, per_channel) if o.preload is None else bool(o.preload))
    warps1 = o.num_warps or 1
    # whether the one-warp kernel's narrow tiles would run XRED (the tile rules below depend on it)
    xr_narrow = (rules.use_xred(target, state_layout, key_stride, K, 4, warps1, pools_aligned) if o.xred is None
                 else bool(o.xred))
    # a plain window the one-warp kernel would prepare (TOKPREP, which runs with XRED): its own tile rules
    prepped = bool(xr_narrow) and o.tokprep is not False and rules.use_tokprep(gate_kind, T, plain, 1)
    lanes = None
    if state_layout == "vk":
        if o.key_lanes is None and o.value_tile is None and o.xred is None and key_stride == 1 and state_fp32:
            lanes = rules.pick_lanes_tile(B, HV, V, K, T, per_channel, tuning, plain, xr_narrow, prepped)
        elif o.key_lanes:
            if o.xred:
                raise ValueError(f"xred={o.xred} is a mode of the one-warp kernel; key_lanes={o.key_lanes} runs the "
                                 f"lanes kernel")
            lanes = (o.value_tile or 16, int(o.key_lanes))
    if lanes is not None:
        bv, kl = lanes
        if not rules.lanes_shape_ok(K, V, bv, kl):
            raise ValueError(f"key_lanes={kl} / value_tile={bv}: the lanes kernel needs a power-of-two K divisible by "
                             f"4 * key_lanes and V divisible by value_tile (K={K}, V={V})")
        if key_stride != 1 or not state_fp32:
            raise ValueError("key_lanes: the lanes kernel needs an FP32 V-major pool [slots, HV, V, K] with key stride 1")
        hb = prep_heads_per_program(HV, B * T, tuning.num_compute_units)
        return RecurrentPlan(shape, "lanes", bv, 1, tuning.name, key_lanes=kl,
                             pdl=rules.lanes_pdl(target, plain, per_channel, bv), fold=rules.lanes_fold(target),
                             v_first=lanes_v_first(), prep_heads=hb, prep_warps=2 if hb == 8 else 1,
                             num_stages=o.num_stages or 1)
    bv = o.value_tile or (rules.pick_wide_tile(B, HV, V, state_layout, tuning, T, per_channel, xr_narrow, prepped) if plain
                          else rules.pick_deferred_tile(B, HV, V, state_layout, tuning))
    xr = (rules.use_xred(target, state_layout, key_stride, K, bv, warps1, pools_aligned, prepped) if o.xred is None
          else int(o.xred))
    if xr not in (0, 1, 2):
        raise ValueError(f"xred must be 0, 1 or 2, got {o.xred!r}")
    if xr and not rules.xred_shape_ok(state_layout, key_stride, K, bv, warps1, pools_aligned):
        raise ValueError(f"xred={xr}: the one-warp kernel with one warp on a V-major pool with key stride 1, "
                         f"65 <= K <= 128, 2 to 16 value columns and an aligned pool (recurrent.rules.xred_aligned) "
                         f"(state_layout={state_layout!r}, K={K}, value_tile={bv}, num_warps={warps1}, "
                         f"aligned={pools_aligned})")
    seq = rules.use_seq_key_sums(target, state_layout, key_stride, K, warps1, state_aligned)
    tp = rules.use_tokprep(gate_kind, T, plain, xr) if o.tokprep is None else bool(o.tokprep)
    if tp and not (plain and xr and 2 <= T <= 10):
        raise ValueError(f"tokprep=True: plain windows of 2 to 10 tokens on the one-warp kernel with xred "
                         f"(gate_kind={gate_kind}, T={T}, plain={plain}, xred={xr})")
    return RecurrentPlan(shape, "one_warp", bv, warps1, tuning.name,
                         fast=rules.use_fast_gate(target, gate_kind, T, bv, plain), xred=xr, seq=seq, tokprep=tp)


def with_overrides(plan: RecurrentPlan, **fields) -> RecurrentPlan:
    """A copy of ``plan`` with ``fields`` replaced (benchmark variants built from a served plan).

    Raises:
        ValueError: an unknown field, or ``kernel`` not one of :data:`RECURRENT_KERNELS`.
    """
    unknown = set(fields) - set(RecurrentPlan.__dataclass_fields__)
    if unknown:
        raise ValueError(f"fields: unknown RecurrentPlan fields {sorted(unknown)}")
    if fields.get("kernel", plan.kernel) not in RECURRENT_KERNELS:
        raise ValueError(f"kernel must be one of {RECURRENT_KERNELS}, got {fields['kernel']!r}")
    return dataclasses.replace(plan, **fields)


def plan_recurrent_for(q: torch.Tensor, v: torch.Tensor, state: torch.Tensor, tokens: int, gate_kind: int,
                       state_layout: str, inter_state: Optional[torch.Tensor] = None, plain: bool = True,
                       overrides: Optional[RecurrentOverrides] = None, target: Optional[Target] = None) -> RecurrentPlan:
    """:func:`plan_recurrent` for a call's tensors: ``q`` ``[B * T, H, K]``, ``v`` ``[B * T, HV, V]``, the pool
    ``state`` (its key stride, dtype and alignment), the snapshot pool ``inter_state`` if any; ``target``
    defaults to ``Target.of(q.device)``.

    Raises:
        ValueError: as :func:`plan_recurrent`, or ``q``'s rows not a multiple of ``tokens``.
    """
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    T = int(tokens)
    if T < 1 or N % T:
        raise ValueError(f"q: {N} rows are not a multiple of tokens={T}")
    key_stride = state.stride(3)  # the key axis of a V-major pool (the rules read it only for "vk")
    return plan_recurrent(N // T, T, H, HV, K, V, gate_kind, state_layout, target or Target.of(q.device), plain=plain,
                          snapshots=inter_state is not None, key_stride=key_stride,
                          state_fp32=state.dtype == torch.float32,
                          pools_aligned=rules.xred_aligned(state, inter_state), state_aligned=rules.xred_aligned(state),
                          overrides=overrides)

# --- chunked prefill --------------------------------------------------------------------------------------------

CHUNK_METHODS = ("auto", "parallel", "sequential")
SEQUENTIAL_VALUE_TILE, SEQUENTIAL_WARPS = 32, 8  # the sequential kernel's spill-free sm_90 launch (compile gate)


@dataclass(frozen=True)
class ChunkOverrides:
    """Experiment overrides of a chunked-prefill plan (benchmarks, tests); ``None`` everywhere = the served
    default. Each field as :func:`plan_chunk` documents it."""

    method: str = "auto"
    value_tile: Optional[int] = None
    num_warps: Optional[int] = None
    tf32: Optional[bool] = None
    scratch_dtype: Optional[torch.dtype] = None
    group_scan: Union[bool, str, None] = None
    group_chunks: Optional[int] = None
    launch: Optional[ChunkLaunch] = None
    fuse_output: Optional[bool] = None


@dataclass(frozen=True)
class ChunkPlan:
    """What one chunked prefill launches.

    Attributes:
        method: ``"parallel"`` (chunk-64, ``triton_chunk_parallel.py``) or ``"sequential"`` (``triton_chunk.py``).
        launch: the chunk-64 table row (``chunk/launch.json``; ``None`` for the sequential kernel).
        tf32: TF32 products allowed; scratch_dtype: the chunk-64 intermediates' dtype (``None``: FP32).
        group_chunks: chunks per group of the group-scan state pass (``None``: the plain pass);
            group_scan_choice: ``(impl, reason)`` to log as op ``delta_rule_prefill_group_scan`` (``None``: none made).
        state_tile: the plain state pass's value columns (``None``: the table's ``state_bv`` / ``state_bv_ckpt``).
        fuse_output: the state pass forms the output; lowp_scratch: 16-bit scratch and the plain state pass.
        value_tile, num_warps: overrides of the table's tiles / warps (sequential: its tile and warps).
        interpret: kernels run in the interpreter (CPU tensors, or a target with ``interpreter``).
    """

    method: str
    launch: Optional[ChunkLaunch]
    tf32: bool
    scratch_dtype: Optional[torch.dtype] = None
    group_chunks: Optional[int] = None
    group_scan_choice: Optional[Tuple[str, str]] = None
    state_tile: Optional[int] = None
    fuse_output: bool = False
    lowp_scratch: bool = False
    value_tile: Optional[int] = None
    num_warps: Optional[int] = None
    interpret: bool = False

    def describe(self) -> str:
        """One line for logs and tables, e.g. ``chunk64 [sm90x132] TF32 state BV=32 fused-o``."""
        if self.method == "sequential":
            return f"sequential BT=16 BV={self.value_tile} w{self.num_warps}{' TF32' if self.tf32 else ''}"
        bits = [f"chunk64 [{self.launch.name}]", "TF32" if self.tf32 else "FP32 products"]
        if self.state_tile:
            bits.append(f"state BV={self.state_tile}")
        if self.group_chunks:
            bits.append(f"group scan x{self.group_chunks}")
        if self.fuse_output:
            bits.append("fused-o")
        return " ".join(bits)


def group_scan_choice(lens: Sequence[int], num_v_heads: int, head_v_dim: int, target: Target,
                      group_chunks: Optional[int] = None, forced: bool = False) -> Tuple[Optional[int], str, str]:
    """``(chunks per group or None, impl, reason)`` of the chunk-64 prefill's group-scan mode (issue 4).

    Args:
        lens: tokens per sequence; num_v_heads, head_v_dim: ``HV``, ``V``; target: the device's.
        group_chunks: the caller's group size, used when the mode is on.
        forced: the caller asked for the mode (``group_scan=True``): always on; without ``group_chunks`` the auto
            size, else ``chunk.group_scan.forced_group_chunks`` (2 groups).

    Auto rule: on a GPU, on when the plain state pass's programs (sequences x value heads x value tiles) fit at
    least twice in one wave of the device, a sequence has at least ``chunk.group_scan.MIN_CHUNKS`` chunks of 64
    tokens, and the mode was timed faster than the plain pass on this part (``chunk.group_scan.GROUP_SCAN_TIMED``;
    on the H200 it was not, so auto stays plain there); groups from ``chunk.group_scan.auto_group_chunks``.
    """
    cus = target.num_compute_units
    launch = chunk_rules.target_chunk_launch(target)
    auto = gs.auto_group_chunks(lens, num_v_heads, head_v_dim, launch.state_bv, cus) if cus else None
    if forced:
        return group_chunks or auto or gs.forced_group_chunks(lens), "group_scan", "forced by the caller (group_scan=True)"
    if target.vendor == "cpu":
        return None, "plain", "CPU tensors: auto mode needs a compute-unit count"
    if auto is None:
        return None, "plain", (f"sequences x value heads x value tiles leave no room for two replay copies in one wave "
                               f"of the {cus} compute units, or no sequence has {gs.MIN_CHUNKS} chunks")
    faster, evidence = gs.GROUP_SCAN_TIMED.get(launch.name, (False, f"not timed on {launch.name}"))
    if not faster:
        return None, "plain", f"shape qualifies, but the mode is off on this part: {evidence}"
    return (group_chunks or auto, "group_scan",
            f"few sequences x value heads for {cus} compute units and a sequence of >= {gs.MIN_CHUNKS} chunks: "
            f"summaries + FP32 scan + parallel replay ({evidence})")


def plan_chunk(lens: Sequence[int], num_v_heads: int, head_v_dim: int, gate_kind: int, lower_bound: Optional[float],
               activation_dtype: torch.dtype, target: Target, *, checkpoints: bool = False,
               overrides: Optional[ChunkOverrides] = None) -> ChunkPlan:
    """Form, table row, tiles and modes of one chunked prefill (docs/kernels.md "Chunked prefill rules").

    Args:
        lens: tokens per sequence (host ints); num_v_heads, head_v_dim: ``HV``, ``V``.
        gate_kind: ``GATE_KDA`` / ``GATE_KDA_SAFE`` / ``GATE_GDN``; lower_bound: the KDA safe gate's bound.
        activation_dtype: q / k / v dtype (16-bit: chunk-64 with TF32 on CUDA); target: the device's.
        checkpoints: the call writes checkpoints (narrower state tiles, no fused output).
        overrides: :class:`ChunkOverrides`. ``method`` ``"auto"`` / ``"parallel"`` / ``"sequential"``; ``tf32``;
            ``scratch_dtype`` (chunk-64 intermediates; default the activations' when 16-bit); ``group_scan``
            (``None`` / ``False``: plain; ``True``: on, ``method`` ``"auto"`` becomes ``"parallel"``; ``"auto"``:
            :func:`group_scan_choice`); ``group_chunks``; ``launch`` (a ``ChunkLaunch`` row instead of the target's);
            ``fuse_output``; ``value_tile`` / ``num_warps``.

    Returns:
        :class:`ChunkPlan`.

    Raises:
        ValueError: unknown ``method`` / ``group_scan``, ``group_chunks < 1``, ``group_scan=True`` with
            ``method="sequential"``, or ``method="sequential"`` on ROCm (it spills on CDNA).
    """
    o = overrides or ChunkOverrides()
    method, group_scan = o.method, o.group_scan
    if method not in CHUNK_METHODS:
        raise ValueError(f"method must be 'auto', 'parallel' or 'sequential', got {method!r}")
    if group_scan not in (None, False, True, "auto"):
        raise ValueError(f"group_scan must be None, False, True or 'auto', got {group_scan!r}")
    if o.group_chunks is not None and o.group_chunks < 1:
        raise ValueError(f"group_chunks must be >= 1, got {o.group_chunks}")
    if group_scan is True:
        if method == "sequential":
            raise ValueError("group_scan: the group-scan mode belongs to method='parallel', not 'sequential'")
        method = "parallel"
    rocm = target.vendor == "rocm"
    half = torch.empty((), dtype=activation_dtype).element_size() == 2
    tf32 = (not rocm and half) if o.tf32 is None else o.tf32
    if method == "auto":
        # ROCm: always the chunk-64 form (the sequential kernel spills on CDNA; issue 9).
        method = "parallel" if rocm or (tf32 and half) else "sequential"
    if rocm:
        if method == "sequential":
            raise ValueError("method: 'sequential' is not offered on ROCm (it spills on CDNA); use 'parallel' or 'auto'")
        tf32 = False  # gfx950 has no xf32 matrix instructions; CDNA is compile-gated with FP32 products
    if method == "sequential":
        return ChunkPlan("sequential", None, tf32, value_tile=o.value_tile or SEQUENTIAL_VALUE_TILE,
                         num_warps=SEQUENTIAL_WARPS if o.num_warps is None else o.num_warps,
                         interpret=target.vendor == "cpu" or target.interpreter)
    scratch = o.scratch_dtype if o.scratch_dtype is not None or not half else activation_dtype
    group_chunks, choice = o.group_chunks, None
    if group_scan is True and group_chunks is None:
        group_chunks, *choice = group_scan_choice(lens, num_v_heads, head_v_dim, target, forced=True)
    elif group_scan == "auto":
        group_chunks, *choice = group_scan_choice(lens, num_v_heads, head_v_dim, target, group_chunks=group_chunks)
    elif group_scan is not True:
        group_chunks = None
    launch = o.launch or chunk_rules.target_chunk_launch(target)
    sd_bytes = 4 if scratch is None else torch.empty((), dtype=scratch).element_size()
    state_tile = None
    if launch.state_bv_costs and not checkpoints and not group_chunks and sd_bytes == 2:
        # 16-bit scratch only: with FP32 scratch the wider tiles exceed sm_90's shared memory (CPU: no CUs)
        state_tile = chunk_rules.pick_state_tile(launch, len(lens) * num_v_heads, head_v_dim, target.num_compute_units or 0)
    lowp = sd_bytes == 2 and not group_chunks
    fuse = o.fuse_output
    if fuse is None:
        fuse = chunk_rules.use_fused_output(launch, gate_kind, lowp, checkpoints, lower_bound, tf32,
                                            state_tile if state_tile is not None else launch.state_bv)
    return ChunkPlan("parallel", launch, tf32, scratch, group_chunks, tuple(choice) if choice else None, state_tile,
                     bool(fuse), lowp, o.value_tile, o.num_warps, target.vendor == "cpu" or target.interpreter)


# --- the docs' dispatch table -------------------------------------------------------------------------------------

DOC_TRITON = (3, 8)  # the Triton the pinned torch installs; the table is generated for it
DOC_TARGETS = (("H200 `sm90x132`", Target("cuda", "sm90", 132, False, DOC_TRITON)),
               ("MI300X `gfx942x304`", Target("rocm", "gfx942", 304, False, DOC_TRITON)),
               ("MI355X `gfx950x256`", Target("rocm", "gfx950", 256, False, DOC_TRITON)))
# (label, gate kind, H, HV, T, batches, mode): Kimi K3 TP8's KDA share (12 heads of 128), Qwen3.8's GDN (16 / 48)
DOC_RECURRENT_CASES = (
    ("KDA decode", GATE_KDA_SAFE, 12, 12, 1, (1, 16, 32), "plain"),
    ("KDA verify T=4", GATE_KDA_SAFE, 12, 12, 4, (1, 32), "plain"),
    ("KDA verify T=4, snapshots", GATE_KDA_SAFE, 12, 12, 4, (32,), "snapshots"),
    ("GDN decode", GATE_GDN, 16, 48, 1, (1,), "plain"),
    ("GDN verify T=5", GATE_GDN, 16, 48, 5, (1, 2, 32), "plain"),
    ("GDN verify T=5, deferred", GATE_GDN, 16, 48, 5, (32,), "deferred"),
)
DOC_CHUNK_CASES = (("KDA prefill", GATE_KDA_SAFE, -5.0, 12, ((1, 65536), (8, 16384))),
                   ("GDN prefill", GATE_GDN, None, 48, ((1, 32768), (4, 8192))))


def dispatch_table_markdown() -> str:
    """The dispatch table of docs/kernels.md: the plan of each served shape (BF16 activations, V-major FP32 pool,
    aligned, 128-dim heads) on each table's target, under :data:`DOC_TRITON` and the default environment.
    ``python -m sgl_hybrid_kernel.delta_rule.plan`` prints it; ``sgl-kernel/tests/test_delta_rule_plan_table.py``
    checks that the committed copy matches."""
    head = "| shape | " + " | ".join(label for label, _ in DOC_TARGETS) + " |"
    rows = [head, "|" + "---|" * (len(DOC_TARGETS) + 1)]

    def cell(p) -> str:
        return p.describe().rsplit(" [", 1)[0]

    for label, kind, H, HV, T, batches, mode in DOC_RECURRENT_CASES:
        for B in batches:
            cells = [cell(plan_recurrent(B, T, H, HV, 128, 128, kind, "vk", t, plain=mode == "plain",
                                         snapshots=mode == "snapshots")) for _, t in DOC_TARGETS]
            rows.append(f"| {label}, B={B} | " + " | ".join(f"`{c}`" for c in cells) + " |")
    for label, kind, lb, HV, shapes in DOC_CHUNK_CASES:
        for B, T in shapes:
            cells = []
            for _, t in DOC_TARGETS:
                p = plan_chunk([T] * B, HV, 128, kind, lb, torch.bfloat16, t)
                cells.append(p.describe().replace(f" [{p.launch.name}]", "") if p.launch else p.describe())
            rows.append(f"| {label}, B={B} T={T // 1024}K | " + " | ".join(f"`{c}`" for c in cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(dispatch_table_markdown(), end="")
