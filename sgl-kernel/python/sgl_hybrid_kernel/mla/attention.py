"""Host wrapper of the split-KV MLA kernel (``triton_attention.py``) and its partition heuristic."""

from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.dcp.merge import merge_partials_strided
from sgl_hybrid_kernel.mla.reference import latent_cache_rows
from sgl_hybrid_kernel.mla.triton_attention import mla_split_kv_kernel

MIN_TOKENS_PER_SPLIT = 128
MAX_SPLITS = 128
WARPS_FOR_ROWS = {16: 8, 32: 4, 64: 8}  # when the caller names no tile (see default_tile)


@functools.lru_cache(maxsize=8)
def multiprocessor_count(device_index: int = 0) -> int:
    """SMs (CUDA) / CUs (ROCm) of a device; 132 (H200) without a GPU."""
    if not torch.cuda.is_available():
        return 132
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_tile(num_heads: int, tokens_per_request: int) -> Tuple[int, int]:
    """``(heads_per_program HB, rows BLOCK_M)``: rows are ``(token, head)`` pairs, ``BLOCK_M`` in {16, 32, 64}.

    One program takes all heads up to 64 (every head reads the same latent tile, so
    splitting heads across programs multiplies the bytes read); above 64 the heads
    are split evenly into ``ceil(H / 64)`` blocks. Verify / extend pack several
    tokens of a request into the tile (12 heads x 5 positions = 60 rows of 64).
    """
    if not 1 <= num_heads:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    hb = triton.cdiv(num_heads, triton.cdiv(num_heads, 64))
    rows = min(64, max(16, triton.next_power_of_2(hb * max(1, tokens_per_request))))
    return hb, rows


def choose_num_splits(
    batch: int,
    num_heads: int,
    max_kv_len: int,
    tokens_per_request: int = 1,
    num_sms: Optional[int] = None,
    block_n: int = 64,
) -> int:
    """KV partitions per request so that ``B x blocks x splits`` programs fill the GPU (seeds digest item 8).

    ``splits`` = the largest power of two ``<= 2 * SMs / programs per split``
    (about two programs per SM, in whole waves: the H200 sweep showed 9 partitions
    at B=32 costing 1.6x more than 8 or 16, a 2.2-wave tail), capped so each
    partition keeps ``MIN_TOKENS_PER_SPLIT`` positions and at ``MAX_SPLITS``.
    Examples on 132 SMs, 12 heads: B=1 at 32K -> 128; B=8 at 8K -> 32; B=32 at
    32K -> 8; B=32 at 1K -> 8; B=128 -> 2; B=1 at 200 tokens -> 1. Under CUDA
    graphs pass the capacity (largest ``max_kv_len`` the graph serves).
    """
    hb, rows = choose_tile(num_heads, tokens_per_request)
    programs = batch * triton.cdiv(num_heads, hb) * triton.cdiv(tokens_per_request, rows // hb)
    sms = num_sms or multiprocessor_count()
    target = max(1, (2 * sms) // max(programs, 1))
    splits = 1 << (target.bit_length() - 1)
    splits = min(splits, max(1, max_kv_len // MIN_TOKENS_PER_SPLIT), MAX_SPLITS)
    return max(1, splits)


def default_tile(platform: str, rows: int, kv_lora_rank: int, kv_fp8: bool = False) -> Dict[str, int]:
    """Launch tile for ``platform`` (``"cuda"`` / ``"rocm"``), ``rows`` per program and latent rank ``R``.

    Each (platform, rows) pair the dispatchers can pick is a config of the compile
    gate (``compile_gate.attention_moe_configs``: no spill on sm_90 / gfx942 /
    gfx950). Hopper, 16-row tiles (decode up to 16 heads): the 512-deep score dot
    whole, 64 positions per tile, 8 warps, 2 stages (fastest of the H200 sweep in
    ``benchmark/kernels/bench_attention_moe.py --sweep``). CDNA (and Hopper above
    16 rows): the score split into 64-column dots and the output into 128-column
    programs, which is what avoids spills there. An FP8 cache on Hopper: 32
    positions, 4 warps (its tile is converted in registers; fastest in the sweep).

    ``score_chunk`` and ``value_cols`` are capped at ``kv_lora_rank`` (both are
    powers of two, so the cap divides ``R``): R = 512 (Kimi K3) keeps the tiles
    above; a smaller rank (R = 128 in the boot gate, 64 in the tiny Kimi K3) takes
    the whole rank in one dot / one program, a smaller tile than the gated one.

    Raises:
        ValueError: ``kv_lora_rank`` not a power of two >= 1.
    """
    R = kv_lora_rank
    if isinstance(R, bool) or not isinstance(R, int) or R < 1 or R & (R - 1):
        raise ValueError(f"kv_lora_rank must be a power of two >= 1, got {R!r}")
    if platform == "cuda" and rows <= 16 and kv_fp8:
        tile = dict(block_n=32, score_chunk=512, value_cols=512, num_warps=4, num_stages=2)
    elif platform == "cuda" and rows <= 16:
        tile = dict(block_n=64, score_chunk=512, value_cols=512, num_warps=8, num_stages=2)
    else:
        tile = dict(block_n=16, score_chunk=64, value_cols=128, num_warps=4 if rows <= 32 else 8, num_stages=2)
    tile["score_chunk"] = min(tile["score_chunk"], R)
    tile["value_cols"] = min(tile["value_cols"], R)
    return tile


def mla_attention_paged_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float,
    page_size: int = 1,
    qo_indptr: Optional[torch.Tensor] = None,
    max_seqlen_q: int = 1,
    kv_lora_rank: int = 512,
    kv_scale: float = 1.0,
    num_splits: Optional[int] = None,
    max_kv_len: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
    workspace: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    block_n: int = 64,
    num_warps: Optional[int] = None,
    num_stages: int = 2,
    score_chunk: Optional[int] = None,
    value_cols: Optional[int] = None,
    causal: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``mla_attention_paged_reference`` (same arguments and results).

    Extra arguments:
        max_seqlen_q: largest ``T_b`` (1 for decode); sizes the grid.
        num_splits: KV partitions (default ``choose_num_splits``, which needs
            ``max_kv_len`` or reads ``kv_lens.max()`` with a host sync).
        out, lse_out: ``[N, H, R]`` / ``[N, H]`` FP32 destinations (in place).
        workspace: ``(part [N, H, S, R] FP32, part_lse [N, H, S] FP32)`` for the
            per-split partials (allocated when absent; ``S >= num_splits``).
        block_n: positions per tile; num_warps / num_stages: launch options.
        score_chunk: latent columns per score dot (default ``R``: one 512-deep dot).
        value_cols: output columns per program (default ``R``; ``R / 2`` doubles
            the programs, each re-reading the tile's score columns from cache).

    Raises:
        ValueError: ``R`` or the rope dim not a power of two, a cache row width
            other than ``q``'s, more than 2**31 cache rows.
    """
    rows_view = latent_cache_rows(kv_cache)
    N, H, D = q.shape
    R, P = kv_lora_rank, D - kv_lora_rank
    if rows_view.shape[-1] != D:
        raise ValueError(f"q head dim {D} != cache row dim {rows_view.shape[-1]}")
    if R & (R - 1) or P < 1 or P & (P - 1):
        raise ValueError(f"kv_lora_rank={R} and rope dim={P} must be powers of two")
    if rows_view.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q and kv_cache need a contiguous last dimension")
    B = kv_lens.shape[0]
    device = q.device
    if qo_indptr is None:
        if N != B:
            raise ValueError(f"q has {N} rows but kv_lens has {B} requests and no qo_indptr was given")
        qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=device)
        max_seqlen_q = 1
    hb, rows = choose_tile(H, max_seqlen_q)
    if num_splits is None:
        if max_kv_len is None:
            max_kv_len = int(kv_lens.max()) if B else 0
        num_splits = choose_num_splits(B, H, max_kv_len, max_seqlen_q, block_n=block_n)
    if out is None:
        out = torch.empty(N, H, R, dtype=q.dtype, device=device)
    if lse_out is None:
        lse_out = torch.empty(N, H, dtype=torch.float32, device=device)
    if N == 0 or B == 0:
        return out, lse_out
    if num_splits == 1:
        part, part_lse = out, lse_out
        strides = (out.stride(0), out.stride(1), 0, lse_out.stride(0), lse_out.stride(1), 0)
    else:
        if workspace is None:
            part = torch.empty(N, H, num_splits, R, dtype=torch.float32, device=device)
            part_lse = torch.empty(N, H, num_splits, dtype=torch.float32, device=device)
        else:
            part, part_lse = workspace
            if part.shape[2] < num_splits or part.shape[:2] != (N, H):
                raise ValueError(f"workspace shape {tuple(part.shape)} too small for N={N}, H={H}, splits={num_splits}")
        strides = (part.stride(0), part.stride(1), part.stride(2), part_lse.stride(0), part_lse.stride(1), part_lse.stride(2))
    tpp = rows // hb
    rc, rv = score_chunk or R, value_cols or R
    if R % rc or R % rv:
        raise ValueError(f"score_chunk={rc} and value_cols={rv} must divide kv_lora_rank={R}")
    grid = (B, triton.cdiv(max_seqlen_q, tpp) * triton.cdiv(H, hb) * (R // rv), num_splits)
    mla_split_kv_kernel[grid](
        q, rows_view, page_table, kv_lens, qo_indptr, part, part_lse,
        float(sm_scale), float(kv_scale), H, num_splits,
        q.stride(0), q.stride(1), rows_view.stride(0), page_table.stride(0),
        *strides,
        R=R, P=P, PAGE_SIZE=page_size, HB=hb, BLOCK_M=rows, BLOCK_N=block_n, RC=rc, RV=rv, CAUSAL=bool(causal),
        num_warps=num_warps or WARPS_FOR_ROWS[rows], num_stages=num_stages,
    )
    if num_splits > 1:
        merge_partials_strided(part[:, :, :num_splits], part_lse[:, :, :num_splits], out, lse_out, split_dim=2)
    return out, lse_out
