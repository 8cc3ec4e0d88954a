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
from typing import Dict, Optional, Sequence, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk_parallel import (
    chunk_gate_cumsum_kernel,
    chunk_intra_a_kernel,
    chunk_intra_arow_kernel,
    chunk_intra_inv_kernel,
    chunk_intra_kernel,
    chunk_intra_solve_kernel,
    chunk_output_kernel,
    chunk_state_kernel,
)
from sgl_hybrid_kernel.delta_rule.chunk.group_scan import run_group_scan_state_pass
from sgl_hybrid_kernel.delta_rule.chunk.rules import (CUMSUM_ROW_LOOP_MIN_TRITON, ChunkLaunch, _splitq,
                                                      fused_output_allowed)
from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides, ChunkPlan, plan_chunk
from sgl_hybrid_kernel.delta_rule.chunk.seq_plan import BC, BT, SeqPlan, int32_to_device, seq_plan
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import TRITON_VERSION
from sgl_hybrid_kernel.platform import Target

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
    plan: Optional[ChunkPlan] = None,
) -> torch.Tensor:
    """Run the four kernels of a chunk-64 ``plan``; arguments already validated by ``gated_delta_chunk_triton``.

    ``plan`` (``plan.plan_chunk``) decides everything below; without it the plan is made here from the
    explicit arguments (tests, benchmarks), which then mean:

    ``scratch_dtype`` holds ``w``, ``kg``, ``u``, ``v_new`` and the chunk-start states ``h``
    (default: FP32; BF16 halves their traffic). ``G`` is always FP32, and so are ``Aqk`` (in the
    scratch dtype for the fused output), ``A`` and its inverse (never leave registers). ``launch``
    defaults to the device's :func:`device_chunk_launch` (parameters by arch and CU count); ``value_tile`` /
    ``num_warps`` override its value tiles / state-passing and output warps.
    ``group_chunks``: run the state pass in group-scan mode with groups of that many
    chunks (``chunk/group_scan.py``); ``None``: the plain sequential state pass.
    ``lens``: the :class:`SeqPlan` of ``cu_seqlens`` (no host work per call), or tokens per
    sequence (offsets from 0; the plan is then looked up in the cache).
    No host sync: index tables come from the plan, checkpoint tables are copied without one.
    ``fuse_output``: the state pass forms the output (``chunk.rules.use_fused_output``; ``None``: as the launch table
    says; ``True`` outside its contract raises ``ValueError``).
    """
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    if not isinstance(lens, SeqPlan):
        lens = seq_plan([0, *itertools.accumulate(int(x) for x in lens)], dev)
    sp = lens
    S, NC, n_sub = len(sp.lens), sp.NC, sp.n_sub
    if plan is None:
        plan = plan_chunk(sp.lens, HV, V, kind, lower_bound, q.dtype, Target.of(dev), checkpoints=bool(checkpoints),
                          overrides=ChunkOverrides(method="parallel", value_tile=value_tile, num_warps=num_warps, tf32=tf32,
                                                   scratch_dtype=torch.float32 if scratch_dtype is None else scratch_dtype,
                                                   group_scan=True if group_chunks else None, group_chunks=group_chunks,
                                                   launch=launch, fuse_output=fuse_output))
    launch, group_chunks, tf32 = plan.launch, plan.group_chunks, plan.tf32
    sd = torch.float32 if plan.scratch_dtype is None else plan.scratch_dtype
    cidx, coff = sp.cidx, sp.coff
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
    fuse_output = plan.fuse_output
    p = launch_params(launch, kind, H, HV, K, V, lb, l2norm, tf32, ckpt_idx is not None, plan.value_tile, plan.num_warps,
                      interpret=plan.interpret, state_tile=plan.state_tile, lowp_scratch=plan.lowp_scratch,
                      fuse_output=fuse_output)
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

        run_group_scan_state_pass(p["state"], kind, k, G, kg, w, u, vn, h, cu_seqlens, sp, state, state_indices,
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
