"""``--attention-backend sgl_hybrid_qsa``: our QSA kernels behind upstream's ``QwenSparseAttnBackend`` (CPU).

Upstream calls ``_forward_paged_attention(q, layer, forward_batch, topk_indices)``
for decode and chain-verify rows with per-row metadata (``token_slot_table``,
``sequence_lengths``, ``token_to_batch_idx``). Fake batches on an instance of
upstream's class go through our hook; the oracle is upstream's own CPU path
(``qsa_sparse_attention`` over ``_logical_to_physical`` slots). Both our torch
reference (CPU dispatch) and the Triton kernels (interpreter; dispatch told the
tensors are on CUDA) are driven, on the dense special case and the sparse walk.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import sgl_hybrid_kernel.qsa.dispatch as qsa_dispatch
from sgl_hybrid_kernel.dispatch import chosen_paths
from sglang.srt.layers.attention.qsa.kernel import qsa_sparse_attention
from sglang.srt.layers.attention.qwen_sparse_attn_backend import QwenSparseAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_hybrid.layers.attention import qsa_backend

HQ, HKV, D, SLOTS = 6, 2, 16, 160


class _Pool:
    def __init__(self, k, v):
        self.k, self.v = k, v

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def _backend(gen, name="sgl_hybrid_qsa"):
    be = QwenSparseAttnBackend.__new__(QwenSparseAttnBackend)  # upstream's class, no runner needed for these paths
    be.runner = SimpleNamespace(decode_attention_backend_str=name, prefill_attention_backend_str="triton")
    be.token_to_kv_pool = _Pool(torch.randn(SLOTS, HKV, D, generator=gen), torch.randn(SLOTS, HKV, D, generator=gen))
    be.qsa_profile = None  # indices are logical positions already (no block expansion)
    be._mtp_shared_sparse_indices = None
    return be


def _batch(gen, be, lens, T, partial, mode=None):
    """Requests with ``lens`` tokens after their T draft rows; upstream's per-row metadata; top-k per row."""
    B, W = len(lens), max(lens)
    req_rows = torch.randperm(SLOTS, generator=gen)[: B * W].view(B, W).int()  # req_to_token rows
    row_len = torch.tensor([L - T + t + 1 for L in lens for t in range(T)], dtype=torch.int32)
    table = req_rows.repeat_interleave(T, 0)  # one token_slot_table row per query row
    be.forward_metadata = SimpleNamespace(token_slot_table=table, sequence_lengths=row_len,
                                          token_to_batch_idx=torch.arange(B * T, dtype=torch.int32))
    K = W
    topk = torch.full((B * T, K), -1, dtype=torch.int32)
    for r, n in enumerate(row_len.tolist()):
        pick = torch.randperm(n, generator=gen)[: max(1, n // 2) if partial else n]
        topk[r, : pick.numel()] = pick.int()
    mode = mode or (ForwardMode.DECODE if T == 1 else ForwardMode.TARGET_VERIFY)
    fb = SimpleNamespace(forward_mode=mode, spec_info=SimpleNamespace(draft_token_num=T))
    q = torch.randn(B * T, HQ, D, generator=gen)
    return q, fb, topk


def _upstream(be, q, topk):
    slots = be._logical_to_physical(topk, be.forward_metadata)
    pool = be.token_to_kv_pool
    return qsa_sparse_attention(q, pool.k, pool.v, slots, 0.25).reshape(q.shape[0], -1)


LAYER = SimpleNamespace(layer_id=0, scaling=0.25)
CASES = {  # name: (lens, T, partial selection, draft reuses selection, expected path)
    "decode_dense": ([9, 14, 3, 20, 11], 1, False, False, "dense"),
    "decode_sparse_small_batch": ([9, 14, 20], 1, True, False, "sparse"),
    "decode_draft_reuse": ([9, 14, 3, 20, 11], 1, True, True, "sparse"),
    "verify_dense": ([9, 14, 6, 20], 3, False, False, "dense"),
    "verify_sparse": ([9, 14, 6], 3, True, False, "sparse"),
    # the MTP draft model's extend after a verify (EAGLE v2): each row its own request
    "draft_extend_dense": ([9, 14, 6, 20], 2, False, False, "dense"),
    "draft_extend_sparse": ([14], 3, True, False, "sparse"),  # 3 rows: below the dense batch guard
}


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_paged_rows_through_upstream_signature_equal_upstream(case, impl, monkeypatch):
    lens, T, partial, reuse, path = CASES[case]
    monkeypatch.setattr(qsa_backend, "_on_accelerator", lambda q: True)
    if impl == "triton":  # the dispatcher's GPU branch, kernels in the interpreter
        monkeypatch.setattr(qsa_dispatch, "device_kind", lambda t: "cuda")
    gen = torch.Generator().manual_seed(len(case))
    be = _backend(gen)
    q, fb, topk = _batch(gen, be, lens, T, partial,
                         ForwardMode.DRAFT_EXTEND_V2 if case.startswith("draft_extend") else None)
    if reuse:
        be._mtp_shared_sparse_indices = object()
    called = []
    out = qsa_backend._around_paged(lambda *a: called.append(a), be, q, LAYER, fb, topk)
    assert not called  # ours ran, not upstream's
    torch.testing.assert_close(out, _upstream(be, q, topk), rtol=1e-5, atol=1e-5)
    assert {c.op: c.impl for c in chosen_paths()}[f"qsa_{path}"] == impl


def test_hooks_leave_other_backends_and_modes_to_upstream(monkeypatch):
    monkeypatch.setattr(qsa_backend, "_on_accelerator", lambda q: True)
    gen = torch.Generator().manual_seed(7)
    be = _backend(gen, name="triton")  # another --attention-backend: upstream's code
    q, fb, topk = _batch(gen, be, [5, 6, 7, 8], 1, False)
    assert qsa_backend._around_paged(lambda *a: "upstream", be, q, LAYER, fb, topk) == "upstream"
    assert qsa_backend._around_fused_kv(lambda *a: "fused", be, q, None, None, LAYER, fb, topk) == "fused"
    ours = _backend(gen)
    assert qsa_backend._around_fused_kv(lambda *a: "fused", ours, q, None, None, LAYER, fb, topk) is None
    fb_extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, spec_info=None)
    assert qsa_backend._around_fused_kv(lambda *a: "fused", ours, q, None, None, LAYER, fb_extend, topk) == "fused"
    ours.forward_metadata = be.forward_metadata
    assert qsa_backend._around_paged(lambda *a: "upstream", ours, q, LAYER, fb_extend, topk) == "upstream"
    # graph metadata without the rows' request-pool indices (or without req_to_token): upstream's path
    ours.forward_metadata = SimpleNamespace(**vars(be.forward_metadata), is_cuda_graph=True)  # placeholder table
    assert qsa_backend._around_paged(lambda *a: "upstream", ours, q, LAYER, fb, topk) == "upstream"
    monkeypatch.setattr(qsa_backend, "_on_accelerator", lambda q: False)  # CPU serving: upstream's path
    assert qsa_backend._around_paged(lambda *a: "upstream", ours, q, LAYER, fb, topk) == "upstream"


@pytest.mark.parametrize("lens,T", [([9, 14, 3, 20, 11], 1), ([9, 14, 6], 3)])
def test_cuda_graph_metadata_reads_req_to_token_rows(lens, T, monkeypatch):
    """Under CUDA graphs upstream's metadata has a one-column placeholder ``token_slot_table`` and the rows'
    request-pool indices; ours gathers the page table from ``req_to_token`` and equals upstream's eager result."""
    monkeypatch.setattr(qsa_backend, "_on_accelerator", lambda q: True)
    gen = torch.Generator().manual_seed(11)
    be = _backend(gen)
    q, fb, topk = _batch(gen, be, lens, T, True)
    want = _upstream(be, q, topk)
    eager = be.forward_metadata
    rows = eager.token_slot_table.shape[0]
    pool_rows = torch.randperm(32, generator=gen)[: len(lens)]
    be.req_to_token = torch.zeros(32, 2100, dtype=torch.int32)  # [pool rows, max_context_len > 2,048: sparse walk]
    be.req_to_token[pool_rows, : eager.token_slot_table.shape[1]] = eager.token_slot_table[T - 1 :: T]
    be.forward_metadata = SimpleNamespace(
        token_slot_table=torch.zeros(rows, 1, dtype=torch.int32), sequence_lengths=eager.sequence_lengths,
        token_to_batch_idx=eager.token_to_batch_idx, row_req_pool_indices=pool_rows.repeat_interleave(T).int(),
        is_cuda_graph=True)
    be._logical_to_physical = lambda *a: pytest.fail("graph rows must not go through the placeholder table")
    called = []
    out = qsa_backend._around_paged(lambda *a: called.append(a), be, q, LAYER, fb, topk)
    assert not called
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
