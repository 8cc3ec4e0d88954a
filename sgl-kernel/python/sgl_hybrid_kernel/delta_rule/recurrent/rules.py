"""Tile and mode rules of the decode / verify kernels (issue 4), as functions of shapes and a
:class:`~sgl_hybrid_kernel.platform.Target`; :func:`sgl_hybrid_kernel.delta_rule.plan.plan_recurrent` is
the one caller that combines them into a plan. The per-architecture numbers they read are rows of
``tiles.json`` beside this file (each with the measurement it came from); the measurements behind the larger
rules are that file's ``measurements`` (one record per rule function), the others are cited in their docstrings.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.recurrent.triton_lanes import gdc_wait
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.platform import Target


@dataclass(frozen=True)
class ValueTileTuning:
    """Parameters of :func:`pick_value_tile`, measured on one (arch, compute-unit count).

    ``num_compute_units`` SMs / CUs and ``waves``: decode narrows the tile until
    ``B * HV * V / BV`` programs fill ``waves`` waves of the device. ``narrow_decode_per_cu``:
    decode on the V-major pool with a per-channel gate (KDA) keeps 4-column one-warp programs
    while there are at most this many per compute unit, and takes them again from
    ``narrow_decode_large_per_cu`` per compute unit; plain verify windows narrow theirs
    until ``verify_waves`` waves (:func:`pick_wide_tile`). ``lanes_per_cu``: plain verify windows
    take the lanes kernel (:func:`pick_lanes_tile`) once its grid has at least this many programs
    per compute unit, GDN's all-modes windows from ``lanes_all_modes_per_cu``; GDN's plain verify windows
    below ``lanes_per_cu`` take it at 8 columns from ``lanes_narrow_per_cu`` programs per compute unit at
    8 columns, or from ``lanes_narrow_xred_per_cu`` where the one-warp kernel runs ``XRED`` (:func:`use_xred`).
    Plain windows that the one-warp kernel prepares (``TOKPREP``, :func:`use_tokprep`) take 4 or 8 columns where
    that grid has at most ``prepped_per_cu`` programs per compute unit, else 8 columns; GDN's take 16 where the
    16-column grid has ``prepped_wide_min_per_cu`` to ``prepped_per_cu`` or at least ``prepped_wide_large_per_cu``
    programs per compute unit; none takes the lanes kernel.
    ``tuned`` is False for the default built for a device no sweep has measured; ``source`` names the
    measurement the row came from and ``evidence`` ``((field, measurement), ...)`` the one behind each threshold.
    """

    name: str
    num_compute_units: int
    waves: int = 2
    tuned: bool = True
    source: str = ""
    narrow_decode_per_cu: int = 32
    verify_waves: int = 8
    lanes_per_cu: int = 8
    lanes_all_modes_per_cu: int = 64
    lanes_narrow_per_cu: int = 4
    lanes_narrow_xred_per_cu: int = 8
    prepped_per_cu: int = 12
    prepped_wide_min_per_cu: int = 9
    prepped_wide_large_per_cu: int = 128
    narrow_decode_large_per_cu: int = 48
    evidence: Tuple[Tuple[str, str], ...] = ()


TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiles.json")


def load_value_tile_tables(path: str = TABLE_FILE) -> Dict[Tuple[str, int], ValueTileTuning]:
    """The tuned rows of ``path``, keyed by ``(arch, compute units)``: a table measured on one part must not
    silently apply to a part with a different CU count (issue 9). Each row: ``arch``, ``num_compute_units``,
    ``source`` (the measurement it came from) and the :class:`ValueTileTuning` fields it sets.

    Raises:
        ValueError: a row without ``arch`` / ``num_compute_units`` / ``source``, or naming an unknown field.
    """
    with open(path) as fh:
        rows = json.load(fh)["tables"]
    fields = set(ValueTileTuning.__dataclass_fields__)
    out = {}
    for row in rows:
        missing = {"name", "arch", "num_compute_units", "source"} - set(row)
        unknown = set(row) - fields - {"arch"}
        if missing or unknown:
            raise ValueError(f"path: row {row.get('name')!r} lacks {sorted(missing)} or sets unknown {sorted(unknown)}")
        args = {k: v for k, v in row.items() if k not in ("arch", "evidence")}
        args["evidence"] = tuple(sorted(row.get("evidence", {}).items()))
        out[(row["arch"], int(row["num_compute_units"]))] = ValueTileTuning(**args)
    return out


VALUE_TILE_TUNED: Dict[Tuple[str, int], ValueTileTuning] = load_value_tile_tables()
# What tests and benchmarks on the CPU interpreter use (no device to ask).
INTERPRETER_TUNING = VALUE_TILE_TUNED[("sm90", 132)]


def value_tile_tuning(arch: Optional[str], num_compute_units: Optional[int]) -> ValueTileTuning:
    """The tuned entry for ``(arch, num_compute_units)``, else the documented default:
    the H200 rules with the wave target taken from this device's own CU count, marked
    ``tuned=False`` (the start-up table says so)."""
    entry = VALUE_TILE_TUNED.get((arch, num_compute_units))
    if entry is not None:
        return entry
    cus = int(num_compute_units or INTERPRETER_TUNING.num_compute_units)
    return ValueTileTuning(f"default({arch}x{cus})", cus, 2, False, "untuned: H200 rules, 2 waves of this device's CUs")


def target_tuning(target: Target) -> ValueTileTuning:
    """:func:`value_tile_tuning` for a target (CPU: the interpreter's table)."""
    if target.vendor == "cpu":
        return INTERPRETER_TUNING
    return value_tile_tuning(*target.key)


def pick_value_tile(
    batch: int,
    num_v_heads: int,
    head_v_dim: int,
    tokens: int = 1,
    state_layout: str = "vk",
    tuning: Optional[ValueTileTuning] = None,
    per_channel_decay: bool = False,
) -> int:
    """Columns per program, from the H200 sweeps (benchmark/kernels/bench_delta_rule_recurrent.py
    ``bench_recurrent_sweep``, docs/kernels.md; issue 4).

    One warp per program up to 16 columns (:func:`recurrent_num_warps`): every K-reduction
    of the chain stays inside the warp (shuffles, no shared memory or barriers); the H200
    sweep found one-warp programs fastest for decode and verify at every batch.

    * Decode (``tokens == 1``): start at 16 columns and halve while ``B * HV * V / BV``
      programs fall short of ``tuning.waves`` waves of ``tuning.num_compute_units``
      (H200: B=1 -> 4, B >= 4 -> 16 for 12 heads).
    * Verify windows (``tokens > 1``): the per-token input tiles held in registers leave
      room for a 4-column state slice with per-channel decay (KDA) or 8 with a per-head
      one (GDN; 4 columns with per-token inputs at B=1, :func:`recurrent_preload`); wider
      preloaded slices spill (compile_gate). Plain verify windows from
      :data:`WIDE_VERIFY_MIN_BATCH` requests do not use this tile: they run the wide kernel
      (:func:`use_wide_verify`, 64 columns, 4 warps), which the H200 measured faster there.
    * State stored K-major (``"kv"``, fla): a tile reads ``BV`` contiguous floats per row,
      so it never goes below 8 columns (one 32-byte sector per row); decode keeps the earlier
      32 / 64 columns (one 16-column warp was 25 % slower there, GDN B=32).

    ``tuning`` defaults to :data:`INTERPRETER_TUNING` (the H200 table); the
    plan passes its target's entry (:func:`target_tuning`).
    """
    tuning = tuning or INTERPRETER_TUNING
    vmax = triton.next_power_of_2(head_v_dim)
    floor = 8 if state_layout == "kv" else 4
    if tokens > 1:
        if batch == 1 and not per_channel_decay and state_layout == "vk":
            return min(4, vmax)  # GDN B=1: 4 columns, per-token inputs (recurrent_preload)
        return min(max(4 if per_channel_decay else 8, floor), vmax)
    if state_layout == "kv":
        return min(64 if batch * num_v_heads >= 512 else 32, vmax)
    bv = 16
    while bv > floor and batch * num_v_heads * triton.cdiv(head_v_dim, bv) < tuning.waves * tuning.num_compute_units:
        bv //= 2
    return min(bv, vmax)


# Longest windows use_tokprep prepares by itself (the kernel takes 2 to 10 tokens when asked, ``tokprep=True``): past
# these the prepared programs' token tiles cost more registers than the prep saves (H200, 2026-12-02,
# ``2026-12-02-h200-verify_tokens_t{3,6,8}_tokprep{0,1}.json``, per-token -> prepared, µs: GDN T=6 B = 1 / 3 / 8 / 32
# 5.31 / 11.36 / 19.92 / 57.33 -> 4.74 / 9.24 / 16.92 / 55.39, T=8 6.30 / 12.55 / 22.35 / 68.37 -> 7.50 / 15.61 / 30.21 /
# 108.40; KDA T=3 2.75 / 3.66 / 5.24 / 14.01 -> 2.60 / 3.46 / 5.18 / 12.90, T=6 3.60 / 5.17 / 7.72 / 20.54 -> 4.23 / 5.94 /
# 7.68 / 23.23)
TOKPREP_MAX_TOKENS_GDN = 6
TOKPREP_MAX_TOKENS_KDA = 4


def use_tokprep(gate_kind: int, tokens: int, plain: bool, xred: int) -> bool:
    """``TOKPREP`` of the one-warp verify kernel (``triton_recurrent._verify_plain_prepped``): a plain window of
    2 to :data:`TOKPREP_MAX_TOKENS_GDN` (GDN) or :data:`TOKPREP_MAX_TOKENS_KDA` (KDA) tokens taking the reduce-scatter
    (``xred``) computes every token's norms, ``q.k``, decay and beta before the state's chain. Prepared windows take
    their own tile rules (``prepped`` in :func:`pick_wide_tile` / :func:`pick_lanes_tile`: never the lanes kernel).
    ``SGL_HYBRID_TOKPREP=0`` turns it off, ``SGL_HYBRID_TOKPREP_KDA=0`` for KDA only.

    Measurements: ``tiles.json`` ``measurements["use_tokprep"]``."""
    if os.environ.get("SGL_HYBRID_TOKPREP", "1") == "0":
        return False
    if gate_kind != GATE_GDN and os.environ.get("SGL_HYBRID_TOKPREP_KDA", "1") == "0":
        return False
    top = TOKPREP_MAX_TOKENS_GDN if gate_kind == GATE_GDN else TOKPREP_MAX_TOKENS_KDA
    return bool(plain and xred and 2 <= tokens <= top)


def use_fast_gate(target: Target, gate_kind: int, tokens: int, value_tile: int, plain: bool) -> bool:
    """Whether a window of the one-warp verify kernel takes ``FAST`` (:func:`triton_recurrent._fexp`,
    ``_frcp``: the bounded KDA gate's and beta's exponentials and reciprocals as ``ex2.approx.ftz`` /
    ``rcp.approx.ftz`` without ``tl.exp`` / ``div.full``'s denormal and range fix-ups; equal results wherever no
    operand or result is denormal or above ``2^126``). CUDA only (not ROCm, not the interpreter), bounded KDA gate:
    the all-modes binary always (every mode of a window keeps one binary), plain windows (``tokens > 1``) at 4- and
    8-column tiles.

    Measurements: ``tiles.json`` ``measurements["use_fast_gate"]``."""
    if gate_kind != GATE_KDA_SAFE or target.vendor != "cuda" or target.interpreter:
        return False
    return (not plain) or (tokens > 1 and 4 <= value_tile < 16)


def xred_shape_ok(state_layout: str, key_stride: int, head_k_dim: int, value_tile: int, num_warps: int,
                  aligned: bool = True) -> bool:
    """Whether the one-warp kernel's ``XRED`` serves this launch: a V-major pool with key stride 1 and a 128-key
    tile (``65 <= K <= 128``), 2 to 16 value columns, one warp, and aligned pools (``aligned``,
    :func:`xred_aligned`: base, slot / head strides and row stride). Triton chooses the state
    tile's layout from these: only then are the 32 lanes on the keys with 4 consecutive keys per thread, which
    ``triton_recurrent._xred_pair``'s lane arithmetic assumes (other key widths or an unaligned pool put lanes on
    the columns; the compile gate's ``*_xred`` rows check the served configs). Issue 4."""
    return (state_layout == "vk" and key_stride == 1 and triton.next_power_of_2(head_k_dim) == 128
            and 2 <= value_tile <= 16 and num_warps == 1 and aligned)


def xred_aligned(*pools: Optional[torch.Tensor]) -> bool:
    """Whether every given V-major pool (``None`` skipped) has a 16-byte aligned base, slot / head strides divisible
    by 16 (Triton specialises the launch on both, as the compile gate's ``*_xred`` rows assume) and a value-row
    stride divisible by 4 (compiled in: rows 16-byte aligned). With any of them off a row's 4-key vectors are not
    aligned and Triton lays the state tile out otherwise (checked by compiling here, e.g. a row stride of 98 or
    102 floats)."""
    return all(t is None or (t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 and t.stride(1) % 16 == 0
                             and t.stride(2) % 4 == 0) for t in pools)


# CUDA archs on which the compile gate checks the XRED binaries' shuffled tiles (compile_gate: the *_xred rows)
XRED_ARCHS = ("sm90",)


def use_seq_key_sums(target: Target, state_layout: str, key_stride: int, head_k_dim: int, num_warps: int,
                     state_aligned: bool) -> bool:
    """``SEQ`` of the one-warp verify kernel (``triton_recurrent._key_sum``): every key sum through an in-order
    view of the thread's 4 keys, a chain of FMAs under Triton 3.7+ (whose in-thread reductions are trees), so replays
    add as their verify did. Only where the state tile's layout matches that view -- :func:`xred_shape_ok` but the
    value tile, with the alignment of the **state pool only** (``state_aligned``, :func:`xred_aligned`: every call of
    a window must answer alike) -- on the CUDA archs of :data:`XRED_ARCHS`, and in the interpreter (so the CPU tests
    run it).

    Measurements: ``tiles.json`` ``measurements["use_seq_key_sums"]``."""
    if not xred_shape_ok(state_layout, key_stride, head_k_dim, 4, num_warps, state_aligned):
        return False
    if target.interpreter:
        return True
    return target.vendor == "cuda" and target.arch in XRED_ARCHS


def use_xred(target: Target, state_layout: str, key_stride: int, head_k_dim: int, value_tile: int,
             num_warps: int = 1, aligned: bool = True, prepped: bool = False) -> int:
    """``XRED`` of the one-warp verify kernel (``triton_recurrent._xred_pair``: each token's ``k.S'`` and
    ``q.S'`` as one reduce-scatter across the warp, bit-identical to Triton's per-column butterflies after the
    in-order sums of ``SEQ``): 1 (CUDA shuffles) below 16 columns, or at any tile of a ``prepped`` window (which
    needs it), else 0. CUDA only, on the archs of :data:`XRED_ARCHS` (whose shuffle layouts the compile gate checks),
    inside :func:`xred_shape_ok`. A window and its replays need not agree on it (states are the same bits).

    Measurements: ``tiles.json`` ``measurements["use_xred"]``."""
    if target.vendor != "cuda" or target.interpreter \
            or not xred_shape_ok(state_layout, key_stride, head_k_dim, value_tile, num_warps, aligned) \
            or target.arch not in XRED_ARCHS:
        return 0
    return int(value_tile < 16 or prepped)


def lanes_shape_ok(head_k_dim: int, head_v_dim: int, value_tile: int, key_lanes: int) -> bool:
    """Whether the lanes kernel serves this shape: power-of-two ``K`` split in key blocks of
    ``4 * key_lanes``, ``V`` a multiple of the power-of-two ``value_tile``."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0  # noqa: E731
    return (pow2(head_k_dim) and pow2(value_tile) and pow2(key_lanes) and key_lanes <= 32
            and head_k_dim % (4 * key_lanes) == 0 and head_v_dim % value_tile == 0)


def pick_lanes_tile(batch: int, num_v_heads: int, head_v_dim: int, head_k_dim: int, tokens: int,
                    per_channel_decay: bool, tuning: Optional[ValueTileTuning] = None,
                    plain: bool = True, xred: bool = False, prepped: bool = False) -> Optional[Tuple[int, int]]:
    """``(value_tile, key_lanes)`` of the lanes kernel (``triton_lanes.py``) for a step on the V-major pool,
    or ``None`` for the one-warp kernel; shapes outside :func:`lanes_shape_ok` always take the one-warp kernel.

    16 columns, 8 key lanes: plain verify windows (either gate) once the 16-column grid has at least
    ``tuning.lanes_per_cu`` programs per compute unit; below that GDN's at 8 columns once that grid has
    ``tuning.lanes_narrow_per_cu`` (``tuning.lanes_narrow_xred_per_cu`` where the one-warp kernel runs ``XRED``);
    GDN's all-modes windows (snapshots, deferred commit, fused replay, :func:`replay_commit`; the choice ignores
    ``tokens``, so a window and its replays take one kernel) from ``tuning.lanes_all_modes_per_cu``. Never decode,
    KDA's all-modes windows, or a ``prepped`` plain window (:func:`use_tokprep`).

    Measurements: ``tiles.json`` ``measurements["pick_lanes_tile"]`` and the row's ``evidence``."""
    tuning = tuning or INTERPRETER_TUNING
    if plain and tokens == 1:
        return None
    if not plain and per_channel_decay:
        return None
    bv, kl = 16, 8
    if not lanes_shape_ok(head_k_dim, head_v_dim, bv, kl):
        return None
    per_cu = tuning.lanes_per_cu if plain else tuning.lanes_all_modes_per_cu
    if plain and prepped:
        return None
    if batch * num_v_heads * triton.cdiv(head_v_dim, bv) >= per_cu * tuning.num_compute_units:
        return bv, kl
    narrow_per_cu = tuning.lanes_narrow_xred_per_cu if xred else tuning.lanes_narrow_per_cu
    if (plain and not per_channel_decay and lanes_shape_ok(head_k_dim, head_v_dim, 8, kl)
            and batch * num_v_heads * triton.cdiv(head_v_dim, 8) >= narrow_per_cu * tuning.num_compute_units):
        return 8, kl
    return None


# From this Triton version a plain GDN window (per-head decay, PLAIN binary) runs slower as a programmatic
# dependent launch (lanes_pdl), except at value tiles of at most LANES_PDL_PLAIN_PER_HEAD_MAX_TILE columns
LANES_PDL_PLAIN_PER_HEAD_OFF_FROM_TRITON = (3, 7)
LANES_PDL_PLAIN_PER_HEAD_MAX_TILE = 8


def lanes_pdl(target: Target, plain: bool = False, per_channel_decay: bool = True, value_tile: int = 16) -> bool:
    """Whether the lanes kernel starts as a programmatic dependent launch of its prologue (Triton
    ``launch_pdl``; it waits, ``gdc_wait``, only before reading the prologue's outputs). NVIDIA sm_90 and newer with a
    Triton that has grid dependency control; never on ROCm or CPU; ``SGL_HYBRID_LANES_PDL=0`` turns it off. Not for
    a plain window with a per-head decay (GDN) over :data:`LANES_PDL_PLAIN_PER_HEAD_MAX_TILE` columns under Triton
    >= :data:`LANES_PDL_PLAIN_PER_HEAD_OFF_FROM_TRITON`.

    Measurements: ``tiles.json`` ``measurements["lanes_pdl"]``."""
    if os.environ.get("SGL_HYBRID_LANES_PDL", "1") == "0" or gdc_wait is None:
        return False
    if target.vendor != "cuda" or not (target.arch or "").startswith("sm"):
        return False
    if (plain and not per_channel_decay and target.triton_version >= LANES_PDL_PLAIN_PER_HEAD_OFF_FROM_TRITON
            and value_tile > LANES_PDL_PLAIN_PER_HEAD_MAX_TILE):
        return False
    return int(target.arch[2:]) >= 90



def window_value_tile(batch: int, num_v_heads: int, head_v_dim: int) -> int:
    """Value columns per program of the chunk-form window kernel (``tl.dot`` needs >= 16)."""
    return min(32, max(16, triton.next_power_of_2(head_v_dim)))


def window_num_warps(target: Target) -> int:
    """Warps per program of the chunk-form window kernel: the spill-free configurations of the
    compile gate (32 columns: 4 warps on CDNA, whose FP32 ``tl.dot`` runs on MFMA; 8 on sm_90,
    whose FP32 ``tl.dot`` is an FMA loop holding whole K strips per thread)."""
    return 4 if target.vendor == "rocm" else 8


def window_dot_precision(target: Target) -> str:
    """``tl.dot`` input precision of the chunk-form window: FP32 (``"ieee"``) on every platform
    (split TF32, ``"tf32x3"``, was faster on the H200 but spills at every spill-free tile)."""
    return "ieee"


def use_wide_verify(batch: int, tokens: int, state_layout: str = "vk") -> bool:
    """Whether a step runs ``gated_delta_verify_wide_kernel`` (one-warp per-token programs) by
    default: every verify window (``tokens > 1``) in every mode (plain, snapshots, deferred commit,
    fused replay), so all modes of a window share one binary, and decode on the V-major pool.
    H200, 2026-11-30 (docs/kernels.md): verify 1.3-1.5x faster than the register-tile kernel at
    B = 32 / 128; decode KDA B=1 2.53-2.66 vs 2.72-2.84 us, B=32 / 128 at the state read + write
    floor. Decode on the K-major pool keeps the register-tile kernel (not measured here)."""
    return tokens > 1 or state_layout == "vk"


def pick_wide_tile(batch: int, num_v_heads: int, head_v_dim: int, state_layout: str = "vk",
                   tuning: Optional[ValueTileTuning] = None, tokens: int = 1, per_channel_decay: bool = False,
                   xred: bool = False, prepped: bool = False) -> int:
    """Value columns per one-warp program of the verify kernel's ``PLAIN`` binary (V-major pool: SGLang's;
    K-major: fla's).

    * Decode (``tokens == 1``), V-major: 4 columns with a per-head gate (GDN); with a per-channel gate (KDA) 4 while
      ``B * HV * V / 4`` programs are at most ``tuning.narrow_decode_per_cu`` per compute unit or at least
      ``tuning.narrow_decode_large_per_cu``, 16 in between (12 heads: B = 12-16).
    * Plain verify windows (``tokens > 1``), V-major: 16 columns, halved (to 4 at least; 2 for KDA without ``xred``)
      while the grid falls short of ``tuning.verify_waves`` waves.
    * ``prepped`` (``TOKPREP``, :func:`use_tokprep`): 4 or 8 columns, the narrower first, where that grid has at most
      ``tuning.prepped_per_cu`` programs per compute unit; else GDN 16 where the 16-column grid has
      ``tuning.prepped_wide_min_per_cu`` to ``prepped_per_cu`` or at least ``tuning.prepped_wide_large_per_cu``
      programs per compute unit, else 8.
    * K-major pool: 16 columns halved while short of ``tuning.waves`` waves, 8 at least.

    Measurements (H200 sweeps, graph replay, states from HBM): ``tiles.json`` ``measurements["pick_wide_tile"]``
    and the row's ``evidence``."""
    tuning = tuning or INTERPRETER_TUNING
    if prepped and tokens > 1 and state_layout == "vk":
        cap = tuning.prepped_per_cu * tuning.num_compute_units
        for bv in (4, 8):
            if batch * num_v_heads * triton.cdiv(head_v_dim, bv) <= cap:
                return min(bv, triton.next_power_of_2(head_v_dim))
        wide = batch * num_v_heads * triton.cdiv(head_v_dim, 16)
        if not per_channel_decay and (tuning.prepped_wide_min_per_cu * tuning.num_compute_units <= wide <= cap
                                      or wide >= tuning.prepped_wide_large_per_cu * tuning.num_compute_units):
            return min(16, triton.next_power_of_2(head_v_dim))
        return min(8, triton.next_power_of_2(head_v_dim))
    if tokens == 1 and state_layout == "vk" and head_v_dim >= 4:
        narrow = batch * num_v_heads * triton.cdiv(head_v_dim, 4)
        if (not per_channel_decay or narrow <= tuning.narrow_decode_per_cu * tuning.num_compute_units
                or narrow >= tuning.narrow_decode_large_per_cu * tuning.num_compute_units):
            return 4
    waves = tuning.verify_waves if (tokens > 1 and state_layout == "vk") else tuning.waves
    floor = 8 if state_layout == "kv" else (2 if tokens > 1 and per_channel_decay and not xred else 4)
    bv = 16
    while bv > floor and batch * num_v_heads * triton.cdiv(head_v_dim, bv) < waves * tuning.num_compute_units:
        bv //= 2
    return min(bv, triton.next_power_of_2(head_v_dim))


def pick_deferred_tile(batch: int, num_v_heads: int, head_v_dim: int, state_layout: str = "vk",
                       tuning: Optional[ValueTileTuning] = None) -> int:
    """Value columns per one-warp program of the verify kernel's all-modes binary (snapshots,
    deferred commit, fused replay, :func:`replay_commit`): 8 (16 on a K-major pool), halved while
    the grid is under ``tuning.verify_waves`` (8) waves of ``tuning.num_compute_units``. H200, 2026-11-30, GDN T=5: B=32
    8 columns (deferred 117 / fused 134 us vs 123 / 146 at 16), K-major 16 (130 vs 157 at 8), B=1
    4 (7.8 vs 8.1 us at 8)."""
    tuning = tuning or INTERPRETER_TUNING
    bv, floor = (16, 8) if state_layout == "kv" else (8, 4)
    while bv > floor and batch * num_v_heads * triton.cdiv(head_v_dim, bv) < tuning.verify_waves * tuning.num_compute_units:
        bv //= 2
    return min(bv, triton.next_power_of_2(head_v_dim))


def recurrent_preload(bv: int, tokens: int = 1, per_channel_decay: bool = True) -> bool:
    """Whether the kernel preloads all ``tokens`` tokens' inputs as register tiles (``PRELOAD``)
    rather than each token's one token ahead of its chain. Decode and narrow verify tiles do;
    from 16 columns the ``[K, T]`` input tiles beside the ``[K, BV]`` state slice spill on
    sm_90 (compile gate), and a 4-column per-head-decay (GDN) tile was faster per token on the
    H200 (B=1, T=5 fused deferred verify: 7.5 vs 8.5 µs at 8 preloaded columns)."""
    if tokens == 1:
        return True
    return bv < 16 and not (bv == 4 and not per_channel_decay)


def recurrent_num_warps(bv: int, tokens: int = 1, state_layout: str = "kv") -> int:
    """Warps per program of the decode / verify kernel for a ``BV``-column tile: one up to
    16 columns (H200 sweep: K-reductions inside one warp), then one per 16 columns so the
    ``[K, BV]`` state slice stays within registers."""
    return max(1, bv // 16)




def lanes_fold(target: Target) -> bool:
    """``FOLD`` of the lanes kernel: its key-block sums in index order (``triton_lanes._lanes_sum``). On CUDA and in
    the interpreter; not on ROCm, where the fold was compiled (gfx942 / gfx950: 136 -> 170 VGPRs for KDA on gfx950,
    140 -> 174 for GDN's all-modes binary on gfx942, one wave per SIMD less) but never run. Every call of one
    process answers alike, so a window and its replays agree. Issue 4, nineteenth round."""
    return target.interpreter or target.vendor == "cuda"

