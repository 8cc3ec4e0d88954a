"""Closed-loop simulator of the speculative-depth controller (issue 7, "Benchmark").

    .venv/bin/python benchmark/spec/controller_sim.py            # full run (minutes, 2-core CPU)
    .venv/bin/python benchmark/spec/controller_sim.py --quick    # tiny version (used by the tests)

For each scenario (acceptance trace x cycle-cost curve x concurrency) it replays the same
closed-loop stream of requests (same request lengths, acceptance and one uniform per
token position of each request: common random numbers) under every fixed depth k = 0..7, upstream's EMA policy (reimplemented from
its documented behaviour; with upstream's default per-batch-size candidates and with all
depths at every batch size), our cycle-cost controller and the per-step oracle, for the
same simulated time, and prints committed tokens/s with ratios to the oracle, the best
fixed depth and the EMA policies measured in the same run. Cycle times seen by the
controller carry 3 % log-normal noise. Writes ``benchmark/results/spec_controller_sim.json``.

Cost curves: ``linear`` and ``flat`` (parametric), ``moe-roofline`` (sim_models.MoERooflineCost,
a roofline model whose bandwidth is the H200 copy ceiling we measured) and ``h200-k3``: the
table measured on one H200 by benchmark/spec/bench_cycle_cost_h200.py (our KDA verify kernel
under CUDA-graph replay plus a BF16 matmul model of the Kimi K3 TP8 target step and an MTP-style
draft layer; ``benchmark/results/2026-11-29-h200-spec_cycle_cost.json``), interpolated in batch size.

Every scenario runs under ``--seeds`` (default 0-5: different request streams and draws);
the summary ratios are the mean over seeds (``*_min``: the worst seed, ``*_sd``: the spread
over seeds), the goals are checked on the means. On the stationary scenarios with
homogeneous requests the controller's expected loss against the best fixed depth is split
into warm-up, probes and decisions off the best depth (:func:`attribute_losses`). ``oracle-saturated`` (the per-step best for a saturated closed loop, true
acceptance; sim_models.SaturatedOraclePolicy) is reported beside the issue's per-step oracle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(_HERE, "..", "..", "python"))

from sim_models import (  # noqa: E402
    DEPTHS,
    FLAT_SLOTS,
    K_MAX,
    UPSTREAM_DEFAULT_SLOTS,
    AcceptanceTrace,
    ControllerPolicy,
    FixedPolicy,
    LinearCost,
    MeasuredCost,
    MoERooflineCost,
    OraclePolicy,
    SaturatedOraclePolicy,
    UpstreamEmaPolicy,
)

from sglang_hybrid.speculative import DepthController  # noqa: E402

COSTS: Dict[str, Callable[[int, int], float]] = {
    "linear": LinearCost(fixed=1.0e-3, per_draft=0.12e-3, per_row=0.02e-3),
    "flat": LinearCost(fixed=1.0e-3, per_draft=0.05e-3, per_row=0.001e-3),
    "moe-roofline": MoERooflineCost(),
    "h200-k3": MeasuredCost(os.path.join(_HERE, "..", "results", "2026-11-29-h200-spec_cycle_cost.json")),
}


@dataclass
class Scenario:
    name: str
    trace: str
    cost: str
    concurrency: List[Tuple[float, int]]  # [(fraction of the run, concurrency from then on)]
    tags: List[str] = field(default_factory=list)
    drift_cycles: int = 300  # drifting phase length, in cycles of depth 2 at the first concurrency

    def concurrency_at(self, frac: float) -> int:
        b = self.concurrency[0][1]
        for start, value in self.concurrency:
            if frac >= start:
                b = value
        return b


SCENARIOS = [
    Scenario("high-b4-linear", "high", "linear", [(0, 4)]),
    Scenario("low-b4-linear", "low", "linear", [(0, 4)]),
    Scenario("mixed-b16-linear", "mixed", "linear", [(0, 16)]),
    Scenario("drifting-b8-linear", "drifting", "linear", [(0, 8)], ["drifting"]),
    Scenario("high-b1-flat", "high", "flat", [(0, 1)]),
    Scenario("high-b64-linear", "high", "linear", [(0, 64)], ["large-batch"]),
    Scenario("drifting-b64-moe", "drifting", "moe-roofline", [(0, 64)], ["drifting", "large-batch"]),
    Scenario("mixed-b128-moe", "mixed", "moe-roofline", [(0, 128)], ["large-batch"]),
    Scenario("ramp-1-128-linear", "high", "linear", [(0, 1), (0.2, 8), (0.4, 32), (0.6, 128), (0.8, 4)],
             ["batch-varies"]),
    Scenario("high-b8-h200k3", "high", "h200-k3", [(0, 8)]),
    Scenario("drifting-b32-h200k3", "drifting", "h200-k3", [(0, 32)], ["drifting", "large-batch"]),
    Scenario("mixed-b64-h200k3", "mixed", "h200-k3", [(0, 64)], ["large-batch"]),
    Scenario("ramp-1-64-h200k3", "high", "h200-k3", [(0, 1), (0.25, 8), (0.5, 64), (0.75, 2)], ["batch-varies"]),
]


def make_policies(cost):
    policies = [FixedPolicy(k) for k in DEPTHS]
    policies.append(UpstreamEmaPolicy(UPSTREAM_DEFAULT_SLOTS, name="ema-upstream"))
    policies.append(UpstreamEmaPolicy(FLAT_SLOTS, name="ema-all-depths"))
    policies.append(ControllerPolicy(DepthController(DEPTHS)))
    policies.append(OraclePolicy(cost))
    policies.append(SaturatedOraclePolicy(cost))
    return policies


def simulate(policy, scenario: Scenario, cycles: int, seed: int, noise: float = 0.03, log=None) -> dict:
    """Run ``policy`` for the simulated time that ``cycles`` cycles of depth 2 take at the first concurrency.

    Common random numbers: request ``n`` of a seed has the same acceptance parameters, length
    and one uniform ``u[j]`` per token position ``j`` under every policy; the draft that would
    become token ``j`` is accepted iff ``u[j] < c_i`` (``i``: its place in the draft), so two
    policies drafting the same token see the same draw. ``log``: a list that gets one tuple
    ``(t, batch, k, seconds, true_seconds, true_E_committed)`` per cycle.
    """
    cost = COSTS[scenario.cost]
    b0 = scenario.concurrency[0][1]
    duration = cycles * cost(2, b0)
    trace = AcceptanceTrace(scenario.trace, period_s=scenario.drift_cycles * cost(2, b0))
    b_max = max(b for _, b in scenario.concurrency)
    max_len = 384
    req_rng = np.random.default_rng([seed, 1])  # request stream: identical for every policy
    noise_rng = np.random.default_rng([seed, 2])
    # per slot: uniforms for every cycle of its current request (common random numbers)
    slot_u = np.zeros((b_max, max_len + K_MAX + 1))
    slot_p, slot_rho = np.zeros(b_max), np.zeros(b_max)
    slot_left = np.zeros(b_max, dtype=np.int64)
    slot_pos = np.zeros(b_max, dtype=np.int64)  # tokens committed so far
    slot_uid = np.zeros(b_max, dtype=np.int64)
    next_uid = 0

    def start_request(s):
        nonlocal next_uid
        p, rho = trace.new_request(req_rng)
        slot_p[s], slot_rho[s] = p, rho
        slot_left[s] = req_rng.integers(64, max_len + 1)
        slot_u[s] = np.random.default_rng([seed, 3, next_uid]).random(max_len + K_MAX + 1)
        slot_pos[s] = 0
        slot_uid[s] = next_uid
        next_uid += 1

    active = 0
    t, tokens, n_cycles = 0.0, 0, 0
    hist: Dict[int, Dict[int, int]] = {}
    while t < duration:
        b = scenario.concurrency_at(t / duration)
        while active < b:
            start_request(active)
            active += 1
        active = min(active, b)  # a falling concurrency retires the newest slots
        sl = slice(0, active)
        c = trace.conditional(slot_p[sl], slot_rho[sl], t)
        rids = slot_uid[sl].tolist()
        k = policy.choose(active, rids, c)
        if k:  # the draft for token position j of a request is tested against that request's u[j]
            u = slot_u[np.arange(active)[:, None], slot_pos[sl, None] + np.arange(k)[None, :]]
            accept = np.cumprod(u < c[:, :k], axis=1).sum(axis=1)
        else:
            accept = np.zeros(active, dtype=np.int64)
        seconds = cost(k, active) * float(np.exp(noise * noise_rng.standard_normal()))
        policy.feedback(accept, k, rids, seconds, active)
        committed = accept + 1
        tokens += int(committed.sum())
        t += seconds
        n_cycles += 1
        hist.setdefault(active, {}).setdefault(k, 0)
        hist[active][k] += 1
        if log is not None:
            log.append((t, active, k, seconds, float(cost(k, active)),
                        float(np.cumprod(c[:, :k], axis=1).sum(axis=1).mean()) + 1.0 if k else 1.0))
        slot_left[sl] -= committed
        slot_pos[sl] += committed
        for s in np.nonzero(slot_left[sl] <= 0)[0]:
            start_request(int(s))
    return {"tokens_per_s": tokens / t, "tokens": tokens, "seconds": t, "cycles": n_cycles,
            "chosen_k_by_batch": {str(b): {str(k): n for k, n in sorted(h.items())} for b, h in sorted(hist.items())}}


RATIOS = {"ours_vs_oracle": "oracle", "ours_vs_oracle_saturated": "oracle-saturated",
          "ours_vs_ema_upstream": "ema-upstream", "ours_vs_ema_all_depths": "ema-all-depths"}


def summarize(per_seed: Dict[int, Dict[str, float]]) -> dict:
    """Ratios of ``cycle-cost`` to the references, mean over seeds, worst seed and spread.

    Two readings of "the best fixed depth": per seed the best of the fixed depths *on that
    seed* (``ours_vs_best_fixed``: the stricter, it picks with hindsight of the seed's noise)
    and one depth for the scenario, the one with the highest mean rate over the seeds
    (``ours_vs_best_fixed_depth``: a fixed policy chosen in advance, compared seed by seed).
    """
    ratios: Dict[str, List[float]] = {}
    fixed_names = [n for n in next(iter(per_seed.values())) if n.startswith("fixed-")]
    depth = max(fixed_names, key=lambda n: float(np.mean([rates[n] for rates in per_seed.values()])))
    for rates in per_seed.values():
        ratios.setdefault("ours_vs_best_fixed_depth", []).append(rates["cycle-cost"] / rates[depth])
    best_fixed_names = []
    for rates in per_seed.values():
        fixed = {n: v for n, v in rates.items() if n.startswith("fixed-")}
        best = max(fixed, key=fixed.get)
        best_fixed_names.append(best)
        ratios.setdefault("ours_vs_best_fixed", []).append(rates["cycle-cost"] / fixed[best])
        for key, ref in RATIOS.items():
            ratios.setdefault(key, []).append(rates["cycle-cost"] / rates[ref])
        ratios.setdefault("oracle_vs_ema_upstream", []).append(rates["oracle"] / rates["ema-upstream"])
    out = {key: float(np.mean(v)) for key, v in ratios.items()}
    out.update({f"{key}_min": float(np.min(v)) for key, v in ratios.items()})
    out.update({f"{key}_sd": float(np.std(v)) for key, v in ratios.items()})
    out["best_fixed"] = max(set(best_fixed_names), key=best_fixed_names.count)
    out["best_fixed_depth"] = depth
    return out


def attribute_losses(expected_rates: Dict[int, Dict[int, float]], logs: Dict[int, tuple], warmup: int = 100) -> dict:
    """Where ``cycle-cost`` loses to the best fixed depth ``k*`` of a stationary scenario, in expectation.

    ``k*``: the fixed depth with the highest mean *expected* rate ``r*`` (sum of batch x true
    E[committed | k] over true cycle time). A controller cycle of true time ``T`` and expected
    yield ``b E`` loses ``r* T - b E`` tokens against ``k*``; the shares of ``r* x total time`` are
    summed per kind of cycle: the first ``warmup`` cycles, probes (a neighbour run instead of
    the decided depth), decided depth != ``k*`` (estimate noise near a decision boundary), and
    cycles at ``k*`` (about 0: batch-composition noise). Expectations, so seed luck cancels;
    meaningful for homogeneous requests (with mixed requests the batch composition itself
    depends on the policy).
    """
    depths = sorted(next(iter(expected_rates.values())))
    k_star = max(depths, key=lambda k: float(np.mean([r[k] for r in expected_rates.values()])))
    parts: Dict[str, List[List[float]]] = {}
    for seed, (log, decided) in logs.items():
        _, b, k, _, t_true, e_true = (np.array(col) for col in zip(*log))
        decided = np.array(decided)
        r_star = expected_rates[seed][k_star]
        loss = (r_star * t_true - b * e_true) / (r_star * t_true.sum())
        early = np.arange(k.size) < warmup
        probe = (k != decided) & ~early
        kinds = {"warmup": early, "probe": probe, "decided_not_k_star": (decided != k_star) & ~probe & ~early,
                 "at_k_star": (decided == k_star) & ~probe & ~early}
        for name, mask in kinds.items():
            parts.setdefault(name, []).append([float(mask.mean()), float(loss[mask].sum())])
        parts.setdefault("total", []).append([1.0, float(loss.sum())])
    return {"k_star": k_star, "warmup_cycles": warmup,
            **{name: {"cycle_share": float(np.mean([v[0] for v in vals])),
                      "loss_share": float(np.mean([v[1] for v in vals])),
                      "loss_share_sd": float(np.std([v[1] for v in vals]))} for name, vals in parts.items()}}


def run(cycles: int = 2500, scenarios=None, seeds=(0,), verbose: bool = True) -> dict:
    scenarios = SCENARIOS if scenarios is None else scenarios
    results = []
    for sc in scenarios:
        t0 = time.perf_counter()
        rows, per_seed, expected, logs = {}, {}, {}, {}
        for seed in seeds:
            for policy in make_policies(COSTS[sc.cost]):
                log: list = []
                r = simulate(policy, sc, cycles, seed, log=log)
                per_seed.setdefault(seed, {})[policy.name] = r["tokens_per_s"]
                if isinstance(policy, FixedPolicy):
                    _, b, _, _, t_true, e_true = (np.array(col) for col in zip(*log))
                    expected.setdefault(seed, {})[policy.k] = float((b * e_true).sum() / t_true.sum())
                elif isinstance(policy, ControllerPolicy):
                    logs[seed] = (log, policy.decided)
                if seed == seeds[0]:
                    rows[policy.name] = r
        summary = summarize(per_seed)
        if sc.trace in ("high", "low") and len(sc.concurrency) == 1:  # stationary, homogeneous requests
            summary["loss_attribution"] = attribute_losses(expected, logs)
        results.append({"scenario": sc.name, "trace": sc.trace, "cost": sc.cost,
                        "concurrency": sc.concurrency, "tags": sc.tags, "summary": summary,
                        "tokens_per_s_by_seed": {str(k): v for k, v in per_seed.items()},
                        "policies": rows, "wall_s": time.perf_counter() - t0})
        if verbose:
            print(f"{sc.name:22s} ours/oracle {summary['ours_vs_oracle']:.4f}  ours/best-fixed "
                  f"({summary['best_fixed']}) {summary['ours_vs_best_fixed']:.4f} (min {summary['ours_vs_best_fixed_min']:.4f}"
                  f" sd {summary['ours_vs_best_fixed_sd']:.4f})  ours/{summary['best_fixed_depth']} "
                  f"{summary['ours_vs_best_fixed_depth']:.4f}"
                  f"  ours/ema-upstream {summary['ours_vs_ema_upstream']:.3f}  oracle/ema-upstream "
                  f"{summary['oracle_vs_ema_upstream']:.3f}  ours/oracle-saturated {summary['ours_vs_oracle_saturated']:.4f}"
                  f"   [{time.perf_counter() - t0:.1f} s]", flush=True)
    return {"results": results, "goals": check_goals(results)}


def check_goals(results) -> dict:
    """Issue 7's goals, each with the scenarios that miss it."""
    def misses(pred):
        return [r["scenario"] for r in results if not pred(r)]

    tagged = [r for r in results if {"drifting", "large-batch"} & set(r["tags"])]
    return {
        "within_3pct_of_oracle": {"missed": misses(lambda r: r["summary"]["ours_vs_oracle_min"] >= 0.97)},
        "at_least_best_fixed": {"missed": misses(lambda r: r["summary"]["ours_vs_best_fixed"] >= 1.0)},
        "at_least_best_fixed_depth_chosen_over_seeds": {
            "missed": misses(lambda r: r["summary"]["ours_vs_best_fixed_depth"] >= 1.0)},
        "10pct_above_ema_upstream_on_drifting_and_large_batch": {
            "missed": [r["scenario"] for r in tagged if r["summary"]["ours_vs_ema_upstream"] < 1.10],
            # where even the per-step oracle (true acceptance) is < 10 % above the EMA policy
            "unreachable_even_for_oracle": [r["scenario"] for r in tagged
                                            if r["summary"]["oracle_vs_ema_upstream"] < 1.10]},
        "10pct_above_ema_all_depths_on_drifting_and_large_batch": {
            "missed": [r["scenario"] for r in tagged if r["summary"]["ours_vs_ema_all_depths"] < 1.10]},
    }


def _controller_settings() -> dict:
    c = DepthController(DEPTHS)
    a = c.acceptance
    return {"hysteresis": c.hysteresis, "profile_cycles": c.profile_cycles, "refresh_cycles": c.refresh_cycles,
            "explore_z": c.explore_z, "objective": c.objective,
            "half_life_cycles": a.half_life_cycles, "drift_z": a.drift_z, "prior_accept": a.prior_accept,
            "prior_weight": a.prior_weight, "request_weight": a.request_weight,
            "adaptive_request_weight": a.adaptive_request_weight, "cost_level_smoothing": c.costs.smoothing,
            "cost_shape_memory": c.costs.shape_memory}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2500, help="run length in cycles of depth 2")
    ap.add_argument("--seeds", default="0,1,2,3,4,5", help="comma list of seeds (request streams and draws)")
    ap.add_argument("--quick", action="store_true", help="3 scenarios x 300 cycles (test)")
    ap.add_argument("--out", default=os.path.join(_HERE, "..", "results", "spec_controller_sim.json"))
    args = ap.parse_args(argv)
    scenarios = [SCENARIOS[i] for i in (0, 3, 6)] if args.quick else SCENARIOS
    cycles = 300 if args.quick else args.cycles
    t0 = time.perf_counter()
    seeds = tuple(int(x) for x in args.seeds.split(","))
    out = run(cycles, scenarios, seeds[:1] if args.quick else seeds)
    out["manifest"] = {
        "command": " ".join(["benchmark/spec/controller_sim.py"] + (argv if argv is not None else sys.argv[1:])),
        "cycles": cycles, "seeds": list(seeds), "cost_noise": 0.03, "depths": DEPTHS,
        "controller": _controller_settings(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, python {platform.python_version()}",
        "wall_s": time.perf_counter() - t0,
        "note": "simulation; cost curves: parametric, roofline model, and the h200-k3 table (measured parts "
                "+ matmul model, benchmark/results/2026-11-29-h200-spec_cycle_cost.json)",
    }
    for goal, v in out["goals"].items():
        print(f"goal {goal}: " + ("met" if not v["missed"] else f"MISSED on {v['missed']}"))
    if not args.quick:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {os.path.relpath(args.out)} ({out['manifest']['wall_s']:.1f} s)")
    return out


if __name__ == "__main__":
    main()
