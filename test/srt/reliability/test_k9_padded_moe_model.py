"""Case K9 at the model level: the tiny Kimi K3 with its MoE run through the padded grouped-GEMM layout.

The kernel-level K9 test (sgl-kernel/tests/test_moe_routing.py) feeds hand-made expert
counts {1, 17, 33} to the layout. Here the whole reference model runs (its own router,
every MoE layer, the shared expert, KDA and MLA layers) with ``moe_experts`` replaced
by the path a GPU grouped GEMM takes, built only from ``sgl_hybrid_kernel.moe``:

=====================  ============================================================
piece                  padding it has
=====================  ============================================================
expert-sorted layout   each expert's rows padded to a multiple of the block (16) with
(``expert_sorted_      the sentinel id; unused blocks expert -1
layout_reference``)
``gather_sorted_rows`` the ``[cap, D]`` GEMM input, a persistent workspace reused
                       across calls and layers
padded weights         the intermediate laid out as ``I_pad = 80`` for ``I = 64``
                       (seeds digest item 17: 640 as 768): persistent, zero-initialised
                       padding columns of ``w13`` rows / ``w2`` columns, written once
``inter_out``          the ``[cap, I_pad]`` activation workspace, persistent, reused
=====================  ============================================================

Before every MoE call the two workspaces are filled with NaN (or 3e38) — what a
previous call or an uninitialised allocation could leave there. The logits must
be bit-identical to those of a run whose workspaces hold zeros, finite, and equal
(to FP32 rounding) to the unpadded model; the padding of the persistent weights
must still be zero afterwards. Row counts per MoE call: 1..7 (prefills of 1..7
tokens, the decode batch sizes of the case) and a decode step of 1.
"""

from __future__ import annotations

import os
import unittest

import torch

from sgl_hybrid_kernel.moe.routing_reference import (
    expert_sorted_layout_reference,
    gather_sorted_rows,
    grouped_swiglu_sorted_reference,
)
from sglang_hybrid.models.kimi_k3 import moe as kimi_moe
from tiny_model import tiny_kimi_k3

BLOCK = 16


class PaddedGroupedMoE:
    """``moe_experts(x, w13, w2, topk_weights, topk_ids)`` through the padded layout with persistent buffers.

    ``fill``: what the workspaces hold before each call (NaN, 3e38, 0). Records, per call, the
    rows ``M``, the layout's rows in use and its capacity (padding rows = rows in use − M·k).
    """

    def __init__(self, fill: float):
        self.fill = fill
        self.padded = {}  # (id(w13), id(w2)) -> (w13 [E, 2 I_pad, D], w2 [E, D, I_pad], I)
        self.rows_ws = torch.empty(0)
        self.act_ws = torch.empty(0)
        self.calls = []

    def padded_weights(self, w13, w2):
        key = (id(w13), id(w2))
        if key not in self.padded:
            E, two_i, D = w13.shape
            I = two_i // 2
            I_pad = (I // BLOCK + 1) * BLOCK  # 64 -> 80: at least one padding block of columns
            w13p = torch.zeros(E, 2 * I_pad, D, dtype=w13.dtype)
            w13p[:, :I], w13p[:, I_pad:I_pad + I] = w13[:, :I], w13[:, I:]
            w2p = torch.zeros(E, w2.shape[1], I_pad, dtype=w2.dtype)
            w2p[:, :, :I] = w2
            self.padded[key] = (w13p, w2p, I)
        return self.padded[key]

    def workspaces(self, cap, D, I_pad):
        if self.rows_ws.shape[0] < cap or self.rows_ws.shape[1:] != (D,) or self.act_ws.shape[1:] != (I_pad,):
            self.rows_ws = torch.empty(max(cap, self.rows_ws.shape[0]), D)
            self.act_ws = torch.empty(self.rows_ws.shape[0], I_pad)
        self.rows_ws.fill_(self.fill)  # garbage a previous call could have left
        self.act_ws.fill_(self.fill)
        return self.rows_ws[:cap], self.act_ws[:cap]

    def __call__(self, x, w13, w2, topk_weights, topk_ids):
        M, D = x.shape
        k = topk_ids.shape[1]
        w13p, w2p, _ = self.padded_weights(w13, w2)
        sorted_ids, block_expert, num_rows = expert_sorted_layout_reference(topk_ids, w13.shape[0], BLOCK)
        rows_ws, act_ws = self.workspaces(sorted_ids.numel(), D, w2p.shape[-1])
        rows = gather_sorted_rows(x, sorted_ids, k, out=rows_ws)
        y = grouped_swiglu_sorted_reference(rows, block_expert, w13p, w2p, BLOCK, inter_out=act_ws)
        valid = sorted_ids < M * k
        entry = sorted_ids[valid].long()
        out = torch.zeros(M, D, dtype=torch.float32)
        out.index_add_(0, entry // k, y[valid] * topk_weights.reshape(-1)[entry].float().unsqueeze(-1))
        self.calls.append((M, int(num_rows), sorted_ids.numel(), M * k))
        return out.to(x.dtype)


def _build(model_dir):
    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM
    from sglang_hybrid.parallel.spec import ParallelSpec

    model = KimiK3ReferenceForCausalLM(KimiLinearConfig.from_pretrained(model_dir), parallel=ParallelSpec())
    model.load_weights(safetensors_weights_iterator([os.path.join(model_dir, "model.safetensors")]))
    return model


class TestK9PaddedMoEModel(unittest.TestCase):
    """Logits of the tiny Kimi K3 whatever its MoE workspaces held before each call."""

    @classmethod
    def setUpClass(cls):
        cls.model = _build(tiny_kimi_k3())
        gen = torch.Generator().manual_seed(9)
        # prompts of 1..7 tokens (MoE row counts 1..7), each followed by one decode step
        cls.prompts = [torch.randint(10, 900, (n,), generator=gen).tolist() for n in range(1, 8)]
        cls.runs = {"unpadded": cls._run(None)}
        cls.harness = {}
        for name, fill in (("zeros", 0.0), ("nan", float("nan")), ("huge", 3e38)):
            cls.harness[name] = PaddedGroupedMoE(fill)
            cls.runs[name] = cls._run(cls.harness[name])

    @classmethod
    def _run(cls, experts):
        from sglang_hybrid.parallel.runner import SequenceRunner

        original = kimi_moe.moe_experts
        if experts is not None:
            kimi_moe.moe_experts = experts
        try:
            return [SequenceRunner(cls.model, max_len=16).greedy(p, 1)[1] for p in cls.prompts]
        finally:
            kimi_moe.moe_experts = original

    def test_logits_bit_identical_whatever_the_workspaces_held(self):
        for name in ("nan", "huge"):
            for n, (a, b) in enumerate(zip(self.runs["zeros"], self.runs[name]), start=1):
                self.assertTrue(torch.isfinite(b).all(), f"{name}: non-finite logits, prompt of {n}")
                self.assertTrue(torch.equal(a, b), f"{name}: logits differ from the zero-workspace run, prompt of {n}")

    def test_padded_layout_equals_the_unpadded_model(self):
        for n, (a, b) in enumerate(zip(self.runs["unpadded"], self.runs["nan"]), start=1):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"prompt of {n}")
            self.assertEqual(b.argmax(-1).tolist(), a.argmax(-1).tolist())

    def test_the_layouts_had_padding_and_it_stayed_zero(self):
        h = self.harness["nan"]
        ms = {m for m, *_ in h.calls}
        self.assertEqual(ms, set(range(1, 8)))  # every row count 1..7 went through the padded path
        self.assertTrue(all(rows > entries for _, rows, _, entries in h.calls))  # padding rows in every call
        self.assertTrue(any(cap > rows for _, rows, cap, _ in h.calls))  # and unused blocks
        n_moe = sum(isinstance(m, kimi_moe.KimiK3MoE) for m in self.model.modules())
        self.assertEqual(len(h.padded), n_moe)  # one persistent padded copy per MoE layer, built once
        for w13p, w2p, I in h.padded.values():
            I_pad = w2p.shape[-1]
            self.assertEqual(I_pad - I, BLOCK)
            self.assertEqual(int(w13p[:, I:I_pad].count_nonzero()), 0)
            self.assertEqual(int(w13p[:, I_pad + I:].count_nonzero()), 0)
            self.assertEqual(int(w2p[:, :, I:].count_nonzero()), 0)


if __name__ == "__main__":
    unittest.main()
