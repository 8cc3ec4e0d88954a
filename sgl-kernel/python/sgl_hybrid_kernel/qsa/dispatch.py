"""QSA dispatch: dense special case or sparse path (guards), Triton or plain torch.

Path (``choose_qsa_path``, seeds digest item 13): the exact dense walk is taken
only when it computes the same token set and pays off: every visible position
fits in the budget (``max_kv_len <= 2048``), the request's verification rows fit
one tile (``T x G <= 64``), at least 4 requests, and the step is not a draft step
reusing an earlier step's selection (then the selected set is not the whole
prefix). Otherwise the sparse path. Implementation: Triton on CUDA / ROCm (head
dims powers of two <= 256), else the plain-torch reference; both logged once.
"""

from __future__ import annotations

import logging
from typing import Tuple

import torch

from sgl_hybrid_kernel.delta_rule.dispatch import device_kind
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.qsa.attention import (
    DENSE_TILE_ROWS,
    choose_qsa_splits,
    default_tile,
    dense_programs_per_sm,
    qsa_attention_triton,
)
from sgl_hybrid_kernel.qsa.reference import qsa_attention_reference

logger = logging.getLogger(__name__)

QSA_BUDGET = 2048
MIN_DENSE_BATCH = 4
MAX_HEAD_DIM = 256


def choose_qsa_path(
    batch: int,
    max_kv_len: int,
    tokens_per_request: int,
    heads_per_kv_head: int,
    draft_reuses_selection: bool = False,
    budget: int = QSA_BUDGET,
) -> Tuple[str, str]:
    """``("dense" | "sparse", reason)`` by the guards above."""
    if draft_reuses_selection:
        return "sparse", "draft step reuses an earlier selection"
    if max_kv_len > budget:
        return "sparse", f"{max_kv_len} visible positions > budget {budget}"
    if tokens_per_request * heads_per_kv_head > DENSE_TILE_ROWS:
        return "sparse", f"{tokens_per_request} x {heads_per_kv_head} rows > {DENSE_TILE_ROWS}-row tile"
    if batch < MIN_DENSE_BATCH:
        return "sparse", f"batch {batch} < {MIN_DENSE_BATCH}"
    return "dense", f"all visible positions <= {budget}: exact dense walk, {tokens_per_request} x {heads_per_kv_head} rows share K/V tiles"


def qsa_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    block_indices: torch.Tensor,
    sm_scale: float,
    max_kv_len: int,
    max_seqlen_q: int,
    compress_ratio: int = 4,
    page_size: int = 1,
    draft_reuses_selection: bool = False,
    budget: int = QSA_BUDGET,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """QSA attention for decode / verify rows; see ``qsa.reference.qsa_attention_reference``.

    ``block_indices [N, NB]`` is the indexer's selection (used on the sparse path);
    ``max_kv_len`` / ``max_seqlen_q`` are host-side bounds for the guards (the
    scheduler knows them; no host sync here).

    Returns ``(o [N, Hq, Dv], lse [N, Hq] FP32)``.

    Raises:
        ValueError: ``Hq`` not a multiple of ``Hkv``.
    """
    Hq, Hkv = q.shape[1], k_cache.shape[1]
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} not a multiple of KV heads {Hkv}")
    path, why = choose_qsa_path(kv_lens.shape[0], max_kv_len, max_seqlen_q, Hq // Hkv, draft_reuses_selection, budget)
    indices = None if path == "dense" else block_indices
    kind = device_kind(q)
    D, DV = q.shape[-1], v_cache.shape[-1]
    dims_ok = D <= MAX_HEAD_DIM and DV <= MAX_HEAD_DIM and not D & (D - 1) and not DV & (DV - 1)
    if kind != "cpu" and dims_ok:
        record_choice(f"qsa_{path}", "triton", f"{kind}: qsa_attention_kernel ({why})", log=logger)
        if indices is not None:
            splits = choose_qsa_splits(q.shape[0] * Hkv, indices.shape[1] * compress_ratio)
        else:
            splits = choose_qsa_splits(kv_lens.shape[0] * Hkv, max_kv_len, programs_per_sm=dense_programs_per_sm(kind))
        return qsa_attention_triton(q, k_cache, v_cache, page_table, kv_lens, qo_indptr, sm_scale, max_seqlen_q,
                                    page_size, indices, compress_ratio, num_splits=splits, **default_tile(kind, indices is not None))
    reason = "CPU tensors: plain-torch reference" if kind == "cpu" else f"outside the Triton contract: head dims {D}, {DV}"
    record_choice(f"qsa_{path}", "torch", f"{reason} ({why})", log=logger)
    return qsa_attention_reference(q, k_cache, v_cache, page_table, kv_lens, qo_indptr, sm_scale, page_size, indices, compress_ratio)
