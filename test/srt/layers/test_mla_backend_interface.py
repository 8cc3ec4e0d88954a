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


# --------------------------------------------------------------------------- extend / chain verify
def _extend_batch(gen, prefix, new, slots=80):
    """Cached prefixes (scattered rows on upstream's prefix rail) and new rows already written at out_cache_loc."""
    kv = torch.randn(slots, 1, D, generator=gen)
    perm = torch.randperm(slots, generator=gen)
    kv_indptr = torch.tensor([0] + list(torch.tensor(prefix).cumsum(0)), dtype=torch.int32)
    qo_indptr = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    kv_indices = perm[: int(kv_indptr[-1])].to(torch.int32)
    out_cache_loc = perm[int(kv_indptr[-1]) : int(kv_indptr[-1]) + int(qo_indptr[-1])].to(torch.int64)
    q = torch.randn(int(qo_indptr[-1]), H, D, generator=gen)
    return q, kv, kv_indptr, kv_indices, qo_indptr, out_cache_loc


def _extend_oracle(q, kv, kv_indptr, kv_indices, qo_indptr, out_cache_loc, scale):
    outs = []
    for b in range(qo_indptr.numel() - 1):
        rows = torch.cat([kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long(),
                          out_cache_loc[int(qo_indptr[b]) : int(qo_indptr[b + 1])].long()])
        lat = kv[rows, 0].double()
        qb = q[int(qo_indptr[b]) : int(qo_indptr[b + 1])].double().transpose(0, 1)  # [H, T, D]
        T, L = qb.shape[1], rows.numel()
        mask = torch.arange(L)[None, :] <= (L - T + torch.arange(T))[:, None]
        o = F.scaled_dot_product_attention(qb, lat.expand(H, -1, -1), lat[:, :R].expand(H, -1, -1), attn_mask=mask, scale=scale)
        outs.append(o.transpose(0, 1).float())
    return torch.cat(outs)


def _triton_extend(q, kv, table, lens, qo, max_q, sm_scale, page_size, R_, kv_scale, causal=True):
    return mla_attention_paged_triton(q, kv, table, lens, sm_scale, page_size, qo, max_q, R_,
                                      1.0 if kv_scale is None else kv_scale, 2, None, block_n=16, causal=causal)


def _fb(mode, out_cache_loc, seq_lens, topk=1):
    from types import SimpleNamespace

    return SimpleNamespace(forward_mode=mode, out_cache_loc=out_cache_loc, batch_size=len(seq_lens),
                           seq_lens_cpu=torch.tensor(seq_lens), spec_info=SimpleNamespace(topk=topk))


@pytest.mark.parametrize("impl", ["dispatch", "triton"])
@pytest.mark.parametrize("mode", ["extend", "target_verify"])
def test_extend_with_cached_prefix_through_upstream_signature(mode, impl, monkeypatch):
    """Chunked prefill after a cache hit (prefix 0 / 5 / 11, new 4 / 1 / 6 rows) and chain verify (3 draft rows,
    upstream's custom mask present) through ``extend_attention_fwd``'s signature == causal SDPA over prefix + new."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if impl == "triton":
        monkeypatch.setattr(mla_backend, "mla_extend", _triton_extend)
    gen = torch.Generator().manual_seed(5)
    prefix, new = ([0, 5, 11], [4, 1, 6]) if mode == "extend" else ([6, 9, 2], [3, 3, 3])
    q, kv, kv_indptr, kv_indices, qo_indptr, loc = _extend_batch(gen, prefix, new)
    fm = ForwardMode.EXTEND if mode == "extend" else ForwardMode.TARGET_VERIFY
    seq_lens = [p + n for p, n in zip(prefix, new)] if mode == "extend" else prefix  # verify: committed length
    mask = None if mode == "extend" else torch.ones(1, dtype=torch.bool)  # chain verify still carries a mask
    ext = mla_backend.SglHybridMLAExtend(lambda *a, **k: pytest.fail("in-contract call reached upstream"))
    ext.batch = (_fb(fm, loc, seq_lens), True)
    o = torch.full((q.shape[0], H, R), float("nan"))
    ext(q, q[:, :1], q[:, :1, :R], o, kv, kv[..., :R], qo_indptr, kv_indptr, kv_indices, mask, True, None, max(new),
        1.0, 1.0, 0.125, logit_cap=0.0, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
        xai_temperature_len=-1, page_size=1, score_mod=None, aux_tensors=None, extend_seq_lens_cpu=new)
    torch.testing.assert_close(o, _extend_oracle(q, kv, kv_indptr, kv_indices, qo_indptr, loc, 0.125), rtol=1e-4, atol=1e-4)


def test_extend_out_of_contract_and_forward_extend_wrapper():
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    gen = torch.Generator().manual_seed(6)
    q, kv, kv_indptr, kv_indices, qo_indptr, loc = _extend_batch(gen, [2, 3], [2, 2])
    ext = mla_backend.SglHybridMLAExtend(lambda *a, **k: "upstream", SimpleNamespace(dcp_size=1))
    args = (q, q, q, torch.empty(4, H, R), kv, kv[..., :R], qo_indptr, kv_indptr, kv_indices)
    assert ext(*args, None, True, None, 2, 1.0, 1.0, 0.1) == "upstream"  # no forward_extend in progress
    ext.batch = (_fb(ForwardMode.TARGET_VERIFY, loc, [2, 3], topk=2), True)
    assert ext(*args, torch.ones(1, dtype=torch.bool), True, None, 2, 1.0, 1.0, 0.1) == "upstream"  # tree verify
    ext.batch = (_fb(ForwardMode.EXTEND, loc, [4, 5]), True)
    assert ext(*args, None, True, None, 2, 1.0, 1.0, 0.1, sliding_window_size=8) == "upstream"
    assert ext(*args, None, True, None, 2, 1.0, 1.0, 0.1, lse_extend=torch.empty(4, H)) == "upstream"
    ext.backend = SimpleNamespace(dcp_size=2)
    assert ext(*args, None, True, None, 2, 1.0, 1.0, 0.1) == "upstream"  # a DCP call other than upstream's two
    seen = []
    be = SimpleNamespace(forward_extend=lambda q, k, v, layer, fb, save=True: seen.append(ext.batch) or "o")
    wrapped = mla_backend._wrap_forward_extend(be, ext)
    fb = _fb(ForwardMode.EXTEND, loc, [4, 5])
    assert wrapped(q, q, q, None, fb) == "o" and seen == [(fb, True)] and ext.batch is None
    wrapped(q, None, None, None, fb, False)
    assert seen[-1] == (fb, False)  # nothing written this step: upstream's kernel reads k/v


def test_extend_page_table_joins_prefix_and_new_rows():
    table, lens = mla_backend.extend_page_table(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 3]),
                                                torch.tensor([7, 8, 9]), torch.tensor([4, 5, 6]), 2, 5)
    assert lens.tolist() == [3, 3] and table[0, :3].tolist() == [7, 4, 5] and table[1, :3].tolist() == [8, 9, 6]


@pytest.mark.parametrize("impl", ["dispatch", "triton"])
def test_dcp_extend_calls_merged_like_upstream_equal_full_attention(impl, monkeypatch):
    """Upstream's ``_forward_extend_dcp`` on 2 ranks, emulated: prefix position p lives on rank p mod 2; each
    rank makes upstream's two calls (new rows over themselves, skip_prefix; its prefix shard for all rows,
    skip_extend, non-causal), both through our extend; prefix parts merged across ranks by LSE, then with the
    new-row part (upstream's logaddexp) == causal SDPA over prefix + new rows."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if impl == "triton":
        monkeypatch.setattr(mla_backend, "mla_extend", _triton_extend)
    gen = torch.Generator().manual_seed(8)
    prefix, new = [9, 0, 14], [3, 2, 5]
    q, kv, kv_indptr, kv_indices, qo_indptr, loc = _extend_batch(gen, prefix, new)
    k_new = kv[loc]  # the new rows' latents as upstream hands them over ([N, 1, R + P])
    ref = _extend_oracle(q, kv, kv_indptr, kv_indices, qo_indptr, loc, 0.125)
    ext = mla_backend.SglHybridMLAExtend(lambda *a, **k: pytest.fail("reached upstream"), SimpleNamespace(dcp_size=2))
    ext.batch = (_fb(ForwardMode.EXTEND, loc, [p + n for p, n in zip(prefix, new)]), True)
    N = q.shape[0]

    def call(k_e, indptr, indices, causal, **flags):
        o, lse = torch.zeros(N, H, R), torch.full((N, H), float("-inf"))
        ext(q, k_e, k_e[..., :R], o, kv, kv[..., :R], qo_indptr, indptr, indices, None, causal, None, max(new), 1.0, 1.0,
            sm_scale=0.125, lse_extend=lse, **flags)
        return o, lse

    cur_o, cur_lse = call(k_new, torch.zeros_like(kv_indptr), kv_indices[:0], True, skip_prefix=True)
    parts = []
    for rank in range(2):
        local = [kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])][rank::2] for b in range(3)]
        indptr = torch.tensor([0] + list(torch.tensor([x.numel() for x in local]).cumsum(0)), dtype=torch.int32)
        parts.append(call(k_new[:0], indptr, torch.cat(local), False, skip_extend=True))
    p_lse = torch.logsumexp(torch.stack([lse for _, lse in parts]), 0)
    p_o = sum(o * torch.nan_to_num(torch.exp(lse - p_lse)).unsqueeze(-1) for o, lse in parts)
    final = torch.logaddexp(p_lse, cur_lse)
    out = p_o * torch.nan_to_num(torch.exp(p_lse - final)).unsqueeze(-1) + cur_o * torch.exp(cur_lse - final).unsqueeze(-1)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
