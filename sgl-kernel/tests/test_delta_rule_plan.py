"""Contracts of the delta-rule plans (issue 43): a plan is checked against the call it is handed to, the tables
refuse rows without their measurement, and bad plan inputs raise ValueError naming the argument."""

import json

import pytest
import torch

from sgl_hybrid_kernel.delta_rule import plan as plan_mod
from sgl_hybrid_kernel.delta_rule.chunk.rules import load_chunk_launch_tables
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE, gate_kind
from sgl_hybrid_kernel.delta_rule.recurrent.rules import VALUE_TILE_TUNED, load_value_tile_tables
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton
from sgl_hybrid_kernel.platform import Target

H200 = Target("cuda", "sm90", 132, False, (3, 8))


def _decode_args(B, H=2, K=16, V=16):
    q = torch.randn(B, H, K)
    return (q, q, torch.randn(B, H, V), torch.randn(B, H), torch.randn(B, H), torch.rand(H), torch.randn(H),
            torch.zeros(B, H, V, K), torch.arange(B))


def test_wrapper_refuses_a_plan_made_for_another_shape():
    args = _decode_args(3)
    interp = Target("cpu", interpreter=True)
    right = plan_mod.plan_recurrent(3, 1, 2, 2, 16, 16, GATE_GDN, "vk", interp)
    o = gated_delta_recurrent_triton(*args, 1, "gdn", state_layout="vk", plan=right)
    assert o.shape == (3, 2, 16) and not o.isnan().any()
    wrong = plan_mod.plan_recurrent(4, 1, 2, 2, 16, 16, GATE_GDN, "vk", interp)  # B=4 for a B=3 call
    with pytest.raises(ValueError, match="plan: made for"):
        gated_delta_recurrent_triton(*args, 1, "gdn", state_layout="vk", plan=wrong)


def test_plan_inputs_are_checked():
    with pytest.raises(ValueError, match="tokens"):
        plan_mod.plan_recurrent(1, 17, 2, 2, 16, 16, GATE_GDN, "vk", H200)
    with pytest.raises(ValueError, match="state_layout"):
        plan_mod.plan_recurrent(1, 1, 2, 2, 16, 16, GATE_GDN, "kk", H200)
    with pytest.raises(ValueError, match="xred"):  # a one-warp mode asked of the register-tile kernel
        plan_mod.plan_recurrent(1, 4, 2, 2, 128, 128, GATE_GDN, "vk", H200,
                                overrides=plan_mod.RecurrentOverrides(wide=False, xred=1))
    with pytest.raises(ValueError, match="method"):
        plan_mod.plan_chunk([64], 2, 16, GATE_GDN, None, torch.bfloat16, H200, overrides=plan_mod.ChunkOverrides(method="x"))
    with pytest.raises(ValueError, match="sequential"):
        plan_mod.plan_chunk([64], 2, 16, GATE_GDN, None, torch.float32, Target("rocm", "gfx942", 304),
                            overrides=plan_mod.ChunkOverrides(method="sequential"))
    with pytest.raises(ValueError, match="fields"):
        plan_mod.with_overrides(plan_mod.plan_recurrent(1, 1, 2, 2, 16, 16, GATE_GDN, "vk", H200), tile=8)
    with pytest.raises(ValueError, match="gate"):
        gate_kind("mamba")
    assert (gate_kind("kda"), gate_kind("kda", -5.0), gate_kind("gdn")) == (GATE_KDA, GATE_KDA_SAFE, GATE_GDN)


def test_tables_are_data_with_their_measurements(tmp_path):
    row = VALUE_TILE_TUNED[("sm90", 132)]
    assert row.tuned and "H200" in row.source and dict(row.evidence)["verify_waves"].startswith("H200")
    assert (row.narrow_decode_per_cu, row.verify_waves, row.prepped_per_cu) == (32, 8, 12)
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"tables": [{"name": "x", "arch": "sm90", "num_compute_units": 1}]}))  # no source
    with pytest.raises(ValueError, match="source"):
        load_value_tile_tables(str(bad))
    with pytest.raises(ValueError, match="source"):
        load_chunk_launch_tables(str(bad))
    bad.write_text(json.dumps({"tables": [{"name": "x", "arch": "sm90", "num_compute_units": 1, "source": "s",
                                           "state_bvv": 3}]}))  # a misspelt field
    with pytest.raises(ValueError, match="state_bvv"):
        load_chunk_launch_tables(str(bad))


def test_plans_describe_what_they_launch():
    p = plan_mod.plan_recurrent(1, 1, 12, 12, 128, 128, GATE_KDA_SAFE, "vk", H200)
    assert p.describe() == "one_warp BV=4 w1 XRED1 SEQ [sm90x132]"
    c = plan_mod.plan_chunk([16384] * 8, 12, 128, GATE_KDA_SAFE, -5.0, torch.bfloat16, H200)
    assert c.describe() == "chunk64 [sm90x132] TF32 state BV=32 fused-o"
    s = plan_mod.plan_chunk([64], 12, 128, GATE_KDA_SAFE, -5.0, torch.float32, H200)
    assert s.describe() == "sequential BT=16 BV=32 w8"


def test_rule_measurements_are_data_beside_the_rules():
    """Each record of ``tiles.json``'s ``measurements`` belongs to a rule of ``recurrent/rules.py`` whose docstring
    points at it, and holds dated H200 figures (the tables that used to live in the docstrings)."""
    import os

    from sgl_hybrid_kernel.delta_rule.recurrent import rules

    with open(os.path.join(os.path.dirname(rules.__file__), "tiles.json")) as fh:
        records = json.load(fh)["measurements"]
    assert {"pick_wide_tile", "pick_lanes_tile", "use_xred", "use_tokprep"} <= set(records)
    for name, text in records.items():
        assert f'measurements["{name}"]' in getattr(rules, name).__doc__
        assert "H200" in text and "2026-1" in text
