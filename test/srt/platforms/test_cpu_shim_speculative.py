"""The speculative-decoding ops of the CPU ``sgl_kernel`` shim (issue 6).

Oracles: hand-built draft trees whose answers follow from the EAGLE tree
definition (node 0 = last verified token, a node sees the root, its ancestors
and itself, positions = ``seq_len`` + depth), and a plain longest-matching-prefix
rule for greedy acceptance on a chain.
"""

from __future__ import annotations

import random
import unittest

import torch

from sgl_kernel import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

QLEN_ONLY, FULL_MASK = 1, 0


def build_tree(parent_list, selected, seq_lens, topk, depth, D, mode):
    B = len(seq_lens)
    if mode == QLEN_ONLY:
        mask = torch.full((B * D * D,), True)
    else:
        mask = torch.full((sum(seq_lens) * D + B * D * D,), True)
    positions = torch.zeros(B * D, dtype=torch.long)
    ri = torch.zeros(B, D, dtype=torch.long)
    nt = torch.full((B, D), -1, dtype=torch.long)
    ns = torch.full((B, D), -1, dtype=torch.long)
    build_tree_kernel_efficient_cpu(torch.tensor(parent_list), torch.tensor(selected), torch.tensor(seq_lens), mask,
                                    positions, ri, nt, ns, topk, depth, D, mode)
    return mask, positions, ri, nt, ns


# root -> n1 -> n3, root -> n2  (topk 2: step-0 ids 0, 1 are root's children; id 2 is a child of id 0)
BRANCH = dict(parent_list=[[-1, 0, 1]], selected=[[0, 1, 2]], topk=2, depth=3, D=4)
BRANCH_VISIBLE = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


class TestBuildTree(unittest.TestCase):
    def test_chain_topk1(self):
        D = 4
        mask, pos, ri, nt, ns = build_tree([[-1, 0, 1]], [[0, 1, 2]], [7], 1, 3, D, QLEN_ONLY)
        self.assertEqual(pos.tolist(), [7, 8, 9, 10])
        self.assertEqual(ri.tolist(), [[0, 1, 2, 3]])
        self.assertEqual(nt.tolist(), [[1, 2, 3, -1]])
        self.assertEqual(ns.tolist(), [[-1, -1, -1, -1]])
        self.assertTrue(torch.equal(mask.view(D, D), torch.tril(torch.ones(D, D, dtype=torch.bool))))

    def test_branching_tree_links_positions_and_mask(self):
        t = BRANCH
        mask, pos, ri, nt, ns = build_tree(t["parent_list"] * 2, t["selected"] * 2, [5, 9], t["topk"], t["depth"],
                                           t["D"], QLEN_ONLY)
        self.assertEqual(pos.tolist(), [5, 6, 6, 7, 9, 10, 10, 11])
        self.assertEqual(ri.tolist(), [[0, 1, 2, 3], [4, 5, 6, 7]])
        self.assertEqual(nt.tolist(), [[1, 3, -1, -1]] * 2)  # root's first child n1, n1's child n3
        self.assertEqual(ns.tolist(), [[-1, 2, -1, -1]] * 2)  # n1's sibling n2
        want = torch.tensor(BRANCH_VISIBLE, dtype=torch.bool)
        self.assertTrue(torch.equal(mask.view(2, 4, 4), torch.stack([want, want])))

    def test_full_mask_rows_carry_the_prefix(self):
        t, seq_lens, D = BRANCH, [3, 2], 4
        mask, *_ = build_tree(t["parent_list"] * 2, t["selected"] * 2, seq_lens, t["topk"], t["depth"], D, FULL_MASK)
        want = [torch.cat([torch.ones(D, L, dtype=torch.bool), torch.tensor(BRANCH_VISIBLE, dtype=torch.bool)], 1)
                for L in seq_lens]
        self.assertTrue(torch.equal(mask, torch.cat([w.reshape(-1) for w in want])))

    def test_rejects_bitpacked_mask(self):
        with self.assertRaisesRegex(ValueError, "tree_mask_mode"):
            build_tree([[-1, 0, 1]], [[0, 1, 2]], [3], 1, 3, 4, 2)


def verify(candidates, target, ri, nt, ns, S):
    B, D = candidates.shape
    predicts = torch.full((B * D,), -7, dtype=torch.long)
    accept_index = torch.full((B, S), -1, dtype=torch.long)
    accept_num = torch.zeros(B, dtype=torch.long)
    verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                           candidates=candidates, retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
                           target_predict=target)
    return predicts, accept_index, accept_num


class TestVerifyTreeGreedy(unittest.TestCase):
    def test_chain_accepts_longest_matching_prefix(self):
        rng = random.Random(0)
        B, D = 64, 4
        _, _, ri1, nt1, ns1 = build_tree([[-1, 0, 1]], [[0, 1, 2]], [0], 1, 3, D, QLEN_ONLY)
        ri = ri1 + torch.arange(B).unsqueeze(1) * D
        nt, ns = nt1.repeat(B, 1), ns1.repeat(B, 1)
        cand = torch.tensor([[rng.randrange(3) for _ in range(D)] for _ in range(B)])
        target = torch.tensor([[rng.randrange(3) for _ in range(D)] for _ in range(B)])
        predicts, accept_index, accept_num = verify(cand, target, ri, nt, ns, D)
        for b in range(B):
            n = 0
            while n < D - 1 and int(cand[b, n + 1]) == int(target[b, n]):
                n += 1
            self.assertEqual(int(accept_num[b]), n)
            self.assertEqual(accept_index[b].tolist(), [b * D + i for i in range(n + 1)] + [-1] * (D - 1 - n))
            # committed tokens: the target's argmax at every accepted node (the last one is the bonus token)
            self.assertEqual(predicts[b * D : b * D + n + 1].tolist(), target[b, : n + 1].tolist())
            self.assertTrue(bool((predicts[b * D + n + 1 : (b + 1) * D] == -7).all()))

    def test_branch_walks_siblings(self):
        _, _, ri, nt, ns = build_tree(BRANCH["parent_list"], BRANCH["selected"], [0], 2, 3, 4, QLEN_ONLY)
        cand = torch.tensor([[100, 11, 12, 13]])
        # Target after root says 12 (n2, the second sibling): accepted; n2 has no child, so stop there.
        p, ai, an = verify(cand, torch.tensor([[12, 50, 51, 52]]), ri, nt, ns, 4)
        self.assertEqual((int(an[0]), ai[0].tolist(), p[[0, 2]].tolist()), (1, [0, 2, -1, -1], [12, 51]))
        # Target says 11 (n1) then 13 (n3): both accepted, bonus from n3.
        p, ai, an = verify(cand, torch.tensor([[11, 13, 60, 61]]), ri, nt, ns, 4)
        self.assertEqual((int(an[0]), ai[0].tolist(), p[[0, 1, 3]].tolist()), (2, [0, 1, 3, -1], [11, 13, 61]))
        # No child matches: nothing accepted, the bonus is the target's token at the root.
        p, ai, an = verify(cand, torch.tensor([[99, 0, 0, 0]]), ri, nt, ns, 4)
        self.assertEqual((int(an[0]), ai[0].tolist(), int(p[0])), (0, [0, -1, -1, -1], 99))


class TestCacheLocOps(unittest.TestCase):
    def setUp(self):
        self.req_to_token = torch.arange(4 * 32, dtype=torch.int32).view(4, 32)

    def test_assign_draft_cache_locs_contiguous(self):
        out = torch.zeros(2 * 2 * 3, dtype=torch.int64)
        assign_draft_cache_locs_contiguous_cpu(torch.tensor([3, 1]), self.req_to_token, torch.tensor([5, 0]), out, 32, 2, 3)
        self.assertEqual(out.tolist(), list(range(96 + 5, 96 + 11)) + list(range(32, 38)))

    def test_assign_extend_cache_locs_packs_ranges(self):
        out = torch.full((6,), -1, dtype=torch.int64)
        assign_extend_cache_locs_cpu(torch.tensor([2, 0, 1]), self.req_to_token, torch.tensor([4, 1, 7]),
                                     torch.tensor([6, 1, 11]), out, 32)
        self.assertEqual(out.tolist(), [68, 69, 39, 40, 41, 42])

    def test_fill_accept_out_cache_loc_skips_rejected(self):
        out = torch.full((7,), -1, dtype=torch.int64)
        fill_accept_out_cache_loc_cpu(torch.tensor([[0, 1, -1, -1], [4, -1, -1, -1], [8, 9, 10, -1]]),
                                      torch.arange(100, 112), out)
        self.assertEqual(out.tolist(), [100, 101, 104, 108, 109, 110, -1])

    def test_fill_bonus_tokens_takes_last_accepted(self):
        bonus = torch.zeros(3, dtype=torch.int64)
        fill_bonus_tokens_cpu(torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]), torch.tensor([2, 1, 4]),
                              bonus, 4)
        self.assertEqual(bonus.tolist(), [6, 9, 16])


if __name__ == "__main__":
    unittest.main()
