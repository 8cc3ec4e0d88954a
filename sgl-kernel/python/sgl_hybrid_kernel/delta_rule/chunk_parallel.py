"""Host wrapper of the multi-kernel chunked prefill (``triton_chunk_parallel.py``, chunk 64).

Four launches (six where the launch table splits the in-chunk step: ``intra_split``,
``intra_inv``): gate cumulative sum, in-chunk WY pieces (parallel over chunks),
state passing (sequential over chunks, parallel over sequences x heads x value
tiles), output (parallel over chunks). Same contract as
``chunk.gated_delta_chunk_triton`` (which calls this for ``method="parallel"``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.triton_chunk_parallel import (
    chunk_gate_cumsum_kernel,
    chunk_intra_a_kernel,
    chunk_intra_arow_kernel,
    chunk_intra_inv_kernel,
    chunk_intra_kernel,
    chunk_intra_solve_kernel,
    chunk_output_kernel,
    chunk_state_kernel,
)
from sgl_hybrid_kernel.delta_rule.triton_recurrent import GATE_GDN, GATE_KDA_SAFE, TRITON_VERSION
from sgl_hybrid_kernel.delta_rule.chunk_group_scan import run_group_scan_state_pass
from sgl_hybrid_kernel.delta_rule.seq_plan import BC, BT, SeqPlan, int32_to_device, seq_plan  # noqa: F401 (re-exported)
from sgl_hybrid_kernel.platform import device_platform

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


# Keyed by (arch, compute units) like the decode value-tile table (recurrent.VALUE_TILE_TUNED):
# a table timed on one part must not silently apply to a part with another CU count.
CHUNK_LAUNCH: Dict[Tuple[str, int], ChunkLaunch] = {
    ("sm90", 132): ChunkLaunch("sm90x132", intra_precision="tf32x3", intra_split=True, intra_a_warps=2, intra_a_kd=16,
                               intra_a_stages=3, intra_a_stacked=True, intra_diag_inv=True, intra_diag_inv_x3=True, fast_exp=True, cumsum_fast_exp=True, intra_inv=True,
                               intra_a_rowspec=True, intra_a_direct=True, intra_inv_chain=True, intra_inv_lowp=True,
                               intra_arow_warps=1, intra_inv_warps=1, intra_inv_stream=1, intra_inv_warps_diag=4,
                               intra_solve_warps=4, cumsum_row_loop=True, cumsum_row_bk=128, cumsum_row_warps=2,
                               intra_a_join=True,
                               state_kd=128, state_warps=4, state_kd_ckpt=64, state_warps_ckpt=8,
                               group_kd=64, group_warps=8,
                               state_bv=16, state_bv_ckpt=8, state_stages=3, state_stages_lowp=4, state_lowp=True,
                               state_bv_costs=((16, 1.0), (32, 1.27), (64, 2.08)),
                               fuse_output_gdn=True, state_kd_fused=64, state_stages_fused=3,
                               intra_aqk_tf32=True, intra_aqk_stages=4, fuse_output_kda_bv=(32,), state_kd_fused_kda=128,
                               value_tile=128, output_warps=4, output_lowp=True, output_kd=32, output_stages=3,
                               intra_solve_lowp=True, intra_bv=64,
                               source="spill-free in compile_gate for sm90; timed on the H200 (bench_delta_rule.py, B=1 T=64K and "
                                      "B=8 T=16K)"),
    ("gfx942", 304): ChunkLaunch("gfx942x304", state_kd=32, state_bv=16, state_bv_ckpt=16, state_early=False, tuned=False,
                                 source="spill-free in compile_gate for gfx942; not timed (no MI300X here)"),
    ("gfx950", 256): ChunkLaunch("gfx950x256", state_kd=32, state_bv=16, state_bv_ckpt=16, state_early=False, tuned=False,
                                 source="spill-free in compile_gate for gfx950; not timed (no MI355X here)"),
}
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


def device_chunk_launch(device: torch.device) -> ChunkLaunch:
    """:func:`chunk_launch` for a tensor's device (CPU tensors: :data:`INTERPRETER_LAUNCH`)."""
    plat = device_platform(device)
    if plat.device == "cpu":
        return INTERPRETER_LAUNCH
    return chunk_launch(*plat.key)


@functools.lru_cache(maxsize=256)
def launch_params(launch: ChunkLaunch, kind: int, H: int, HV: int, K: int, V: int, lower_bound: float,
                  l2norm: bool, tf32: bool, ckpt: bool, value_tile: Optional[int] = None,
                  num_warps: Optional[int] = None, interpret: bool = False,
                  state_tile: Optional[int] = None, lowp_scratch: bool = False,
                  fuse_output: bool = False) -> Dict[str, tuple]:
    """``{"cumsum" | "intra" (or "intra_a" [+ "intra_inv"] + "intra_solve") | "state" | "output":
    (kernel, constexprs, num_warps, grid_tail[, num_stages])}``: what
    :func:`gated_delta_chunk_parallel` launches; ``compile_gate`` compiles the same dicts.
    Cached per argument tuple (a launch costs no dict building on the host): do not mutate the result.
    ``grid_tail``: the grid's value-tile / channel-block / row-block dimension; ``num_stages``
    (``intra_a`` and ``output``): the software-pipelining stages it is launched and compile-gated
    with (the other parts: Triton's default). ``interpret``: CPU tensors (Triton interpreter; ``state_lowp``
    then multiplies the rounded operands in FP32, since the interpreter's BF16 dot is wrong).
    ``state_tile``: value columns of the state pass (:func:`pick_state_tile`; ``value_tile`` wins).
    ``lowp_scratch``: the scratch is 16-bit and the plain (not group-scan) state pass runs, so without
    checkpoints it takes ``launch.state_stages_lowp`` stages. ``fuse_output`` (:func:`fused_output_allowed`'s
    contract): the stacked ``A`` programs also write q's row factor and the state pass forms the output
    (``FUSE_O``); there is no ``"output"`` part. Raises ``ValueError`` for ``fuse_output`` outside that
    contract."""
    if fuse_output and not fused_output_allowed(launch, kind, lowp_scratch, ckpt, lower_bound, tf32):
        raise ValueError("fuse_output: needs the stacked A programs (launch.intra_split, intra_a_stacked) for GDN, or "
                         "for the bounded KDA gate with launch.intra_aqk_tf32 and TF32 products; a 16-bit scratch "
                         "without the group scan, and no checkpoints")
    BK = triton.next_power_of_2(K)
    BVP = triton.next_power_of_2(V)
    sbv = min(value_tile or state_tile or (launch.state_bv_ckpt if ckpt else launch.state_bv), BVP)
    obv = min(value_tile or launch.value_tile, BVP)
    # the row-loop cumsum (per-channel gates, Triton >= 3.7) runs its own channel block and warps; otherwise
    # tl.cumsum at cumsum_bk / cumsum_warps, as timed before the row loop existed
    row_loop = launch.cumsum_row_loop and kind != GATE_GDN and TRITON_VERSION >= CUMSUM_ROW_LOOP_MIN_TRITON
    gbk = min(launch.cumsum_row_bk if row_loop else launch.cumsum_bk, BK)
    skd = (launch.state_kd_ckpt or launch.state_kd) if ckpt else launch.state_kd
    swarps = (launch.state_warps_ckpt or launch.state_warps) if ckpt else launch.state_warps
    common = dict(H=H, HV=HV, K=K, V=V, BK=BK, BT=BT, GATE=kind, L2NORM=l2norm, TF32=tf32)
    factorized = kind == GATE_KDA_SAFE and (BC - 1) * abs(lower_bound) <= 80.0
    # the unbounded KDA gate (diagonal blocks summed over key blocks) keeps FP32 FMA products: not
    # timed, and with 3xTF32 it sits at sm_90's 255-register cap (a variant of it spilled; compile_gate)
    aprec = launch.intra_precision if tf32 and (kind == GATE_GDN or factorized) else "ieee"
    kd = min(launch.intra_kd, BK)
    if launch.intra_split:
        stacked = launch.intra_a_stacked and (kind == GATE_GDN or factorized)
        diag_inv = stacked and launch.intra_inv and launch.intra_diag_inv
        if stacked:
            a_part = (chunk_intra_arow_kernel, dict(H=H, HV=HV, K=K, BK=BK, BT=BT, BC=BC, GATE=kind, L2NORM=l2norm,
                                                    KD=min(launch.intra_a_kd, BK), APREC=aprec,
                                                    DIAG_INV=(2 if diag_inv and launch.intra_diag_inv_x3 and aprec == "tf32x3"
                                                              else diag_inv),
                                                    FAST_EXP=launch.fast_exp and not interpret,
                                                    ROWSPEC=launch.intra_a_rowspec, DIRECT=launch.intra_a_direct,
                                                    SPLITQ=_splitq(launch, kind, lower_bound, tf32), JOIN=launch.intra_a_join,
                                                    # zero blocks above the diagonal only for readers of whole
                                                    # rows: the solve without the inverse launch (A), the state
                                                    # pass forming the output (Aqk)
                                                    A_UPPER=not launch.intra_inv, Q_UPPER=fuse_output,
                                                    # without RQ the pointers are None constexprs: the binary is unchanged
                                                    RQ=fuse_output, **({} if fuse_output else {"rq_ptr": None}),
                                                    **({} if fuse_output and kind != GATE_GDN else {"qeg_ptr": None})))
        else:
            a_part = (chunk_intra_a_kernel, dict(H=H, HV=HV, K=K, BK=BK, BT=BT, BC=BC, GATE=kind, L2NORM=l2norm,
                                                 FACTORIZED=factorized, KB=min(launch.intra_kb, BK),
                                                 KD=min(launch.intra_a_kd, BK), TF32=tf32, APREC=aprec))
        intra = {
            "intra_a": a_part + ((launch.intra_arow_warps or launch.intra_a_warps) if stacked else launch.intra_a_warps,
                                 (BT // BC,), (launch.intra_aqk_stages or launch.intra_a_stages)
                                 if _splitq(launch, kind, lower_bound, tf32) else launch.intra_a_stages),
            "intra_solve": (chunk_intra_solve_kernel, dict(**common, BV=min(launch.intra_bv, BVP), BC=BC, KD=kd,
                                                           APREC=aprec, INV=launch.intra_inv,
                                                           LOWP=(2 if interpret else 1) if launch.intra_solve_lowp else 0),
                            launch.intra_solve_warps, ()),
        }
        if launch.intra_inv:
            intra["intra_inv"] = (chunk_intra_inv_kernel, dict(HV=HV, BT=BT, BC=BC, APREC=aprec, DIAG_INV=diag_inv,
                                                               CHAIN=launch.intra_inv_chain and aprec == "tf32x3",
                                                               STREAM=launch.intra_inv_stream if (
                                                                   diag_inv and launch.intra_inv_chain and aprec == "tf32x3") else 0),
                                  launch.intra_inv_warps if diag_inv else (launch.intra_inv_warps_diag or launch.intra_inv_warps), ())
    else:
        intra = {"intra": (chunk_intra_kernel, dict(**common, BV=min(launch.intra_bv, BVP), BC=BC,
                                                    FACTORIZED=factorized,
                                                    KB=min(launch.intra_kb, BK), KD=kd,
                                                    APREC=aprec),
                           launch.intra_warps, ())}
    stages = launch.state_stages_lowp if lowp_scratch and not ckpt and launch.state_stages_lowp else launch.state_stages
    if fuse_output:
        stages = launch.state_stages_fused or stages
        skd = (kind != GATE_GDN and launch.state_kd_fused_kda) or launch.state_kd_fused or skd
    parts = {
        "cumsum": (chunk_gate_cumsum_kernel, dict(HV=HV, K=K, BK=gbk, BT=BT, GATE=kind,
                                                  FAST_EXP=launch.cumsum_fast_exp and kind == GATE_KDA_SAFE and not interpret,
                                                  ROW_LOOP=row_loop),
                   launch.cumsum_row_warps if row_loop else launch.cumsum_warps,
                   (1 if kind == GATE_GDN else triton.cdiv(K, gbk),)),
        **intra,
        "state": (chunk_state_kernel, dict(**common, BV=sbv, BC=BC, KD=max(min(skd, BK), BK // 4), CKPT=ckpt,
                                           STAGES=stages, EARLY=launch.state_early,
                                           LOWP=(2 if interpret else 1) if (launch.state_lowp or fuse_output) and not ckpt else 0,
                                           FUSE_O=fuse_output),
                  num_warps or swarps, (triton.cdiv(V, sbv),)),
        "output": (chunk_output_kernel, dict(**common, BV=obv, LOWP=(2 if interpret else 1) if launch.output_lowp else 0,
                                             KD=min(launch.output_kd, BK)),
                   num_warps or launch.output_warps, (triton.cdiv(V, obv),), launch.output_stages),
    }
    if fuse_output:
        del parts["output"]
    return parts


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


def gated_delta_chunk_parallel(
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
    has_initial_state: torch.Tensor,
    kind: int,
    lower_bound: Optional[float],
    scale: float,
    l2norm: bool,
    state_layout: str,
    checkpoints: Sequence[Tuple[int, int, int]],
    checkpoint_pool: Optional[torch.Tensor],
    lens: Sequence[int],
    value_tile: Optional[int] = None,
    tf32: bool = False,
    scratch_dtype: Optional[torch.dtype] = None,
    num_warps: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    launch: Optional[ChunkLaunch] = None,
    group_chunks: Optional[int] = None,
    fuse_output: Optional[bool] = None,
) -> torch.Tensor:
    """Run the four kernels; arguments already validated by ``gated_delta_chunk_triton``.

    ``scratch_dtype`` holds ``w``, ``kg``, ``u``, ``v_new`` and the chunk-start states ``h``
    (default: FP32; BF16 halves their traffic). ``G`` is always FP32, and so are ``Aqk`` (in the
    scratch dtype for the fused output), ``A`` and its inverse (never leave registers). ``launch``
    defaults to the device's :func:`device_chunk_launch` (parameters by arch and CU count); ``value_tile`` /
    ``num_warps`` override its value tiles / state-passing and output warps.
    ``group_chunks``: run the state pass in group-scan mode with groups of that many
    chunks (``chunk_group_scan.py``); ``None``: the plain sequential state pass.
    ``lens``: the :class:`SeqPlan` of ``cu_seqlens`` (no host work per call), or tokens per
    sequence (offsets from 0; the plan is then looked up in the cache).
    No host sync: index tables come from the plan, checkpoint tables are copied without one.
    ``fuse_output``: the state pass forms the output (:func:`use_fused_output`; ``None``: as the launch table
    says; ``True`` outside its contract raises ``ValueError``).
    """
    launch = launch or device_chunk_launch(q.device)
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    if not isinstance(lens, SeqPlan):
        lens = seq_plan([0, *itertools.accumulate(int(x) for x in lens)], dev)
    plan = lens
    S, NC, n_sub = len(plan.lens), plan.NC, plan.n_sub
    sd = torch.float32 if scratch_dtype is None else scratch_dtype
    cidx, coff = plan.cidx, plan.coff
    ckpt_idx = None
    if checkpoints:
        table = [-1] * (S * n_sub)
        for seq, pos, dst in checkpoints:
            table[seq * n_sub + triton.cdiv(pos, BC) - 1] = dst
        ckpt_idx = int32_to_device(table, dev).view(S, n_sub)
    o = out if out is not None else torch.empty_like(v)
    if NC == 0:
        return o
    lb = 0.0 if lower_bound is None else float(lower_bound)
    state_tile = None
    if launch.state_bv_costs and ckpt_idx is None and not group_chunks and sd.itemsize == 2:
        # 16-bit scratch only: with FP32 scratch the wider tiles exceed sm_90's shared memory (CPU: no CUs)
        state_tile = pick_state_tile(launch, S * HV, V, device_platform(dev).num_compute_units or 0)
    lowp = sd.itemsize == 2 and not group_chunks
    if fuse_output is None:
        fuse_output = use_fused_output(launch, kind, lowp, ckpt_idx is not None, lower_bound, tf32,
                                       state_tile if state_tile is not None else launch.state_bv)
    p = launch_params(launch, kind, H, HV, K, V, lb, l2norm, tf32, ckpt_idx is not None, value_tile, num_warps,
                      interpret=dev.type == "cpu", state_tile=state_tile, lowp_scratch=lowp, fuse_output=fuse_output)
    gshape = (N, HV) if kind == GATE_GDN else (N, HV, K)
    G = torch.empty(gshape, dtype=torch.float32, device=dev)
    # Aqk in the scratch dtype for the fused output (its product rounds it to that anyway; half the shared memory)
    aqk = torch.empty(N, HV, BT, dtype=sd if fuse_output else torch.float32, device=dev)
    w = torch.empty(N, HV, K, dtype=sd, device=dev)
    kg = torch.empty(N, HV, K, dtype=sd, device=dev)
    u = torch.empty(N, HV, V, dtype=sd, device=dev)
    qeg = rq = None
    if fuse_output:
        vn = h = u  # not written
        rq = torch.empty(N, HV, dtype=torch.float32, device=dev)  # q's row factor
        if kind != GATE_GDN:
            qeg = torch.empty(N, HV, K, dtype=sd, device=dev)  # KDA: q e^G (raw q), the fused pass's left operand
    else:
        vn = torch.empty(N, HV, V, dtype=sd, device=dev)
        h = torch.empty(NC, HV, K, V, dtype=sd, device=dev)
    kern, cx, nw, grid = p["cumsum"]
    kern[(NC, HV) + grid](f, A_log, dt_bias, G, cu_seqlens, cidx, lb, **cx, num_warps=nw)
    if "intra" in p:
        kern, cx, nw, grid = p["intra"]
        kern[(NC, HV)](q, k, v, b, G, aqk, w, u, kg, cu_seqlens, cidx, scale, **cx, num_warps=nw)
    else:
        a_rows = torch.empty(N, HV, BT, dtype=torch.float32, device=dev)  # strict rows of A, FP32
        kern, cx, nw, grid, ns = p["intra_a"]
        kern[(NC, HV) + grid](q, k, b, G, aqk, a_rows, cu_seqlens, cidx, scale, **cx, num_warps=nw, num_stages=ns,
                              **({"rq_ptr": rq} if rq is not None else {}), **({"qeg_ptr": qeg} if qeg is not None else {}))
        m_rows = a_rows  # the inverse's rows: over A (FP32), or the 16-bit scratch that w / u round M to anyway
        if "intra_inv" in p:
            if launch.intra_inv_lowp and launch.intra_solve_lowp and sd.itemsize == 2:
                m_rows = torch.empty(N, HV, BT, dtype=sd, device=dev)
            kern, cx, nw, grid = p["intra_inv"]
            kern[(NC, HV)](a_rows, m_rows, cu_seqlens, cidx, **cx, num_warps=nw)
        kern, cx, nw, grid = p["intra_solve"]
        kern[(NC, HV)](k, v, b, G, m_rows, w, u, kg, cu_seqlens, cidx, **cx, num_warps=nw)

    def strides(t):
        s0, s1, s2, s3 = t.stride()
        return (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)

    if group_chunks:

        run_group_scan_state_pass(p["state"], kind, k, G, kg, w, u, vn, h, cu_seqlens, plan, state, state_indices,
                                  has_initial_state, state_layout, checkpoints, checkpoint_pool, group_chunks, l2norm, tf32,
                                  launch)
    else:
        cp = checkpoint_pool if ckpt_idx is not None else state
        kern, cx, nw, grid = p["state"]
        kern[grid + (S * HV,)](
            k, G, kg, w, u, vn, h, cu_seqlens, coff, state, state_indices, has_initial_state, cp,
            ckpt_idx if ckpt_idx is not None else state_indices, n_sub, *strides(state), *strides(cp),
            q if qeg is None else qeg, G if rq is None else rq, aqk, o, **cx, num_warps=nw)
    if "output" in p:
        kern, cx, nw, grid, ns = p["output"]
        kern[grid + (NC, HV)](q, G, aqk, vn, h, o, cu_seqlens, cidx, scale, **cx, num_warps=nw, num_stages=ns)
    return o
