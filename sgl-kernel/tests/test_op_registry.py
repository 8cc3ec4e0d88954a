"""The op registry (start-up table + boot gates), the KDA/GDN ops in it, and value-tile tables
keyed by (arch, compute units). Triton paths run in the interpreter on tiny FP32 shapes."""

import pytest
import torch

import sgl_hybrid_kernel.delta_rule.dispatch as delta_dispatch
import sgl_hybrid_kernel.delta_rule.recurrent.wrapper as recurrent
from sgl_hybrid_kernel import dispatch
from sgl_hybrid_kernel.delta_rule.recurrent.rules import INTERPRETER_TUNING, pick_value_tile, value_tile_tuning
from sgl_hybrid_kernel.platform import Target

CPU = torch.device("cpu")


def _ops():
    return {e.op: e for e in dispatch.registered_ops()}


def test_delta_rule_ops_are_registered_and_plan_torch_on_cpu():
    ops = _ops()
    assert {"delta_rule_decode", "delta_rule_prefill"} <= set(ops)
    for name in ("delta_rule_decode", "delta_rule_prefill"):
        choice = ops[name].plan(CPU)
        assert (choice.op, choice.impl) == (name, "torch") and "CPU" in choice.reason


@pytest.mark.parametrize("op", ["delta_rule_decode", "delta_rule_prefill"])
@pytest.mark.parametrize("impl", ["torch", "triton:sm90x132"])
def test_each_implementation_passes_its_gate(op, impl):
    result = _ops()[op].gate(impl, CPU)
    assert result.ok and result.error is None
    assert 0.0 < result.max_abs_err < 1e-5 < result.tolerance


def test_a_wrong_triton_kernel_fails_its_gate(monkeypatch):
    original = recurrent.gated_delta_recurrent_triton

    def sign_flipped_gate(q, k, v, f, *args, **kwargs):  # the bug: gate input negated
        return original(q, k, v, -f, *args, **kwargs)

    monkeypatch.setattr(recurrent, "gated_delta_recurrent_triton", sign_flipped_gate)
    result = _ops()["delta_rule_decode"].gate("triton:sm90x132", CPU)
    assert not result.ok and result.max_abs_err > 1e-2


def test_unknown_implementation_and_duplicate_registration_raise():
    ops = _ops()
    with pytest.raises(ValueError, match="impl"):
        ops["delta_rule_decode"].gate("aiter", CPU)
    with pytest.raises(ValueError, match="already registered"):
        dispatch.register_op("delta_rule_decode", lambda d: None, ops["delta_rule_decode"].gate)
    assert dispatch.register_op("delta_rule_decode", ops["delta_rule_decode"].plan, ops["delta_rule_decode"].gate)


def test_value_tile_tables_are_keyed_by_arch_and_compute_units():
    h200 = value_tile_tuning("sm90", 132)
    assert h200 is INTERPRETER_TUNING and h200.tuned
    mi355x, half = value_tile_tuning("gfx950", 256), value_tile_tuning("gfx950", 128)
    assert not mi355x.tuned and mi355x.num_compute_units == 256 and half.num_compute_units == 128
    # B=4 decode, 12 heads x 128: 16 columns fill 2 waves of 132 or 128 CUs; 256 CUs need 8.
    assert pick_value_tile(4, 12, 128, tuning=h200) == 16
    assert pick_value_tile(4, 12, 128, tuning=half) == 16
    assert pick_value_tile(4, 12, 128, tuning=mi355x) == 8
    assert pick_value_tile(4, 12, 128) == 16  # default: the H200 table (interpreter, benchmarks)


def test_untuned_device_is_named_in_the_recorded_choice(monkeypatch):
    monkeypatch.setattr(delta_dispatch, "device_kind", lambda t: "rocm")
    monkeypatch.setattr(Target, "of", staticmethod(lambda device: Target("rocm", "gfx950", 256)))
    q, s = torch.zeros(1, 12, 128), torch.zeros(1, 12, 128, 128)
    assert delta_dispatch.choose_recurrent(q, q, s) == "triton"
    assert delta_dispatch.choose_chunk(q, q, s) == "triton"  # chunk-64 form, compile-gated on CDNA (issue 9)
    got = {c.op: c for c in dispatch.chosen_paths()}
    assert got["delta_rule_decode"].impl == "triton:default(gfx950x256)"
    assert "no tuned value-tile table" in got["delta_rule_decode"].reason
    assert got["delta_rule_prefill"].impl.startswith("triton:chunk64:") and "rocm" in got["delta_rule_prefill"].reason
    monkeypatch.undo()  # leave the process-wide record as the CPU has it
    delta_dispatch.choose_recurrent(q, q, s), delta_dispatch.choose_chunk(q, q, s)
