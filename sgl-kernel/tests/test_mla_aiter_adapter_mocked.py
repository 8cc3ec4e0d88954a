"""The aiter MLA decode adapter on CPU with aiter mocked at its boundary (``mla_decode_fwd``).

The fake checks the contract we read from ROCm/aiter (head count 16 or 128, 4-D
``kv_buffer`` with one KV head, CSR page metadata, ``o`` written in place,
``(logits, lse)`` returned), computes attention from that CSR metadata by its
own loop, and writes NaN into the padded heads: the adapter must drop them.
"""

import pytest
import torch

from sgl_hybrid_kernel.mla import mla_attention_paged_reference
from sgl_hybrid_kernel.mla.aiter_adapter import aiter_paged_metadata, mla_decode_aiter, pad_query_heads, padded_head_count


class FakeAiter:
    def __init__(self, real_heads):
        self.real_heads = real_heads
        self.calls = []

    def __call__(self, q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                 page_size=1, nhead_kv=1, sm_scale=None, return_lse=False, kv_scale=None, **unused):
        B, nhead, D = q.shape
        assert nhead in (16, 128), nhead
        assert kv_buffer.dim() == 4 and kv_buffer.shape[1:3] == (page_size, 1) and nhead_kv == 1
        assert o.shape == (B, nhead, 512) and max_seqlen_q == 1 and return_lse
        assert torch.equal(qo_indptr, torch.arange(B + 1, dtype=torch.int32))
        assert torch.equal(q[:, self.real_heads:], torch.zeros_like(q[:, self.real_heads:]))  # padding is zeros
        self.calls.append(nhead)
        lse = torch.empty(B, nhead)
        flat = kv_buffer.reshape(-1, D).float() * (1.0 if kv_scale is None else float(kv_scale))
        for b in range(B):
            pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
            n = (len(pages) - 1) * page_size + int(kv_last_page_lens[b])
            slots = (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n]
            kv = flat[slots]
            s = q[b].float() @ kv.t() * sm_scale
            lse[b] = torch.logsumexp(s, -1)
            o[b] = (torch.softmax(s, -1) @ kv[:, :512]).to(o.dtype)
        o[:, self.real_heads:] = float("nan")
        lse[:, self.real_heads:] = float("nan")
        return None, lse


def _case(B, lens, ps, gen, dtype=torch.float32):
    max_pages = max((L + ps - 1) // ps for L in lens) or 1
    n_pages = B * max_pages + 2
    cache = torch.randn(n_pages, ps, 576, generator=gen).to(dtype)
    pt = torch.randperm(n_pages, generator=gen)[: B * max_pages].view(B, max_pages).to(torch.int32)
    return cache, pt


@pytest.mark.parametrize("H", [4, 8, 12, 16, 32, 64, 128])
def test_adapter_pads_query_heads_and_drops_them_mocked(H):
    gen = torch.Generator().manual_seed(H)
    lens, ps = [9, 1, 16], 4
    cache, pt = _case(3, lens, ps, gen)
    q = torch.randn(3, H, 576, generator=gen)
    fake = FakeAiter(H)
    o, lse = mla_decode_aiter(q, cache, pt, torch.tensor(lens, dtype=torch.int32), 0.05, page_size=ps, decode_fn=fake)
    assert fake.calls == [16 if H <= 16 else 128]
    ref_o, ref_lse = mla_attention_paged_reference(q, cache, pt, torch.tensor(lens), 0.05, ps)
    assert o.shape == (3, H, 512) and lse.shape == (3, H)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_adapter_empty_request_and_fp8_scale_mocked():
    gen = torch.Generator().manual_seed(0)
    lens, ps = [0, 5], 2
    cache, pt = _case(2, lens, ps, gen)
    fp8 = (cache * 8).to(torch.float8_e4m3fn)
    q = torch.randn(2, 12, 576, generator=gen)
    o, lse = mla_decode_aiter(q, fp8, pt, torch.tensor(lens), 0.05, page_size=ps, kv_scale=0.125, decode_fn=FakeAiter(12))
    assert torch.equal(o[0], torch.zeros(12, 512)) and torch.isneginf(lse[0]).all()
    ref_o, ref_lse = mla_attention_paged_reference(q, fp8, pt, torch.tensor(lens), 0.05, ps, kv_scale=0.125)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_csr_metadata_from_page_table():
    pt = torch.tensor([[7, 3, 9], [4, 0, 0], [5, 6, 0]], dtype=torch.int32)
    qo, indptr, indices, last, empty = aiter_paged_metadata(pt, torch.tensor([9, 0, 4]), page_size=4)
    assert indptr.tolist() == [0, 3, 4, 5]
    assert indices[:5].tolist() == [7, 3, 9, 4, 5]
    assert last.tolist() == [1, 1, 4] and empty.tolist() == [False, True, False] and qo.tolist() == [0, 1, 2, 3]


def test_head_padding_rules():
    assert [padded_head_count(h) for h in (1, 12, 16, 17, 96, 128)] == [16, 16, 16, 128, 128, 128]
    with pytest.raises(ValueError, match="num_heads"):
        padded_head_count(129)
    q = torch.randn(2, 12, 8)
    qp = pad_query_heads(q, 16)
    assert torch.equal(qp[:, :12], q) and torch.equal(qp[:, 12:], torch.zeros(2, 4, 8))


def test_dispatcher_takes_aiter_on_rocm_when_it_imports_mocked(monkeypatch):
    """The dispatcher's ROCm branch, with the platform and aiter's import mocked."""
    import sgl_hybrid_kernel.mla.dispatch as d
    from sgl_hybrid_kernel.dispatch import chosen_paths

    gen = torch.Generator().manual_seed(5)
    cache, pt = _case(2, [6, 3], 2, gen, torch.bfloat16)
    q = torch.randn(2, 12, 576, generator=gen).to(torch.bfloat16)
    fake = FakeAiter(12)
    monkeypatch.setattr(d, "device_kind", lambda t: "rocm")
    monkeypatch.setattr(d, "aiter_mla_decode_fn", lambda: fake)
    o, lse = d.mla_decode(q, cache, pt, torch.tensor([6, 3]), 0.05, page_size=2)
    assert fake.calls == [16] and o.dtype == torch.bfloat16
    choice = {c.op: c for c in chosen_paths()}["mla_decode"]
    assert choice.impl == "aiter" and "12 padded to 16" in choice.reason
    ref_o, _ = mla_attention_paged_reference(q.float(), cache.float(), pt, torch.tensor([6, 3]), 0.05, 2)
    torch.testing.assert_close(o.float(), ref_o, rtol=2e-2, atol=2e-2)
