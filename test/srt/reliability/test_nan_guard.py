"""The NaN guard's pieces without a server: row detection, the layer tracer, abort of only the bad request."""

from __future__ import annotations

import unittest
from http import HTTPStatus
from types import SimpleNamespace

import torch
from torch import nn

from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang_hybrid.reliability import nan_guard


class _Layer(nn.Module):
    def __init__(self, poison: bool):
        super().__init__()
        self.self_attn = nn.Identity()
        self.mlp = nn.Identity()
        self.poison = poison

    def forward(self, x):
        x = self.self_attn(x * float("nan") if self.poison else x)
        return self.mlp(x)


class _Model(nn.Module):
    def __init__(self, poison_layer: int):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([_Layer(i == poison_layer) for i in range(4)])

    def forward(self, x):
        for layer in self.model.layers:
            x = layer(x)
        return x


class TestNanGuard(unittest.TestCase):
    def test_nonfinite_rows(self):
        x = torch.zeros(4, 6)
        x[1, 2] = float("nan")
        x[3, 0] = float("-inf")
        self.assertEqual(nan_guard.nonfinite_rows(x).tolist(), [1, 3])
        self.assertEqual(nan_guard.nonfinite_rows(torch.zeros(2, 3)).numel(), 0)
        with self.assertRaisesRegex(ValueError, "logits must be"):
            nan_guard.nonfinite_rows(torch.zeros(3))

    def test_tracer_names_the_first_nonfinite_module_and_resets_per_pass(self):
        model = _Model(poison_layer=2)
        tracer = nan_guard._LayerTracer(model)
        self.assertEqual(len(tracer.modules), 8)
        model(torch.ones(2, 3))
        self.assertEqual(tracer.first, "model.layers.2.self_attn")
        model.model.layers[2].poison = False
        model(torch.ones(2, 3))
        self.assertIsNone(tracer.first)

    def test_only_the_poisoned_request_is_aborted(self):
        logits = torch.randn(3, 5)
        logits[1, 4] = float("nan")
        runner = SimpleNamespace(_sglang_hybrid_nan_tracer=SimpleNamespace(first="model.layers.7.mlp"))
        nan_guard._before_sample(runner, SimpleNamespace(next_token_logits=logits), SimpleNamespace(rids=["a", "b", "c"]))
        self.assertTrue(torch.isfinite(logits).all())
        self.assertEqual(logits[1].abs().sum().item(), 0.0)
        reqs = [SimpleNamespace(rid=r, to_finish=None) for r in ("a", "b", "c")]
        nan_guard._before_process_batch_result(None, SimpleNamespace(reqs=reqs), None)
        self.assertIsNone(reqs[0].to_finish)
        self.assertIsNone(reqs[2].to_finish)
        fin = reqs[1].to_finish
        self.assertIsInstance(fin, FINISH_ABORT)
        self.assertEqual(fin.status_code, HTTPStatus.INTERNAL_SERVER_ERROR)
        self.assertIn("model.layers.7.mlp", fin.message)
        self.assertEqual(nan_guard._poisoned, {})  # consumed


class TestTestOnlyNanInjection(unittest.TestCase):
    """The reference model's fault injection (``SGLANG_HYBRID_TEST_INJECT_NAN``) poisons prompt positions only: a
    decode step whose sampled input token is the trigger stays finite (it used to fail unrelated requests of the
    reliability server tests now and then)."""

    def test_prompt_positions_only(self):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang_hybrid.models.kimi_k3.model import _inject_nan_for_test

        x, ids, spec = torch.ones(3, 4), torch.tensor([5, 964, 7]), (2, 964)
        extend = _inject_nan_for_test(x, ids, 2, spec, SimpleNamespace(forward_mode=ForwardMode.EXTEND))
        self.assertEqual(torch.isnan(extend).all(dim=1).tolist(), [False, True, False])
        decode = _inject_nan_for_test(x, ids, 2, spec, SimpleNamespace(forward_mode=ForwardMode.DECODE))
        self.assertTrue(torch.isfinite(decode).all())
        self.assertTrue(torch.isfinite(_inject_nan_for_test(x, ids, 1, spec)).all())  # another layer


if __name__ == "__main__":
    unittest.main()
