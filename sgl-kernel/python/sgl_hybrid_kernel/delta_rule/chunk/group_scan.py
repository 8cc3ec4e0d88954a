"""Group-scan mode of the chunk-64 prefill (issue 4): the state pass split over groups of chunks.

For few sequences x heads the chunk-64 form's state pass (one program per sequence,
value head and value tile, sequential over all chunks) leaves most of the GPU idle.
Here each sequence is cut into groups of ``group_chunks`` chunks of 64 tokens and the
state pass becomes (kernels in ``triton_chunk_group_scan.py``; diagram in
docs/kernels.md):

1. summaries ``S -> A_g S + B_g`` of every group but a sequence's last, in parallel;
2. an ordered FP32 scan over each sequence's groups gives every group's start state;
3. the unchanged state-pass kernel replays all groups in parallel from their start
   states (``h`` / ``v_new`` for the output kernel, checkpoints, end states); the last
   group's end state is the sequence's final state, copied to its slot on the device
   (``chunk_group_final_kernel``).

Cost: the summaries redo the group's recurrence on ``V + K`` columns, so the state
pass does ~3x the arithmetic of the plain pass in exchange for ``G``-fold parallelism
and a ``G``-fold shorter serial chain. The plain-torch twin of the same mode is
``naive.prefill_group_scan_torch`` (per sequence: ``group_scan_sequence``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.chunk.seq_plan import BC, BT, SeqPlan, int32_to_device, seq_plan
from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk_group_scan import (
    chunk_group_final_kernel,
    chunk_group_scan_kernel,
    chunk_group_summary_kernel,
)

# Auto mode: a sequence needs this many chunks before splitting it pays (the summaries
# and the scan are two extra launches), and the plain state pass's programs must fit at
# least twice into one wave (PROGRAMS_PER_CU per compute unit).
MIN_CHUNKS = 16
# Replay programs per compute unit the auto mode aims at: one, since the sm_90 state kernel holds
# one 8-warp program per SM (255 registers) and a step costs the same however many programs wait
# (docs/kernels.md), so a split only pays while the replay fits in one wave.
PROGRAMS_PER_CU = 1
MIN_GROUP_CHUNKS = 4
# Forced mode without a group size, where the auto rule finds no split: this many groups per
# longest sequence (the summaries redo the recurrence on every group but the last, so the fewest
# groups cost least: 2 groups timed best of 2 / 3 / 4 / 8 at B=1, T=4,096 on the H200, 2026-11-30,
# benchmark/results/2026-11-30-h200-prefill_host.json).
FORCED_GROUPS = 2
# Auto mode also needs the mode timed faster than the plain pass on the part (keyed by the
# chunk launch-table entry's name): ``(faster, evidence)``. Not in the table: not timed, off.
GROUP_SCAN_TIMED: Dict[str, Tuple[bool, str]] = {
    "sm90x132": (False, "timed slower on the H200: 0.64-0.69x / 0.80-0.96x the plain pass at B=1, T=4,096 / "
                        "65,536 (benchmark/results/2026-11-29-h200-group_scan.json); 0.71x (2 groups, 0.564 vs 0.403 ms, "
                        "host overhead removed) at B=1, T=4,096 (2026-11-30-h200-prefill_host.json)"),
}
# Benchmark knob: augmented columns per summary program (None: the launch table's state_bv,
# the compile-gated configuration).
SUMMARY_BV_OVERRIDE: Optional[int] = None
SCAN_BV = 32  # value columns per scan program (>= 16: tl.dot)
SCAN_WARPS = 4
FINAL_BV = 16  # value columns per final-state copy program


def plan_groups(lens: Sequence[int], group_chunks: int) -> Tuple[List[Tuple[int, int, int]], List[int]]:
    """Split each sequence's chunks into groups of ``group_chunks`` (the last may be shorter).

    Args:
        lens: tokens per sequence.
        group_chunks: chunks of ``BT`` tokens per group (>= 1).

    Returns:
        ``(groups, goff)``: ``groups[g] = (sequence, first chunk in the sequence, chunks)``
        in token order; ``goff`` ``[S + 1]``: first group of each sequence. An empty
        sequence gets one empty group (its state is still carried to its slot).

    Raises:
        ValueError: ``group_chunks < 1``.
    """
    if group_chunks < 1:
        raise ValueError(f"group_chunks must be >= 1, got {group_chunks}")
    groups: List[Tuple[int, int, int]] = []
    goff = [0]
    for s, n in enumerate(lens):
        nc = triton.cdiv(int(n), BT)
        if nc == 0:
            groups.append((s, 0, 0))
        for c0 in range(0, nc, group_chunks):
            groups.append((s, c0, min(group_chunks, nc - c0)))
        goff.append(len(groups))
    return groups, goff


def auto_group_chunks(lens: Sequence[int], HV: int, V: int, state_bv: int, num_compute_units: int) -> Optional[int]:
    """Chunks per group the auto mode uses, or ``None`` when no split fits: the plain state pass's
    ``P = S * HV * ceil(V / state_bv)`` programs leave room for fewer than 2 copies of the replay in
    one wave (``num_compute_units * PROGRAMS_PER_CU // P < 2``), or no sequence has
    :data:`MIN_CHUNKS` chunks. Otherwise that many groups per longest sequence, of at least
    :data:`MIN_GROUP_CHUNKS` chunks."""
    programs = len(lens) * HV * triton.cdiv(V, state_bv)
    longest = max((triton.cdiv(int(n), BT) for n in lens), default=0)
    groups = PROGRAMS_PER_CU * num_compute_units // max(programs, 1)
    if groups < 2 or longest < MIN_CHUNKS:
        return None
    return max(MIN_GROUP_CHUNKS, triton.cdiv(longest, groups))


def forced_group_chunks(lens: Sequence[int]) -> int:
    """Chunks per group when the caller forces the mode without a size and the auto rule finds no
    split: :data:`FORCED_GROUPS` groups per longest sequence (at least :data:`MIN_GROUP_CHUNKS` chunks)."""
    longest = max((triton.cdiv(int(n), BT) for n in lens), default=0)
    return max(MIN_GROUP_CHUNKS, triton.cdiv(longest, FORCED_GROUPS))


def group_scan_launch_params(kind: int, H: int, HV: int, K: int, V: int, l2norm: bool, tf32: bool,
                             launch) -> Dict[str, Tuple[object, Dict[str, object], int, tuple]]:
    """``{"summary" | "scan" | "final": (kernel, constexprs, num_warps, grid_tail)}`` as launched by
    :func:`run_group_scan_state_pass`; ``compile_gate`` compiles the same dicts. ``launch``: the
    device's ``chunk.parallel.ChunkLaunch`` — the summary takes ``group_kd`` / ``group_warps`` (0: the
    state pass's key block and warps) and the state pass's value tile (no checkpoints); the scan the same key block, with ``tf32x3`` products
    when ``tf32`` (CUDA: FP32-level error, IEEE FP32 dots spill on sm_90) else IEEE FP32.
    Cached per argument tuple and :data:`SUMMARY_BV_OVERRIDE`: do not mutate the result."""
    return _group_scan_launch_params(kind, H, HV, K, V, l2norm, tf32, launch, SUMMARY_BV_OVERRIDE)


@functools.lru_cache(maxsize=256)
def _group_scan_launch_params(kind, H, HV, K, V, l2norm, tf32, launch, summary_bv):
    BK = triton.next_power_of_2(K)
    KD = max(min(launch.group_kd or launch.state_kd, BK), BK // 4)
    sbv = min(summary_bv or launch.state_bv, triton.next_power_of_2(V + K))
    vbv = min(SCAN_BV, max(16, triton.next_power_of_2(V)))
    return {
        "summary": (chunk_group_summary_kernel,
                    dict(H=H, HV=HV, K=K, V=V, BK=BK, BV=sbv, BT=BT, KD=KD, GATE=kind, L2NORM=l2norm, TF32=tf32),
                    launch.group_warps or launch.state_warps, (triton.cdiv(V + K, sbv),)),
        "scan": (chunk_group_scan_kernel, dict(HV=HV, K=K, V=V, BK=BK, BV=vbv, KD=KD, X3=tf32), SCAN_WARPS,
                 (triton.cdiv(V, vbv),)),
        "final": (chunk_group_final_kernel, dict(HV=HV, K=K, V=V, BK=BK, BV=FINAL_BV), 4, (triton.cdiv(V, FINAL_BV),)),
    }


def run_group_scan_state_pass(
    state_launch: Tuple[object, Dict[str, object], int, tuple],
    kind: int,
    k: torch.Tensor,
    G: torch.Tensor,
    kg: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    vn: torch.Tensor,
    h: torch.Tensor,
    cu_seqlens: torch.Tensor,
    lens,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    state_layout: str,
    checkpoints: Sequence[Tuple[int, int, int]],
    checkpoint_pool: Optional[torch.Tensor],
    group_chunks: int,
    l2norm: bool,
    tf32: bool,
    launch,
) -> None:
    """The group-scan replacement of ``chunk_state_kernel``'s one launch (called by
    ``chunk.parallel.gated_delta_chunk_parallel`` when ``group_chunks`` is set).

    ``kg``: the decayed keys ``chunk_intra_kernel`` wrote (the replay's state update).
    Same outputs as the plain state pass: ``h`` ``[NC, HV, K, V]`` chunk-start states,
    ``vn`` pseudo-values, checkpoints into ``checkpoint_pool``, each sequence's final
    state into its slot (``state_indices[i] < 0``: none). ``state_launch`` is the plain
    pass's ``(kernel, constexprs, num_warps, grid_tail)``; its constexprs fix ``H``,
    ``HV``, ``K``, ``V`` and the replay's tiles; ``launch`` the summary / scan tiles.
    ``lens``: the ``seq_plan.SeqPlan`` of ``cu_seqlens`` (its group tables are cached on it:
    no host sync, no table copy per call) or tokens per sequence (offsets from 0).
    """
    kern, cx, nw, grid = state_launch
    H, HV, K, V = cx["H"], cx["HV"], cx["K"], cx["V"]
    dev = k.device
    plan = lens if isinstance(lens, SeqPlan) else seq_plan([0, *itertools.accumulate(int(x) for x in lens)], dev)
    gp = group_plan(plan, group_chunks, dev)
    S, NG = len(plan.lens), gp.NG
    p = group_scan_launch_params(kind, H, HV, K, V, l2norm, tf32, launch)
    summ = torch.empty(max(NG, 1), HV, K, V + K, dtype=torch.float32, device=dev)
    if gp.n_summaries:
        skern, scx, snw, sgrid = p["summary"]
        skern[sgrid + (gp.n_summaries, HV)](k, G, w, u, cu_seqlens, gp.gidx, summ, **scx, num_warps=snw)
    start = torch.empty(NG, HV, K, V, dtype=torch.float32, device=dev)
    s0, s1, s2, s3 = state.stride()
    st = (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)
    ckern, ccx, cnw, cgrid = p["scan"]
    ckern[cgrid + (S * HV,)](summ, start, gp.goff_t, state, state_indices, has_initial_state, *st, **ccx, num_warps=cnw)
    ckpt_idx = None
    n_sub = max(1, group_chunks * (BT // BC))
    if checkpoints:
        table = [-1] * (NG * n_sub)
        goff, gcu, bos = gp.goff, gp.gcu, plan.bos
        for seq, pos, dst in checkpoints:
            gi = min(goff[seq] + (pos - 1) // (group_chunks * BT), goff[seq + 1] - 1)
            local = pos - (gcu[gi] - bos[seq])
            table[gi * n_sub + triton.cdiv(local, BC) - 1] = dst
        ckpt_idx = int32_to_device(table, dev).view(NG, n_sub)
    cp = checkpoint_pool if ckpt_idx is not None else start
    c0_, c1_, c2_, c3_ = cp.stride()
    cst = (c0_, c1_, c2_, c3_) if (state_layout == "kv" or ckpt_idx is None) else (c0_, c1_, c3_, c2_)
    kern[grid + (NG * HV,)](
        k, G, kg, w, u, vn, h, gp.gcu_t, gp.gcoff_t, start, gp.slots, gp.one, cp,
        ckpt_idx if ckpt_idx is not None else gp.slots, n_sub, *start.stride(), *cst, k, G, G, vn, **cx, num_warps=nw)
    # The last group's end state (left in ``start`` by the replay) is the final state.
    fkern, fcx, fnw, fgrid = p["final"]
    fkern[fgrid + (S * HV,)](start, gp.last_t, state, state_indices, *st, **fcx, num_warps=fnw)


@dataclass
class GroupPlan:
    """Host tables and their device copies for one (:class:`seq_plan.SeqPlan`, group size);
    cached on the plan (``plan.extra``), built with one non-blocking host-to-device copy.
    ``goff`` ``[S + 1]`` first group per sequence; ``gcu`` ``[NG + 1]`` token bounds of each group
    (the replay treats a group as a sequence); device: ``gidx`` ``[n_summaries, 4]`` (sequence,
    first chunk, chunks, group), ``goff_t``, ``gcu_t``, ``gcoff_t`` ``[NG]`` first global chunk per
    group, ``last_t`` ``[S]`` last group per sequence, ``slots`` ``arange(NG)``, ``one`` ``[NG]`` ones."""

    NG: int
    n_summaries: int
    goff: List[int]
    gcu: List[int]
    gidx: torch.Tensor
    goff_t: torch.Tensor
    gcu_t: torch.Tensor
    gcoff_t: torch.Tensor
    last_t: torch.Tensor
    slots: torch.Tensor
    one: torch.Tensor


def group_plan(plan, group_chunks: int, device: torch.device) -> GroupPlan:
    """The cached :class:`GroupPlan` of ``plan`` (a ``seq_plan.SeqPlan``) for groups of
    ``group_chunks`` chunks.

    Raises:
        ValueError: ``group_chunks < 1``.
    """
    key = ("group_scan", int(group_chunks))
    gp = plan.extra.get(key)
    if gp is not None:
        return gp
    groups, goff = plan_groups(plan.lens, group_chunks)
    NG = len(groups)
    first_chunk = [0, *itertools.accumulate(plan.n_ch)]
    bos = plan.bos
    gcu = [bos[s] + c0 * BT for (s, c0, _) in groups] + [bos[-1]]
    gcoff = [first_chunk[s] + c0 for (s, c0, _) in groups]
    summaries = [x for gi, (s, c0, nc) in enumerate(groups) if gi + 1 < goff[s + 1] for x in (s, c0, nc, gi)]
    last = [goff[s + 1] - 1 for s in range(len(plan.lens))]
    parts = [summaries, goff, gcu, gcoff, last, list(range(NG)), [1] * NG]
    flat = int32_to_device([x for part in parts for x in part], device)
    views, o = [], 0
    for part in parts:
        views.append(flat[o: o + len(part)])
        o += len(part)
    gp = GroupPlan(NG, len(summaries) // 4, goff, gcu, views[0].view(-1, 4), *views[1:])
    plan.extra[key] = gp
    return gp
