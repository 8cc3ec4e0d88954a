"""DCP merge hook of ``--attention-backend sgl_hybrid_mla``: one all-to-all + our merge for upstream's all-reduce merge.

Two gloo processes form upstream's ``GroupCoordinator`` (the DCP group type
``TritonAttnBackend`` passes), the hook is installed through upstream's
``HookRegistry`` and ``triton_backend.cp_lse_ag_out_rs_mha`` (the patched
name) is called next to upstream's own ``sglang.srt.layers.dcp.comm``
function on the same per-rank inputs, with NaN in an empty shard's output
(``lse = -inf``) and a row empty on both ranks. Oracles: upstream's merge
and an FP64 LSE merge of all ranks' inputs (each rank's inputs are
regenerated from its seed). Checked: equal outputs / LSEs (FP32, 1e-6;
the BF16-output two-exchange path at BF16 tolerance), no NaN, our path taken
(counter + ``record_choice``), our Triton merge kernel (interpreter) on the
exchanged layout, and the fallbacks to upstream (not under our backend,
``H`` not divisible by ``c``, a group of one rank).
"""

from __future__ import annotations

import os
import tempfile
import unittest
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_hybrid.bench.server import free_port

C, R, H, D = 2, 5, 4, 8
EMPTY_ON_RANK1, EMPTY_ON_ALL = 1, 3  # rows


def _inputs(rank: int, heads: int = H, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1000 + rank)
    o = torch.randn(R, heads, D, generator=gen)
    lse = torch.randn(R, heads, generator=gen) * 3
    if rank == 1:
        lse[EMPTY_ON_RANK1] = float("-inf")
        o[EMPTY_ON_RANK1] = float("nan")  # garbage behind an empty shard must not leak
    lse[EMPTY_ON_ALL] = float("-inf")
    o[EMPTY_ON_ALL] = 0.0
    return o.to(dtype), lse


def _oracle(rank: int):
    """FP64 merge of both ranks' inputs, this rank's head slice."""
    parts = [_inputs(r) for r in range(C)]
    o = torch.stack([p[0] for p in parts]).double()
    lse = torch.stack([p[1] for p in parts]).double()
    g = torch.logsumexp(lse, 0)
    w = torch.where(torch.isneginf(lse), 0.0, torch.exp(lse - torch.where(torch.isneginf(g), 0.0, g)))
    out = (torch.where(w[..., None] > 0, o, 0.0) * w[..., None]).sum(0)
    h = H // C
    return out[:, rank * h:(rank + 1) * h], g[:, rank * h:(rank + 1) * h]


def _worker(rank, port, out_dir):
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=C)
    from sglang.srt.distributed import parallel_state as ps

    ps.is_shm_available = lambda *a: False  # plain gloo collectives (the AMX shm path is tested elsewhere)
    kw = dict(local_rank=rank, torch_distributed_backend="gloo", use_pynccl=False, use_mscclpp=False,
              use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False, use_hpu_communicator=False,
              use_xpu_communicator=False, use_message_queue_broadcaster=False)
    group = ps.GroupCoordinator(group_ranks=[[0, 1]], group_name="dcp_merge_test", **kw)
    solo = ps.GroupCoordinator(group_ranks=[[0], [1]], group_name="dcp_merge_solo", **kw)

    from sgl_hybrid_kernel.dcp import dispatch as merge_dispatch
    from sgl_hybrid_kernel.dispatch import chosen_paths
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.layers.dcp import comm
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_hybrid.layers.attention import dcp_merge_hook as hook

    upstream = comm.cp_lse_ag_out_rs_mha
    hook.install()
    HookRegistry.apply_hooks()
    hooked = triton_backend.cp_lse_ag_out_rs_mha
    res = {"patched": hooked is not upstream}

    def both(o, lse, grp=group, **k):
        with hook.serving():
            ours = hooked(o.clone(), lse.clone(), grp, **k)
        return ours, upstream(o.clone(), lse.clone(), grp, **k)

    o, lse = _inputs(rank)
    src = o.clone()
    with hook.serving():
        res["ours_lse"] = hooked(o, lse, group, return_lse=True)
    res["input_untouched"] = torch.equal(o.nan_to_num(7.0), src.nan_to_num(7.0))
    res["up_lse"] = upstream(o.clone(), lse.clone(), group, return_lse=True)
    res["ours"], res["up"] = both(o, lse)
    res["calls_ours"] = hook.CALLS["sgl_hybrid"]
    res["choice"] = {c.op: c.impl for c in chosen_paths()}

    # BF16 output: two exchanges (output in BF16, LSE in FP32)
    ob, lb = _inputs(rank, dtype=torch.bfloat16)
    res["bf16"] = both(ob, lb, return_lse=True)

    # our Triton merge kernel (interpreter) on the exchanged layout: pretend the tensors are on a GPU
    real_kind = merge_dispatch.device_kind
    merge_dispatch.device_kind = lambda t: "cuda"
    try:
        with hook.serving():
            res["triton"] = hooked(o.clone(), lse.clone(), group, return_lse=True)
        res["triton_choice"] = {c.op: c.impl for c in chosen_paths()}["dcp_merge"]
    finally:
        merge_dispatch.device_kind = real_kind

    # fallbacks to upstream's function
    before = hook.CALLS["upstream"]
    res["not_ours"] = hooked(o.clone(), lse.clone(), group, return_lse=True)  # not under serving()
    o3, l3 = _inputs(rank, heads=3)
    res["h3"] = both(o3, l3, return_lse=True)  # 3 heads over 2 ranks
    with hook.serving():
        res["solo_same_object"] = hooked(o, lse, solo) is o
    res["fallbacks"] = hook.CALLS["upstream"] - before
    res["calls_ours_end"] = hook.CALLS["sgl_hybrid"]
    try:
        hook.a2a_merge(o3, l3, group)
        res["bad_h"] = "accepted"
    except ValueError as exc:
        res["bad_h"] = str(exc)
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


class TestMlaDcpMergeHook(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(free_port(), tmp), nprocs=C, join=True)
            cls.r = [torch.load(os.path.join(tmp, f"rank{i}.pt"), weights_only=False) for i in range(C)]

    def test_hook_replaced_the_name_triton_backend_calls(self):
        for r in self.r:
            self.assertTrue(r["patched"])
            self.assertEqual(r["choice"]["dcp_merge_hook"], "sgl_hybrid")
            self.assertEqual(r["calls_ours"], 2)

    def test_equals_upstream_merge_and_fp64_oracle(self):
        for rank, r in enumerate(self.r):
            (o, lse), (uo, ulse) = r["ours_lse"], r["up_lse"]
            ref_o, ref_lse = _oracle(rank)
            self.assertEqual(tuple(o.shape), (R, H // C, D))
            self.assertEqual((o.dtype, lse.dtype), (torch.float32, torch.float32))
            self.assertFalse(torch.isnan(o).any() or torch.isnan(lse).any())
            torch.testing.assert_close(o, uo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(lse, ulse, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(o, ref_o.float(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(lse, ref_lse.float(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(r["ours"], r["up"], rtol=1e-6, atol=1e-6)
            self.assertTrue(r["input_untouched"])

    def test_empty_shard_rows(self):
        for rank, r in enumerate(self.r):
            o, lse = r["ours_lse"]
            _, inputs_lse = _inputs(0)
            # row empty on rank 1 only: rank 0's partial alone (weight 1)
            h = H // C
            torch.testing.assert_close(lse[EMPTY_ON_RANK1], inputs_lse[EMPTY_ON_RANK1, rank * h:(rank + 1) * h])
            torch.testing.assert_close(o[EMPTY_ON_RANK1], _inputs(0)[0][EMPTY_ON_RANK1, rank * h:(rank + 1) * h])
            # row empty everywhere: (0, -inf)
            self.assertTrue(torch.isneginf(lse[EMPTY_ON_ALL]).all())
            self.assertTrue(torch.equal(o[EMPTY_ON_ALL], torch.zeros_like(o[EMPTY_ON_ALL])))

    def test_bf16_output_two_exchanges(self):
        for r in self.r:
            (o, lse), (uo, ulse) = r["bf16"]
            self.assertEqual((o.dtype, o.shape), (uo.dtype, uo.shape))
            self.assertEqual(lse.dtype, torch.float32)
            torch.testing.assert_close(o.float(), uo.float(), rtol=1.6e-2, atol=1e-2)
            torch.testing.assert_close(lse, ulse, rtol=1e-6, atol=1e-6)

    def test_triton_merge_kernel_on_exchanged_layout(self):
        for r in self.r:
            self.assertEqual(r["triton_choice"], "triton")
            (o, lse), (uo, ulse) = r["triton"], r["up_lse"]
            self.assertFalse(torch.isnan(o).any())
            torch.testing.assert_close(o, uo, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(lse, ulse, rtol=1e-6, atol=1e-6)

    def test_fallbacks_to_upstream(self):
        for r in self.r:
            self.assertEqual(r["fallbacks"], 3)
            self.assertEqual(r["calls_ours_end"], 4)  # + the BF16 and Triton-path calls, no fallback counted as ours
            (o, lse) = r["not_ours"]
            torch.testing.assert_close(o, r["up_lse"][0], rtol=0, atol=0)
            (o3, l3), (u3, ul3) = r["h3"]
            self.assertEqual(tuple(o3.shape), (R, 1, D))  # upstream's own slicing (H // c heads)
            torch.testing.assert_close(o3, u3, rtol=0, atol=0, equal_nan=True)
            torch.testing.assert_close(l3, ul3, rtol=0, atol=0, equal_nan=True)
            self.assertTrue(r["solo_same_object"])
            self.assertIn("not divisible", r["bad_h"])


def test_mla_backend_forwards_run_under_serving():
    from sglang_hybrid.layers.attention import dcp_merge_hook, mla_backend

    seen = []
    backend = SimpleNamespace(forward_decode=lambda *a, **k: seen.append(dcp_merge_hook.active()) or "o")
    assert mla_backend._wrap_forward_decode(backend)(1, x=2) == "o"
    ext = SimpleNamespace(batch=None)
    backend.forward_extend = lambda *a, **k: seen.append(dcp_merge_hook.active())
    mla_backend._wrap_forward_extend(backend, ext)(None, None, None, None, "fb")
    assert seen == [True, True] and not dcp_merge_hook.active()


if __name__ == "__main__":
    unittest.main()
