"""Layer taps (python/sglang_hybrid/tools/layer_taps.py): what a pass records and how passes compare."""

from __future__ import annotations

import os
import sys
import tempfile
import unittest

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_hybrid.tools import layer_taps

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "gpu")))
import gpu_cases  # noqa: E402  (the GPU suite's comparison rule, pure Python)


class _Layer(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.self_attn = torch.nn.Linear(4, 4, bias=False)
        self.mlp = torch.nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.self_attn.weight.copy_(torch.eye(4) * scale)
            self.mlp.weight.copy_(torch.eye(4) * 2)


class _Model(torch.nn.Module):
    """``model.layers.<i>.{self_attn, mlp}`` like the served models; ``forward(input_ids, positions, fb)``."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([_Layer(1.0), _Layer(3.0)])

    def forward(self, input_ids, positions, forward_batch):
        h = input_ids.float()[:, None].repeat(1, 4)
        for layer in self.model.layers:
            h = layer.mlp(layer.self_attn(h))
        return h


class _Batch:
    def __init__(self, mode, input_ids=None):
        self.forward_mode = mode
        self.input_ids = input_ids


class TestLayerTaps(unittest.TestCase):
    def test_records_extend_passes_only_with_inputs_and_outputs(self):
        with tempfile.TemporaryDirectory() as d:
            model = _Model()
            layer_taps.LayerTaps(model, d)
            ids = torch.tensor([1, 2, 3])
            model.forward(ids, None, _Batch(ForwardMode.EXTEND))  # upstream calls model.forward directly
            model.forward(ids, None, _Batch(ForwardMode.DECODE))
            model(ids, None, forward_batch=_Batch(ForwardMode.EXTEND))
            passes = layer_taps.load_passes(d)
            self.assertEqual(len(passes), 2)  # the decode pass is not recorded
            taps = passes[0]["taps"]
            x = ids.float()[:, None].repeat(1, 4)
            torch.testing.assert_close(taps["model.layers.0.self_attn:in"], x)
            torch.testing.assert_close(taps["model.layers.1.self_attn:out"], x * 2 * 3)
            torch.testing.assert_close(taps["model.layers.1.mlp:out"], x * 12)
            self.assertEqual(passes[1]["input_ids"].tolist(), [1, 2, 3])

    def test_passes_over_the_token_limit_are_not_recorded_and_do_not_count(self):
        """The start-up warm-up's long prompt must not use up the pass budget before the tap prompt."""
        with tempfile.TemporaryDirectory() as d:
            model = _Model()
            layer_taps.LayerTaps(model, d, max_passes=1, max_tokens=4)
            model.forward(torch.arange(1, 6), None, _Batch(ForwardMode.EXTEND))  # 5 tokens: over the limit
            model.forward(torch.tensor([7, 8]), None, _Batch(ForwardMode.EXTEND))
            model.forward(torch.tensor([9]), None, _Batch(ForwardMode.EXTEND))  # budget of 1 pass used
            self.assertEqual([p["input_ids"].tolist() for p in layer_taps.load_passes(d)], [[7, 8]])

    def test_prefill_graph_declines_only_the_passes_the_taps_want(self):
        """Module hooks do not run in a replayed CUDA graph: a wanted pass must run eagerly."""
        with tempfile.TemporaryDirectory() as d:
            model = _Model()
            taps = layer_taps.LayerTaps(model, d, max_passes=1, max_tokens=4)
            layer_taps._ACTIVE[:] = [taps]
            try:
                graph = lambda self, fb: True  # noqa: E731  (upstream's verdict: the graph can run)
                can = lambda fb: layer_taps._prefill_graph_unless_tapped(graph, None, fb)  # noqa: E731
                self.assertFalse(can(_Batch(ForwardMode.EXTEND, torch.arange(3))))
                self.assertTrue(can(_Batch(ForwardMode.EXTEND, torch.arange(5))))  # over the token limit
                self.assertTrue(can(_Batch(ForwardMode.DECODE, torch.arange(1))))
                model.forward(torch.tensor([7, 8]), None, _Batch(ForwardMode.EXTEND))  # the one pass
                self.assertTrue(can(_Batch(ForwardMode.EXTEND, torch.arange(3))))  # budget used: graphs again
            finally:
                layer_taps._ACTIVE.clear()

    def test_compare_passes_names_the_layer_that_departs(self):
        with tempfile.TemporaryDirectory() as ref_dir, tempfile.TemporaryDirectory() as test_dir:
            ref, bad = _Model(), _Model()
            with torch.no_grad():
                bad.model.layers[1].mlp.weight[0, 0] = 2.5  # a fault in layer 1's MLP only
            layer_taps.LayerTaps(ref, ref_dir)
            layer_taps.LayerTaps(bad, test_dir)
            ids = torch.tensor([4, 5])
            for m in (ref, bad):
                m.forward(ids, None, _Batch(ForwardMode.EXTEND))
            a = layer_taps.find_pass(layer_taps.load_passes(ref_dir), [4, 5])
            b = layer_taps.find_pass(layer_taps.load_passes(test_dir), [4, 5])
            self.assertIsNone(layer_taps.find_pass(layer_taps.load_passes(ref_dir), [4, 6]))
            rows = {r.key: r for r in layer_taps.compare_passes(a, b)}
            self.assertEqual(rows["model.layers.1.mlp:in"].max_abs, 0.0)
            # layer 1's MLP input is 5 * 6 = 30 at the last token: 0.5 * 30 off
            self.assertAlmostEqual(rows["model.layers.1.mlp:out"].max_abs, 15.0, places=5)
            self.assertAlmostEqual(rows["model.layers.1.mlp:out"].rel, 15.0 / 60.0, places=5)


def _cont(ids, lp, top2):
    return {"ids": ids, "lp": lp, "top2": top2}


class TestContinuationRule(unittest.TestCase):
    """``gpu_cases.compare_continuations``: the GPU suite's token oracle."""

    want = _cont([5, 6, 7], [-0.1, -0.2, -0.3], [[(-0.1, 5), (-2.0, 9)], [(-0.2, 6), (-0.25, 8)], [(-0.3, 7), (-3.0, 1)]])

    def test_identical(self):
        v = gpu_cases.compare_continuations(_cont([5, 6, 7], [-0.1, -0.2, -0.3], []), self.want, 0.1, 0.05)
        self.assertTrue(v.ok)
        self.assertEqual(v.equal, 3)

    def test_parting_at_a_near_tie_on_the_runner_up_is_accepted(self):
        v = gpu_cases.compare_continuations(_cont([5, 8, 1], [-0.1, -0.24, -0.1], []), self.want, 0.1, 0.05)
        self.assertTrue(v.ok, v.describe())
        self.assertEqual(v.equal, 1)

    def test_parting_where_the_reference_was_sure_fails(self):
        v = gpu_cases.compare_continuations(_cont([9, 6, 7], [-2.0, -0.2, -0.3], []), self.want, 0.1, 0.05)
        self.assertFalse(v.ok)
        self.assertIn("token 0", v.why)

    def test_a_token_outside_the_top_two_fails_even_at_a_tie(self):
        v = gpu_cases.compare_continuations(_cont([5, 3, 7], [-0.1, -0.2, -0.3], []), self.want, 1.0, 0.05)
        self.assertFalse(v.ok)

    def test_equal_tokens_with_distant_log_probs_fail(self):
        v = gpu_cases.compare_continuations(_cont([5, 6, 7], [-0.1, -0.5, -0.3], []), self.want, 0.1, 0.05)
        self.assertFalse(v.ok)
        self.assertIn("log-prob", v.why)


if __name__ == "__main__":
    unittest.main()
