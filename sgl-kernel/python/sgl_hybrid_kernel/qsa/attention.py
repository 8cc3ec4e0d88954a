"""Host wrapper of the QSA kernel (``triton_qsa.py``): sparse walk or dense special case."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.dcp.merge import merge_partials_strided
from sgl_hybrid_kernel.qsa.triton_qsa import qsa_attention_kernel, qsa_merge_kernel

DENSE_TILE_ROWS = 64


def choose_qsa_splits(programs: int, positions: int, num_sms: int = 132, min_positions: int = 128,
                      programs_per_sm: int = 6) -> int:
    """Partitions of each program's key range (dense: the causal prefix; sparse: the selection list).

    The largest power of two ``<= programs_per_sm * SMs / programs``, each partition keeping at
    least ``min_positions``. ``programs_per_sm``: programs of the tile resident on one SM
    (``dense_programs_per_sm`` for the dense walk). H200 sweeps at C32 x 5 positions, 2 KV heads,
    2,000 visible positions: sparse (320 programs, 6) -> 2 partitions (89.7 us vs 209.5 with one);
    dense with the 64-position 3-stage tile (112 KB of shared memory, 2 per SM; 64 programs) -> 4
    (29.9 us; 2 / 3 / 8 partitions: 31.1 / 30.4 / 36.5 us; issue 5, 2026-11-29 page-prefetch sweep).
    """
    target = max(1, (programs_per_sm * num_sms) // max(programs, 1))
    return max(1, min(1 << (target.bit_length() - 1), max(1, positions // min_positions), 64))


def dense_programs_per_sm(platform: str) -> int:
    """Programs of the default dense tile resident per SM / CU (``choose_qsa_splits``'s ``programs_per_sm``):
    2 for the CUDA tile (112 KB of shared memory each), else 6 as for the sparse walk."""
    return 2 if platform == "cuda" else 6


def default_tile(platform: str, sparse: bool) -> dict:
    """Launch options per platform and walk. CUDA: the fastest configs of the H200 sweeps
    (dense: 64-position tile, 3 stages, 112 KB shared memory, no spills at the launch's
    divisibility specialisation; partitions merged by ``qsa_merge_kernel``, 4 heads per program);
    CDNA: the compile gate's spill-free configs (DCP merge)."""
    if platform == "cuda":
        return dict(block_n=32, num_warps=4) if sparse else dict(block_n=64, num_warps=4, num_stages=3, merge_block_h=4)
    return dict(block_n=16, num_warps=4) if sparse else dict(block_n=16, num_warps=8)


def qsa_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    sm_scale: float,
    max_seqlen_q: int,
    page_size: int = 1,
    block_indices: Optional[torch.Tensor] = None,
    compress_ratio: int = 4,
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    num_splits: int = 1,
    merge_block_h: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``qsa_attention_reference``.

    ``block_indices=None`` takes the dense walk (one program per request and KV
    head, all ``max_seqlen_q x G`` rows in one tile); otherwise the sparse walk
    (one program per query row and KV head). ``num_splits > 1`` splits each
    program's key range into partitions merged by their LSE (FP32 workspace):
    by ``qsa_merge_kernel`` (``merge_block_h`` heads per program) or, with
    ``merge_block_h=0``, by the DCP merge kernel.

    Raises:
        ValueError: dense walk with ``max_seqlen_q * G > 64`` rows, head dims not
            powers of two, or ``Hq`` not a multiple of ``Hkv``.
    """
    N, Hq, D = q.shape
    Hkv, DV = k_cache.shape[1], v_cache.shape[-1]
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} not a multiple of KV heads {Hkv}")
    if D & (D - 1) or DV & (DV - 1):
        raise ValueError(f"head dims D={D}, Dv={DV} must be powers of two")
    G = Hq // Hkv
    B = kv_lens.shape[0]
    kv_lens, qo_indptr = kv_lens.contiguous(), qo_indptr.contiguous()  # the kernel indexes them densely
    out = torch.empty(N, Hq, DV, dtype=q.dtype, device=q.device) if out is None else out
    lse_out = torch.empty(N, Hq, dtype=torch.float32, device=q.device) if lse_out is None else lse_out
    if N == 0:
        return out, lse_out
    sparse = block_indices is not None
    if sparse:
        tpp = 1
        rows = max(16, triton.next_power_of_2(G))
        row_req = torch.searchsorted(qo_indptr[1:].to(torch.int64), torch.arange(N, device=q.device), right=True).to(torch.int32)
        idx = block_indices
        grid = (N, Hkv)
        if block_n % compress_ratio:
            raise ValueError(f"block_n={block_n} must be a multiple of compress_ratio={compress_ratio}")
    else:
        tpp = max_seqlen_q
        if tpp * G > DENSE_TILE_ROWS:
            raise ValueError(f"dense walk: {tpp} positions x {G} heads per KV head exceed the {DENSE_TILE_ROWS}-row tile")
        rows = max(16, triton.next_power_of_2(tpp * G))
        row_req, idx = qo_indptr, qo_indptr  # unused
        grid = (B, Hkv)
    if num_splits > 1:
        part = torch.empty(N, Hq, num_splits, DV, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(N, Hq, num_splits, dtype=torch.float32, device=q.device)
        dst = (part, part_lse, part.stride(0), part.stride(1), part.stride(2), part_lse.stride(0), part_lse.stride(1), part_lse.stride(2))
    else:
        dst = (out, lse_out, out.stride(0), out.stride(1), 0, lse_out.stride(0), lse_out.stride(1), 0)
    qsa_attention_kernel[grid + (num_splits,)](
        q, k_cache, v_cache, page_table, kv_lens, qo_indptr, row_req, idx, dst[0], dst[1],
        float(sm_scale), idx.shape[1] if sparse else 0, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        page_table.stride(0), idx.stride(0) if sparse else 0, *dst[2:],
        G=G, D=D, DV=DV, PAGE_SIZE=page_size, RATIO=compress_ratio, TPP=tpp, BLOCK_M=rows, BLOCK_N=block_n,
        SPARSE=sparse, num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1 and merge_block_h and lse_out.stride(1) == 1:  # qsa_merge_kernel indexes LSE heads densely
        qsa_merge_kernel[(N, triton.cdiv(Hq, merge_block_h))](
            part, part_lse, out, lse_out, Hq, num_splits, part.stride(0), part.stride(1), part_lse.stride(0),
            part_lse.stride(1), out.stride(0), out.stride(1), lse_out.stride(0),
            DV=DV, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_H=merge_block_h, num_warps=4,
        )
    elif num_splits > 1:
        merge_partials_strided(part, part_lse, out, lse_out, split_dim=2)
    return out, lse_out
