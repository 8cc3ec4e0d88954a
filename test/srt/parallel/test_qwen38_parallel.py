"""Qwen3.8 reference under TP = 2, with 2 gloo processes on CPU (issue 8).

One ``torch.multiprocessing.spawn`` of 2 processes (model level, no server;
``sglang_hybrid.parallel.qwen38_runner``): prefill of a 9-token prompt (with an
EOS inside, so the PLE n-gram reset is exercised), then 8 greedy decode steps.
The oracle is the single-process run of the same checkpoint, which itself
matches the FP64 architecture oracle (``test/srt/models/qwen38_oracle.py``) to
~1e-6. TP cuts GDN heads and their conv / recurrent states, QSA query heads
(the single KV head and the indexer replicated), and every expert's and the
shared expert's intermediate; hyper-connections, PLE, embedding and head are
replicated. Tolerance: FP32 logits, ``atol = 5e-5``, ``rtol = 1e-5`` (TP changes
the summation order only; a missing shard or head is off by O(1)); greedy
tokens exactly equal. ``torch.distributed.all_reduce`` / ``all_gather`` are
wrapped with counters keyed by the block running during one decode step.
"""

from __future__ import annotations

import os
import tempfile
import unittest
from collections import Counter

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from qwen38_oracle import Qwen38Oracle
from sglang_hybrid.bench.server import free_port
from test_kimi_k3_parallel import wrap_collectives
from tiny_model import tiny_qwen38

PROMPT = [5, 17, 99, 3, 250, 0, 41, 7, 12]
STEPS = 8


def _count_collectives(model, counts: Counter):
    where = {"at": "outside"}
    for layer in model.layers:
        attn = layer.linear_attn if layer.is_linear else layer.self_attn
        kind = "gdn" if layer.is_linear else "qsa"
        attn.register_forward_pre_hook(lambda *_, k=f"{layer.layer_id}.{kind}": where.update(at=k))
        layer.mlp.register_forward_pre_hook(lambda *_, k=f"{layer.layer_id}.moe": where.update(at=k))
    return wrap_collectives(counts, where, ("all_reduce", "all_gather", "broadcast", "reduce_scatter"))


def _worker(rank, port, model_dir, out_dir):
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from sglang_hybrid.parallel.qwen38_runner import Qwen38SequenceRunner
    from sglang_hybrid.models.qwen38.loader import load_qwen38_text_model
    from sglang_hybrid.parallel.spec import ParallelSpec

    res = {}
    if rank == 0:  # the single-process oracle (no collective involved)
        model, head = load_qwen38_text_model(model_dir)
        res["single"] = dict(zip(("tokens", "logits"), Qwen38SequenceRunner(model, head).greedy(PROMPT, STEPS)))
    model, head = load_qwen38_text_model(model_dir, ParallelSpec(tp_rank=rank, tp_size=2))
    runner = Qwen38SequenceRunner(model, head)
    tokens, logits = runner.greedy(PROMPT, STEPS)
    counts: Counter = Counter()
    originals = _count_collectives(model, counts)
    try:
        runner.step([tokens[-1]])  # one more decode step, counted
    finally:
        for op, fn in originals.items():
            setattr(dist, op, fn)
    gdn = next(layer for layer in model.layers if layer.is_linear)
    qsa = next(layer for layer in model.layers if not layer.is_linear)
    state = runner.req_to_token_pool.mamba2_layer_cache(gdn.layer_id)
    res["tp2"] = {
        "tokens": tokens,
        "logits": logits,
        "decode_collectives": dict(counts),
        "gdn_state_shape": tuple(state.temporal.shape),
        "gdn_conv_shape": tuple(state.conv[0].shape),
        "qsa_heads": (qsa.self_attn.H, qsa.self_attn.KV),
        "moe_inter": (qsa.mlp.inter, qsa.mlp.shared_expert.intermediate_size),
        "hyper": model.layers[0].attn_hyper_connection.input_mix_weight_down.clone(),
        "num_layers": len(model.layers),
    }
    try:
        load_qwen38_text_model(model_dir, ParallelSpec(tp_rank=rank, tp_size=2, moe_owned_output=True))
        res["owned"] = "accepted"
    except ValueError as exc:
        res["owned"] = str(exc)
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


class TestQwen38Parallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model_dir = tiny_qwen38()
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(free_port(), cls.model_dir, tmp), nprocs=2, join=True)
            cls.r = [torch.load(os.path.join(tmp, f"rank{i}.pt")) for i in range(2)]
        cls.single = cls.r[0]["single"]

    def test_single_process_run_matches_fp64_oracle(self):
        full = PROMPT + self.single["tokens"]
        want = Qwen38Oracle(self.model_dir).logits(full)[len(PROMPT) - 1 :].float()
        torch.testing.assert_close(self.single["logits"], want, rtol=1e-4, atol=1e-4)

    def test_tp2_matches_single_process(self):
        for rank in range(2):
            got = self.r[rank]["tp2"]
            torch.testing.assert_close(got["logits"], self.single["logits"], rtol=1e-5, atol=5e-5, msg=f"rank {rank}")
            self.assertEqual(got["tokens"], self.single["tokens"], f"rank {rank}")

    def test_each_rank_holds_half_the_heads_and_state(self):
        # tiny config: GDN 2 key / 4 value heads of 16, conv 4; QSA 4 query heads, 1 KV head; MoE I 32, shared 32
        for rank in range(2):
            got = self.r[rank]["tp2"]
            self.assertEqual(got["gdn_state_shape"], (2, 2, 16, 16))  # [slots, H_v / 2, d_v, d_k]
            self.assertEqual(got["gdn_conv_shape"], (2, 16 + 16 + 2 * 16, 3))  # q|k|v channels of the rank
            self.assertEqual(got["qsa_heads"], (2, 1))
            self.assertEqual(got["moe_inter"], (16, 16))
        torch.testing.assert_close(self.r[0]["tp2"]["hyper"], self.r[1]["tp2"]["hyper"], rtol=0, atol=0)

    def test_one_all_reduce_per_block_and_nothing_else(self):
        for rank in range(2):
            got = self.r[rank]["tp2"]
            counts = got["decode_collectives"]
            L = got["num_layers"]
            self.assertEqual(sum(counts.values()), 2 * L, counts)  # PLE, hyper-connections: none
            for (block, op), n in counts.items():
                self.assertEqual((op, n), ("all_reduce", 1), block)
            self.assertEqual({b.split(".")[1] for b, _ in counts}, {"gdn", "qsa", "moe"})

    def test_moe_ownership_is_refused_for_non_latent_moe(self):
        for rank in range(2):
            self.assertIn("needs latent MoE", self.r[rank]["owned"])


if __name__ == "__main__":
    unittest.main()
