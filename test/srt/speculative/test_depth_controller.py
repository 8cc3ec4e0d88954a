"""Cycle-cost depth controller (issue 7): the article's 1.12 threshold, the limits, hysteresis, drift.

The acceptance reference of the issue: a_1 + a_2 + a_3 = 2.00 and a_4 = 0.36 (unconditional
rates), i.e. 3.00 committed tokens per cycle at 3 drafts and 3.36 at 4. We use
a = [0.80, 0.66, 0.54, 0.36]. Observations are fed through the estimator (50 requests per
cycle on a quantile grid, so the empirical rates equal a exactly), costs through the table.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sglang_hybrid.speculative import (
    AcceptanceEstimator,
    CycleCostTable,
    CycleTimer,
    DepthController,
    ParametricCycleCost,
    SyntheticAcceptance,
    batch_bucket,
    select_depth,
)
from sglang_hybrid.speculative.acceptance import BENCHMARK_MODE_ENV

REFERENCE = [0.80, 0.66, 0.54, 0.36]
GRID = (np.arange(50) + 0.5) / 50  # quantile grid: #{u < a_i} = 50 * a_i exactly for these a_i
BASE_COSTS = {0: 0.70, 1: 0.80, 2: 0.90, 3: 1.00}  # ms; rates 1.43, 2.25, 2.73, 3.00


def _reference_controller(t4: float, **kw) -> DepthController:
    syn = SyntheticAcceptance(REFERENCE, benchmark_mode=True)
    ctl = DepthController(range(5), refresh_cycles=0, explore_z=0, **kw)  # the decision rule alone
    for _ in range(200):
        ctl.observe(syn.accept_lengths(4, GRID), 4)
    for k, t in {**BASE_COSTS, 4: t4}.items():
        for _ in range(3):
            ctl.record_cycle_cost(k, 8, t * 1e-3)
    return ctl


def test_reference_acceptance_gives_article_committed_tokens():
    syn = SyntheticAcceptance(REFERENCE, benchmark_mode=True)
    assert syn.expected_committed(3) == pytest.approx(3.00)
    assert syn.expected_committed(4) == pytest.approx(3.36)
    committed = _reference_controller(1.11).expected_committed()
    assert committed[3] == pytest.approx(3.00, abs=2e-3)
    assert committed[4] == pytest.approx(3.36, abs=2e-3)


@pytest.mark.parametrize("t4, expected", [(1.11, 4), (1.13, 3), (1.117, 4), (1.123, 3)])
def test_four_drafts_exactly_when_cycle_grows_less_than_12_percent(t4, expected):
    # T(4)/T(3) < 3.36 / 3.00 = 1.12  <=>  4 drafts
    assert _reference_controller(t4).choose_depth(8) == expected


@pytest.mark.parametrize("t4, expected", [(1.1199, 4), (1.1201, 3)])
def test_select_depth_threshold_is_exactly_1_12(t4, expected):
    committed = {0: 1.0, 1: 1.8, 2: 2.46, 3: 3.00, 4: 3.36}
    assert select_depth(committed, {**BASE_COSTS, 4: t4}) == expected


def _near_zero_history(**kw):
    ctl = DepthController(range(8), refresh_cycles=0, **kw)
    costs = ParametricCycleCost(fixed=1e-3, per_draft=0.1e-3, per_row=0.01e-3)
    for k in range(8):
        ctl.record_cycle_cost(k, 16, costs(k, 16))
        ctl.record_cycle_cost(k, 16, costs(k, 16))
    history = []
    for _ in range(100):
        history.append(ctl.choose_depth(16))
        ctl.observe(np.zeros(16, dtype=int), history[-1])
    return history


def test_acceptance_near_zero_chooses_no_drafts():
    history = _near_zero_history(explore_z=0)  # the decision rule alone
    assert history[0] > 0  # the prior (c_1 = 0.5) makes drafting look worth a try
    assert set(history[3:]) == {0}, history  # then no speculation tax
    # with the upper-confidence probes: k = 1 is looked at while c_1 is uncertain, then rarely
    probing = _near_zero_history()
    assert set(probing[3:]) <= {0, 1} and probing[3:].count(1) <= 6 and probing[-20:].count(1) <= 1, probing


def test_acceptance_near_one_with_cheap_verify_chooses_k_max():
    ctl = DepthController([0, 1, 3, 5, 7])
    cheap = ParametricCycleCost(fixed=1e-3, per_draft=0.01e-3, per_row=0.001e-3)
    for _ in range(60):
        k = ctl.choose_depth(4)
        ctl.observe(np.full(4, k), k)  # every draft accepted
        ctl.record_cycle_cost(k, 4, cheap(k, 4))
    assert ctl.choose_depth(4) == 7
    assert ctl.expected_committed()[7] > 7.5


def test_best_depth_falls_as_batch_grows():
    # verify cost grows with batch x (k + 1) rows (issue 7); acceptance c = 0.8 per position
    ctl = DepthController(range(8), refresh_cycles=0, explore_z=0)
    syn = SyntheticAcceptance(np.cumprod([0.8] * 7), benchmark_mode=True)
    for _ in range(100):
        ctl.observe(syn.accept_lengths(7, GRID), 7)
    costs = ParametricCycleCost(fixed=1e-3, per_draft=0.1e-3, per_row=0.02e-3)
    chosen = []
    for b in (1, 8, 32, 128):
        for k in range(8):
            ctl.record_cycle_cost(k, b, costs(k, b))
            ctl.record_cycle_cost(k, b, costs(k, b))
        chosen.append(ctl.choose_depth(b))
    assert chosen == sorted(chosen, reverse=True) and chosen[0] >= 4 and chosen[-1] <= 1, chosen


def test_hysteresis_keeps_depth_until_the_margin_is_exceeded():
    def last_cycle_table():  # each cell holds its last cycle: the test moves T(4) alone
        return CycleCostTable(range(5), smoothing=0.0, shape_memory=1)

    ctl = _reference_controller(1.13, hysteresis=0.02, costs=last_cycle_table())
    assert ctl.choose_depth(8) == 3
    for t4, expected in [(1.11, 3), (1.10, 3), (1.08, 4), (1.13, 4), (1.14, 4), (1.15, 3)]:
        # up needs rate(4)/rate(3) = 1.12 / T4 > 1.02, i.e. T4 < 1.098: 1.11 and 1.10 stay, 1.08
        # moves; down needs rate(3)/rate(4) = T4 / 1.12 > 1.02, i.e. T4 > 1.142: 1.13 and 1.14
        # stay, 1.15 moves
        for _ in range(60):  # let the cost EMA converge
            ctl.record_cycle_cost(4, 8, t4 * 1e-3)
        assert ctl.choose_depth(8) == expected, t4
    flappy = _reference_controller(1.13, hysteresis=0.0, costs=last_cycle_table())
    assert flappy.choose_depth(8) == 3
    for _ in range(60):
        flappy.record_cycle_cost(4, 8, 1.11e-3)
    assert flappy.choose_depth(8) == 4  # without hysteresis a 0.9 % edge already switches


def test_local_profile_and_refresh_probe_only_neighbours():
    ctl = DepthController(range(8), refresh_cycles=50)
    syn = SyntheticAcceptance(np.cumprod([0.8] * 7), benchmark_mode=True)
    costs = ParametricCycleCost(fixed=1e-3, per_draft=0.1e-3, per_row=0.02e-3)  # best at b=128: k=1
    chosen = []
    for _ in range(300):
        k = ctl.choose_depth(128)
        chosen.append(k)
        ctl.observe(syn.accept_lengths(k, GRID), k)
        ctl.record_cycle_cost(k, 128, costs(k, 128))
    counts = {k: chosen.count(k) for k in set(chosen)}
    assert max(counts, key=counts.get) == 1 and counts[1] > 270, counts
    assert 4 not in counts and 7 not in counts, counts  # a large batch never pays for deep drafts
    assert counts[0] >= 3 and counts[2] >= 3, counts  # profiled, then refreshed every ~50 steps


def test_decay_follows_drift_and_no_decay_does_not():
    grid16 = (np.arange(16) + 0.5) / 16

    def run(**kw):
        ctl = DepthController(range(5), acceptance=AcceptanceEstimator(4, **kw), refresh_cycles=0, explore_z=0)
        for k, t in {**BASE_COSTS, 4: 1.05}.items():
            ctl.record_cycle_cost(k, 16, t * 1e-3)
            ctl.record_cycle_cost(k, 16, t * 1e-3)
        high = SyntheticAcceptance(REFERENCE, benchmark_mode=True)
        for _ in range(300):
            ctl.observe(high.accept_lengths(4, grid16), 4)
        history = []
        for _ in range(80):  # acceptance collapses: every draft rejected
            history.append(ctl.choose_depth(16))
            ctl.observe(np.zeros(16, dtype=int), history[-1])
        return history

    # k = 0 pays once c_1 < ~0.14: with a 20-cycle half-life that takes ~2.5 half-lives
    decayed = run(half_life_cycles=20.0, drift_z=math.inf)
    assert decayed[:20] == [4] * 20 and 40 <= decayed.index(0) <= 70 and decayed[-1] == 0, decayed
    detected = run(half_life_cycles=20.0)  # default change detection (fast half-life 4, 4 sigma)
    assert detected[0] == 4 and detected.index(0) <= 25 and set(detected[25:]) == {0}, detected
    frozen = run(half_life_cycles=math.inf, drift_z=math.inf)
    assert frozen == [4] * 80  # 300 old cycles outweigh 80 new ones without decay


def test_estimator_handles_censoring_like_a_product_limit_estimator():
    # Cycles at depths 1, 2 and 4 mixed; a naive "fraction with L >= i" would be biased low
    # for i > 1 because shallow cycles cannot accept deep positions.
    syn = SyntheticAcceptance(REFERENCE, benchmark_mode=True)
    est = AcceptanceEstimator(4, half_life_cycles=math.inf, drift_z=math.inf)
    rng = np.random.default_rng(0)
    naive_hits = np.zeros(4)
    n = 0
    for i in range(1500):
        k = (1, 2, 4)[i % 3]
        lengths = syn.sample_accept_lengths(k, 16, rng)
        est.observe(lengths, k)
        naive_hits += [(lengths >= j).sum() for j in range(1, 5)]
        n += lengths.size
    np.testing.assert_allclose(est.survival(), REFERENCE, atol=0.015)
    assert naive_hits[3] / n < REFERENCE[3] - 0.1


def test_per_request_estimates_separate_requests():
    est = AcceptanceEstimator(3, half_life_cycles=math.inf, drift_z=math.inf)
    for _ in range(100):
        est.observe([3, 0], 3, request_ids=["good", "bad"])
    assert est.survival(["good"])[2] > 0.9
    assert est.survival(["bad"])[0] < 0.1
    assert est.survival()[0] == pytest.approx(0.5, abs=0.01)  # pooled
    assert est.survival(["new"])[0] == pytest.approx(0.5, abs=0.01)  # unseen request: pooled curve


def test_synthetic_acceptance_is_benchmark_only_and_validated(monkeypatch):
    monkeypatch.delenv(BENCHMARK_MODE_ENV, raising=False)
    with pytest.raises(ValueError, match="benchmark-only"):
        SyntheticAcceptance(REFERENCE)
    with pytest.raises(ValueError, match="non-increasing"):
        SyntheticAcceptance([0.5, 0.6], benchmark_mode=True)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        SyntheticAcceptance([1.2, 0.5], benchmark_mode=True)
    with pytest.raises(ValueError, match="non-empty"):
        SyntheticAcceptance([], benchmark_mode=True)
    monkeypatch.setenv(BENCHMARK_MODE_ENV, "1")
    syn = SyntheticAcceptance(REFERENCE)
    lengths = syn.sample_accept_lengths(4, 200_000, np.random.default_rng(1))
    np.testing.assert_allclose([(lengths >= i).mean() for i in range(1, 5)], REFERENCE, atol=0.005)


def test_bad_inputs_raise_value_errors_naming_the_argument():
    est = AcceptanceEstimator(4)
    with pytest.raises(ValueError, match="accept_lengths"):
        est.observe([3], 2)
    with pytest.raises(ValueError, match="depth"):
        est.observe([0], 5)
    with pytest.raises(ValueError, match="request_ids"):
        est.observe([0, 1], 2, request_ids=["a"])
    with pytest.raises(ValueError, match="batch_size"):
        batch_bucket(0)
    with pytest.raises(ValueError, match="seconds"):
        CycleCostTable([0, 1]).record(1, 4, -1.0)
    with pytest.raises(ValueError, match="depths"):
        DepthController([0])


def test_cost_table_buckets_prior_scaling_and_outlier_clip():
    assert [batch_bucket(b) for b in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    prior = ParametricCycleCost(fixed=1.0, per_draft=0.5, per_row=0.0)
    table = CycleCostTable([0, 1, 2], prior)
    table.record(0, 4, 2.0)  # measured 2x the prior in bucket 4
    assert table.estimate(2, 3) == pytest.approx(2.0 * prior(2, 4))  # unmeasured: prior x bucket scale
    table.record(0, 4, 100.0)  # a stall: clipped to 3x the estimate (log residual log 3)
    shape = math.log(2.0) + 0.5 * math.log(3.0)  # running mean of the 2 cycles' residuals
    level = 0.5 * (math.log(6.0) - shape)  # the level takes half of what is left
    assert table.estimate(0, 4) == pytest.approx(math.exp(level + shape))
    assert table.as_dict()["4"]["0"]["cycles"] == 2
    # a depth's first cycle in a measured bucket is clipped like any stall, against its prior-scaled estimate
    predicted = table.estimate(1, 4)
    table.record(1, 4, 1000.0)
    assert table.estimate(1, 4) == pytest.approx(3.0 * predicted)


def test_cost_level_moves_all_depths_and_shape_keeps_long_memory():
    table = CycleCostTable([0, 1])  # level smoothing 0.5, shape memory 200 cycles
    rng = np.random.default_rng(0)
    for _ in range(50):  # both depths measured with 3 % noise: T(1) / T(0) = 1.2
        table.record(0, 8, 1.0 * math.exp(0.03 * rng.standard_normal()))
        table.record(1, 8, 1.2 * math.exp(0.03 * rng.standard_normal()))
    assert table.estimate(1, 8) / table.estimate(0, 8) == pytest.approx(1.2, rel=0.015)
    for _ in range(60):  # then only depth 0 runs, and everything gets 1.5x slower (longer context)
        table.record(0, 8, 1.5 * math.exp(0.03 * rng.standard_normal()))
    # depth 1, not run since, follows through the bucket level; the ratio keeps its long
    # average (the running depth's shape soaks up ~2 % of the jump before the level has it).
    # A per-cell EMA would leave depth 1 at 1.2 (a ratio of 0.8).
    assert table.estimate(0, 8) == pytest.approx(1.5, rel=0.06)  # the level: about one cycle's noise
    assert table.estimate(1, 8) == pytest.approx(1.8, rel=0.08)
    assert table.estimate(1, 8) / table.estimate(0, 8) == pytest.approx(1.2, rel=0.025)
    assert table.log_se(1, 8) == pytest.approx(table.noise / math.sqrt(50))
    assert 0.02 < table.noise < 0.06 and table.log_se(1, 16) == math.inf


def test_unmeasured_bucket_interpolates_between_measured_buckets():
    prior = ParametricCycleCost(fixed=1.0, per_draft=0.0, per_row=0.0)  # 1 s everywhere
    table = CycleCostTable([0, 1], prior)
    table.record(0, 4, 2.0)  # bucket 4: 2x the prior
    table.record(0, 64, 8.0)  # bucket 64: 8x the prior
    assert table.estimate(1, 16) == pytest.approx(2.0 ** 2)  # log-linear in log2(bucket): midway
    assert table.estimate(1, 1) == pytest.approx(2.0)  # below every measured bucket: the nearest
    assert table.estimate(1, 256) == pytest.approx(8.0)


def test_wall_clock_timer_attributes_intervals_to_decode_steps():
    ticks = iter([0.0, 1.0, 3.0, 3.5, 6.0])
    timer = CycleTimer(clock=lambda: next(ticks))
    timer.mark((2, 4))
    timer.mark((3, 4))
    timer.mark(None)  # a prefill step: its interval is not a decode cycle
    timer.mark((1, 8))
    assert timer.collect() == [((2, 4), 1.0), ((3, 4), 2.0)]
    timer.mark((1, 8))
    assert timer.collect() == [((1, 8), 2.5)]


def test_metrics_and_log_line_report_histogram_curve_and_costs():
    ctl = _reference_controller(1.11)
    for _ in range(5):
        ctl.choose_depth(8)
    m = ctl.metrics()
    assert m["chosen_depth_histogram"]["4"] == 5
    assert m["acceptance_curve"] == pytest.approx(REFERENCE, abs=2e-3)
    assert m["cycle_cost_s"]["8"]["4"]["seconds"] == pytest.approx(1.11e-3)
    line = ctl.format_log_line()
    assert "chosen k [4:5]" in line and "by bucket [b8 4:5]" in line and "k4=1.11" in line


def test_change_detection_is_quiet_while_stationary_and_fires_within_a_few_cycles_of_a_jump():
    # 3,000 stationary cycles of 8 requests (c_i = 0.9 * 0.97^(i-1), depth 4): at 4 standard
    # errors no reset may fire; then c_1 falls to 0.35 and a reset must follow within 5 cycles.
    rng = np.random.default_rng(7)
    est = AcceptanceEstimator(4)
    plain = AcceptanceEstimator(4, drift_z=math.inf)  # same data, decay only

    def feed(p):
        c = p * 0.97 ** np.arange(4)
        lengths = np.cumprod(rng.random((8, 4)) < c, axis=1).sum(axis=1)
        est.observe(lengths, 4)
        plain.observe(lengths, 4)

    for _ in range(3000):
        feed(0.9)
    assert est.resets == 0
    assert est.survival()[0] == pytest.approx(0.9, abs=0.03)
    for n in range(1, 6):
        feed(0.35)
        if est.resets:
            break
    assert est.resets == 1, n
    # the slow counts restarted from the fast ones (half-life 4): the estimate has moved far
    # more than the 40-cycle decay alone moves it in the same cycles
    assert est.survival()[0] < plain.survival()[0] - 0.1, (est.survival()[0], plain.survival()[0], n)
