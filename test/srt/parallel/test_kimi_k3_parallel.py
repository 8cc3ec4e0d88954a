"""Kimi K3 reference under TP, DCP and MoE output ownership, with 2 gloo processes on CPU (issue 8).

One ``torch.multiprocessing.spawn`` of 2 processes runs every configuration
(model level, no server; ``sglang_hybrid.parallel.runner``): prefill of a
7-token prompt, then 8 greedy decode steps. The oracle is the single-process
run of the same checkpoint (``ParallelSpec()``, no collective), which itself
matches the FP64 architecture oracle (``kimi_k3_oracle``) to ~2e-5. Tolerance of
the parallel runs against it: FP32 logits (|logit| <= 4), ``atol = 5e-5``,
``rtol = 1e-5`` (TP and the DCP merge change the summation order; measured
differences <= 1.7e-5; a missing shard or a wrong merge is off by O(1));
greedy tokens exactly equal.

Configurations (2 processes; DCP width must divide TP width, so DCP = 2 needs TP = 2):
``tp2`` (TP = 2), ``tp2_dcp2`` (TP = 2 + DCP = 2), and on a latent-MoE variant
of the checkpoint ``latent_tp2`` (plain TP: replicated routed output
projection) and ``latent_tp2_owned`` / ``latent_tp2_dcp2_owned`` (MoE routed-output
ownership). ``torch.distributed.all_reduce`` / ``all_gather`` are wrapped with
counters keyed by the layer running, to show ownership adds no collective.
"""

from __future__ import annotations

import os
import tempfile
import unittest
from collections import Counter

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kimi_k3_oracle import KimiK3Oracle
from sglang_hybrid.bench.server import free_port
from tiny_latent import tiny_kimi_k3_latent
from tiny_model import tiny_kimi_k3

PROMPT = [5, 17, 99, 3, 250, 41, 7]
STEPS = 8
CONFIGS = {
    # name: (checkpoint, tp, dcp, owned)
    "tp2": ("base", 2, 1, False),
    "tp2_dcp2": ("base", 2, 2, False),
    "latent_tp2": ("latent", 2, 1, False),
    "latent_tp2_owned": ("latent", 2, 1, True),
    "latent_tp2_dcp2_owned": ("latent", 2, 2, True),
}


def _build(model_dir, spec):
    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM

    cfg = KimiLinearConfig.from_pretrained(model_dir)
    model = KimiK3ReferenceForCausalLM(cfg, parallel=spec)
    model.load_weights(safetensors_weights_iterator([os.path.join(model_dir, "model.safetensors")]))
    return model


def _count_collectives(model, counts: Counter):
    """Wrap all_reduce / all_gather; key each call by (layer, sub-block, op)."""
    where = {"at": "outside"}
    for i, layer in enumerate(model.model.layers):
        for part in ("self_attn", "mlp"):
            getattr(layer, part).register_forward_pre_hook(lambda *_, k=f"{i}.{part}": where.update(at=k))
    return wrap_collectives(counts, where, ("all_reduce", "all_gather"))


def wrap_collectives(counts: Counter, where: dict, ops) -> dict:
    """Replace each ``torch.distributed`` op in ``ops`` by a wrapper that counts its calls under
    ``(where["at"], op)``; returns the originals (to put back with ``setattr``)."""
    originals = {op: getattr(dist, op) for op in ops}

    def wrap(op):
        def counted(*args, **kwargs):
            counts[(where["at"], op)] += 1
            return originals[op](*args, **kwargs)

        return counted

    for op in originals:
        setattr(dist, op, wrap(op))
    return originals


def _worker(rank, port, dirs, out_dir):
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from sglang_hybrid.parallel.runner import SequenceRunner
    from sglang_hybrid.parallel.spec import ParallelSpec

    results = {}
    # Single-process oracles, one per rank at the same time (no collective involved).
    single = "base" if rank == 0 else "latent"
    tokens, logits = SequenceRunner(_build(dirs[single], ParallelSpec())).greedy(PROMPT, STEPS)
    results[f"single_{single}"] = {"tokens": tokens, "logits": logits}
    for name, (ckpt, tp, dcp, owned) in CONFIGS.items():
        spec = ParallelSpec(tp_rank=rank, tp_size=tp, dcp_size=dcp, moe_owned_output=owned)
        model = _build(dirs[ckpt], spec)
        runner = SequenceRunner(model)
        tokens, logits = runner.greedy(PROMPT, STEPS)
        counts: Counter = Counter()
        originals = _count_collectives(model, counts)
        try:
            runner.step([tokens[-1]])  # one more decode step, counted
        finally:
            for op, fn in originals.items():
                setattr(dist, op, fn)
        up = [m.mlp.routed_expert_up_proj.numel() for m in model.model.layers if hasattr(m.mlp, "routed_expert_up_proj")]
        results[name] = {
            "tokens": tokens,
            "logits": logits,
            "decode_collectives": dict(counts),
            "kv_rows": runner.kv_rows_used,
            "up_proj_elems": sum(up),
        }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


class TestKimiK3Parallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        dirs = {"base": tiny_kimi_k3(), "latent": tiny_kimi_k3_latent(os.path.join(cls.tmp.name, "latent"))}
        mp.spawn(_worker, args=(free_port(), dirs, cls.tmp.name), nprocs=2, join=True)
        cls.r = [torch.load(os.path.join(cls.tmp.name, f"rank{i}.pt")) for i in range(2)]
        cls.single = {"base": cls.r[0]["single_base"], "latent": cls.r[1]["single_latent"]}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _check_equal_to_single(self, name):
        ckpt = CONFIGS[name][0]
        ref = self.single[ckpt]
        for rank in range(2):
            got = self.r[rank][name]
            torch.testing.assert_close(got["logits"], ref["logits"], rtol=1e-5, atol=5e-5, msg=f"{name} rank {rank}")
            self.assertEqual(got["tokens"], ref["tokens"], f"{name} rank {rank}")

    def test_single_process_run_matches_fp64_oracle(self):
        # The runner (model-level, no server) against the independent FP64 oracle.
        ref = self.single["base"]
        full = PROMPT + ref["tokens"]
        want = KimiK3Oracle(tiny_kimi_k3()).logits(full)[len(PROMPT) - 1 :].float()
        torch.testing.assert_close(ref["logits"], want, rtol=1e-4, atol=1e-4)

    def test_tp2_matches_single_process(self):
        self._check_equal_to_single("tp2")

    def test_tp2_dcp2_matches_single_process(self):
        self._check_equal_to_single("tp2_dcp2")

    def test_latent_moe_tp2_plain_and_owned_match_single_process(self):
        for name in ("latent_tp2", "latent_tp2_owned", "latent_tp2_dcp2_owned"):
            self._check_equal_to_single(name)

    def test_dcp_kv_rows_per_rank_fall_by_dcp_width(self):
        L = len(PROMPT) + STEPS + 1  # prompt, 8 greedy steps, 1 counted decode step
        for rank in range(2):
            self.assertEqual(self.r[rank]["tp2"]["kv_rows"], L)
            # positions p with p mod 2 == rank
            self.assertEqual(self.r[rank]["tp2_dcp2"]["kv_rows"], len(range(rank, L, 2)))

    def test_moe_ownership_adds_no_collective(self):
        for rank in range(2):
            plain = self.r[rank]["latent_tp2"]["decode_collectives"]
            owned = self.r[rank]["latent_tp2_owned"]["decode_collectives"]
            self.assertEqual(owned, plain)
            # Per MoE layer: latent all-reduce + shared all-reduce, nothing else.
            moe = [k for k in plain if k[0].endswith(".mlp") and k[0] != "0.mlp"]
            self.assertTrue(moe)
            for key in moe:
                self.assertEqual(plain[key], 2 if key[1] == "all_reduce" else 0, key)
            self.assertNotIn(("0.mlp", "all_gather"), plain)
            self.assertEqual(plain[("0.mlp", "all_reduce")], 1)  # dense layer 0: row-parallel down

    def test_dcp_adds_only_two_all_gathers_per_mla_layer(self):
        plain = self.r[0]["latent_tp2_owned"]["decode_collectives"]
        dcp = self.r[0]["latent_tp2_dcp2_owned"]["decode_collectives"]
        extra = Counter(dcp)
        extra.subtract(plain)
        extra = {k: v for k, v in extra.items() if v}
        # MLA layers of the tiny model: 3 and 7 (0-based); two all-gathers each.
        self.assertEqual(extra, {("3.self_attn", "all_gather"): 2, ("7.self_attn", "all_gather"): 2})

    def test_owned_rank_loads_half_of_routed_output_projection(self):
        plain, owned = self.r[0]["latent_tp2"]["up_proj_elems"], self.r[0]["latent_tp2_owned"]["up_proj_elems"]
        self.assertGreater(plain, 0)
        self.assertEqual(owned * 2, plain)


if __name__ == "__main__":
    unittest.main()
