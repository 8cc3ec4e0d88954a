"""The store tier's rules without a server (python/sglang_hybrid/mem_cache/store.py, issue 45): atomic
file objects, publication only when every part is stored, readers that take all parts or none, and
failures counted as misses."""

import os
import tempfile
import unittest

import torch

from sglang_hybrid.mem_cache.store import LocalFileStore, StoreError, StoreTier, open_store

H = [bytes([i]) * 16 for i in range(4)]  # page hashes; H[3] ends the resume point


def _tier(d):
    return StoreTier(LocalFileStore(os.path.join(d, "store")), "ns/test")


class TestStoreTier(unittest.TestCase):
    def test_publish_needs_the_state_and_every_page(self):
        with tempfile.TemporaryDirectory() as d:
            t = _tier(d)
            rows = [torch.arange(8.0).reshape(2, 4), None]
            for h in H[:3]:
                self.assertTrue(t.put_page(h, rows))
            self.assertFalse(t.publish(H[3], H))  # page H[3] and the state are missing
            self.assertTrue(t.put_page(H[3], rows))
            self.assertFalse(t.publish(H[3], H))  # the state is missing
            self.assertIsNone(t.read(H, H[3]))  # unpublished: never read
            self.assertTrue(t.put_state(H[3], [torch.ones(3)], 1))
            self.assertTrue(t.publish(H[3], H))
            pages, state = t.read(H, H[3])
            self.assertEqual(len(pages), 4)
            torch.testing.assert_close(pages[0][0], rows[0])
            self.assertIsNone(pages[0][1])
            self.assertEqual(state["dim"], 1)
            torch.testing.assert_close(state["tensors"][0], torch.ones(3))
            self.assertEqual((t.published, t.reads, t.failures), (1, 1, 0))

    def test_a_missing_or_corrupt_part_gives_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            t = _tier(d)
            for h in H:
                t.put_page(h, [torch.zeros(2)])
            t.put_state(H[3], [torch.zeros(1)], 1)
            self.assertTrue(t.publish(H[3], H))
            os.remove(t.store._file(t.key("kv", H[1])))  # the store evicted one page
            self.assertIsNone(t.read(H, H[3]))
            t.put_page(H[1], [torch.zeros(2)])
            t.store.put(t.key("st", H[3]), b"not a tensor file")  # a foreign or torn object
            self.assertIsNone(t.read(H, H[3]))
            self.assertEqual(t.failures, 1)  # the corrupt read is counted, the eviction is a plain miss

    def test_file_objects_are_replaced_atomically_and_tmp_files_ignored(self):
        with tempfile.TemporaryDirectory() as d:
            s = LocalFileStore(d)
            s.put("a/b", b"1")
            s.put("a/b", b"22")
            with open(os.path.join(d, "a", "partial.tmp"), "wb") as f:
                f.write(b"x")  # what a writer killed mid-write leaves
            self.assertEqual(s.get("a/b"), b"22")
            self.assertEqual(s.exists(["a/b", "a/partial", "a/c"]), [True, False, False])
            self.assertEqual(sorted(os.listdir(os.path.join(d, "a"))), ["b", "partial.tmp"])

    def test_a_store_gone_mid_run_is_a_counted_miss(self):
        with tempfile.TemporaryDirectory() as d:
            t = _tier(d)
            os.rmdir(t.store.path)
            open(t.store.path, "w").close()
            self.assertEqual(t.exists("kv", H[:2]), [False, False])
            self.assertFalse(t.put_page(H[0], [torch.zeros(1)]))
            self.assertEqual(t.failures, 2)

    def test_open_store_errors_name_the_argument(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "--hybrid-store must be one of"):
                open_store("redis", None)
            with self.assertRaisesRegex(ValueError, "--hybrid-store-config"):
                open_store("file", None)
            cfg = os.path.join(d, "c.json")
            with open(cfg, "w") as f:
                f.write('{"path": "%s"}' % os.path.join(d, "s"))
            self.assertIsInstance(open_store("file", cfg), LocalFileStore)
            with open(cfg, "w") as f:
                f.write('{"path": "%s"}' % os.path.join(cfg, "under-a-file"))
            with self.assertRaises(StoreError):
                open_store("file", cfg)


if __name__ == "__main__":
    unittest.main()
