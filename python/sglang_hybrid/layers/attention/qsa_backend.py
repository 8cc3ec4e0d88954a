"""Our QSA kernels inside upstream's Qwen sparse-attention backend (issue 5, Wiring).

``--attention-backend sgl_hybrid_qsa`` (registered through upstream's
``register_attention_backend``) selects upstream's ``QwenSparseAttnBackend`` --
the backend upstream's hybrid-GDN wrapper builds for Qwen3.8's QSA layers
(``attn_backend_wrapper``: ``full_attn_backend = QwenSparseAttnBackend(runner)``
whenever ``is_qwen_qsa(config)``) -- and two AROUND hooks on that class make its
decode, chain-verify and MTP draft-extend rows run ``sgl_hybrid_kernel.qsa.dispatch.qsa_attention``
when the runner's decode or prefill backend is ``sgl_hybrid_qsa`` (draft-extend rows: one request per
row, as upstream's own fallback treats them; that fallback needs flash-attn, which a CUDA machine
without the wheel lacks):

* ``_try_fused_kv_attention`` returns ``None`` for decode / speculative rows, so
  upstream writes K/V with ``set_kv_buffer`` and calls ``_forward_paged_attention``;
* ``_forward_paged_attention(q, layer, forward_batch, topk_indices)`` builds our
  kernel's arguments from upstream's metadata and returns ``[rows, Hq * Dv]``.

Upstream's metadata for these rows (``_metadata_from_forward_batch``): one
``token_slot_table`` row per query row (logical position -> cache slot, page
size 1), ``sequence_lengths`` per row (position + 1) and
``token_to_batch_idx = arange(rows)``. Chain verify puts a request's ``T``
draft rows next to each other, so the request's last row carries its whole page
table and length: our ``page_table = token_slot_table[T-1::T]`` (a view),
``kv_lens = sequence_lengths[T-1::T]``, ``qo_indptr = arange(0, rows + 1, T)``;
row ``t`` then sees positions ``<= kv_len - T + t`` = its own length - 1, the
rule upstream's ``_logical_to_physical`` applies. The selection is upstream's
expanded top-k (logical positions, ``-1`` unused: ``_expand_block_indices``),
passed with ``compress_ratio = 1``. The dispatcher takes the exact dense walk
when its guards hold (``choose_qsa_path``: every visible position <= 2,048 by
the table's host-side width, ``T x G <= 64``, batch >= 4, not a draft step that
reuses an earlier selection: upstream's ``should_reuse_mtp_sparse_indices``),
else our sparse walk. Outside the contract (CPU tensors, rows not in the chain
layout, FP8 / quantised pools) upstream's own path runs. Under CUDA graphs upstream's
metadata carries a one-column placeholder table: the page table is then gathered from
``req_to_token`` by the rows' request-pool indices inside the graph
(:func:`graph_token_table`; as wide as the context, so the dense special case is not taken).
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.qsa.dispatch import qsa_attention

logger = logging.getLogger(__name__)

BACKEND_NAME = "sgl_hybrid_qsa"


def enabled(backend) -> bool:
    """Whether the runner that built ``backend`` chose ``--attention-backend sgl_hybrid_qsa``
    (its resolved decode / prefill backend strings)."""
    runner = getattr(backend, "runner", None)
    names = {getattr(runner, "decode_attention_backend_str", None), getattr(runner, "prefill_attention_backend_str", None)}
    return BACKEND_NAME in names


def _on_accelerator(q: torch.Tensor) -> bool:
    return q.is_cuda  # CUDA and ROCm tensors (the interface tests patch this to drive the CPU paths)


def _rows_per_request(forward_batch, rows: int) -> Optional[int]:
    mode = forward_batch.forward_mode
    if mode.is_decode():
        return 1
    if mode.is_target_verify():
        t = int(getattr(getattr(forward_batch, "spec_info", None), "draft_token_num", 0) or 0)
        return t if t > 0 and rows % t == 0 else None
    if mode.is_draft_extend_v2():
        # the MTP draft model's extend after a verify: every row carries its own table row and visible
        # length (upstream's fallback treats each row as a request), so each row is one request here
        return 1
    return None


def graph_token_table(backend, metadata) -> Optional[torch.Tensor]:
    """Under CUDA graphs upstream's metadata carries a one-column placeholder ``token_slot_table``; the
    rows' request-pool indices (``row_req_pool_indices``, refilled before every replay) select the rows
    of ``req_to_token`` instead: ``[rows, max_context_len]`` int32, gathered on the device inside the
    graph. ``None`` when either is missing."""
    req_to_token = getattr(backend, "req_to_token", None)
    rows_idx = getattr(metadata, "row_req_pool_indices", None)
    if req_to_token is None or rows_idx is None:
        return None
    return req_to_token[rows_idx.long()].to(torch.int32)


def kernel_arguments(metadata, rows: int, T: int, table: Optional[torch.Tensor] = None
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(page_table [B, W] int32, kv_lens [B] int32, qo_indptr [B + 1] int32)`` from upstream's per-row
    metadata, ``B = rows / T`` requests of ``T`` consecutive rows (each request's last row).
    ``table``: the per-row token table to use instead of ``metadata.token_slot_table`` (CUDA graphs)."""
    table = metadata.token_slot_table if table is None else table
    lens = metadata.sequence_lengths.to(torch.int32)
    page_table = table[T - 1 :: T]
    qo = torch.arange(0, rows + 1, T, dtype=torch.int32, device=table.device)
    return page_table, lens[T - 1 :: T].contiguous(), qo  # the kernels index kv_lens contiguously


def forward_paged(backend, q: torch.Tensor, layer, forward_batch, topk_indices: torch.Tensor) -> Optional[torch.Tensor]:
    """Our QSA for upstream's ``_forward_paged_attention`` call; ``None`` when the call is outside our contract.

    Args:
        q: ``[rows, Hq, D]``; layer: upstream's ``RadixAttention`` (``layer_id``, ``scaling``);
        topk_indices: ``[rows, K]`` block ids or logical positions from upstream's indexer.

    Returns:
        ``[rows, Hq * Dv]`` in ``q.dtype``, or ``None``.
    """
    pool = backend.token_to_kv_pool
    k_buf = pool.get_key_buffer(layer.layer_id)
    v_buf = pool.get_value_buffer(layer.layer_id)
    rows = q.shape[0]
    T = _rows_per_request(forward_batch, rows)
    metadata = backend._resolve_metadata(forward_batch)
    graph = getattr(metadata, "is_cuda_graph", False) or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    table = graph_token_table(backend, metadata) if graph else None
    why = None
    if T is None:
        why = f"mode {forward_batch.forward_mode}: rows per request not fixed"
    elif graph and table is None:
        why = "CUDA-graph metadata without row_req_pool_indices / req_to_token"
    elif metadata.token_slot_table.shape[0] != rows or metadata.token_to_batch_idx.numel() != rows:
        why = "metadata rows are not one per query row"
    elif k_buf.dtype != q.dtype or v_buf.dtype != q.dtype:
        why = f"KV pool dtype {k_buf.dtype} != query dtype {q.dtype}"
    elif q.shape[1] % k_buf.shape[1]:
        why = "query heads not a multiple of KV heads"
    if why:
        record_choice("qsa_backend", "upstream", f"sgl_hybrid_qsa: upstream kernel for {why}", log=logger)
        return None
    logical = backend._expand_block_indices(topk_indices, metadata).to(torch.int32)
    page_table, kv_lens, qo = kernel_arguments(metadata, rows, T, table)
    reuse = bool(backend.should_reuse_mtp_sparse_indices(forward_batch)) if hasattr(backend, "should_reuse_mtp_sparse_indices") else False
    out, _ = qsa_attention(q, k_buf, v_buf, page_table, kv_lens, qo, logical, float(layer.scaling),
                           max_kv_len=int(page_table.shape[1]), max_seqlen_q=T, compress_ratio=1, page_size=1,
                           draft_reuses_selection=reuse)
    record_choice("qsa_backend", "sgl_hybrid", "--attention-backend sgl_hybrid_qsa: sgl_hybrid_kernel.qsa in upstream's "
                  "QwenSparseAttnBackend (decode, chain verify)", log=logger)
    return out.reshape(rows, -1)


def _around_paged(original, self, q, layer, forward_batch, topk_indices, *args, **kwargs):
    if enabled(self) and _on_accelerator(q) and not args and not kwargs:
        out = forward_paged(self, q, layer, forward_batch, topk_indices)
        if out is not None:
            return out
    return original(self, q, layer, forward_batch, topk_indices, *args, **kwargs)


def _around_fused_kv(original, self, q, k, v, layer, forward_batch, indices, *args, **kwargs):
    mode = forward_batch.forward_mode
    if enabled(self) and _on_accelerator(q) and (mode.is_decode() or mode.is_target_verify()):
        return None  # upstream then writes K/V and calls _forward_paged_attention (ours)
    return original(self, q, k, v, layer, forward_batch, indices, *args, **kwargs)


def create_backend(runner):
    """``register_attention_backend`` factory: upstream's QSA backend (its paged rows run ours through the hooks)."""
    from sglang.srt.layers.attention.qwen_sparse_attn_backend import QwenSparseAttnBackend

    return QwenSparseAttnBackend(runner)


def install() -> None:
    """Register ``--attention-backend sgl_hybrid_qsa`` and the two hooks."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    from sglang_hybrid.patches import register_patches

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)
    register_patches(__name__)  # AROUND _forward_paged_attention and _try_fused_kv_attention (patches.py)
