"""The CPU ``sgl_kernel`` stand-in: implemented ops are correct, the rest fail loudly."""

from __future__ import annotations

import unittest

import torch

import sgl_kernel
from sgl_hybrid_kernel.conv.reference import causal_conv1d
from sgl_kernel.mamba import causal_conv1d_fn_cpu, causal_conv1d_update_cpu


class TestCpuShim(unittest.TestCase):
    def test_assign_req_to_token_pool(self):
        table = torch.full((4, 10), -1, dtype=torch.int32)
        locs = torch.arange(100, 107)
        sgl_kernel.assign_req_to_token_pool_cpu(
            torch.tensor([2, 0]), table, torch.tensor([3, 0]), torch.tensor([6, 4]), locs, 10
        )
        self.assertEqual(table[2].tolist(), [-1, -1, -1, 100, 101, 102, -1, -1, -1, -1])
        self.assertEqual(table[0].tolist()[:5], [103, 104, 105, 106, -1])
        self.assertTrue((table[1] == -1).all() and (table[3] == -1).all())

    def test_copy_all_layer_kv_cache(self):
        bufs = [torch.arange(40, dtype=torch.float32).view(10, 4), torch.arange(30, dtype=torch.int16).view(10, 3)]
        before = [b.clone() for b in bufs]
        ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
        strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
        sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([7, 8]), torch.tensor([1, 2]))
        for b, old in zip(bufs, before):
            self.assertTrue(torch.equal(b[7], old[1]) and torch.equal(b[8], old[2]))
            self.assertTrue(torch.equal(b[:7], old[:7]) and torch.equal(b[9], old[9]))

    def test_conv_update_on_the_pool_layout_upstream_passes(self):
        D, K = 6, 4
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(D, K, generator=gen), torch.randn(9, D, generator=gen)
        pool = torch.zeros(3, K - 1, D)  # KDA pool layout; upstream hands the transposed view
        for t in range(9):
            y = causal_conv1d_update_cpu(x[t : t + 1], pool.transpose(-1, -2), w, None, "silu", torch.tensor([1]))
        ref, ref_state = causal_conv1d(x, w)
        torch.testing.assert_close(y, ref[-1:], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pool[1], ref_state)

    def test_unprovided_ops_raise_with_their_name(self):
        with self.assertRaisesRegex(NotImplementedError, "fused_gdn_gating_cpu"):
            torch.ops.sgl_kernel.fused_gdn_gating_cpu([torch.zeros(1)])
        with self.assertRaisesRegex(NotImplementedError, "causal_conv1d_fn_cpu"):
            causal_conv1d_fn_cpu(torch.zeros(1))
        with self.assertRaisesRegex(NotImplementedError, "rotate_input_ids_cpu"):
            sgl_kernel.rotate_input_ids_cpu()  # multi-layer EAGLE; the speculative ops are in test_cpu_shim_speculative.py

    def test_amx_probes_stay_false(self):
        # Upstream switches to Intel-AMX kernels when these exist; the shim must not provide them.
        for name in ("convert_weight_packed", "fused_qk_norm_cpu", "fused_qk_norm_rope_cpu"):
            self.assertFalse(hasattr(torch.ops.sgl_kernel, name), name)


if __name__ == "__main__":
    unittest.main()


class TestFlashMlaStandin(unittest.TestCase):
    """On CUDA without the sgl-flash-mla wheel, upstream's MTP start-up imports ``flashmla_backend``
    (issue 40): the stand-in lets that import succeed and every FlashMLA op fail when called."""

    def test_upstream_flashmla_backend_imports_and_ops_raise(self):
        import subprocess
        import sys

        code = (
            "import importlib.util, sys\n"
            "from sgl_kernel import flash_mla_standin\n"
            "assert importlib.util.find_spec('flash_mla') is None\n"
            "assert flash_mla_standin.install() is True\n"
            "assert flash_mla_standin.install() is False\n"  # once only
            "from sglang.kernels.ops.attention import flash_mla_interface as fi\n"
            "import flash_mla\n"
            "try:\n"
            "    flash_mla.get_mla_metadata(None)\n"
            "except NotImplementedError as e:\n"
            "    print('raised:', e)\n"
            "try:\n"
            "    fi.FlashMLASchedMeta()\n"
            "except NotImplementedError as e:\n"
            "    print('raised:', e)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        lines = [line for line in out.stdout.splitlines() if line.startswith("raised:")]
        self.assertEqual(len(lines), 2, out.stdout)
        self.assertIn("flash_mla.get_mla_metadata", lines[0])
        self.assertIn("sgl-flash-mla wheel is not installed", lines[1])
