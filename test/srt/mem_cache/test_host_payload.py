"""The host tier's payload copies (``HostPayloadStore``): which KV pools are copied row by row, and
that a page's rows, including Qwen3.8's compressed QSA indexer keys (one row per ``ratio`` token
slots), come back at new slots intact (issue 45: the tiers were off for Qwen3.8)."""

from __future__ import annotations

import types
import unittest

import torch

from sglang_hybrid.mem_cache.host_tier import HostPayloadStore

PAGE, RATIO, LAYERS, SLOTS = 8, 4, 2, 64


def _pool_class(name):
    return type(name, (), {})


def _qsa_cache(full_name="MHATokenToKVPool", outer_name="QSATokenToKVPool"):
    g = torch.Generator().manual_seed(0)
    full = _pool_class(full_name)()
    full.k_buffer = [torch.randn(SLOTS, 2, 3, generator=g) for _ in range(LAYERS)]
    full.v_buffer = [torch.randn(SLOTS, 2, 5, generator=g) for _ in range(LAYERS)]
    outer = _pool_class(outer_name)()
    outer.full_kv_pool = full
    outer.qsa_compress_ratio = RATIO
    outer.qsa_compressed_k_buffer_pool = [torch.randn(SLOTS // RATIO, 1, 4, generator=g) for _ in range(LAYERS)]
    mamba = types.SimpleNamespace(mamba_cache=types.SimpleNamespace(
        conv=[torch.randn(LAYERS, 6, 3, 2, generator=g)], temporal=torch.randn(LAYERS, 6, 2, 2, generator=g)))
    cache = types.SimpleNamespace(
        page_size=PAGE,
        token_to_kv_pool_allocator=types.SimpleNamespace(get_kvcache=lambda: outer),
        req_to_token_pool=types.SimpleNamespace(mamba_pool=mamba, translate_mamba_indices=lambda i: i),
    )
    return cache, full, outer, mamba


class TestHostPayloadStore(unittest.TestCase):
    def test_qsa_pages_restore_token_and_compressed_rows(self):
        cache, full, outer, mamba = _qsa_cache()
        store = HostPayloadStore(cache)
        self.assertTrue(store._kv_direct)
        src = torch.arange(16, 32)  # two pages
        want_k = [b[16:32].clone() for b in full.k_buffer]
        want_v = [b[16:32].clone() for b in full.v_buffer]
        want_c = [b[4:8].clone() for b in outer.qsa_compressed_k_buffer_pool]
        want_state = mamba.mamba_cache.temporal[:, 1].clone()
        store.save_kv([b"p0", b"p1"], src)
        store.save_state(b"s", torch.tensor([1]))
        # the device rows are overwritten (evicted and reused) before the restore
        for b in full.k_buffer + full.v_buffer + outer.qsa_compressed_k_buffer_pool:
            b.zero_()
        mamba.mamba_cache.temporal.zero_()
        dst = torch.arange(40, 56)
        store.load([b"p0", b"p1"], dst, b"s", torch.tensor([4]))
        for layer in range(LAYERS):
            torch.testing.assert_close(full.k_buffer[layer][40:56], want_k[layer], rtol=0, atol=0)
            torch.testing.assert_close(full.v_buffer[layer][40:56], want_v[layer], rtol=0, atol=0)
            torch.testing.assert_close(outer.qsa_compressed_k_buffer_pool[layer][10:14], want_c[layer], rtol=0, atol=0)
            self.assertEqual(float(outer.qsa_compressed_k_buffer_pool[layer][:10].abs().sum()), 0.0)
        torch.testing.assert_close(mamba.mamba_cache.temporal[:, 4], want_state, rtol=0, atol=0)

    def test_page_rows_layout_and_store_round_trip(self):
        cache, full, outer, _ = _qsa_cache()
        store = HostPayloadStore(cache)
        src = torch.arange(16, 32)
        store.save_kv([b"p0", b"p1"], src)
        rows = store.page_rows(b"p1")
        # flat: K of every layer, V of every layer, then the compressed keys (PAGE / RATIO rows each)
        self.assertEqual([t.shape[0] for t in rows], [PAGE] * (2 * LAYERS) + [PAGE // RATIO] * LAYERS)
        torch.testing.assert_close(rows[-1], outer.qsa_compressed_k_buffer_pool[-1][6:8], rtol=0, atol=0)
        self.assertEqual([t.tolist() for t in store.slice_page(store.device_rows(src), 1)], [t.tolist() for t in rows])
        # a page read back from the store, then restored at new slots
        other = HostPayloadStore(cache)
        other.add_page(b"p1", rows)
        other.save_state(b"s", torch.tensor([0]))
        other.load([b"p1"], torch.arange(48, 56), b"s", torch.tensor([2]))
        torch.testing.assert_close(outer.qsa_compressed_k_buffer_pool[0][12:14], rows[2 * LAYERS], rtol=0, atol=0)
        torch.testing.assert_close(full.v_buffer[1][48:56], rows[LAYERS + 1], rtol=0, atol=0)
        with self.assertRaisesRegex(ValueError, "tensors for a pool of"):
            other.add_page(b"p2", rows[:-1])

    def test_unknown_pool_types_are_not_copied_row_by_row(self):
        for full_name, outer_name in (("MHATokenToKVPoolFP4", "QSATokenToKVPool"),
                                      ("MHATokenToKVPool", "SomeNewQSAPool")):
            cache, *_ = _qsa_cache(full_name, outer_name)
            self.assertFalse(HostPayloadStore(cache)._kv_direct, (full_name, outer_name))


if __name__ == "__main__":
    unittest.main()
