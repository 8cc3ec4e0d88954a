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
