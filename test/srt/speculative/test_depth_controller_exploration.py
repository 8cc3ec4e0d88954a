"""Depth controller (issue 7): upper-confidence probes, the saturated-loop objective, empirical-Bayes shrinkage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sglang_hybrid.speculative import AcceptanceEstimator, DepthController, ParametricCycleCost, SyntheticAcceptance

GRID = (np.arange(50) + 0.5) / 50


def _run(ctl, syn, costs, b, steps, rng):
    chosen = []
    for _ in range(steps):
        k = ctl.choose_depth(b)
        chosen.append(k)
        ctl.observe(syn.accept_lengths(k, rng.random(b)), k)
        ctl.record_cycle_cost(k, b, costs(k, b) * math.exp(0.03 * rng.standard_normal()))
    return chosen


def test_upper_confidence_probes_stop_once_the_neighbours_are_known_worse():
    # c = 0.8 per position, b = 8: k = 2 is best; k = 1 and 3 are ~2.7 % worse (beyond the 1 %
    # hysteresis), so they are probed while uncertain; the doubling gap makes that rare later on
    syn = SyntheticAcceptance(np.cumprod([0.8] * 7), benchmark_mode=True)
    costs = ParametricCycleCost(fixed=1e-3, per_draft=0.05e-3, per_row=0.1e-3)
    rates = {k: syn.expected_committed(k) / costs(k, 8) for k in range(8)}
    assert max(rates, key=rates.get) == 2
    assert 0.96 * rates[2] < rates[1] < 0.98 * rates[2] and 0.96 * rates[2] < rates[3] < 0.98 * rates[2]
    ctl = DepthController(range(8), refresh_cycles=0, max_probe_gap=1 << 20)
    chosen = _run(ctl, syn, costs, 8, 600, np.random.default_rng(0))
    assert chosen[100:].count(2) >= 0.95 * 500, {k: chosen.count(k) for k in set(chosen)}
    early, late = 100 - chosen[:100].count(2), 500 - chosen[100:].count(2)
    assert ctl.probes >= 5 and late <= early, (early, late, ctl.probes)
    off = DepthController(range(8), refresh_cycles=0, explore_z=0)
    assert _run(off, syn, costs, 8, 600, np.random.default_rng(0))[100:].count(2) >= 0.95 * 500
    assert off.probes == 0


def test_probes_notice_a_rise_in_acceptance_while_at_depth_zero():
    # at k = 0 nothing about acceptance is learnt between probes of k = 1: they cost a few
    # cycles in a low phase (the gap doubles up to max_probe_gap) and find a rise quickly
    costs = ParametricCycleCost(fixed=1e-3, per_draft=0.1e-3, per_row=0.02e-3)
    low = SyntheticAcceptance([0.02] * 7, benchmark_mode=True)
    high = SyntheticAcceptance(np.cumprod([0.9] * 7), benchmark_mode=True)
    ctl = DepthController(range(8), refresh_cycles=0, max_probe_gap=32)
    rng = np.random.default_rng(1)
    before = _run(ctl, low, costs, 8, 300, rng)
    assert before[-200:].count(0) >= 200 - 200 // 16, before[-200:]
    after = _run(ctl, high, costs, 8, 200, rng)
    found = next((i for i, k in enumerate(after) if k >= 3), None)
    assert found is not None and found <= 40, after[:60]
    assert after[-50:].count(after[-1]) >= 45 and after[-1] >= 5, after[-50:]


def test_saturated_objective_is_the_harmonic_mean_over_arrivals():
    est = AcceptanceEstimator(4, half_life_cycles=math.inf, drift_z=math.inf, adaptive_request_weight=False,
                              request_weight=1e-6)
    rng = np.random.default_rng(0)
    good = SyntheticAcceptance([0.95, 0.9, 0.85, 0.8], benchmark_mode=True)
    bad = SyntheticAcceptance([0.1, 0.01, 0.001, 0.0001], benchmark_mode=True)
    for _ in range(400):
        lengths = np.concatenate([good.sample_accept_lengths(4, 1, rng), bad.sample_accept_lengths(4, 1, rng)])
        est.observe(lengths, 4, ["g", "b"])
    ctl = DepthController(range(5), acceptance=est, explore_z=0)
    step = DepthController(range(5), acceptance=est, explore_z=0, objective="step")
    e = {k: (good.expected_committed(k), bad.expected_committed(k)) for k in range(5)}
    eff = ctl.effective_committed(["g", "b"])
    p = est.survival_per_request(["g", "b"])
    mine = [[1.0 + p[r, :k].sum() for r in range(2)] for k in range(5)]  # the estimator's own E_r(k)
    for k in range(5):  # equal weights: the harmonic mean of the two requests
        assert eff[k] == pytest.approx(2.0 / (1.0 / mine[k][0] + 1.0 / mine[k][1]), rel=1e-9)
        assert eff[k] == pytest.approx(2.0 / (1.0 / e[k][0] + 1.0 / e[k][1]), rel=0.06)  # vs the truth
        assert step.effective_committed(["g", "b"])[k] == pytest.approx(sum(mine[k]) / 2, rel=1e-9)
    # built under k0: weights E_r(k0) (a request's share of the batch is 1 / E_r(k0))
    w = np.array(mine[4])
    eff4 = ctl.effective_committed(["g", "b"], built_under=4)
    assert eff4[2] == pytest.approx(w.sum() / (w[0] / mine[2][0] + w[1] / mine[2][1]), rel=1e-9)
    # a cost curve where the batch mean says "draft 3" and the long-run rate says "draft 1"
    costs = ParametricCycleCost(fixed=1e-3, per_draft=0.0, per_row=0.3e-3)
    # the same from the true acceptance
    assert max(range(5), key=lambda j: sum(e[j]) / costs(j, 2)) == 3
    assert max(range(5), key=lambda j: 2.0 / (1.0 / e[j][0] + 1.0 / e[j][1]) / costs(j, 2)) == 1
    for c in (ctl, step):
        for k in range(5):
            c.record_cycle_cost(k, 2, costs(k, 2))
    assert step.choose_depth(2, ["g", "b"]) == 3
    assert ctl.choose_depth(2, ["g", "b"]) == 1
    # equal requests: both objectives agree
    assert ctl.choose_depth(2) == step.choose_depth(2)


def test_request_weight_follows_the_spread_between_requests():
    def fitted(p_of_request):
        est = AcceptanceEstimator(2, half_life_cycles=math.inf, request_half_life_cycles=math.inf)
        rng = np.random.default_rng(0)
        ids = list(range(32))
        for _ in range(64):
            lengths = (rng.random(32) < np.array([p_of_request(i) for i in ids])).astype(int)
            est.observe(lengths, 1, ids)
        return est.request_weight

    alike = fitted(lambda i: 0.8)  # all requests accept alike: differences are noise
    mixed = fitted(lambda i: 0.9 if i % 2 else 0.2)  # two kinds of request
    # Beta moments: m (1 - m) / v - 1 with v = 0.1225 between (0.9, 0.2) -> ~0.8 -> clipped to 1
    assert alike >= 100 and mixed == pytest.approx(1.0, abs=0.5), (alike, mixed)
    off = AcceptanceEstimator(2, adaptive_request_weight=False)
    off.observe([1, 0] * 16, 1, list(range(32)))
    assert off.request_weight == 4.0


def test_survival_per_request_and_bad_arguments():
    est = AcceptanceEstimator(3, half_life_cycles=math.inf, adaptive_request_weight=False, request_weight=1.0)
    for _ in range(50):
        est.observe([3, 0], 3, ["a", "b"])
    p = est.survival_per_request(["a", "b", "new"])
    assert p.shape == (3, 3)
    assert p[0, 2] > 0.9 and p[1, 0] < 0.1  # each request's own curve
    assert p[2] == pytest.approx(np.cumprod(est.pooled_conditional()))  # unseen: pooled
    assert est.survival(["a", "b"]) == pytest.approx(p[:2].mean(axis=0))
    assert est.survival_se()[0] > 0 and np.all(np.isfinite(est.survival_se()))
    with pytest.raises(ValueError, match="objective"):
        DepthController(range(3), objective="fastest")
    with pytest.raises(ValueError, match="max_probe_gap"):
        DepthController(range(3), max_probe_gap=0)
    with pytest.raises(ValueError, match="explore_z"):
        DepthController(range(3), explore_z=math.inf)
