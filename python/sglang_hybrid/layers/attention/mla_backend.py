"""Our MLA split-KV decode kernel inside upstream's Triton attention backend (issue 5, Wiring).

``--attention-backend sgl_hybrid_mla`` (registered through upstream's
``register_attention_backend``) builds upstream's ``TritonAttnBackend`` with its
decode kernel swapped for :class:`SglHybridMLADecode`, so upstream's own Kimi K3 MLA layers
(``RadixAttention`` with ``qk_head_dim = R + P``, ``v_head_dim = R``) use it on
GPU/ROCm. This is the *narrow* form of the issue's request: upstream's backend
keeps metadata, KV writes, prefill/extend and the DCP path; only its decode
kernel call (the instance attribute ``decode_attention_fwd``, called with
upstream's signature) is replaced by :class:`SglHybridMLADecode`, which runs ``sgl_hybrid_kernel.mla.dispatch.mla_decode`` (Triton split-KV, aiter on
ROCm through the head-padding adapter, torch on CPU) and writes upstream's
``o`` and ``attn_lse`` buffers. With DCP, upstream's own collective
(``cp_lse_ag_out_rs_mha``) merges the per-rank ``(o, lse)`` pairs our kernel
returns. Calls outside our contract go to upstream's kernel: page size > 1,
attention sinks, ``score_mod``, logit soft-capping, different K/V scales,
non-MLA layers, and CUDA-graph capture (building the page table needs the
batch's longest KV length on the host).

Upstream's decode rail: ``kv_indptr`` ``[B + 1]`` and ``kv_indices`` (cache row of
each position, page size 1). Our kernel reads a page table ``[B, max_len]``;
:func:`page_table_from_rail` builds it once per forward (cached while the
backend's ``forward_metadata`` object and the rail tensors are the same) and pads with row 0 (never read: positions past ``kv_lens`` are masked).
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.mla.dispatch import mla_decode

logger = logging.getLogger(__name__)

BACKEND_NAME = "sgl_hybrid_mla"


def page_table_from_rail(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, batch: int,
                         max_len: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Upstream's ragged decode rail -> ``(page_table [B, max_len] int32, kv_lens [B] int32)``.

    Args:
        kv_indptr: ``[>= B + 1]`` int offsets into ``kv_indices``; kv_indices: cache rows.
        batch: ``B``; max_len: longest KV length (read from the rail with a host sync when ``None``).

    Raises:
        ValueError: ``kv_indptr`` shorter than ``B + 1``.
    """
    if kv_indptr.numel() < batch + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.numel()} entries for {batch} requests")
    start = kv_indptr[:batch].long()
    lens = (kv_indptr[1 : batch + 1].long() - start)
    if max_len is None:
        max_len = int(lens.max()) if batch else 0
    pos = torch.arange(max(max_len, 1), device=kv_indices.device)
    idx = start[:, None] + pos[None, :]
    valid = pos[None, :] < lens[:, None]
    table = torch.where(valid, kv_indices[idx.clamp(max=max(kv_indices.numel() - 1, 0))].long(), 0) if kv_indices.numel() \
        else torch.zeros_like(idx)
    return table.to(torch.int32), lens.to(torch.int32)


def _eligible(has_mla, page_size, sinks, score_mod, logit_cap, k_scale, v_scale, xai_temperature_len) -> Optional[str]:
    if not has_mla:
        return "not an MLA layer"
    if page_size != 1:
        return f"page_size={page_size} (rail adapter handles page size 1)"
    if sinks is not None or score_mod is not None:
        return "attention sinks / score_mod"
    if logit_cap not in (None, 0, 0.0):
        return "logit soft-capping"
    if float(k_scale) != float(v_scale):
        return "different K and V scales"
    if xai_temperature_len not in (None, -1):
        return "xai temperature"
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return "CUDA-graph capture (page table needs the host-side longest KV length)"
    return None


class SglHybridMLADecode:
    """Callable with upstream's ``decode_attention_fwd`` signature, running our MLA decode.

    ``upstream`` is the function it replaces (used for calls outside our contract).
    """

    def __init__(self, upstream, backend=None):
        self.upstream = upstream
        self.backend = backend  # its forward_metadata object identifies one forward
        self._meta = None
        self._rail_key = None
        self._rail = None

    def _table(self, kv_indptr, kv_indices, batch):
        meta = getattr(self.backend, "forward_metadata", None)
        key = (kv_indptr.data_ptr(), kv_indices.data_ptr(), kv_indices.numel(), batch)
        if meta is None or meta is not self._meta or key != self._rail_key:
            self._rail = page_table_from_rail(kv_indptr, kv_indices, batch)
            self._meta, self._rail_key = meta, key  # holding meta keeps its id from being reused
        return self._rail

    def __call__(self, q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                 max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None, xai_temperature_len=-1,
                 has_mla=False, use_pdl=False, page_size: int = 1, score_mod=None, aux_tensors=None, **kwargs):
        why = _eligible(has_mla, page_size, sinks, score_mod, logit_cap, k_scale, v_scale, xai_temperature_len)
        if why:
            record_choice("mla_decode_backend", "upstream", f"sgl_hybrid_mla: upstream kernel for {why}", log=logger)
            return self.upstream(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                                 max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=logit_cap, sinks=sinks,
                                 xai_temperature_len=xai_temperature_len, has_mla=has_mla, use_pdl=use_pdl,
                                 page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
        B, H, R = q.shape[0], q.shape[1], o.shape[-1]
        table, lens = self._table(kv_indptr, kv_indices, B)
        kv_scale = None if float(k_scale) == 1.0 else float(k_scale)
        out, lse = mla_decode(q, k_buffer, table, lens, float(sm_scale), 1, R, kv_scale,
                              max_kv_len=table.shape[1])
        o.view(B, H, R).copy_(out)
        if attn_lse is not None:  # upstream's DCP path reduces attn_lse[:B, :H, :] with logsumexp over splits
            attn_lse[:B, :H, 0] = lse
            attn_lse[:B, :H, 1:] = float("-inf")
        record_choice("mla_decode_backend", "sgl_hybrid", "--attention-backend sgl_hybrid_mla: sgl_hybrid_kernel.mla "
                      "decode in upstream's TritonAttnBackend", log=logger)
        return o


def create_backend(runner):
    """``register_attention_backend`` factory: upstream's Triton backend with our MLA decode."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = TritonAttnBackend(runner)
    backend.decode_attention_fwd = SglHybridMLADecode(backend.decode_attention_fwd, backend)
    return backend


def install() -> None:
    """Register ``--attention-backend sgl_hybrid_mla``."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)
