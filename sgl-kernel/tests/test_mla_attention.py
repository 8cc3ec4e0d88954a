"""MLA decode / extend over a paged latent cache: the plain-torch reference against torch SDPA on the
decompressed heads (independent oracle), and the split-KV Triton kernel (interpreter, FP32, tiny dims)
against the reference: head counts, partitions (including empty ones), FP8 cache, NaN-prefilled buffers."""

import pytest
import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.mla import mla_attention_paged_reference, mla_decode, mla_extend
from sgl_hybrid_kernel.mla.attention import MAX_SPLITS, choose_num_splits, choose_tile, mla_attention_paged_triton


def _paged_cache(lens, D, page_size, gen, dtype=torch.float64, spare_pages=3):
    """Random cache with each request's pages scattered (shuffled page ids)."""
    max_pages = max(1, max((int(L) + page_size - 1) // page_size for L in lens))
    n_pages = len(lens) * max_pages + spare_pages
    cache = torch.randn(n_pages, page_size, D, generator=gen, dtype=dtype)
    perm = torch.randperm(n_pages, generator=gen)[: len(lens) * max_pages]
    page_table = perm.view(len(lens), max_pages).to(torch.int32)
    return cache, page_table


def _gather(cache, page_table, b, L, page_size):
    pos = torch.arange(L)
    return cache.reshape(-1, cache.shape[-1])[page_table[b, pos // page_size].long() * page_size + pos % page_size]


@pytest.mark.parametrize("H", [4, 8, 12, 16, 32, 64, 128])
def test_reference_equals_sdpa_on_decompressed_heads(H):
    """Kimi K3 dims (kv_lora 512 + rope 64): absorbed paged attention == SDPA over per-head K/V."""
    gen = torch.Generator().manual_seed(H)
    R, P, dn, dv, ps = 512, 64, 16, 8, 4
    lens = [9, 1, 14]
    qo = torch.tensor([0, 3, 4, 6])  # request 0: 3 new rows (extend), 1: decode, 2: 2 rows (verify)
    cache, pt = _paged_cache(lens, R + P, ps, gen)
    w_kc, w_vc = torch.randn(H, dn, R, generator=gen, dtype=torch.float64), torch.randn(H, dv, R, generator=gen, dtype=torch.float64)
    q_nope = torch.randn(6, H, dn, generator=gen, dtype=torch.float64)
    q_pe = torch.randn(6, H, P, generator=gen, dtype=torch.float64)
    scale = (dn + P) ** -0.5
    q = torch.cat([torch.einsum("thd,hdr->thr", q_nope, w_kc), q_pe], -1)
    o_lat, lse = mla_attention_paged_reference(q, cache, pt, torch.tensor(lens), scale, ps, qo)
    for b, L in enumerate(lens):
        t0, t1 = int(qo[b]), int(qo[b + 1])
        rows = _gather(cache, pt, b, L, ps)
        c, k_pe = rows[:, :R], rows[:, R:]
        k = torch.cat([torch.einsum("sr,hdr->hsd", c, w_kc), k_pe.expand(H, L, P)], -1)  # [H, L, dn+P]
        v = torch.einsum("sr,hvr->hsv", c, w_vc)
        qh = torch.cat([q_nope[t0:t1], q_pe[t0:t1]], -1).transpose(0, 1)  # [H, T, dn+P]
        T = t1 - t0
        visible = torch.arange(L)[None, :] <= (L - T + torch.arange(T))[:, None]
        ref = F.scaled_dot_product_attention(qh, k, v, attn_mask=visible, scale=scale).transpose(0, 1)
        torch.testing.assert_close(torch.einsum("thr,hvr->thv", o_lat[t0:t1], w_vc), ref, rtol=1e-9, atol=1e-9)
        scores = (qh @ k.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
        torch.testing.assert_close(lse[t0:t1].double(), torch.logsumexp(scores, -1).t(), rtol=1e-6, atol=1e-6)


def test_reference_empty_request_gives_zero_and_neg_inf():
    cache, pt = _paged_cache([0, 3], 12, 2, torch.Generator().manual_seed(0), torch.float32)
    o, lse = mla_attention_paged_reference(torch.randn(2, 3, 12), cache, pt, torch.tensor([0, 3]), 0.3, 2, kv_lora_rank=8)
    assert torch.equal(o[0], torch.zeros(3, 8)) and torch.isneginf(lse[0]).all() and torch.isfinite(lse[1]).all()


TINY_R, TINY_P = 32, 16


@pytest.mark.parametrize(
    "H,splits,page_size,lens",
    [(12, 1, 4, [37, 1, 0, 70]), (12, 8, 4, [37, 1, 0, 70]), (1, 3, 1, [37, 1, 0, 70]), (40, 2, 8, [37, 1, 0, 70]), (66, 2, 2, [30, 0])],
)
def test_triton_decode_matches_reference(H, splits, page_size, lens):
    """Head counts across one and two head blocks, 1..8 partitions (some empty), NaN-prefilled outputs."""
    gen = torch.Generator().manual_seed(H * 10 + splits)
    B = len(lens)
    cache, pt = _paged_cache(lens, TINY_R + TINY_P, page_size, gen, torch.float32)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(B, H, TINY_R + TINY_P, generator=gen)
    ref_o, ref_lse = mla_attention_paged_reference(q, cache, pt, kv_lens, 0.2, page_size, kv_lora_rank=TINY_R)
    out = torch.full((B, H, TINY_R), float("nan"))
    lse = torch.full((B, H), float("nan"))
    ws = (torch.full((B, H, splits, TINY_R), float("nan")), torch.full((B, H, splits), float("nan")))
    mla_attention_paged_triton(q, cache, pt, kv_lens, 0.2, page_size, kv_lora_rank=TINY_R, num_splits=splits,
                               out=out, lse_out=lse, workspace=ws, block_n=16)
    torch.testing.assert_close(out, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)
    empty = lens.index(0)
    assert torch.equal(out[empty], torch.zeros(H, TINY_R)) and torch.isneginf(lse[empty]).all()


def test_triton_tile_variants_agree_and_fp8_cache():
    """Chunked score dots / split value columns (the CDNA tile) and an FP8 e4m3 cache with a scale."""
    gen = torch.Generator().manual_seed(7)
    lens = [50, 23]
    cache, pt = _paged_cache(lens, TINY_R + TINY_P, 4, gen, torch.float32)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(2, 12, TINY_R + TINY_P, generator=gen)
    ref = mla_attention_paged_reference(q, cache, pt, kv_lens, 0.2, 4, kv_lora_rank=TINY_R)
    got = mla_attention_paged_triton(q, cache, pt, kv_lens, 0.2, 4, kv_lora_rank=TINY_R, num_splits=2, block_n=16,
                                     score_chunk=8, value_cols=16)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    fp8 = (cache * 4).to(torch.float8_e4m3fn)
    ref8 = mla_attention_paged_reference(q, fp8, pt, kv_lens, 0.2, 4, kv_lora_rank=TINY_R, kv_scale=0.25)
    got8 = mla_attention_paged_triton(q, fp8, pt, kv_lens, 0.2, 4, kv_lora_rank=TINY_R, kv_scale=0.25, num_splits=3, block_n=16)
    torch.testing.assert_close(got8, ref8, rtol=1e-5, atol=1e-5)
    # the scale matters: an FP8 cache read without it is a different function
    assert (ref8[0] - mla_attention_paged_reference(q, fp8, pt, kv_lens, 0.2, 4, kv_lora_rank=TINY_R)[0]).abs().max() > 1e-2


def test_triton_extend_with_cached_prefix_matches_reference():
    """Chunked prefill after a cache hit: 5 and 9 new rows after 20 and 0 cached positions, and a decode row."""
    gen = torch.Generator().manual_seed(3)
    lens = [25, 9, 40]
    qo = torch.tensor([0, 5, 14, 15], dtype=torch.int32)
    cache, pt = _paged_cache(lens, TINY_R + TINY_P, 4, gen, torch.float32)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(15, 12, TINY_R + TINY_P, generator=gen)
    ref = mla_attention_paged_reference(q, cache, pt, kv_lens, 0.2, 4, qo, kv_lora_rank=TINY_R)
    for splits in (1, 3):
        got = mla_attention_paged_triton(q, cache, pt, kv_lens, 0.2, 4, qo, max_seqlen_q=9, kv_lora_rank=TINY_R,
                                         num_splits=splits, block_n=16)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_non_causal_rows_see_the_whole_shard():
    """``causal=False`` (a DCP rank's prefix shard of an extend): every new row sees all ``kv_lens[b]``
    positions; the reference equals softmax over all positions in FP64, and Triton (1 and 2 splits) the reference."""
    gen = torch.Generator().manual_seed(4)
    lens = [7, 0, 19]
    qo = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    cache, pt = _paged_cache(lens, TINY_R + TINY_P, 4, gen, torch.float32)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(9, 4, TINY_R + TINY_P, generator=gen)
    ref = mla_attention_paged_reference(q, cache, pt, kv_lens, 0.2, 4, qo, kv_lora_rank=TINY_R, causal=False)
    rows = cache.reshape(-1, TINY_R + TINY_P).double()
    for b, (t0, t1) in enumerate(zip(qo[:-1].tolist(), qo[1:].tolist())):
        pos = torch.arange(lens[b])
        kv = rows[pt[b, pos // 4].long() * 4 + pos % 4]
        if lens[b] == 0:
            assert torch.isneginf(ref[1][t0:t1]).all() and not ref[0][t0:t1].any()
            continue
        w = torch.softmax(0.2 * q[t0:t1].double() @ kv.T, dim=-1)  # no mask: all rows see all positions
        torch.testing.assert_close(ref[0][t0:t1].double(), w @ kv[:, :TINY_R], rtol=1e-5, atol=1e-5)
    for splits in (1, 2):
        got = mla_attention_paged_triton(q, cache, pt, kv_lens, 0.2, 4, qo, max_seqlen_q=4, kv_lora_rank=TINY_R,
                                         num_splits=splits, block_n=16, causal=False)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_partition_heuristic_fills_the_gpu_and_keeps_long_partitions():
    assert choose_tile(12, 1) == (12, 16) and choose_tile(128, 1) == (64, 64) and choose_tile(12, 5) == (12, 64)
    assert choose_tile(96, 1) == (48, 64) and choose_tile(1, 1) == (1, 16)
    # Kimi K3 TP8 decode (12 heads) on 132 SMs: about two programs per SM in whole waves
    assert choose_num_splits(1, 12, 32768, num_sms=132) == MAX_SPLITS == 128
    assert choose_num_splits(32, 12, 32768, num_sms=132) == 8  # 256 programs; 9 would leave a 2.2-wave tail
    assert choose_num_splits(8, 12, 8192, num_sms=132) == 32
    assert choose_num_splits(128, 12, 32768, num_sms=132) == 2
    assert choose_num_splits(1, 12, 200, num_sms=132) == 1  # a partition keeps >= 128 positions
    assert choose_num_splits(1, 12, 1024, num_sms=132) == 8
    assert choose_num_splits(1, 128, 32768, num_sms=132) == 128 and choose_num_splits(64, 128, 32768, num_sms=132) == 2


def test_dispatch_on_cpu_uses_reference_and_logs_it():
    from sgl_hybrid_kernel.dispatch import chosen_paths

    gen = torch.Generator().manual_seed(1)
    cache, pt = _paged_cache([6, 2], 24, 2, gen, torch.float32)
    q = torch.randn(2, 3, 24, generator=gen)
    o, lse = mla_decode(q, cache, pt, torch.tensor([6, 2]), 0.5, page_size=2, kv_lora_rank=16)
    ref = mla_attention_paged_reference(q, cache, pt, torch.tensor([6, 2]), 0.5, 2, kv_lora_rank=16)
    assert torch.equal(o, ref[0]) and torch.equal(lse, ref[1])
    o2, _ = mla_extend(q, cache, pt, torch.tensor([6, 2]), torch.tensor([0, 1, 2]), 1, 0.5, page_size=2, kv_lora_rank=16)
    assert torch.equal(o2, o)
    reasons = {c.op: (c.impl, c.reason) for c in chosen_paths()}
    assert reasons["mla_decode"][0] == "torch" and "CPU" in reasons["mla_decode"][1]
    with pytest.raises(ValueError, match="q must be"):
        mla_decode(q[0], cache, pt, torch.tensor([6, 2]), 0.5)


def test_default_tile_fits_the_latent_rank():
    """Chunk / columns capped at ``R`` (they must divide it): Kimi K3's R = 512 keeps the swept tiles, the boot
    gate's R = 128 and the tiny Kimi K3's R = 64 get one chunk / one value program (were 512 -> ValueError)."""
    from sgl_hybrid_kernel.mla.attention import default_tile

    assert default_tile("cuda", 16, 512) == dict(block_n=64, score_chunk=512, value_cols=512, num_warps=8, num_stages=2)
    assert default_tile("cuda", 16, 512, True) == dict(block_n=32, score_chunk=512, value_cols=512, num_warps=4, num_stages=2)
    assert default_tile("rocm", 16, 512) == dict(block_n=16, score_chunk=64, value_cols=128, num_warps=4, num_stages=2)
    assert default_tile("cuda", 64, 512)["num_warps"] == 8
    for R in (16, 64, 128, 256):
        for platform, rows, fp8 in (("cuda", 16, False), ("cuda", 16, True), ("cuda", 64, False), ("rocm", 16, False)):
            t = default_tile(platform, rows, R, fp8)
            assert R % t["score_chunk"] == 0 and R % t["value_cols"] == 0, (R, platform, rows, t)
    assert default_tile("cuda", 16, 64)["score_chunk"] == 64 and default_tile("cuda", 16, 128)["value_cols"] == 128
    assert default_tile("rocm", 16, 128) == dict(block_n=16, score_chunk=64, value_cols=128, num_warps=4, num_stages=2)
    for bad in (96, 0, True):
        with pytest.raises(ValueError, match="power of two"):
            default_tile("cuda", 16, bad)


@pytest.mark.parametrize("R", [64, 128])
@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_triton_at_the_default_tile_matches_reference_for_small_ranks(R, platform):
    """Decode (4 heads: the 16-row tile) and a 5-row verify (the 64-row tile) at ``default_tile``'s tile for
    ``R`` = 64 (tiny Kimi K3) / 128 (boot gate case): before the tile followed ``R`` the CUDA decode tile
    (score_chunk 512) and, at R = 64, every tile (value_cols 128) raised ValueError."""
    from sgl_hybrid_kernel.mla.attention import default_tile

    gen = torch.Generator().manual_seed(R + len(platform))
    P, H, lens = 16, 4, [21, 0, 9]
    cache, pt = _paged_cache(lens, R + P, 4, gen, torch.float32)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(3, H, R + P, generator=gen)
    ref = mla_attention_paged_reference(q, cache, pt, kv_lens, 0.2, 4, kv_lora_rank=R)
    _, rows = choose_tile(H, 1)
    got = mla_attention_paged_triton(q, cache, pt, kv_lens, 0.2, 4, kv_lora_rank=R, num_splits=2,
                                     **default_tile(platform, rows, R))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    qo = torch.tensor([0, 5, 5, 8], dtype=torch.int32)
    qe = torch.randn(8, H, R + P, generator=gen)
    ref_e = mla_attention_paged_reference(qe, cache, pt, kv_lens, 0.2, 4, qo, kv_lora_rank=R)
    _, rows = choose_tile(H, 5)
    got_e = mla_attention_paged_triton(qe, cache, pt, kv_lens, 0.2, 4, qo, max_seqlen_q=5, kv_lora_rank=R,
                                       num_splits=1, **default_tile(platform, rows, R))
    torch.testing.assert_close(got_e, ref_e, rtol=1e-5, atol=1e-5)


def test_boot_gate_with_the_cuda_tile_passes(monkeypatch):
    """The MLA boot gates (``mla/ops.py``: an R = 128 case beside Kimi K3's 512) with the tile the dispatcher
    picks on CUDA, run in the interpreter: the gate raised ValueError at R = 128 on the H200."""
    from sgl_hybrid_kernel.mla import ops

    monkeypatch.setattr(ops, "device_kind", lambda t: "cuda")
    for gate in (ops.gate_mla_decode, ops.gate_mla_extend):
        res = gate("triton", "cpu")
        assert res.max_abs_err <= res.tolerance, res


def test_fp32_mla_is_not_tf32_on_sm90_and_bf16_keeps_the_tensor_cores():
    """The MLA boot gates also run FP32 at 1e-4: no TF32 MMA in the sm_90 PTX of the decode (512-deep and
    chunked) and tiny (R = 64) tiles at FP32; BF16 still runs MMA / WGMMA. The tiny config also compiles."""
    from test_qsa_attention import sm90_dot_report

    report = sm90_dot_report(["mla_decode_h12_cuda", "mla_verify_t5_h12", "mla_decode_tiny_r64_cuda"])
    for name, by_dtype in report.items():
        assert by_dtype["fp32"] == [False, 0], (name, by_dtype)
        assert by_dtype["bf16"][1] > 0 and not by_dtype["bf16"][0], (name, by_dtype)
