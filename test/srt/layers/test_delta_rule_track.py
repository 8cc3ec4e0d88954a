"""Prefix-cache tracking in our KDA / GDN extend (``layers/attention/delta_rule_common.py``).

``plan_track_snapshots`` turns upstream's ``track_chunk_idx`` into our chunk kernel's checkpoints and fills the
rows that ask for the starting state on the device; the chunk indices are read on the host once per forward
pass, not once per linear-attention layer (each read waits for the GPU).
"""

import unittest

import torch

from sglang_hybrid.layers.attention import delta_rule_common as drc


class TestTrackSnapshots(unittest.TestCase):
    def test_rows_checkpoints_and_untouched_rows(self):
        torch.manual_seed(0)
        ssm = torch.randn(6, 2, 4, 3)  # [slots, HV, V, K]
        slots = torch.tensor([4, 1, 3, 5], dtype=torch.int32)
        has_init = torch.tensor([1, 0, 1, 1], dtype=torch.int32)
        track = torch.full((4, 2, 4, 3), 7.0)
        chunks = torch.tensor([0, 0, 2, -1], dtype=torch.int32)
        ckpts = drc.plan_track_snapshots(track, chunks, ssm, slots, has_init)
        self.assertEqual(ckpts, [(2, 2 * drc.MAMBA_CHUNK, 2)])
        self.assertTrue(torch.equal(track[0], ssm[4]))  # c == 0 with a prefix: the slot's state
        self.assertTrue(torch.equal(track[1], torch.zeros(2, 4, 3)))  # c == 0 from scratch: zeros
        self.assertTrue(torch.equal(track[2], torch.full((2, 4, 3), 7.0)))  # written by the kernel later
        self.assertTrue(torch.equal(track[3], torch.full((2, 4, 3), 7.0)))  # not tracked
        self.assertEqual(drc.plan_track_snapshots(None, chunks, ssm, slots, has_init), [])

    def test_a_garbage_slot_does_not_leak_into_a_fresh_row(self):
        ssm = torch.full((2, 1, 2, 2), float("nan"))
        track = torch.ones(1, 1, 2, 2)
        drc.plan_track_snapshots(track, torch.tensor([0]), ssm, torch.tensor([1]), torch.tensor([0]))
        self.assertTrue(torch.equal(track, torch.zeros(1, 1, 2, 2)))

    def test_chunk_indices_read_once_per_forward(self):
        chunks = torch.tensor([0, 3, -1], dtype=torch.int32)
        reads = []
        real = torch.Tensor.tolist

        def counting(t):
            if t is chunks:
                reads.append(1)
            return real(t)

        torch.Tensor.tolist = counting
        try:
            for _layer in range(4):  # one forward: every layer gets the same metadata tensor
                self.assertEqual(drc.track_chunks_on_host(chunks), [0, 3, -1])
            nxt = torch.tensor([1], dtype=torch.int32)  # the next forward's metadata
            self.assertEqual(drc.track_chunks_on_host(nxt), [1])
        finally:
            torch.Tensor.tolist = real
        self.assertEqual(len(reads), 1)


if __name__ == "__main__":
    unittest.main()
