"""Fused MoE routing (Triton interpreter) against the plain-torch reference and the existing Kimi K3 router:
Kimi K3 (sigmoid + correction bias + groups) and Qwen (softmax, shared-expert slot) configurations,
ties to the smaller index, distinct ids for NaN / infinite logits, the expert-sorted block-padded layout
against a naive loop, and case K9 (padded MoE rows: valid rows bit-identical whatever the padding holds)."""

import pytest
import torch

from sgl_hybrid_kernel.moe import biased_grouped_topk, fused_moe_routing, moe_experts
from sgl_hybrid_kernel.moe.routing import fused_moe_routing_triton
from sgl_hybrid_kernel.moe.routing_reference import (
    expert_sorted_layout_reference,
    gather_sorted_rows,
    grouped_swiglu_sorted_reference,
    route_tokens_reference,
)

# The interpreter evaluates the kernels with numpy, which warns on the all-NaN rows these tests feed on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _naive_layout(ids, num_experts, block):
    flat = ids.reshape(-1).tolist()
    sorted_ids, owners = [], []
    for e in range(num_experts):
        entries = [i for i, x in enumerate(flat) if x == e]
        if not entries:
            continue
        padded = -(-len(entries) // block) * block
        sorted_ids += entries + [len(flat)] * (padded - len(entries))
        owners += [e] * (padded // block)
    return sorted_ids, owners


def _nasty_logits(gen, M, E):
    x = torch.randn(M, E, generator=gen)
    x[1] = float("nan")  # all NaN
    x[2, : E // 2] = 0.25  # a plateau of ties
    x[2, E // 2 :] = float("-inf")
    x[3, 5] = float("inf")
    x[4, ::3] = float("nan")
    return x


CONFIGS = {
    "kimi_k3_grouped": dict(top_k=6, scoring_func="sigmoid", num_expert_group=4, topk_group=2, routed_scaling_factor=2.5),
    "kimi_k3_flat_shared": dict(top_k=8, scoring_func="sigmoid", shared_expert_weight=1.0),
    "qwen_softmax_shared": dict(top_k=5, scoring_func="softmax", shared_expert_weight=0.7),
    "softmax_grouped_no_renorm": dict(top_k=4, scoring_func="softmax", num_expert_group=8, topk_group=3, renormalize=False),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_triton_routing_matches_reference(name):
    cfg = dict(CONFIGS[name])
    gen = torch.Generator().manual_seed(len(name))
    M, E = 7, 64
    if cfg["scoring_func"] == "sigmoid":
        cfg["correction_bias"] = torch.randn(E, generator=gen) * 0.1
    logits = _nasty_logits(gen, M, E)
    r = fused_moe_routing_triton(logits, block_size=4, **cfg)
    w, ids = route_tokens_reference(logits, **cfg)
    assert torch.equal(r.ids, ids)
    for row in r.ids[:, : cfg["top_k"]]:
        assert len(set(row.tolist())) == cfg["top_k"]  # distinct even for the NaN / inf rows
    finite = torch.isfinite(logits).all(-1)
    torch.testing.assert_close(r.weights[finite], w[finite], rtol=1e-6, atol=1e-6)
    n_experts = E + int("shared_expert_weight" in cfg)
    sorted_ids, owners = _naive_layout(ids, n_experts, 4)
    assert r.sorted_ids[: len(sorted_ids)].tolist() == sorted_ids and int(r.num_rows) == len(sorted_ids)
    assert (r.sorted_ids[len(sorted_ids):] == ids.numel()).all()  # padding written as the sentinel
    assert r.block_expert[: len(owners)].tolist() == owners and (r.block_expert[len(owners):] == -1).all()
    ref_layout = expert_sorted_layout_reference(ids, n_experts, 4)
    assert all(torch.equal(a, b) for a, b in zip(ref_layout, (r.sorted_ids, r.block_expert, r.num_rows)))


def test_sigmoid_bias_routing_equals_the_kimi_k3_router_and_ties():
    gen = torch.Generator().manual_seed(3)
    logits, bias = _nasty_logits(gen, 6, 32), torch.randn(32, generator=gen) * 0.1
    w_ref, ids_ref = biased_grouped_topk(logits, bias, 4, num_expert_group=4, topk_group=2, routed_scaling_factor=1.5)
    r = fused_moe_routing_triton(logits, 4, "sigmoid", bias, 4, 2, routed_scaling_factor=1.5)
    assert torch.equal(r.ids.long(), ids_ref)
    ok = torch.isfinite(logits).all(-1)
    torch.testing.assert_close(r.weights[ok], w_ref[ok], rtol=1e-6, atol=1e-6)
    tie = fused_moe_routing_triton(torch.zeros(1, 16), 3, "softmax")
    assert tie.ids.tolist() == [[0, 1, 2]]


def test_k9_padded_moe_rows_are_bit_identical_whatever_the_padding_holds():
    """Expert token counts {1, 17, 33} with block 16; intermediate 10 laid out as 16 columns (640 -> 768 in
    miniature); NaN / huge values in every reused buffer; decode batch sizes 1..7 give no NaN."""
    gen = torch.Generator().manual_seed(9)
    E, D, I, I_pad, blk = 3, 8, 10, 16, 16
    counts = [1, 17, 33]
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in enumerate(counts)])[torch.randperm(51, generator=gen)]
    ids = ids.view(51, 1)
    w13 = torch.zeros(E, 2 * I_pad, D)
    w2 = torch.zeros(E, D, I_pad)
    w13[:, :I], w13[:, I_pad : I_pad + I] = torch.randn(E, I, D, generator=gen), torch.randn(E, I, D, generator=gen)
    w2[:, :, :I] = torch.randn(E, D, I, generator=gen)
    x = torch.randn(51, D, generator=gen)
    layout = fused_moe_routing_triton(torch.where(torch.arange(E)[None] == ids.long(), 5.0, -5.0), 1, "sigmoid", block_size=blk)
    assert torch.equal(layout.ids, ids)
    sorted_ids, block_expert = layout.sorted_ids, layout.block_expert
    assert int(layout.num_rows) == 16 + 32 + 48

    def run(fill):
        rows = gather_sorted_rows(x, sorted_ids, 1, out=torch.full((sorted_ids.numel(), D), fill))
        return grouped_swiglu_sorted_reference(rows, block_expert, w13, w2, blk, inter_out=torch.full((sorted_ids.numel(), I_pad), fill))

    clean, nan, huge = run(0.0), run(float("nan")), run(3e38)
    valid = sorted_ids < 51
    assert torch.equal(clean, nan) and torch.equal(clean, huge) and not torch.isnan(nan).any()
    assert torch.equal(clean[~valid], torch.zeros_like(clean[~valid]))
    out = torch.zeros(51, D).index_add_(0, sorted_ids[valid].long(), clean[valid])
    unpadded = moe_experts(x, torch.cat([w13[:, :I], w13[:, I_pad : I_pad + I]], 1), w2[:, :, :I], torch.ones(51, 1), ids.long())
    torch.testing.assert_close(out, unpadded, rtol=1e-5, atol=1e-5)
    for M in range(1, 8):  # decode batch sizes
        r = fused_moe_routing(torch.randn(M, 64, generator=gen), 6, "softmax", shared_expert_weight=1.0)
        assert not torch.isnan(r.weights).any() and int(r.num_rows) % 16 == 0


def test_dispatch_and_argument_errors():
    from sgl_hybrid_kernel.dispatch import chosen_paths

    r = fused_moe_routing(torch.randn(3, 16), 2, "sigmoid", torch.zeros(16))
    assert {c.op: c.impl for c in chosen_paths()}["moe_routing"] == "torch" and r.ids.shape == (3, 2)
    with pytest.raises(ValueError, match="scoring_func"):
        fused_moe_routing(torch.randn(3, 16), 2, "relu")
    with pytest.raises(ValueError, match="top_k"):
        fused_moe_routing_triton(torch.randn(3, 16), 17)
    with pytest.raises(ValueError, match="num_expert_group"):
        route_tokens_reference(torch.randn(3, 16), 2, num_expert_group=3)



@pytest.mark.parametrize("layout_block", [64, 1024])
def test_layout_with_two_bitmap_words_equals_the_reference(layout_block):
    """M = 70 tokens: two 64-token bitmap words (token 63 uses the sign bit), entries taken 64 or 1,024 per
    step: sorted rows, block owners and row count equal the reference's stable sort by expert."""
    gen = torch.Generator().manual_seed(37)
    logits = torch.randn(70, 24, generator=gen)
    logits[5] = 0.0  # one all-tie row
    r = fused_moe_routing_triton(logits, 5, "softmax", shared_expert_weight=1.0, block_size=4, layout_block=layout_block)
    ref = expert_sorted_layout_reference(r.ids, 25, 4)
    assert all(torch.equal(a, b) for a, b in zip(ref, (r.sorted_ids, r.block_expert, r.num_rows)))
    assert int(r.num_rows) > 70 * 6  # padding rows present, so the check covers them
