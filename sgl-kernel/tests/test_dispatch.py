"""The kernel-path record: one log line per decision, a table of all of them."""

import logging

from sgl_hybrid_kernel.dispatch import chosen_paths, record_choice


def test_choice_logged_once_and_listed(caplog):
    log = logging.getLogger("test_dispatch")
    with caplog.at_level(logging.INFO, logger="test_dispatch"):
        record_choice("unit_op", "torch", "CPU", log=log)
        record_choice("unit_op", "torch", "CPU", log=log)
        record_choice("unit_op", "triton:bt64", "CUDA sm90", log=log)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "triton:bt64" in lines[1]
    assert [c.impl for c in chosen_paths() if c.op == "unit_op"] == ["triton:bt64"]


def test_delta_rule_dispatch_on_cpu_and_contract():
    import torch

    from sgl_hybrid_kernel.delta_rule.dispatch import choose_chunk, choose_recurrent, device_kind

    q, v, s = torch.zeros(2, 3, 128), torch.zeros(2, 3, 128), torch.zeros(1, 3, 128, 128)
    assert device_kind(q) == "cpu"
    assert choose_recurrent(q, v, s) == "torch" and choose_chunk(q, v, s) == "torch"
    reasons = {c.op: c.reason for c in chosen_paths()}
    assert "CPU" in reasons["delta_rule_decode"] and "CPU" in reasons["delta_rule_prefill"]


def test_delta_rule_decode_reason_built_once_per_target(monkeypatch, caplog):
    """Every served decode call asks the dispatcher (with its gate kind); the reason (rules, tables,
    the first call's plan) is built and logged once, later calls of another batch are only counted."""
    import torch

    import sgl_hybrid_kernel.delta_rule.dispatch as disp
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN
    from sgl_hybrid_kernel.dispatch import call_counts
    from sgl_hybrid_kernel.platform import Target

    monkeypatch.setattr(disp, "device_kind", lambda t: "cuda")
    monkeypatch.setattr(Target, "of", staticmethod(lambda d: Target("cuda", "sm90", 132)))
    plans = []
    real = disp.plan_recurrent_for
    monkeypatch.setattr(disp, "plan_recurrent_for", lambda *a, **kw: plans.append(a[0].shape[0]) or real(*a, **kw))
    s = torch.zeros(64, 4, 128, 128)
    before = call_counts()
    with caplog.at_level(logging.INFO, logger=disp.logger.name):
        for B in (1, 8, 32):
            q = torch.zeros(B, 4, 128, dtype=torch.bfloat16)
            assert disp.choose_recurrent(q, q, s, 1, GATE_GDN) == "triton"
    choice = next(c for c in chosen_paths() if c.op == "delta_rule_decode")
    key = f"delta_rule_decode={choice.impl}"
    assert plans == [1] and "plan of the first call" in choice.reason
    assert call_counts()[key] - before.get(key, 0) == 3
    assert sum("delta_rule_decode" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.undo()  # leave the process-wide record as the CPU has it
    disp.choose_recurrent(s[:1, :, 0], s[:1, :, 0], s)
