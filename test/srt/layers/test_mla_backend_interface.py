"""``--attention-backend sgl_hybrid_mla``: our MLA decode behind upstream's Triton backend (CPU).

Upstream's ``TritonAttnBackend.forward_decode`` calls ``decode_attention_fwd(q,
k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
num_kv_splits, max_kv_splits, sm_scale, k_descale, v_descale, logit_cap=...,
sinks=..., xai_temperature_len=..., has_mla=True, use_pdl=..., page_size=...,
score_mod=..., ...)`` with Kimi K3's absorbed MLA layout (``q`` ``[B, H, R + P]``,
MLA pool ``[slots, 1, R + P]``, ``o`` ``[B, H, R]``) and a ragged rail. A fake
batch through :class:`SglHybridMLADecode` (torch path, and the Triton kernel in
the interpreter) must equal ``torch.nn.functional.scaled_dot_product_attention``
over the gathered rows; its ``attn_lse`` must give upstream's DCP reduction
(logsumexp over splits) the true LSE.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.mla.attention import mla_attention_paged_triton
from sglang_hybrid.layers.attention import mla_backend
from sglang_hybrid.layers.attention.mla_backend import SglHybridMLADecode, page_table_from_rail

H, R, P = 4, 32, 16
D = R + P


def _batch(gen, lens, slots=40):
    kv = torch.randn(slots, 1, D, generator=gen)
    perm = torch.randperm(slots, generator=gen)
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    indices = perm[: int(indptr[-1])].to(torch.int32)  # scattered cache rows, as the allocator gives them
    q = torch.randn(len(lens), H, D, generator=gen)
    return q, kv, indptr, indices


def _oracle(q, kv, indptr, indices, scale):
    outs, lses = [], []
    for b in range(q.shape[0]):
        rows = kv[indices[int(indptr[b]) : int(indptr[b + 1])].long(), 0]  # [L, D]
        o = F.scaled_dot_product_attention(q[b].unsqueeze(1).double(), rows.double().expand(H, -1, -1),
                                           rows[:, :R].double().expand(H, -1, -1), scale=scale)
        outs.append(o[:, 0].float())
        lses.append(torch.logsumexp(scale * q[b].double() @ rows.double().T, dim=-1).float())
    return torch.stack(outs), torch.stack(lses)


def _triton_decode(q, kv, table, lens, sm_scale, page_size, R_, kv_scale, max_kv_len=None):
    return mla_attention_paged_triton(q, kv, table, lens, sm_scale, page_size, None, 1, R_,
                                      1.0 if kv_scale is None else kv_scale, 2, max_kv_len, block_n=16)


@pytest.mark.parametrize("impl", ["dispatch", "triton"])
def test_decode_through_upstream_signature(impl, monkeypatch):
    if impl == "triton":  # CPU dispatch picks torch; drive the Triton kernel (2 KV splits) in the interpreter
        monkeypatch.setattr(mla_backend, "mla_decode", _triton_decode)
    gen = torch.Generator().manual_seed(0)
    lens = [7, 1, 19]
    q, kv, indptr, indices = _batch(gen, lens)
    scale = 0.125
    upstream = lambda *a, **k: pytest.fail("in-contract call must not reach upstream's kernel")  # noqa: E731
    fn = SglHybridMLADecode(upstream)
    o = torch.full((3, H * R), float("nan"))
    max_splits = 4
    attn_logits = torch.empty(3, H, max_splits, R + 1)
    attn_lse = torch.full((3, H, max_splits), float("-inf"))
    ret = fn(q, kv, kv[..., :R], o.view(3, H, R), indptr, indices, attn_logits, attn_lse, torch.full((3,), 2),
             max_splits, scale, 1.0, 1.0, logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=True,
             use_pdl=False, page_size=1, score_mod=None, aux_tensors=None, enable_lean=False)
    ro, rlse = _oracle(q, kv, indptr, indices, scale)
    torch.testing.assert_close(o.view(3, H, R), ro, rtol=1e-4, atol=1e-4)
    assert ret.data_ptr() == o.data_ptr()
    # Upstream's DCP path: local_lse = logsumexp(attn_lse[:B, :H, :], -1) feeds cp_lse_ag_out_rs_mha.
    torch.testing.assert_close(torch.logsumexp(attn_lse, -1), rlse, rtol=1e-4, atol=1e-4)


def test_out_of_contract_calls_go_to_upstream():
    gen = torch.Generator().manual_seed(1)
    q, kv, indptr, indices = _batch(gen, [3, 4])
    calls = []
    fn = SglHybridMLADecode(lambda *a, **k: calls.append(k) or "upstream")
    common = (q, kv, kv[..., :R], torch.empty(2, H, R), indptr, indices, None, None, None, 1, 0.1)
    assert fn(*common, 1.0, 1.0, has_mla=True, page_size=16) == "upstream"
    assert fn(*common, 1.0, 1.0, has_mla=True, sinks=torch.zeros(H)) == "upstream"
    assert fn(*common, 1.0, 1.0, has_mla=True, logit_cap=30.0) == "upstream"
    assert fn(*common, 1.0, 1.0, has_mla=False) == "upstream"
    assert fn(*common, 0.5, 1.0, has_mla=True) == "upstream"
    assert len(calls) == 5 and calls[0]["page_size"] == 16


def test_page_table_from_rail():
    indptr = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)
    indices = torch.tensor([9, 3, 7, 1, 4, 8], dtype=torch.int32)
    table, lens = page_table_from_rail(indptr, indices, 3)
    assert lens.tolist() == [2, 0, 3]
    assert table[0, :2].tolist() == [9, 3] and table[2, :3].tolist() == [7, 1, 4] and table.shape == (3, 3)
    with pytest.raises(ValueError, match="kv_indptr"):
        page_table_from_rail(indptr, indices, 5)


def test_registered_as_attention_backend_choice():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    mla_backend.install()
    mla_backend.install()  # idempotent: upstream calls register() in several processes
    assert ATTENTION_BACKENDS["sgl_hybrid_mla"] is mla_backend.create_backend
    assert ATTENTION_BACKEND_CHOICES.count("sgl_hybrid_mla") == 1
