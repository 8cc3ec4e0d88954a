"""Our MLA kernels inside upstream's Triton attention backend (issue 5, Wiring).

``--attention-backend sgl_hybrid_mla`` (registered through upstream's
``register_attention_backend``) builds upstream's ``TritonAttnBackend`` with its
decode and extend kernels swapped, so upstream's own Kimi K3 MLA layers
(``RadixAttention`` with ``qk_head_dim = R + P``, ``v_head_dim = R``) use ours on
GPU/ROCm. Upstream's backend keeps metadata, KV writes and the DCP collective;
the instance attributes ``decode_attention_fwd`` and ``extend_attention_fwd``
(called with upstream's signatures) become :class:`SglHybridMLADecode` and
:class:`SglHybridMLAExtend`, which run ``sgl_hybrid_kernel.mla.dispatch``
(Triton split-KV, aiter on ROCm through the head-padding adapter for decode,
torch on CPU). Decode writes upstream's ``o`` and ``attn_lse``: with DCP,
the per-rank ``(o, lse)`` pairs reach upstream's ``cp_lse_ag_out_rs_mha`` call,
which :mod:`.dcp_merge_hook` turns into one all-to-all of head groups and our
merge kernel while this backend's ``forward_decode`` / ``forward_extend``
run. Extend covers chunked prefill after a prefix-cache hit and chain target-verify (causal over prefix + new rows, read
from the paged cache where upstream's ``forward_extend`` has just written them:
``forward_extend`` is wrapped to hand over ``out_cache_loc``). Calls outside our
contract go to upstream's kernels: page size > 1, attention sinks,
``score_mod``, logit soft-capping, different K/V scales, non-MLA layers, tree
verify (custom masks), DCP extend calls other than upstream's two shard calls (the new rows over
themselves, and over this rank's prefix shard: both ours, upstream merges them by their LSE), and
extend under CUDA-graph capture. Decode is
captured too: the page table is then as wide as the context (``max_context_len``), built
on the device inside the graph.

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
from sgl_hybrid_kernel.mla.dispatch import mla_decode, mla_extend
from sglang_hybrid.layers.attention import dcp_merge_hook

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
    return None


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


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

    def _table(self, kv_indptr, kv_indices, batch, max_len=None):
        meta = getattr(self.backend, "forward_metadata", None)
        key = (kv_indptr.data_ptr(), kv_indices.data_ptr(), kv_indices.numel(), batch, max_len)
        if meta is None or meta is not self._meta or key != self._rail_key:
            self._rail = page_table_from_rail(kv_indptr, kv_indices, batch, max_len)
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
        # Under CUDA-graph capture the longest KV length is not known on the host: the table is
        # as wide as the context (upstream's graph rail holds max_context_len rows per request),
        # built on the device inside the graph; positions past kv_lens are masked by the kernel.
        bound = int(self.backend.max_context_len) if _capturing() and self.backend is not None else None
        table, lens = self._table(kv_indptr, kv_indices, B, bound)
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


def extend_page_table(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                      out_cache_loc: torch.Tensor, batch: int, max_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Upstream's extend rails -> ``(page_table [B, max_len] int32, kv_lens [B] int32)`` over prefix + new rows.

    Request ``b``'s cached prefix is ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` and its new rows, already
    written to the cache, sit at ``out_cache_loc[qo_indptr[b]:qo_indptr[b+1]]`` (upstream's ``forward_extend``
    stores them before its kernel runs); row ``j`` of the table is the prefix slot ``j`` or new row
    ``j - prefix``. ``max_len`` is a host-side bound on prefix + new rows (entries past ``kv_lens`` are 0).
    """
    pstart = kv_indptr[:batch].long()
    plen = kv_indptr[1 : batch + 1].long() - pstart
    qstart = qo_indptr[:batch].long()
    qlen = qo_indptr[1 : batch + 1].long() - qstart
    j = torch.arange(max(max_len, 1), device=out_cache_loc.device)[None, :]
    in_prefix = j < plen[:, None]
    in_new = (~in_prefix) & (j < (plen + qlen)[:, None])
    p_idx = (pstart[:, None] + j).clamp(max=max(kv_indices.numel() - 1, 0))
    n_idx = (qstart[:, None] + j - plen[:, None]).clamp(min=0, max=max(out_cache_loc.numel() - 1, 0))
    prefix = kv_indices[p_idx].long() if kv_indices.numel() else torch.zeros_like(j)
    table = torch.where(in_prefix, prefix, torch.where(in_new, out_cache_loc[n_idx].long(), 0))
    return table.to(torch.int32), (plen + qlen).to(torch.int32)


class SglHybridMLAExtend:
    """Callable with upstream's ``extend_attention_fwd`` signature, running our MLA extend (prefill after a
    cached prefix, chain target-verify) over the paged latent cache.

    Needs the batch's ``out_cache_loc`` (where upstream just wrote the new rows): the backend's
    ``forward_extend`` is wrapped to hand it over (:func:`create_backend`). ``upstream`` serves every call
    outside the contract: no cache write this step, DCP (its extend merge needs causal masks on global
    positions), non-MLA layers, tree verify / custom masks, sliding windows, sinks, ``score_mod``, soft
    capping, LSE / skip-prefix calls, page size > 1, different K/V scales and CUDA-graph capture.
    """

    def __init__(self, upstream, backend=None):
        self.upstream = upstream
        self.backend = backend
        self.batch = None  # (forward_batch, save_kv_cache) of the forward_extend in progress

    def _why_not(self, q, k_buffer, v_buffer, o, custom_mask, is_causal, extras, dcp_part=False) -> Optional[str]:
        fb, saved = self.batch if self.batch is not None else (None, False)
        if fb is None:
            return "no forward_extend in progress"
        if dcp_part:
            if getattr(self.backend, "dcp_size", 1) <= 1:
                return "skip-prefix / skip-extend call without DCP"
        elif not saved:
            return "new rows not written to the cache this step"
        elif getattr(self.backend, "dcp_size", 1) > 1:
            return "DCP extend call other than upstream's two shard calls"
        if k_buffer.dim() != 3 or k_buffer.shape[1] != 1 or q.shape[-1] != k_buffer.shape[-1] \
                or v_buffer.data_ptr() != k_buffer.data_ptr() or o.shape[-1] != v_buffer.shape[-1]:
            return "not an absorbed MLA layer (latent cache, V = leading columns of K)"
        if not is_causal and not dcp_part:
            return "non-causal extend"
        if custom_mask is not None:
            mode, spec = fb.forward_mode, getattr(fb, "spec_info", None)
            if not (mode.is_target_verify() and int(getattr(spec, "topk", 0) or 0) == 1):
                return "custom mask (tree verify or non-chain)"
        for name, value, ok in extras:
            if value != ok:
                return f"{name}={value!r}"
        if _capturing():
            return "CUDA-graph capture (page table needs the host-side longest length)"
        return None

    def __call__(self, q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                 custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
                 skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
                 xai_temperature_len=-1, lse_extend=None, skip_prefix=False, skip_extend=False, page_size: int = 1,
                 score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None, identity_kv_indices: bool = False):
        # upstream's DCP extend (_forward_extend_dcp) makes two calls, merged by their LSE: the new rows over
        # themselves (skip_prefix, causal) and this rank's prefix shard for all heads (skip_extend, non-causal)
        dcp_part = (bool(skip_prefix) != bool(skip_extend)) and lse_extend is not None
        extras = (("sliding_window_size", sliding_window_size if sliding_window_size is not None else -1, -1),
                  ("sinks", sinks, None), ("score_mod", score_mod, None), ("aux_tensors", aux_tensors, None),
                  ("window_kv_offsets", window_kv_offsets, None), ("identity_kv_indices", bool(identity_kv_indices), False),
                  ("page_size", page_size, 1), ("logit_cap", float(logit_cap or 0.0), 0.0),
                  ("xai_temperature_len", xai_temperature_len or -1, -1), ("same K/V scales", float(k_scale) == float(v_scale), True))
        if not dcp_part:
            extras += (("lse_extend", lse_extend, None), ("skip_prefix", bool(skip_prefix), False),
                       ("skip_extend", bool(skip_extend), False))
        elif skip_prefix and (k_extend.dim() != 3 or k_extend.shape[1] != 1 or k_extend.shape[-1] != q_extend.shape[-1]):
            extras += (("new-row latent shape", tuple(k_extend.shape), "[N, 1, R + P]"),)
        why = self._why_not(q_extend, k_buffer, v_buffer, o_extend, custom_mask, is_causal, extras, dcp_part)
        if why:
            record_choice("mla_extend_backend", "upstream", f"sgl_hybrid_mla: upstream kernel for {why}", log=logger)
            return self.upstream(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                                 kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale,
                                 sm_scale, logit_cap=logit_cap, skip_prefix_custom_mask=skip_prefix_custom_mask,
                                 sliding_window_size=sliding_window_size, sinks=sinks, window_kv_offsets=window_kv_offsets,
                                 xai_temperature_len=xai_temperature_len, lse_extend=lse_extend, skip_prefix=skip_prefix,
                                 skip_extend=skip_extend, page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors,
                                 extend_seq_lens_cpu=extend_seq_lens_cpu, identity_kv_indices=identity_kv_indices)
        fb = self.batch[0]
        B = int(fb.batch_size) if getattr(fb, "batch_size", None) is not None else qo_indptr.numel() - 1
        scale = q_extend.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
        R = o_extend.shape[-1]
        if dcp_part:
            self._dcp_part(q_extend, k_extend, o_extend, k_buffer, qo_indptr, kv_indptr, kv_indices, int(max_len_extend),
                           float(k_scale), scale, R, lse_extend, bool(skip_prefix), B, getattr(fb, "seq_lens_cpu", None))
            return
        seq_cpu = getattr(fb, "seq_lens_cpu", None)
        if seq_cpu is not None and len(seq_cpu):
            # extend: seq_lens include the new rows; verify: seq_lens are the committed prefix
            max_len = int(max(seq_cpu[:B])) + int(max_len_extend)
        else:
            max_len = int((kv_indptr[1 : B + 1] - kv_indptr[:B]).max()) + int(max_len_extend)  # host sync
        table, lens = extend_page_table(qo_indptr, kv_indptr, kv_indices, fb.out_cache_loc, B, max_len)
        kv_scale = None if float(k_scale) == 1.0 else float(k_scale)
        out, _ = mla_extend(q_extend, k_buffer, table, lens, qo_indptr[: B + 1], int(max_len_extend), scale, 1, R, kv_scale)
        o_extend.copy_(out.view_as(o_extend))
        record_choice("mla_extend_backend", "sgl_hybrid", "--attention-backend sgl_hybrid_mla: sgl_hybrid_kernel.mla "
                      "extend (cached prefix, chain verify) in upstream's TritonAttnBackend", log=logger)


    def _dcp_part(self, q, k_new, o, k_buffer, qo_indptr, kv_indptr, kv_indices, max_q, k_scale, scale, R, lse_out,
                  new_rows, B, seq_cpu):
        """One of upstream's two DCP extend calls. New rows: causal over themselves, read from ``k_new`` (under
        DCP the cache holds only this rank's positions; for an MLA layer V is the first ``R`` latent columns,
        as the pool stores it). Prefix shard: every new row sees all of the request's positions on this rank."""
        qo = qo_indptr[: B + 1]
        if new_rows:
            lens = (qo[1:] - qo[:-1]).to(torch.int32)
            table = (qo[:-1, None].long() + torch.arange(max(max_q, 1), device=q.device)[None, :])
            table = table.clamp(max=max(k_new.shape[0] - 1, 0)).to(torch.int32)
            out, lse = mla_extend(q, k_new, table, lens, qo, max_q, scale, 1, R, None)
        else:
            bound = int(max(seq_cpu[:B])) if seq_cpu is not None and len(seq_cpu) else None  # else a host sync
            table, lens = page_table_from_rail(kv_indptr, kv_indices, B, bound)
            kv_scale = None if k_scale == 1.0 else k_scale
            out, lse = mla_extend(q, k_buffer, table, lens, qo, max_q, scale, 1, R, kv_scale, causal=False)
        o.copy_(out.view_as(o))
        lse_out.copy_(lse)
        record_choice("mla_extend_dcp_backend", "sgl_hybrid", "--attention-backend sgl_hybrid_mla: sgl_hybrid_kernel.mla "
                      "for upstream's DCP extend calls (new rows causal; prefix shard non-causal), merged by upstream "
                      "(cross-rank step: dcp_merge_hook)",
                      log=logger)


def _wrap_forward_extend(backend, ext: SglHybridMLAExtend):
    original = backend.forward_extend

    def forward_extend(q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
        ext.batch = (forward_batch, bool(save_kv_cache) and k is not None and v is not None)
        try:
            with dcp_merge_hook.serving():  # upstream's DCP extend merge -> ours (dcp_merge_hook)
                return original(q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
        finally:
            ext.batch = None

    return forward_extend


def _wrap_forward_decode(backend):
    original = backend.forward_decode

    def forward_decode(*args, **kwargs):
        with dcp_merge_hook.serving():  # upstream's DCP decode merge -> ours (dcp_merge_hook)
            return original(*args, **kwargs)

    return forward_decode


def create_backend(runner):
    """``register_attention_backend`` factory: upstream's Triton backend with our MLA decode and extend, and
    (through :func:`dcp_merge_hook.serving` around ``forward_decode`` / ``forward_extend``) our DCP merge."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = TritonAttnBackend(runner)
    backend.decode_attention_fwd = SglHybridMLADecode(backend.decode_attention_fwd, backend)
    ext = SglHybridMLAExtend(backend.extend_attention_fwd, backend)
    backend.extend_attention_fwd = ext
    backend.forward_extend = _wrap_forward_extend(backend, ext)
    backend.forward_decode = _wrap_forward_decode(backend)
    return backend


def install() -> None:
    """Register ``--attention-backend sgl_hybrid_mla``."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)
