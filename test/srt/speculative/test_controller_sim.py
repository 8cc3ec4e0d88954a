"""The controller simulator (benchmark/spec/controller_sim.py): a tiny run, and its EMA baseline vs upstream."""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC_DIR = os.path.join(ROOT, "benchmark", "spec")


def _load(name):
    if SPEC_DIR not in sys.path:
        sys.path.insert(0, SPEC_DIR)
    return importlib.import_module(name)


sim = _load("controller_sim")
models = _load("sim_models")


def test_tiny_simulation_compares_every_policy_in_one_run():
    out = sim.run(cycles=300, scenarios=[sim.SCENARIOS[i] for i in (0, 6)], verbose=False)
    for row in out["results"]:
        rates = {name: r["tokens_per_s"] for name, r in row["policies"].items()}
        assert set(rates) == {f"fixed-k{k}" for k in range(8)} | {"ema-upstream", "ema-all-depths", "cycle-cost",
                                                                  "oracle", "oracle-saturated"}
        assert row["summary"]["ours_vs_oracle"] == pytest.approx(rates["cycle-cost"] / rates["oracle"])
        best_fixed = max(v for n, v in rates.items() if n.startswith("fixed-"))
        assert rates["oracle"] >= 0.99 * best_fixed, row["scenario"]
        assert rates["cycle-cost"] >= 0.95 * rates["oracle"], row["scenario"]
        assert rates["cycle-cost"] >= 0.95 * best_fixed, row["scenario"]
    moe = out["results"][1]
    assert moe["scenario"] == "drifting-b64-moe"
    # upstream's default candidates at batch >= 64 are [0]: the cost-blind policy cannot draft there
    assert moe["policies"]["ema-upstream"]["chosen_k_by_batch"] == {"64": {"0": moe["policies"]["ema-upstream"]["cycles"]}}
    assert moe["summary"]["ours_vs_ema_upstream"] > 1.5


def test_moe_roofline_cost_shape():
    cost = models.MoERooflineCost()
    batches = (1, 4, 64, 256, 512)
    t = np.array([[cost(k, b) for k in range(8)] for b in batches])
    assert np.all(np.diff(t, axis=1) > 0) and np.all(np.diff(t, axis=0) > 0)
    ratio = t[:, 7] / t[:, 0]
    # more verify rows touch more experts until all 512 are read every step; past that the
    # step turns compute-bound and deep drafts get expensive again
    assert ratio[1] > ratio[2] > ratio[3] and ratio[4] > ratio[3], ratio


def test_h200_measured_cost_curve_is_loaded_and_interpolated():
    import json

    path = os.path.join(ROOT, "benchmark", "results", "2026-11-29-h200-spec_cycle_cost.json")
    with open(path) as f:
        data = json.load(f)
    assert data["device"].startswith("NVIDIA H200") and data["complete"] and data["kda_kernel_impl"] == ["triton"]
    cost = models.MeasuredCost(path)
    rows = {(r["batch"], r["k"]): r["cycle_s"] for r in data["rows"]}
    assert cost(3, 8) == rows[(8, 3)] and cost(0, 64) == rows[(64, 0)]  # grid points: the measurement
    assert cost(5, 12) == pytest.approx((rows[(8, 5)] + rows[(16, 5)]) / 2)  # linear in the batch size
    t = np.array([[cost(k, b) for k in range(8)] for b in (1, 2, 4, 8, 16, 32, 64)])
    assert np.all(np.diff(t, axis=1) > 0) and np.all(np.diff(t, axis=0) > 0)  # more rows cost more
    with pytest.raises(ValueError, match="outside"):
        cost(1, 128)
    assert "h200-k3" in sim.COSTS and any(sc.cost == "h200-k3" for sc in sim.SCENARIOS)


def test_saturated_oracle_beats_per_step_oracle_on_a_mixed_closed_loop():
    # requests that accept little stay longer in a saturated loop; the per-step oracle ignores it
    sc = sim.Scenario("mixed-b16", "mixed", "linear", [(0, 16)])
    cost = sim.COSTS["linear"]
    step = sim.simulate(models.OraclePolicy(cost), sc, 600, 0)["tokens_per_s"]
    saturated = sim.simulate(models.SaturatedOraclePolicy(cost), sc, 600, 0)["tokens_per_s"]
    fixed1 = sim.simulate(models.FixedPolicy(1), sc, 600, 0)["tokens_per_s"]
    assert saturated > step and saturated >= 0.999 * fixed1 and step < fixed1


@pytest.mark.parametrize("slots_key", ["1", "8", "32"])
def test_ema_reimplementation_matches_upstream_decisions(slots_key):
    """Outside oracle: upstream's own AdaptiveSpeculativeParams fed the same accept lengths."""
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    batch = int(slots_key)
    ours = models.UpstreamEmaPolicy(models.UPSTREAM_DEFAULT_SLOTS, initial=3)
    upstream = AdaptiveSpeculativeParams(initial_steps=3)
    rng = np.random.default_rng(batch)
    p = 0.9
    for step in range(400):
        if step % 100 == 0:
            p = 0.95 if p < 0.5 else 0.2  # acceptance swings so the depth moves both ways
        k = upstream.get_steps_for_batch(batch)
        assert ours.choose(batch, [], None) == k, step
        accept = (np.cumprod(rng.random((batch, k)) < p, axis=1).sum(axis=1) if k else np.zeros(batch, int))
        upstream.on_verify_complete(accept.tolist(), batch)
        ours.feedback(accept, k, [], 1.0, batch)


def test_e2e_script_reads_the_controller_log_line():
    from sglang_hybrid.speculative import DepthController

    e2e = _load("e2e_cpu_depth")
    from collections import Counter

    ctl = DepthController(range(4))
    for b, k in [(1, 3), (8, 1)]:
        ctl.record_cycle_cost(k, b, 2e-3 * (k + 1))
    ctl.chosen, ctl.cycles = {1: Counter({3: 2}), 8: Counter({1: 1})}, 3  # this test is about the format
    parsed = e2e.parse_log_line("INFO ... " + ctl.format_log_line())
    assert parsed["cycles"] == 3 and parsed["chosen"] == {k: n for k, n in {1: 1, 3: 2}.items()}
    assert parsed["chosen_by_bucket"] == {1: {3: 2}, 8: {1: 1}}
    assert parsed["cycle_ms"][1][3] == pytest.approx(8.0) and parsed["cycle_ms"][8][1] == pytest.approx(4.0)
    assert len(parsed["acceptance_curve"]) == 3
    assert e2e.diff_hist({1: {3: 5}, 8: {1: 4, 2: 1}}, {1: {3: 5}, 8: {1: 1}}) == {8: {1: 3, 2: 1}}
    with pytest.raises(ValueError, match="line"):
        e2e.parse_log_line("spec depth controller: nothing")


def test_loss_attribution_splits_the_expected_shortfall_by_kind_of_cycle():
    # k* = 1 (expected rate 2 tokens/s); the controller's 5 cycles, 1 s each:
    # 2 warm-up cycles at k*, a probe of k0, a decision for k0, one lucky cycle at k*
    log = [(0, 1, 1, 1.0, 1.0, 2.0), (1, 1, 1, 1.0, 1.0, 2.0), (2, 1, 0, 1.0, 1.0, 1.0),
           (3, 1, 0, 1.0, 1.0, 1.0), (4, 1, 1, 1.0, 1.0, 2.5)]
    decided = [1, 1, 1, 0, 1]
    out = sim.attribute_losses({0: {0: 1.0, 1: 2.0}}, {0: (log, decided)}, warmup=2)
    assert out["k_star"] == 1
    # each loss is (r* T - b E) / (r* x 5 s): probe (2 - 1) / 10, off k* (2 - 1) / 10, at k* (2 - 2.5) / 10
    assert out["warmup"]["loss_share"] == pytest.approx(0.0)
    assert out["probe"]["loss_share"] == pytest.approx(0.1) and out["probe"]["cycle_share"] == pytest.approx(0.2)
    assert out["decided_not_k_star"]["loss_share"] == pytest.approx(0.1)
    assert out["at_k_star"]["loss_share"] == pytest.approx(-0.05)
    assert out["total"]["loss_share"] == pytest.approx(0.15)


def test_decided_depth_tells_probes_apart():
    from sglang_hybrid.speculative import DepthController

    ctl = DepthController(range(4))
    assert ctl.decided_depth(4) is None
    probes = 0
    for _ in range(12):
        k = ctl.choose_depth(4)
        decided = ctl.decided_depth(4)
        if k != decided:  # a probe runs a neighbour of the decided depth, never a far depth
            probes += 1
            assert abs(k - decided) == 1, (k, decided)
        ctl.observe([k] * 4, k)
        ctl.record_cycle_cost(k, 4, 1e-3 * (1 + 0.1 * k))
    assert probes >= 2  # the unmeasured neighbours are profiled first
    assert ctl.decided_depth(64) is None  # another bucket
