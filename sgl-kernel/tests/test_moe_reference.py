"""MoE routing contract: ties to the smaller index, distinct ids, grouping, weights."""

import torch

from sgl_hybrid_kernel.moe import biased_grouped_topk, moe_experts


def test_ties_go_to_smaller_index_and_ids_are_distinct():
    logits = torch.zeros(2, 8)
    logits[1, :] = float("nan")
    w, ids = biased_grouped_topk(logits, torch.zeros(8), top_k=3)
    assert ids[0].tolist() == [0, 1, 2]
    assert len(set(ids[1].tolist())) == 3


def test_bias_changes_choice_not_weight():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, ids = biased_grouped_topk(logits, torch.tensor([0.0, 0.0, 0.0, 5.0]), top_k=2, renormalize=False)
    assert ids[0].tolist() == [3, 0]
    torch.testing.assert_close(w[0], torch.sigmoid(torch.tensor([-1.0, 2.0])))


def test_group_limited_selection_and_scaling():
    # Group 1 (experts 2,3) has the best pair; topk_group=1 keeps only it.
    logits = torch.tensor([[3.0, -9.0, 2.0, 2.0]])
    w, ids = biased_grouped_topk(logits, torch.zeros(4), top_k=2, num_expert_group=2, topk_group=1, routed_scaling_factor=2.5)
    assert sorted(ids[0].tolist()) == [2, 3]
    torch.testing.assert_close(w.sum(), torch.tensor(2.5))


def test_experts_weighted_sum_matches_dense_loop():
    torch.manual_seed(0)
    M, D, I, E = 5, 8, 6, 4
    x, w13, w2 = torch.randn(M, D), torch.randn(E, 2 * I, D), torch.randn(E, D, I)
    weights, ids = biased_grouped_topk(torch.randn(M, E), torch.zeros(E), top_k=2)
    out = moe_experts(x, w13, w2, weights, ids)
    ref = torch.zeros(M, D)
    for m in range(M):
        for j in range(2):
            e = int(ids[m, j])
            h = w13[e] @ x[m]
            ref[m] += weights[m, j] * (w2[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
