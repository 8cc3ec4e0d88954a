"""Launch tables and rules of the chunk-64 prefill (issue 4, issue 9), as functions of shapes and a
:class:`~sgl_hybrid_kernel.platform.Target`; :func:`sgl_hybrid_kernel.delta_rule.plan.plan_chunk` combines them
into a plan and ``chunk.parallel.launch_params`` turns a plan's table row into the launches. The rows are
``launch.json`` beside this file (each with the measurement it came from).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import triton

from sgl_hybrid_kernel.delta_rule.chunk.seq_plan import BC
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.platform import Target

# ChunkLaunch.cumsum_row_loop applies from this Triton on: 3.8 lowers the gate cumsum's tl.cumsum with
# branches and twice 3.6's shuffles (H200, B=8 T=16K: 518 us at 64 channels / 4 warps; the row loop 322 at
# 128 / 2), while under 3.6 tl.cumsum at 64 / 4 is the faster form (339 vs the row loop's 399 us; 3.7 was not
# measured; docs/kernels.md at tag lab-history-2026-12-07, eighteenth round)
CUMSUM_ROW_LOOP_MIN_TRITON = (3, 7)


@dataclass(frozen=True)
class ChunkLaunch:
    """Launch parameters of the four kernels on one (arch, compute-unit count).

    ``*_warps``: warps (CUDA) / wavefronts (ROCm) per program; ``cumsum_bk``: gate
    channels per cumulative-sum program; ``intra_kd`` / ``state_kd``: key block of the
    in-chunk and state-passing products (the state is held as ``K / state_kd <= 4``
    blocks); ``intra_kb``: channels per step of the unbounded-gate diagonal block;
    ``intra_bv``: value block of ``u = M beta v``; ``intra_precision``: ``input_precision`` of the
    products that build ``A`` and its block inverse when TF32 is allowed (``"ieee"``: FP32 FMA;
    ``"tf32x3"``: FP32 operands split into TF32 high + low parts on the tensor cores, FP32
    accumulation, CUDA only; FP32 products, ``tf32=False``, and the unbounded KDA gate always use ``"ieee"``); ``state_bv`` / ``state_bv_ckpt``:
    value columns per state-passing program without / with checkpoints; ``state_kd_ckpt`` /
    ``state_warps_ckpt``: key block and warps of the state pass with checkpoints (0: ``state_kd`` /
    ``state_warps``; sm_90: the whole-K, 4-warp pass spills with checkpoints); ``group_kd`` /
    ``group_warps``: the same for the group-scan summaries and scan (``chunk_group_scan``); ``state_stages``:
    software-pipelining stages of the state pass's chunk loop (1: none);
    ``state_early``: issue each chunk step's loads before its stores (else each block's loads
    follow the previous block's state store; CDNA: off, which keeps 3 waves per SIMD
    where early loads would leave 2 — neither timed);
    ``intra_split``: run the in-chunk step as two launches (issue 4): ``A`` / ``Aqk`` by one program per
    (chunk, head, 16-row block) with ``intra_a_warps``, key blocks of ``intra_a_kd`` and
    ``intra_a_stages`` pipelining stages, then the block inverse and ``w`` / ``u`` / ``kg`` per
    (chunk, head) with ``intra_solve_warps`` (``A`` through an FP32 scratch), instead of the fused
    ``chunk_intra_kernel`` with ``intra_warps``; ``intra_inv`` (split only): the inverse by a third launch
    between those two, its ten 16x16 blocks as small products in ``intra_inv_warps`` warps per
    (chunk, head), written over ``A`` (FP32); ``intra_a_stacked`` (split only; bounded KDA gate and GDN):
    the ``A`` / ``Aqk`` programs as ``chunk_intra_arow_kernel`` (same grid, warps, ``intra_a_kd`` and
    stages: key blocks in the outer loop, ``[k; q]`` stacked into one 32-row operand, the row factors
    exponentiated once per key block; the unbounded KDA gate keeps ``chunk_intra_a_kernel``);
    ``intra_arow_warps``: warps of the stacked ``A`` programs (0: ``intra_a_warps``; the unbounded gate's
    ``chunk_intra_a_kernel`` keeps ``intra_a_warps``: on one warp it spills on sm_90);
    ``fast_exp`` (CUDA): the stacked ``A`` programs exponentiate with ``ex2.approx.ftz`` (no denormal
    fix-up, ``triton_recurrent._fexp``; never under the interpreter): their exponents are bounded below by
    ``-15 |lower_bound|`` except the per-pair vector ``e^{G_r - E_j}``, where a flushed value only drops terms
    below ``1e-38`` of the sum; ``cumsum_fast_exp`` (CUDA, bounded KDA gate): the gate cumsum
    forms ``lb sigmoid(.)`` with ``ex2.approx.ftz`` and ``rcp.approx.ftz``, the MUFU operations of ``tl.exp``
    and of the FP32 division without their fix-ups (the same ``G`` wherever nothing is denormal or above
    2^126; H200 B=8 T=16K: cumsum 386 -> 339 us, 2026-12-01-h200-prefill_fexp.json);
    ``cumsum_row_loop`` (per-channel gates, Triton >= ``CUMSUM_ROW_LOOP_MIN_TRITON``): the chunk's scan as a
    sequential FP32 sum over its 64 rows (eight rows' loads issued together, then their sums stored; additions
    in row order) instead of ``tl.cumsum``, on ``cumsum_row_bk`` channels and ``cumsum_row_warps`` warps per
    program (H200, Triton 3.8, B=8 T=16K: 518 -> 322 us at 128 channels on 2 warps); elsewhere ``tl.cumsum``
    keeps ``cumsum_bk`` / ``cumsum_warps``;
    ``intra_a_join`` (stacked ``A`` programs: GDN, and KDA without ``intra_aqk_tf32``): the row block's ``k`` and
    ``q`` loaded as two ``[16, KD]`` tiles and joined into the stacked operand instead of one load through a
    per-row pointer select, which Triton 3.8 turns into scalar 2-byte loads (GDN ``A`` programs compiled for
    sm_90: 253 -> 163 registers, 164 -> 72 static global loads; 3.6: 154 -> 138; the same values);
    ``intra_inv_stream`` (with ``intra_diag_inv`` and chained 3xTF32 merges): the inverse launch stores each
    ``M`` block once formed and loads a row block's ``A`` blocks when that row starts (1) or all first (2),
    instead of holding all ten to the end (Triton 3.8 kept them at 255 registers; streamed on one warp: 198,
    H200 B=8 T=16K 446 -> 289 us; ``M`` may alias ``A``: each ``A`` block is read before its place is written);
    ``intra_diag_inv`` (with ``intra_a_stacked`` and ``intra_inv``): the 16x16 diagonal inverses
    ``(I + A_ii)^-1`` computed by the stacked ``A`` programs (one per row block, stored in place of
    ``A_ii``), so the inverse launch only merges the off-diagonal blocks;
    ``intra_diag_inv_x3`` (with ``intra_diag_inv`` and ``tf32x3`` products): those diagonal inverses' six
    repeated-squaring products as three chained TF32 tensor-core products each
    (``triton_chunk_parallel._tril_inverse_16_x3``) instead of FP32 FMA products, which a one-warp program
    fed through shared memory (H200, 2026-12-02: ``A`` programs B=8 T=16K 1,899 -> 1,877 us, B=1 T=64K
    828 -> 785, GDN B=1 T=32K 876 -> 739; the same inverses in the inverse launch instead were slower);
    ``intra_a_rowspec`` (stacked only): the ``A`` programs branch once on their row block into one of
    four copies of the body, whose column-block tests are then static (straight-line code, the row
    operand kept in registers); ``intra_a_direct`` (stacked, KDA): each pair's columns as
    ``k_s e^{G_r - G_s}`` in one exponential per element instead of ``(k_s e^{E_j - G_s}) e^{G_r - E_j}``;
    ``intra_aqk_tf32`` (stacked, KDA, ``tf32x3``): ``k`` and ``q`` as two operands, ``A`` from three TF32
    products and ``Aqk`` (which the output step rounds to the BF16 scratch) from one, as fla builds it;
    ``intra_aqk_stages``: those programs' pipelining stages (0: ``intra_a_stages``);
    ``intra_inv_chain`` (``tf32x3``): the inverse launch's merges as chained TF32 products on operands
    split once; ``intra_inv_lowp`` (with ``intra_solve_lowp`` and 16-bit scratch): the inverse launch
    stores the finished inverse in the scratch dtype, which the ``w`` / ``u`` step rounds it to anyway
    (bit-identical results, half the bytes); ``intra_inv_warps_diag``: the inverse launch's warps when it
    also inverts the diagonal blocks (no ``intra_diag_inv``: the unbounded KDA gate; 0: ``intra_inv_warps``);
    ``intra_solve_lowp``: ``w`` / ``u`` as BF16 products of the finished inverse and
    their right operands rounded to the BF16 scratch (as fla's recompute of w / u; FP32 scratch:
    unchanged);
    ``state_stages_lowp``: the state pass's pipelining stages with 16-bit scratch, no checkpoints and no
    group scan (0: ``state_stages``; sm_90: each stage holds one chunk's BF16 ``w`` / ``kg`` / ``u`` tiles,
    and an FP32 scratch at 4 stages exceeds the 227 KiB per block);
    ``state_bv_costs``: ``((value columns, relative time of one chunk step), ...)`` of the state pass
    without checkpoints and with 16-bit scratch: :func:`pick_state_tile` takes the tile whose waves x step
    time is least for the batch (wider tiles when ``sequences x HV x V / state_bv`` programs would run
    in several waves; empty: always ``state_bv``);
    ``state_lowp``: the state pass's products take the state / ``v_new`` rounded to the scratch dtype
    (BF16 scratch: BF16 tensor-core products with FP32 accumulation, as fla's state pass; FP32
    scratch: unchanged);
    ``fuse_output_gdn`` (GDN with the stacked ``A`` programs; 16-bit scratch, no checkpoints, no group scan):
    the state pass also forms the output (``chunk_state_kernel`` with ``FUSE_O``; q's row factor and ``Aqk``,
    in the scratch dtype, written by the ``A`` programs), so neither the chunk-start states nor ``v_new``
    go through memory and the output launch is skipped; ``state_kd_fused`` / ``state_stages_fused``: that pass's key block and pipelining
    stages (0: ``state_kd`` / ``state_stages_lowp``); ``fuse_output_kda_bv`` (KDA with ``intra_aqk_tf32``;
    same contract): the state tiles (value columns, as :func:`pick_state_tile` chose them) at which the
    state pass also forms KDA's output from the ``q e^G`` and row factor the unstacked ``A`` programs write
    (empty: never; narrower tiles re-read ``q e^G`` too often, and the 64-column pass spills);
    ``state_kd_fused_kda``: that pass's key block (0: ``state_kd_fused``);
    ``value_tile``: value columns per output program; ``output_lowp``: the output step's two
    products take ``q e^G`` and ``Aqk`` rounded to the BF16 scratch (BF16 tensor-core products with
    FP32 accumulation, as fla's output step; FP32 scratch: unchanged); ``output_kd`` /
    ``output_stages``: key block and software-pipelining stages of its ``(q e^G) h_c`` loop. Every entry is compiled by
    ``compile_gate`` for its arch and must be free of spills there (issue 9).
    ``tuned`` is False for an entry not timed on that part (the dispatch log says so).
    """

    name: str
    cumsum_bk: int = 64
    cumsum_warps: int = 4
    intra_kd: int = 32
    intra_kb: int = 4
    intra_bv: int = 32
    intra_warps: int = 8
    intra_precision: str = "ieee"
    intra_split: bool = False
    intra_a_warps: int = 4
    intra_a_kd: int = 16
    intra_a_stages: int = 3
    intra_solve_warps: int = 4
    intra_inv: bool = False
    intra_inv_warps: int = 2
    intra_inv_warps_diag: int = 0
    intra_a_stacked: bool = False
    intra_arow_warps: int = 0
    intra_diag_inv: bool = False
    intra_diag_inv_x3: bool = False
    intra_a_rowspec: bool = False
    intra_a_direct: bool = False
    intra_aqk_tf32: bool = False
    intra_aqk_stages: int = 0
    fuse_output_kda_bv: Tuple[int, ...] = ()
    intra_inv_chain: bool = False
    intra_inv_lowp: bool = False
    fast_exp: bool = False
    cumsum_fast_exp: bool = False
    cumsum_row_loop: bool = False
    cumsum_row_bk: int = 128
    cumsum_row_warps: int = 2
    intra_inv_stream: int = 0
    intra_a_join: bool = False
    intra_solve_lowp: bool = False
    state_kd: int = 64
    state_bv: int = 32
    state_bv_ckpt: int = 8
    state_bv_costs: Tuple[Tuple[int, float], ...] = ()
    state_warps: int = 8
    state_kd_ckpt: int = 0
    state_warps_ckpt: int = 0
    group_kd: int = 0
    group_warps: int = 0
    state_stages: int = 1
    state_stages_lowp: int = 0
    state_early: bool = True
    state_lowp: bool = False
    fuse_output_gdn: bool = False
    state_kd_fused: int = 0
    state_kd_fused_kda: int = 0
    state_stages_fused: int = 0
    value_tile: int = 32
    output_warps: int = 8
    output_lowp: bool = False
    output_kd: int = 128
    output_stages: int = 1
    tuned: bool = True
    source: str = ""



TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.json")


def load_chunk_launch_tables(path: str = TABLE_FILE) -> Dict[Tuple[str, int], ChunkLaunch]:
    """The rows of ``path`` keyed by ``(arch, compute units)`` (like the decode tile table: a table timed on one
    part must not silently apply to a part with another CU count). Lists become tuples.

    Raises:
        ValueError: a row without ``name`` / ``arch`` / ``num_compute_units`` / ``source``, or an unknown field.
    """
    with open(path) as fh:
        rows = json.load(fh)["tables"]
    fields = set(ChunkLaunch.__dataclass_fields__)
    out = {}
    for row in rows:
        missing = {"name", "arch", "num_compute_units", "source"} - set(row)
        unknown = set(row) - fields - {"arch", "num_compute_units"}
        if missing or unknown:
            raise ValueError(f"path: row {row.get('name')!r} lacks {sorted(missing)} or sets unknown {sorted(unknown)}")
        args = {k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v)
                for k, v in row.items() if k not in ("arch", "num_compute_units")}
        out[(row["arch"], int(row["num_compute_units"]))] = ChunkLaunch(**args)
    return out


CHUNK_LAUNCH: Dict[Tuple[str, int], ChunkLaunch] = load_chunk_launch_tables()
# Parts of a known arch with another CU count get that arch's compile-gated parameters,
# marked untuned (spills depend on the arch, not on the CU count).
ARCH_DEFAULT: Dict[str, Tuple[str, int]] = {"sm90": ("sm90", 132), "gfx942": ("gfx942", 304), "gfx950": ("gfx950", 256)}
INTERPRETER_LAUNCH = CHUNK_LAUNCH[("sm90", 132)]


def chunk_launch(arch: Optional[str], num_compute_units: Optional[int]) -> ChunkLaunch:
    """The entry for ``(arch, num_compute_units)``; for another CU count of a gated arch, that
    arch's entry marked ``tuned=False``; for an arch the gate does not compile, the sm_90
    entry marked ``tuned=False`` (its spill-freeness there is unchecked: the log says so)."""
    entry = CHUNK_LAUNCH.get((arch, num_compute_units))
    if entry is not None:
        return entry
    base = CHUNK_LAUNCH[ARCH_DEFAULT.get(arch, ("sm90", 132))]
    gated = "compile-gated" if arch in ARCH_DEFAULT else "not compile-gated"
    return ChunkLaunch(**{**base.__dict__, "name": f"{base.name}->{arch}x{num_compute_units}", "tuned": False,
                          "source": f"{base.name} parameters on an untimed part ({gated} for {arch})"})


def target_chunk_launch(target: Target) -> ChunkLaunch:
    """:func:`chunk_launch` for a target (CPU: :data:`INTERPRETER_LAUNCH`)."""
    if target.vendor == "cpu":
        return INTERPRETER_LAUNCH
    return chunk_launch(*target.key)



def _splitq(launch: ChunkLaunch, kind: int, lower_bound: Optional[float], tf32: bool) -> bool:
    """Whether the stacked KDA ``A`` programs run with ``k`` and ``q`` unstacked (``intra_aqk_tf32``): the
    bounded gate with 3xTF32 products."""
    return (launch.intra_aqk_tf32 and kind == GATE_KDA_SAFE and tf32 and launch.intra_precision == "tf32x3"
            and lower_bound is not None and (BC - 1) * abs(lower_bound) <= 80.0)


def fused_output_allowed(launch: ChunkLaunch, kind: int, lowp_scratch: bool, ckpt: bool,
                         lower_bound: Optional[float] = None, tf32: bool = True) -> bool:
    """The fused output's contract (issue 4): the stacked ``A`` programs write q's row factor (GDN), or
    ``q e^G`` and the row factor (KDA with the bounded gate and unstacked ``k`` / ``q``, ``intra_aqk_tf32``,
    which needs ``lower_bound`` and TF32 products); a 16-bit scratch without the group scan
    (``lowp_scratch``); no checkpoints."""
    if not (launch.intra_split and launch.intra_a_stacked and lowp_scratch and not ckpt):
        return False
    return kind == GATE_GDN or _splitq(launch, kind, lower_bound, tf32)


def use_fused_output(launch: ChunkLaunch, kind: int, lowp_scratch: bool, ckpt: bool,
                     lower_bound: Optional[float] = None, tf32: bool = True, state_tile: Optional[int] = None) -> bool:
    """Whether the state pass forms the output by default: :func:`fused_output_allowed` and the table's
    ``launch.fuse_output_gdn`` (GDN) / ``state_tile in launch.fuse_output_kda_bv`` (KDA; H200, B=8 T=16K at
    32 columns: state pass + output 1,535 -> ~1,000 us, the ``A`` programs +240 us; at B=1, 16 columns,
    slower)."""
    on = launch.fuse_output_gdn if kind == GATE_GDN else state_tile in launch.fuse_output_kda_bv
    return on and fused_output_allowed(launch, kind, lowp_scratch, ckpt, lower_bound, tf32)


def pick_state_tile(launch: ChunkLaunch, programs_per_tile: int, V: int, num_compute_units: int) -> int:
    """Value columns of the state pass without checkpoints (16-bit scratch; issue 4): of
    ``launch.state_bv_costs``, the tile whose ``waves x step time`` is least, where ``waves =
    ceil(programs_per_tile x ceil(V / columns) / num_compute_units)`` (waves of one program per SM) and
    the step times are relative, measured on the H200 with the 4-stage pass (``state_stages_lowp``,
    ``2026-11-30-h200-prefill_sixth_sweep2.json``: B=1 T=64K and B=8 T=16K give the same per-wave chunk
    step, 16 / 32 / 64 columns ~ 1 : 1.27 : 2.08; at 4 stages one program fills an SM's shared memory).
    Ties keep the narrower tile (listed first). ``programs_per_tile``: sequences x value heads. Without
    costs or compute units: ``launch.state_bv``.

    Kimi K3 TP8 (12 heads x 128): B=1 -> 16 columns (96 programs, one wave; H200 state pass 788 us, 32
    columns 995), B=2 -> 32, B=4 -> 64, B=8 -> 32 (764 us; 16 columns 1,181, 64 columns 824)."""
    if not launch.state_bv_costs or num_compute_units <= 0:
        return launch.state_bv
    best = None
    for bv, cost in launch.state_bv_costs:
        waves = -(-programs_per_tile * triton.cdiv(V, bv) // num_compute_units)
        if best is None or waves * cost < best[0] - 1e-9:
            best = (waves * cost, bv)
    return best[1]


