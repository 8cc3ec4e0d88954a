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


class _Event:
    """A CUDA event stand-in: ``done`` says whether its work has finished; ``synchronize`` records the wait."""

    def __init__(self, done: bool):
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True


class TestNoSyncOnTheServedPath(unittest.TestCase):
    def setUp(self):
        nan_guard._pending.clear()
        nan_guard._poisoned.clear()

    def test_sampling_hook_never_synchronises(self):
        """Bad rows are zeroed and queued with tensor ops only: no nonzero / item / tolist / bool, each of
        which waits for the forward pass on a GPU (the hook used nonzero() on every step)."""
        logits = torch.randn(4, 6)
        logits[2, 1] = float("inf")
        forbidden = ("nonzero", "item", "tolist", "__bool__")
        saved = {n: getattr(torch.Tensor, n) for n in forbidden}

        def boom(*_a, **_k):
            raise AssertionError("a synchronising tensor op in the sampling hook")

        try:
            for n in forbidden:
                setattr(torch.Tensor, n, boom)
            nan_guard._before_sample(SimpleNamespace(), SimpleNamespace(next_token_logits=logits),
                                     SimpleNamespace(rids=["a", "b", "c", "d"]))
        finally:
            for n, f in saved.items():
                setattr(torch.Tensor, n, f)
        self.assertEqual(logits[2].abs().sum().item(), 0.0)
        self.assertEqual(len(nan_guard._pending), 1)

    def test_each_batch_reads_its_own_mask_not_the_next_ones(self):
        """Overlap scheduling: batch N+1 is sampled before batch N's results are processed. Processing N
        waits on N's event only (N+1's forward may still run) and aborts N's bad request; N+1's mask is
        read when N+1's results are processed."""
        ev_n, ev_n1 = _Event(done=False), _Event(done=False)
        nan_guard._pending.extend([
            nan_guard._Pending(ev_n, torch.tensor([False, True, False]), ["a", "b", "c"], "w"),
            nan_guard._Pending(ev_n1, torch.tensor([False, False, True]), ["a", "b", "c"], "w"),
        ])
        reqs = [SimpleNamespace(rid=r, to_finish=None) for r in ("a", "b", "c")]
        nan_guard._before_process_batch_result(None, SimpleNamespace(reqs=reqs), None)
        self.assertEqual((ev_n.waited, ev_n1.waited), (True, False))
        self.assertEqual([r.to_finish is not None for r in reqs], [False, True, False])
        reqs = [SimpleNamespace(rid=r, to_finish=None) for r in ("a", "c")]
        nan_guard._before_process_batch_result(None, SimpleNamespace(reqs=reqs), None)
        self.assertTrue(ev_n1.waited)
        self.assertEqual([r.to_finish is not None for r in reqs], [False, True])
        self.assertEqual((nan_guard._pending, nan_guard._poisoned), ([], {}))

    def test_finished_copies_are_read_without_waiting(self):
        done = _Event(done=True)
        nan_guard._pending.append(nan_guard._Pending(done, torch.tensor([True]), ["x"], "w"))
        nan_guard._before_process_batch_result(None, SimpleNamespace(reqs=[]), None)  # another batch
        self.assertFalse(done.waited)
        self.assertIn("x", nan_guard._poisoned)  # aborted when x's own batch is processed
        req = SimpleNamespace(rid="x", to_finish=None)
        nan_guard._before_process_batch_result(None, SimpleNamespace(reqs=[req]), None)
        self.assertIsInstance(req.to_finish, FINISH_ABORT)


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
