"""The CPU ``sgl_kernel`` shim's distributed ops, with 2 gloo processes (issue 8).

``torch.ops.sgl_kernel.shm_allreduce`` / ``shm_allgather`` are what upstream's
``GroupCoordinator.all_reduce`` / ``all_gather`` call on a CPU host where
``is_shm_available`` holds (AMX with the real kernels, arm64). Checked twice:
the ops called directly (sum / rank-ordered concatenation of known per-rank
tensors, non-contiguous input, a wrong reduce op rejected), and through
upstream's own ``GroupCoordinator`` with ``is_shm_available`` forced true, so
the call sites and schemas upstream uses are the ones exercised.
"""

from __future__ import annotations

import os
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_hybrid.bench.server import free_port


def _rank_tensor(rank: int) -> torch.Tensor:
    # distinct, exactly representable values per rank
    return torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1) + 100 * rank


def _worker(rank, port, out_dir):
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    import sgl_kernel  # noqa: F401  (registers the ops)

    ops = torch.ops.sgl_kernel
    res = {}
    ops.initialize(2, rank)
    x = _rank_tensor(rank)
    ops.shm_allreduce(x, int(dist.ReduceOp.SUM))
    res["allreduce"] = x
    y = _rank_tensor(rank).t()  # non-contiguous, reduced in place
    ops.shm_allreduce(y, int(dist.ReduceOp.SUM))
    res["allreduce_t"] = y
    res["allgather0"] = ops.shm_allgather(_rank_tensor(rank), 0)
    res["allgather1"] = ops.shm_allgather(_rank_tensor(rank), 1)
    try:
        ops.shm_allreduce(torch.ones(2), int(dist.ReduceOp.MAX))
        res["bad_op"] = "accepted"
    except (ValueError, RuntimeError) as exc:
        res["bad_op"] = str(exc)

    # Upstream's GroupCoordinator on a gloo group, shared-memory path forced on.
    from sglang.srt.distributed import parallel_state as ps

    calls = []
    real = ps.is_shm_available
    ps.is_shm_available = lambda *a: calls.append(a) or True
    try:
        group = ps.GroupCoordinator(
            group_ranks=[[0, 1]], local_rank=rank, torch_distributed_backend="gloo", use_pynccl=False,
            use_mscclpp=False, use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False,
            use_hpu_communicator=False, use_xpu_communicator=False, use_message_queue_broadcaster=False,
            group_name="shim_test",
        )
        res["coord_allreduce"] = group.all_reduce(_rank_tensor(rank))
        res["coord_allgather"] = group.all_gather(_rank_tensor(rank), dim=-1)
    finally:
        ps.is_shm_available = real
    res["shm_checks"] = len(calls)
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


class TestCpuShimCollectives(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(free_port(), tmp), nprocs=2, join=True)
            cls.r = [torch.load(os.path.join(tmp, f"rank{i}.pt")) for i in range(2)]
        cls.a, cls.b = _rank_tensor(0), _rank_tensor(1)

    def test_allreduce_sums_in_place(self):
        for r in self.r:
            torch.testing.assert_close(r["allreduce"], self.a + self.b, rtol=0, atol=0)
            torch.testing.assert_close(r["allreduce_t"], (self.a + self.b).t(), rtol=0, atol=0)
            torch.testing.assert_close(r["coord_allreduce"], self.a + self.b, rtol=0, atol=0)

    def test_allgather_concatenates_in_rank_order(self):
        for r in self.r:
            torch.testing.assert_close(r["allgather0"], torch.cat([self.a, self.b], 0), rtol=0, atol=0)
            torch.testing.assert_close(r["allgather1"], torch.cat([self.a, self.b], 1), rtol=0, atol=0)
            torch.testing.assert_close(r["coord_allgather"], torch.cat([self.a, self.b], 1), rtol=0, atol=0)

    def test_upstream_took_the_shm_path(self):
        for r in self.r:
            self.assertEqual(r["shm_checks"], 2)  # one check per collective, both answered "shm"

    def test_reduce_op_other_than_sum_is_rejected(self):
        for r in self.r:
            self.assertIn("reduce_op must be ReduceOp.SUM", r["bad_op"])


if __name__ == "__main__":
    unittest.main()
