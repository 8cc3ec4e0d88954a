"""The chunked prefill's compile warm-up (``delta_rule/chunk/variants.py``).

1. The representative batches reach every binary (kernel, constexprs, warps, stages) that a wide sample of
   served batches reaches, with and without checkpoints, for Kimi K3's KDA and Qwen3.8's GDN at their
   per-GPU widths on the H200 (sm90) and MI300X (gfx942) tables: no batch seen while serving compiles a
   binary the warm-up did not.
2. ``precompile_variants`` runs each representative through the wrapper (Triton interpreter, tiny FP32
   shapes) and leaves the served state pool untouched.
3. ``chunk_state_kernel`` is not specialised on ``n_sub``, the one integer that changes with the batch.
"""

import random
import unittest

import torch

from sgl_hybrid_kernel.delta_rule.chunk import variants
from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk_parallel import chunk_state_kernel
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, gate_kind
from sgl_hybrid_kernel.delta_rule.plan import Target

TARGETS = {"sm90": Target("cuda", "sm90", 132, False, (3, 6)), "gfx942": Target("hip", "gfx942", 304, False, (3, 6))}
MODELS = {"kimi_k3_tp8": (12, 12, 128, 128, gate_kind("kda", -5.0), -5.0),
          "qwen38_tp1": (16, 32, 128, 128, GATE_GDN, None)}


def sample_batches(n: int, seed: int):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        s = rng.choice([1, 2, 3, 5, 7, 9, 17, 33, 50, 64])
        lens = [rng.randint(1, 6000) if rng.random() < 0.3 else rng.randint(1, 300) for _ in range(s)]
        if sum(lens) <= 16384:
            out.append(lens)
    return out


class TestRepresentatives(unittest.TestCase):
    def test_representatives_reach_every_sampled_binary(self):
        batches = sample_batches(150, 1)
        for tname, tgt in TARGETS.items():
            for mname, (H, HV, K, V, kind, lb) in MODELS.items():
                reps = variants.representative_batches(H, HV, K, V, kind, lb, torch.bfloat16, tgt)
                covered = set().union(*(variants.launch_keys(l, c, H, HV, K, V, kind, lb, torch.bfloat16, tgt)
                                        for l, c in reps))
                seen = set()
                for lens in batches:
                    for ckpt in (False, True):
                        seen |= variants.launch_keys(lens, ckpt, H, HV, K, V, kind, lb, torch.bfloat16, tgt)
                with self.subTest(target=tname, model=mname):
                    self.assertEqual(seen - covered, set())
                    # with and without checkpoints are different binaries: at least one of each
                    self.assertEqual({c for _, c in reps}, {False, True})

    def test_batch_shape_changes_the_binaries(self):
        """The premise: one batch alone does not reach every binary (else the warm-up's first prefill would
        have compiled them all), here KDA on sm90: more than one representative without checkpoints."""
        H, HV, K, V, kind, lb = MODELS["kimi_k3_tp8"]
        reps = variants.representative_batches(H, HV, K, V, kind, lb, torch.bfloat16, TARGETS["sm90"])
        self.assertGreater(len([1 for _, c in reps if not c]), 1)


class TestPrecompile(unittest.TestCase):
    def test_runs_each_representative_on_scratch_pools(self):
        torch.manual_seed(0)
        N, H, HV, K, V = 5, 2, 2, 16, 16
        q, k = torch.randn(N, H, K), torch.randn(N, H, K)
        v, f, b = torch.randn(N, HV, V), torch.randn(N, HV, K), torch.randn(N, HV)
        A_log, dt_bias = torch.zeros(HV), torch.zeros(HV * K)
        state = torch.randn(3, HV, V, K)  # the served pool ("vk" layout)
        before = state.clone()
        calls = []
        from sgl_hybrid_kernel.delta_rule.chunk import wrapper

        real = wrapper.gated_delta_chunk_triton

        def spy(*args, **kwargs):
            calls.append((tuple(kwargs["seq_lens_cpu"]), bool(kwargs["checkpoints"]), args[8].data_ptr()))
            return real(*args, **kwargs)

        wrapper.gated_delta_chunk_triton = spy
        try:
            n, _ = variants.precompile_variants(q, k, v, f, b, A_log, dt_bias, state, "kda", -5.0)
        finally:
            wrapper.gated_delta_chunk_triton = real
        cpu = Target.of(q.device)
        reps = variants.representative_batches(H, HV, K, V, gate_kind("kda", -5.0), -5.0, q.dtype, cpu)
        self.assertEqual(n, len(reps))
        self.assertEqual([(lens, ck) for lens, ck, _ in calls], reps)
        self.assertTrue(all(ptr != state.data_ptr() for _, _, ptr in calls))
        self.assertTrue(torch.equal(state, before))


class TestSpecialisation(unittest.TestCase):
    def test_n_sub_is_not_specialised(self):
        if hasattr(chunk_state_kernel, "params"):  # a JITFunction
            names = [p.name for p in chunk_state_kernel.params if p.do_not_specialize]
        else:  # TRITON_INTERPRET=1: the interpreter keeps the decorator's arguments
            names = chunk_state_kernel.kwargs["do_not_specialize"]
        self.assertIn("n_sub", names)


if __name__ == "__main__":
    unittest.main()
