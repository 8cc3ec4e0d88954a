"""Host wrapper of the multi-kernel chunked prefill (``triton_chunk_parallel.py``, chunk 64).

Four launches: gate cumulative sum, in-chunk WY pieces (parallel over chunks),
state passing (sequential over chunks, parallel over sequences x heads x value
tiles), output (parallel over chunks). Same contract as
``chunk.gated_delta_chunk_triton`` (which calls this for ``method="parallel"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.triton_chunk_parallel import (
    chunk_gate_cumsum_kernel,
    chunk_intra_kernel,
    chunk_output_kernel,
    chunk_state_kernel,
)
from sgl_hybrid_kernel.delta_rule.triton_recurrent import GATE_GDN, GATE_KDA_SAFE
from sgl_hybrid_kernel.platform import device_platform

BT = 64  # tokens per chunk
BC = 16  # rows per diagonal block of the in-chunk inverse; checkpoint grid


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
    value columns per state-passing program without / with checkpoints; ``state_stages``:
    software-pipelining stages of the state pass's chunk loop (1: none);
    ``state_early``: issue each chunk step's loads before its stores (else each block's loads
    follow the previous block's state store; CDNA: off, which keeps 3 waves per SIMD
    where early loads would leave 2 — neither timed);
    ``value_tile``: value columns per output program. Every entry is compiled by
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
    state_kd: int = 64
    state_bv: int = 32
    state_bv_ckpt: int = 8
    state_warps: int = 8
    state_stages: int = 1
    state_early: bool = True
    value_tile: int = 32
    output_warps: int = 8
    tuned: bool = True
    source: str = ""


# Keyed by (arch, compute units) like the decode value-tile table (recurrent.VALUE_TILE_TUNED):
# a table timed on one part must not silently apply to a part with another CU count.
CHUNK_LAUNCH: Dict[Tuple[str, int], ChunkLaunch] = {
    ("sm90", 132): ChunkLaunch("sm90x132", intra_precision="tf32x3", state_kd=64, state_bv=16, state_bv_ckpt=8, state_stages=3,
                               source="spill-free in compile_gate for sm90; timed on the H200 (bench_delta_rule.py)"),
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


def launch_params(launch: ChunkLaunch, kind: int, H: int, HV: int, K: int, V: int, lower_bound: float,
                  l2norm: bool, tf32: bool, ckpt: bool, value_tile: Optional[int] = None,
                  num_warps: Optional[int] = None) -> Dict[str, Tuple[object, Dict[str, object], int, tuple]]:
    """``{"cumsum" | "intra" | "state" | "output": (kernel, constexprs, num_warps, grid_tail)}``: what
    :func:`gated_delta_chunk_parallel` launches; ``compile_gate`` compiles the same dicts.
    ``grid_tail``: the grid's value-tile / channel-block dimension."""
    BK = triton.next_power_of_2(K)
    BVP = triton.next_power_of_2(V)
    sbv = min(value_tile or (launch.state_bv_ckpt if ckpt else launch.state_bv), BVP)
    obv = min(value_tile or launch.value_tile, BVP)
    gbk = min(launch.cumsum_bk, BK)
    common = dict(H=H, HV=HV, K=K, V=V, BK=BK, BT=BT, GATE=kind, L2NORM=l2norm, TF32=tf32)
    factorized = kind == GATE_KDA_SAFE and (BC - 1) * abs(lower_bound) <= 80.0
    # the unbounded KDA gate (diagonal blocks summed over key blocks) keeps FP32 FMA products: not
    # timed, and with 3xTF32 it sits at sm_90's 255-register cap (a variant of it spilled; compile_gate)
    aprec = launch.intra_precision if tf32 and (kind == GATE_GDN or factorized) else "ieee"
    return {
        "cumsum": (chunk_gate_cumsum_kernel, dict(HV=HV, K=K, BK=gbk, BT=BT, GATE=kind), launch.cumsum_warps,
                   (1 if kind == GATE_GDN else triton.cdiv(K, gbk),)),
        "intra": (chunk_intra_kernel, dict(**common, BV=min(launch.intra_bv, BVP), BC=BC,
                                           FACTORIZED=factorized,
                                           KB=min(launch.intra_kb, BK), KD=min(launch.intra_kd, BK),
                                           APREC=aprec),
                  launch.intra_warps, ()),
        "state": (chunk_state_kernel, dict(**common, BV=sbv, BC=BC, KD=max(min(launch.state_kd, BK), BK // 4), CKPT=ckpt,
                                           STAGES=launch.state_stages,
                                           EARLY=launch.state_early),
                  num_warps or launch.state_warps, (triton.cdiv(V, sbv),)),
        "output": (chunk_output_kernel, dict(**common, BV=obv), num_warps or launch.output_warps, (triton.cdiv(V, obv),)),
    }


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
) -> torch.Tensor:
    """Run the four kernels; arguments already validated by ``gated_delta_chunk_triton``.

    ``scratch_dtype`` holds ``w``, ``kg``, ``u``, ``v_new`` and the chunk-start states ``h``
    (default: FP32; BF16 halves their traffic). ``G`` and ``Aqk`` are always FP32,
    and so are ``A`` and its inverse (never leave registers). ``launch`` defaults to the
    device's :func:`device_chunk_launch` (parameters by arch and CU count); ``value_tile`` /
    ``num_warps`` override its value tiles / state-passing and output warps.
    ``group_chunks``: run the state pass in group-scan mode with groups of that many
    chunks (``chunk_group_scan.py``); ``None``: the plain sequential state pass.
    """
    launch = launch or device_chunk_launch(q.device)
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    S = len(lens)
    dev = q.device
    n_ch = [triton.cdiv(n, BT) for n in lens]
    NC = sum(n_ch)
    sd = torch.float32 if scratch_dtype is None else scratch_dtype
    cidx = torch.tensor([(s, c) for s in range(S) for c in range(n_ch[s])] or [(0, 0)], dtype=torch.int32).to(dev)
    coff = torch.tensor([sum(n_ch[:s]) for s in range(S)], dtype=torch.int32).to(dev)
    n_sub = max(1, max((triton.cdiv(n, BT) * (BT // BC) for n in lens), default=1))
    ckpt_idx = None
    if checkpoints:
        table = torch.full((S, n_sub), -1, dtype=torch.int32)
        for seq, pos, dst in checkpoints:
            table[seq, triton.cdiv(pos, BC) - 1] = dst
        ckpt_idx = table.to(dev)
    o = out if out is not None else torch.empty_like(v)
    if NC == 0:
        return o
    lb = 0.0 if lower_bound is None else float(lower_bound)
    p = launch_params(launch, kind, H, HV, K, V, lb, l2norm, tf32, ckpt_idx is not None, value_tile, num_warps)
    gshape = (N, HV) if kind == GATE_GDN else (N, HV, K)
    G = torch.empty(gshape, dtype=torch.float32, device=dev)
    aqk = torch.empty(N, HV, BT, dtype=torch.float32, device=dev)
    w = torch.empty(N, HV, K, dtype=sd, device=dev)
    kg = torch.empty(N, HV, K, dtype=sd, device=dev)
    u = torch.empty(N, HV, V, dtype=sd, device=dev)
    vn = torch.empty(N, HV, V, dtype=sd, device=dev)
    h = torch.empty(NC, HV, K, V, dtype=sd, device=dev)
    kern, cx, nw, grid = p["cumsum"]
    kern[(NC, HV) + grid](f, A_log, dt_bias, G, cu_seqlens, cidx, lb, **cx, num_warps=nw)
    kern, cx, nw, grid = p["intra"]
    kern[(NC, HV)](q, k, v, b, G, aqk, w, u, kg, cu_seqlens, cidx, scale, **cx, num_warps=nw)

    def strides(t):
        s0, s1, s2, s3 = t.stride()
        return (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)

    if group_chunks:
        from sgl_hybrid_kernel.delta_rule.chunk_group_scan import run_group_scan_state_pass

        run_group_scan_state_pass(p["state"], kind, k, G, kg, w, u, vn, h, cu_seqlens, lens, state, state_indices,
                                  has_initial_state, state_layout, checkpoints, checkpoint_pool, group_chunks, l2norm, tf32,
                                  launch)
    else:
        cp = checkpoint_pool if ckpt_idx is not None else state
        kern, cx, nw, grid = p["state"]
        kern[grid + (S * HV,)](
            k, G, kg, w, u, vn, h, cu_seqlens, coff, state, state_indices, has_initial_state, cp,
            ckpt_idx if ckpt_idx is not None else state_indices, n_sub, *strides(state), *strides(cp), **cx, num_warps=nw)
    kern, cx, nw, grid = p["output"]
    kern[grid + (NC, HV)](q, G, aqk, vn, h, o, cu_seqlens, cidx, scale, **cx, num_warps=nw)
    return o
