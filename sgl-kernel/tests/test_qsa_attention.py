"""QSA: the sparse walk over selected compressed blocks and the exact dense special case (Triton interpreter)
against the plain-torch reference, the dense reference against torch SDPA (GQA, causal), equality of the two
paths when every visible block is selected, and the guards that choose between them."""

import pytest
import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.qsa import choose_qsa_path, qsa_attention, qsa_attention_reference
from sgl_hybrid_kernel.qsa.attention import qsa_attention_triton

HQ, HKV, D, DV, RATIO, PS = 6, 2, 16, 16, 4, 2


def _case(gen, lens, T, NB):
    B = len(lens)
    max_pages = max(-(-L // PS) for L in lens)
    slots_n = (B * max_pages + 1) * PS
    k = torch.randn(slots_n, HKV, D, generator=gen)
    v = torch.randn(slots_n, HKV, DV, generator=gen)
    pt = torch.randperm(B * max_pages + 1, generator=gen)[: B * max_pages].view(B, max_pages).int()
    qo = torch.arange(0, (B + 1) * T, T, dtype=torch.int32)
    q = torch.randn(B * T, HQ, D, generator=gen)
    all_blocks = torch.full((B * T, NB), -1, dtype=torch.int32)
    sparse = torch.full((B * T, NB), -1, dtype=torch.int32)
    for b, L in enumerate(lens):
        for t in range(T):
            n_vis = -(-(L - T + t + 1) // RATIO)
            all_blocks[b * T + t, :n_vis] = torch.randperm(n_vis, generator=gen).int()  # any order
            pick = torch.randperm(n_vis, generator=gen)[: max(1, n_vis // 2)].int()
            sparse[b * T + t, : pick.numel()] = pick
    return q, k, v, pt, torch.tensor(lens, dtype=torch.int32), qo, all_blocks, sparse


def test_dense_reference_equals_sdpa_with_gqa():
    gen = torch.Generator().manual_seed(0)
    lens, T = [9, 13], 3
    q, k, v, pt, kv_lens, qo, _, _ = _case(gen, lens, T, 8)
    o, _ = qsa_attention_reference(q.double(), k.double(), v.double(), pt, kv_lens, qo, 0.25, PS)
    for b, L in enumerate(lens):
        pos = torch.arange(L)
        slots = pt[b, pos // PS].long() * PS + pos % PS
        qb = q[b * T : (b + 1) * T].double().transpose(0, 1)
        mask = pos[None, :] <= (L - T + torch.arange(T))[:, None]
        ref = F.scaled_dot_product_attention(qb, k[slots].double().transpose(0, 1), v[slots].double().transpose(0, 1),
                                             attn_mask=mask, scale=0.25, enable_gqa=True)
        torch.testing.assert_close(o[b * T : (b + 1) * T], ref.transpose(0, 1), rtol=1e-10, atol=1e-10)


def test_dense_walk_equals_sparse_walk_when_every_visible_block_is_selected():
    gen = torch.Generator().manual_seed(1)
    lens, T = [21, 6, 30, 12], 5
    q, k, v, pt, kv_lens, qo, all_blocks, _ = _case(gen, lens, T, 8)
    ref = qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS)  # dense causal prefix
    ref_sparse = qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS, all_blocks, RATIO)
    torch.testing.assert_close(ref_sparse, ref, rtol=1e-6, atol=1e-6)
    nan_out = lambda: (torch.full((20, HQ, DV), float("nan")), torch.full((20, HQ), float("nan")))  # noqa: E731
    dense = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, None, RATIO, *nan_out(), block_n=16)
    dense_split = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, None, RATIO, *nan_out(), block_n=8, num_splits=3)
    torch.testing.assert_close(dense_split, ref, rtol=1e-5, atol=1e-5)
    # 8 tiles of 4 positions in one partition: each tile's page ids are read one iteration ahead (carried)
    dense_many = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, None, RATIO, *nan_out(), block_n=4, num_stages=3)
    torch.testing.assert_close(dense_many, ref, rtol=1e-5, atol=1e-5)
    sparse = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, all_blocks, RATIO, *nan_out(), block_n=16)
    torch.testing.assert_close(dense, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse, ref, rtol=1e-5, atol=1e-5)


def test_sparse_walk_with_a_partial_selection_matches_reference():
    gen = torch.Generator().manual_seed(2)
    lens, T = [25, 17], 2
    q, k, v, pt, kv_lens, qo, _, sparse = _case(gen, lens, T, 8)
    ref = qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS, sparse, RATIO)
    got = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, sparse, RATIO, block_n=16)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    got_split = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, sparse, RATIO, block_n=8, num_splits=2)
    torch.testing.assert_close(got_split, ref, rtol=1e-5, atol=1e-5)
    dense = qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS)
    assert (ref[0] - dense[0]).abs().max() > 1e-2  # a partial selection is a different function


def test_guards_choose_the_sparse_path_outside_the_exact_contract():
    from sgl_hybrid_kernel.qsa.attention import choose_qsa_splits

    assert choose_qsa_splits(64, 2000) == 8 and choose_qsa_splits(320, 2048) == 2 and choose_qsa_splits(64, 200) == 1
    assert choose_qsa_splits(64, 2000, programs_per_sm=2) == 4  # the CUDA dense tile: 2 programs per SM
    assert choose_qsa_path(32, 2048, 5, 12)[0] == "dense"
    assert choose_qsa_path(32, 2049, 5, 12)[0] == "sparse"  # more visible positions than the budget
    assert choose_qsa_path(32, 1000, 6, 12)[0] == "sparse"  # 72 rows > 64-row tile
    assert choose_qsa_path(3, 1000, 5, 12)[0] == "sparse"  # batch < 4
    assert choose_qsa_path(32, 1000, 5, 12, draft_reuses_selection=True)[0] == "sparse"


def test_dispatch_on_cpu_follows_the_guards():
    from sgl_hybrid_kernel.dispatch import chosen_paths

    gen = torch.Generator().manual_seed(3)
    lens, T = [21, 6, 30, 12], 5
    q, k, v, pt, kv_lens, qo, _, sparse = _case(gen, lens, T, 8)
    o, _ = qsa_attention(q, k, v, pt, kv_lens, qo, sparse, 0.25, max_kv_len=30, max_seqlen_q=T, compress_ratio=RATIO, page_size=PS)
    assert torch.equal(o, qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS)[0])  # dense: selection unused
    o2, _ = qsa_attention(q, k, v, pt, kv_lens, qo, sparse, 0.25, max_kv_len=30, max_seqlen_q=T, compress_ratio=RATIO,
                          page_size=PS, draft_reuses_selection=True)
    assert torch.equal(o2, qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS, sparse, RATIO)[0])
    ops = {c.op: c.reason for c in chosen_paths()}
    assert "exact dense walk" in ops["qsa_dense"] and "reuses" in ops["qsa_sparse"]
    with pytest.raises(ValueError, match="KV heads"):
        qsa_attention(q[:, :5], k, v, pt, kv_lens, qo, sparse, 0.25, 30, T)



def test_split_partitions_with_empty_ones_and_an_empty_row_match_reference():
    """Dense walk split into 4 partitions (a request of 4 positions leaves partitions empty) with NaN-prefilled
    outputs: the merged result is the reference's, and a row that sees nothing gives (0, -inf)."""
    gen = torch.Generator().manual_seed(4)
    lens, T = [21, 6, 30, 4], 4
    q, k, v, pt, kv_lens, qo, _, _ = _case(gen, lens, T, 8)
    kv_lens[3] = 3  # request 3: its first query row sees nothing (kv_len - T + 0 < 0)
    ref = qsa_attention_reference(q, k, v, pt, kv_lens, qo, 0.25, PS)
    out = (torch.full((16, HQ, DV), float("nan")), torch.full((16, HQ), float("nan")))
    # the partials merged by the DCP kernel and by qsa_merge_kernel (4 heads per program: the second block of 6
    # heads is half masked; 3 partitions pad to 4)
    for splits, merge in ((4, {}), (3, dict(merge_block_h=4))):
        out = (torch.full((16, HQ, DV), float("nan")), torch.full((16, HQ), float("nan")))
        got = qsa_attention_triton(q, k, v, pt, kv_lens, qo, 0.25, T, PS, None, RATIO, *out, block_n=4, num_splits=splits,
                                   **merge)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[0][12], torch.zeros(HQ, DV)) and torch.isneginf(got[1][12]).all()


def sm90_dot_report(configs) -> dict:
    """``{config: {dtype: (tf32 in the PTX, MMA / WGMMA instructions)}}`` of compile-gate configs cross-compiled
    for sm_90 with BF16 and with FP32 activations (a subprocess: conftest makes this process interpret kernels)."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, re, sys\n"
        "from sgl_hybrid_kernel.compile_gate import compiled_asm\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    out[name] = {}\n"
        "    for dt in ('bf16', 'fp32'):\n"
        "        ptx = compiled_asm(name, 'sm90', activation=dt)['ptx']\n"
        "        out[name][dt] = ('tf32' in ptx, len(re.findall(r'\\b(?:wgmma|mma)\\.', ptx)))\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code, *configs], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_fp32_qsa_is_not_tf32_on_sm90_and_bf16_keeps_the_tensor_cores():
    """FP32 QSA (the boot gate's dtype, tolerance 1e-4) compiled for sm_90: no TF32 MMA in the PTX (TF32 was
    2e-3 off on the H200), FP32 products instead; BF16 (serving) still runs MMA / WGMMA."""
    report = sm90_dot_report(["qsa_dense_t5_cuda", "qsa_sparse_cuda"])
    for name, by_dtype in report.items():
        assert by_dtype["fp32"] == [False, 0], (name, by_dtype)
        assert by_dtype["bf16"][1] > 0 and not by_dtype["bf16"][0], (name, by_dtype)
