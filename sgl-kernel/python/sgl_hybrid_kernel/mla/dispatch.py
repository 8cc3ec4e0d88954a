"""MLA decode / extend dispatch: aiter (ROCm, decode), Triton split-KV (CUDA / ROCm), or plain torch.

Choice, logged once per op through ``sgl_hybrid_kernel.dispatch.record_choice``:

* CPU tensors -> ``mla_attention_paged_reference``.
* ROCm decode with BF16 query and cache and ``aiter`` importable -> aiter's
  ``mla_decode_fwd`` through the query-head padding adapter (``aiter_adapter.py``).
  FP8 caches stay on Triton there: aiter's FP8 kernels also want an FP8 query.
* Otherwise Triton when the shape is inside the tested contract: latent rank and
  rope dim powers of two with ``R <= 512`` and ``P <= 64``, 1..128 heads, query
  BF16 / FP16 / FP32, cache of the query's dtype or FP8 (e4m3) with a scale.
* Anything else -> the plain-torch reference (the reason is logged).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Optional, Tuple

import torch

from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.platform import device_platform
from sgl_hybrid_kernel.mla.aiter_adapter import AITER_DECODE_HEAD_COUNTS, mla_decode_aiter, padded_head_count
from sgl_hybrid_kernel.mla.attention import choose_tile, default_tile, mla_attention_paged_triton
from sgl_hybrid_kernel.mla.reference import mla_attention_paged_reference

logger = logging.getLogger(__name__)

MAX_HEADS = 128
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))


@functools.lru_cache(maxsize=1)
def aiter_mla_decode_fn() -> Optional[Callable]:
    """aiter's ``mla_decode_fwd`` if ``aiter`` imports (ROCm), else ``None``."""
    try:
        from aiter.mla import mla_decode_fwd
    except Exception:  # ImportError, or aiter's own "ROCm version file not found"
        return None
    return mla_decode_fwd


def _why_not_triton(q: torch.Tensor, kv_dtype: torch.dtype, kv_lora_rank: int) -> Optional[str]:
    H, D = q.shape[1], q.shape[2]
    R, P = kv_lora_rank, D - kv_lora_rank
    if not (0 < R <= 512 and R & (R - 1) == 0 and 0 < P <= 64 and P & (P - 1) == 0):
        return f"kv_lora_rank={R}, rope dim={P} (kernel: powers of two, R <= 512, P <= 64)"
    if not 1 <= H <= MAX_HEADS:
        return f"{H} heads (kernel tested for 1..{MAX_HEADS})"
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"query dtype {q.dtype}"
    if kv_dtype != q.dtype and kv_dtype not in FP8_DTYPES:
        return f"cache dtype {kv_dtype} with query dtype {q.dtype}"
    return None


def _choose(op: str, q: torch.Tensor, kv_cache: torch.Tensor, kv_lora_rank: int, decode: bool, tokens: int = 1) -> str:
    kind = device_kind(q)
    if kind == "cpu":
        record_choice(op, "torch", "CPU tensors: plain-torch reference", log=logger)
        return "torch"
    H = q.shape[1]
    if (decode and kind == "rocm" and q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16
            and H <= max(AITER_DECODE_HEAD_COUNTS) and aiter_mla_decode_fn() is not None):
        hp = padded_head_count(H)
        record_choice(op, "aiter", f"rocm: aiter mla_decode_fwd, query heads {H} padded to {hp}", log=logger)
        return "aiter"
    why = _why_not_triton(q, kv_cache.dtype, kv_lora_rank)
    if why:
        record_choice(op, "torch", f"outside the Triton contract: {why}", log=logger)
        return "torch"
    hb, rows = choose_tile(H, tokens)
    tile = default_tile(kind, rows, kv_lora_rank, kv_cache.dtype in FP8_DTYPES)
    dev = device_platform(q.device)
    cus = f"{dev.arch} x {dev.num_compute_units} CUs" if dev.num_compute_units else "the device's CU count"
    record_choice(op, "triton", f"{kind}: mla_split_kv_kernel rows={rows} block_n={tile['block_n']} "
                  f"score_chunk={tile['score_chunk']} value_cols={tile['value_cols']} (spill-free {kind} tile, "
                  f"not tuned per CU count; KV splits sized for {cus})", log=logger)
    return "triton"


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float,
    page_size: int = 1,
    kv_lora_rank: int = 512,
    kv_scale: Optional[float] = None,
    num_splits: Optional[int] = None,
    max_kv_len: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MLA decode over a paged latent cache: one query row per request.

    Args:
        q: ``[B, H, R + P]`` absorbed latent + rope query (Kimi K3: R = 512, P = 64).
        kv_cache: paged latent cache (``mla.reference.latent_cache_rows``), BF16 /
            FP16 / FP32 or FP8 e4m3 with per-tensor ``kv_scale``.
        page_table: ``[B, max_pages]`` int32; kv_lens: ``[B]`` int32 (0 allowed).
        sm_scale: softmax scale; page_size: positions per page.
        num_splits, max_kv_len: KV partitions for the Triton path (default from
            ``attention.choose_num_splits``; pass one of them under CUDA graphs).

    Returns:
        ``(o [B, H, R] in q.dtype, lse [B, H] FP32, natural log; (0, -inf) for an empty request)``.

    Raises:
        ValueError: malformed shapes (see the reference).
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, D], got shape {tuple(q.shape)}")
    impl = _choose("mla_decode", q, kv_cache, kv_lora_rank, decode=True)
    if impl == "aiter":
        return mla_decode_aiter(q, kv_cache, page_table, kv_lens, sm_scale, page_size, kv_lora_rank, kv_scale,
                                decode_fn=aiter_mla_decode_fn())
    if impl == "triton":
        hb, rows = choose_tile(q.shape[1], 1)
        return mla_attention_paged_triton(q, kv_cache, page_table, kv_lens, sm_scale, page_size, None, 1, kv_lora_rank,
                                          1.0 if kv_scale is None else kv_scale, num_splits, max_kv_len,
                                          **default_tile(device_kind(q), rows, kv_lora_rank, kv_cache.dtype in FP8_DTYPES))
    return mla_attention_paged_reference(q, kv_cache, page_table, kv_lens, sm_scale, page_size, None, kv_lora_rank,
                                         1.0 if kv_scale is None else kv_scale)


def mla_extend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    max_seqlen_q: int,
    sm_scale: float,
    page_size: int = 1,
    kv_lora_rank: int = 512,
    kv_scale: Optional[float] = None,
    num_splits: Optional[int] = None,
    causal: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MLA prefill / extend (or speculative verify) with a cached prefix, absorbed form.

    Request ``b`` has ``T_b = qo_indptr[b+1] - qo_indptr[b]`` new rows whose cache
    entries are already written after its ``kv_lens[b] - T_b`` cached positions
    (chunked prefill after a prefix-cache hit); row ``t`` sees positions
    ``<= kv_lens[b] - T_b + t``. Arguments and results as ``mla_decode`` with
    ``q [N, H, R + P]`` varlen and ``max_seqlen_q = max T_b``. ``causal=False``: every
    row sees all ``kv_lens[b]`` positions (one DCP rank's prefix shard).
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [N, H, D], got shape {tuple(q.shape)}")
    impl = _choose("mla_extend", q, kv_cache, kv_lora_rank, decode=False, tokens=max_seqlen_q)
    scale = 1.0 if kv_scale is None else kv_scale
    if impl == "triton":
        hb, rows = choose_tile(q.shape[1], max_seqlen_q)
        return mla_attention_paged_triton(q, kv_cache, page_table, kv_lens, sm_scale, page_size, qo_indptr, max_seqlen_q,
                                          kv_lora_rank, scale, num_splits or 1,
                                          **default_tile(device_kind(q), rows, kv_lora_rank, kv_cache.dtype in FP8_DTYPES), causal=causal)
    return mla_attention_paged_reference(q, kv_cache, page_table, kv_lens, sm_scale, page_size, qo_indptr, kv_lora_rank, scale,
                                         causal)
