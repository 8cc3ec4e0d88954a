"""Host wrapper of the multi-kernel chunked prefill (``triton_chunk_parallel.py``, chunk 64).

Four launches: gate cumulative sum, in-chunk WY pieces (parallel over chunks),
state passing (sequential over chunks, parallel over sequences x heads x value
tiles), output (parallel over chunks). Same contract as
``chunk.gated_delta_chunk_triton`` (which calls this for ``method="parallel"``).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import triton

from sgl_hybrid_kernel.delta_rule.triton_chunk_parallel import (
    chunk_gate_cumsum_kernel,
    chunk_intra_kernel,
    chunk_output_kernel,
    chunk_state_kernel,
)
from sgl_hybrid_kernel.delta_rule.triton_recurrent import GATE_GDN, GATE_KDA_SAFE

BT = 64  # tokens per chunk
BC = 16  # rows per diagonal block of the in-chunk inverse; checkpoint grid


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
    value_tile: int = 32,
    tf32: bool = False,
    scratch_dtype: Optional[torch.dtype] = None,
    num_warps: int = 8,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Run the four kernels; arguments already validated by ``gated_delta_chunk_triton``.

    ``scratch_dtype`` holds ``w``, ``u``, ``v_new`` and the chunk-start states ``h``
    (default: FP32; BF16 halves their traffic). ``G`` and ``Aqk`` are always FP32,
    and so are ``A`` and its inverse (never leave registers).
    """
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
    BK = triton.next_power_of_2(K)
    gshape = (N, HV) if kind == GATE_GDN else (N, HV, K)
    G = torch.empty(gshape, dtype=torch.float32, device=dev)
    aqk = torch.empty(N, HV, BT, dtype=torch.float32, device=dev)
    w = torch.empty(N, HV, K, dtype=sd, device=dev)
    u = torch.empty(N, HV, V, dtype=sd, device=dev)
    vn = torch.empty(N, HV, V, dtype=sd, device=dev)
    h = torch.empty(NC, HV, K, V, dtype=sd, device=dev)
    lb = 0.0 if lower_bound is None else float(lower_bound)
    chunk_gate_cumsum_kernel[(NC, HV)](f, A_log, dt_bias, G, cu_seqlens, cidx, lb, HV=HV, K=K, BK=BK, BT=BT, GATE=kind)
    chunk_intra_kernel[(NC, HV)](
        q, k, v, b, G, aqk, w, u, cu_seqlens, cidx, scale,
        H=H, HV=HV, K=K, V=V, BK=BK, BVF=triton.next_power_of_2(V), BT=BT, BC=BC, GATE=kind, L2NORM=l2norm,
        FACTORIZED=kind == GATE_KDA_SAFE and (BC - 1) * abs(lb) <= 80.0, KB=min(16, BK), KD=BK, TF32=tf32,
        num_warps=num_warps,
    )

    def strides(t):
        s0, s1, s2, s3 = t.stride()
        return (s0, s1, s2, s3) if state_layout == "kv" else (s0, s1, s3, s2)

    cp = checkpoint_pool if ckpt_idx is not None else state
    chunk_state_kernel[(triton.cdiv(V, value_tile), S * HV)](
        k, G, w, u, vn, h, cu_seqlens, coff, state, state_indices, has_initial_state, cp,
        ckpt_idx if ckpt_idx is not None else state_indices, n_sub, *strides(state), *strides(cp),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=value_tile, BT=BT, BC=BC, GATE=kind, L2NORM=l2norm,
        CKPT=ckpt_idx is not None, TF32=tf32, num_warps=num_warps,
    )
    chunk_output_kernel[(triton.cdiv(V, value_tile), NC, HV)](
        q, G, aqk, vn, h, o, cu_seqlens, cidx, scale,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=value_tile, BT=BT, GATE=kind, L2NORM=l2norm, TF32=tf32,
        num_warps=num_warps,
    )
    return o
