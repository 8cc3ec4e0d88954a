"""Speculative depth by cycle cost: choose the draft depth that commits the most tokens per second.

Issue 7 (and seeds-digest item 11). Before each decode step, for the running batch,

    rate(k) = E[committed | k] / T(k, batch),   E[committed | k] = 1 + sum_{i<=k} P_i,

over the draft depths ``k`` whose graphs / buffers exist (``k = 0`` commits one token with
no draft cost). ``P_i`` comes from :class:`~.acceptance.AcceptanceEstimator`, ``T`` from
:class:`~.cycle_cost.CycleCostTable`. The controller moves to the argmax only when it
beats the current depth of that batch-size bucket by more than ``hysteresis`` (relative),
so ``k`` does not flap on noise.

Objective under saturation (``objective="saturated"``, the default). Per-step
``E[committed | k]`` (the batch mean) is the right numerator for one step, but not for the
long run of a saturated server (fixed concurrency: a finished request is replaced at once).
There a request with acceptance ``E_r(k)`` stays ``L_r / E_r(k)`` cycles, so requests that
accept little pile up in the batch and the sustained rate is ``b / (T(k) * E_arr[1 / E_r(k)])``,
a harmonic mean over *arriving* requests. With per-request estimates we use
``E_eff(k) = sum_r w_r / sum_r (w_r / E_r(k))``, ``w_r = E_r(k_0)`` (``k_0``: the depth the batch
was built under; a request's share of the batch is ``∝ 1 / E_r(k_0)``, so ``w_r`` undoes it and
gives every arrival the same weight). Equal requests give the batch mean back. In the
simulator a per-step oracle with the true acceptance loses up to 1.1 % to the best fixed
depth on mixed-acceptance traces and this objective with the same true acceptance does not
(docs/speculative.md). ``objective="step"``: the batch mean.

Exploration (local, so a large batch never pays for its deepest depths). Only the
neighbours of the chosen depth (``k + 1``, ``k - 1`` in the available list) are ever run
instead of it:

* *profile*: a neighbour never measured in the bucket is run (at most ``profile_cycles``
  times), so the search climbs the measured rate curve; a depth never measured is costed
  as the prior scaled by the bucket's (else the neighbouring buckets') measured cells;
* *upper confidence*: a neighbour is run when its rate could still beat the chosen one,
  ``log rate(j) - log rate(k) + explore_z * se > 0``, where ``se`` combines the standard
  errors of the two cells' costs (:meth:`~.cycle_cost.CycleCostTable.log_se`) and of the
  acceptance of the draft positions between them
  (:meth:`~.acceptance.AcceptanceEstimator.survival_se`; a censored position's count decays,
  so its uncertainty grows back while it is not drafted);
* *decaying*: after each such probe the neighbour's minimum gap (in steps of the bucket)
  doubles, from 1 up to ``max_probe_gap``; it restarts at 1 when the chosen depth changes
  or the acceptance estimator detects a shift. A steady state spends few cycles on probes
  (none once the neighbour is known to be worse by more than ``explore_z`` standard errors),
  and a change is still looked at within ``max_probe_gap`` steps (at ``k = 0`` nothing
  about acceptance is learnt between probes);
* *refresh*: a neighbour not run for ``refresh_cycles`` steps of the bucket is run once
  (``0``: never), the bound on how stale a cell can get.

Cells seeded with ``profile_cycles`` or more :meth:`DepthController.record_cycle_cost`
calls are not profiled. ``explore_z <= 0`` turns the upper-confidence probes off.

Only numpy; no SGLang import (the SGLang policy adapter is ``controller_hooks.py``).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, Hashable, Mapping, Optional, Sequence

import numpy as np

from .acceptance import AcceptanceEstimator
from .cycle_cost import CycleCostTable, batch_bucket


def select_depth(
    expected_committed: Mapping[int, float],
    cycle_seconds: Mapping[int, float],
    *,
    current: Optional[int] = None,
    hysteresis: float = 0.0,
) -> int:
    """Depth maximising ``expected_committed[k] / cycle_seconds[k]``, staying at ``current`` unless beaten.

    Args:
        expected_committed: ``{k: tokens per request per cycle}`` for every available depth.
        cycle_seconds: ``{k: seconds per cycle}``, same keys, all > 0.
        current: the depth in use (kept unless the best rate exceeds its rate × (1 + hysteresis)).
        hysteresis: relative margin >= 0.

    Raises:
        ValueError: empty or mismatched keys, a non-positive cost, negative ``hysteresis``.
    """
    if not expected_committed or set(expected_committed) != set(cycle_seconds):
        raise ValueError(
            f"expected_committed and cycle_seconds must have the same non-empty depth keys, "
            f"got {sorted(expected_committed)} and {sorted(cycle_seconds)}"
        )
    if hysteresis < 0:
        raise ValueError(f"hysteresis must be >= 0, got {hysteresis!r}")
    rates = {}
    for k, tokens in expected_committed.items():
        t = cycle_seconds[k]
        if not t > 0:
            raise ValueError(f"cycle_seconds[{k}] must be > 0, got {t!r}")
        rates[k] = tokens / t
    best = max(sorted(rates), key=lambda k: rates[k])  # ties: the smaller depth
    if current is not None and current in rates and rates[best] <= rates[current] * (1.0 + hysteresis):
        return current
    return best


class DepthController:
    """Online draft-depth controller (acceptance estimator + cycle-cost table + hysteresis).

    Args:
        depths: available draft depths (e.g. ``[0, 1, 3, 5, 7]``); ``max(depths) >= 1``.
        acceptance: an :class:`~.acceptance.AcceptanceEstimator` with ``max_depth == max(depths)``
            (default: one with its default half-lives and priors).
        costs: a :class:`~.cycle_cost.CycleCostTable` over ``depths`` (default: parametric prior).
        hysteresis: relative rate margin needed to leave the current depth (default 1 %).
        profile_cycles: measurements a neighbouring depth gets before the search moves on (0: none).
        refresh_cycles: steps of a bucket after which a neighbouring depth is re-run once (0: never).
        explore_z: standard errors of optimism of the upper-confidence probes (<= 0: none).
        max_probe_gap: cap of the doubling gap between two upper-confidence probes (steps, >= 1).
        objective: ``"saturated"`` (harmonic weighting of per-request acceptance, see above) or
            ``"step"`` (batch mean).

    Raises:
        ValueError: bad ``depths``, ``hysteresis < 0``, ``profile_cycles`` or ``refresh_cycles`` < 0,
            an estimator or table that does not match ``depths``, a non-finite ``explore_z``,
            ``max_probe_gap < 1``, an
            unknown ``objective``.
    """

    def __init__(
        self,
        depths: Sequence[int],
        *,
        acceptance: Optional[AcceptanceEstimator] = None,
        costs: Optional[CycleCostTable] = None,
        hysteresis: float = 0.01,
        profile_cycles: int = 2,
        refresh_cycles: int = 400,
        explore_z: float = 2.0,
        max_probe_gap: int = 32,
        objective: str = "saturated",
    ):
        depths = sorted(set(int(k) for k in depths))
        if not depths or depths[0] < 0 or depths[-1] < 1:
            raise ValueError(f"depths must be ints >= 0 with at least one depth >= 1, got {depths!r}")
        if hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {hysteresis!r}")
        if profile_cycles < 0:
            raise ValueError(f"profile_cycles must be >= 0, got {profile_cycles!r}")
        if refresh_cycles < 0:
            raise ValueError(f"refresh_cycles must be >= 0, got {refresh_cycles!r}")
        if not math.isfinite(explore_z):
            raise ValueError(f"explore_z must be a finite number, got {explore_z!r}")
        self.explore_z = float(explore_z)
        if max_probe_gap < 1:
            raise ValueError(f"max_probe_gap must be >= 1 (steps), got {max_probe_gap!r}")
        self.max_probe_gap = int(max_probe_gap)
        if objective not in ("saturated", "step"):
            raise ValueError(f"objective must be 'saturated' or 'step', got {objective!r}")
        self.objective = objective
        self.depths = depths
        self.hysteresis = float(hysteresis)
        self.profile_cycles = int(profile_cycles)
        self.refresh_cycles = int(refresh_cycles)
        self.acceptance = acceptance if acceptance is not None else AcceptanceEstimator(depths[-1])
        if self.acceptance.max_depth != depths[-1]:
            raise ValueError(f"acceptance.max_depth={self.acceptance.max_depth} != max(depths)={depths[-1]}")
        self.costs = costs if costs is not None else CycleCostTable(depths)
        if self.costs.depths != depths:
            raise ValueError(f"costs.depths={self.costs.depths} != depths={depths}")
        self._current: Dict[int, int] = {}
        self._profile_tries: Counter = Counter()
        self._bucket_steps: Counter = Counter()
        self._last_run: Dict[tuple, int] = {}  # (bucket, depth) -> bucket step
        self._probe_gap: Dict[tuple, int] = {}  # (bucket, depth) -> minimum steps between probes
        self._resets_seen = 0
        self.probes = 0
        self.chosen: Dict[int, Counter] = {}  # bucket -> Counter(depth)
        self.cycles = 0

    # ---- decisions -----------------------------------------------------------------------
    def expected_committed(self, request_ids: Optional[Sequence[Hashable]] = None) -> Dict[int, float]:
        """``{k: E[committed | k]}`` (tokens per request per cycle) for every available depth."""
        p = self.acceptance.survival(request_ids)
        cum = [0.0]
        for value in p:
            cum.append(cum[-1] + float(value))
        return {k: 1.0 + cum[k] for k in self.depths}

    def effective_committed(self, request_ids: Optional[Sequence[Hashable]] = None,
                            built_under: Optional[int] = None) -> Dict[int, float]:
        """``{k: E_eff(k)}``: the numerator of the rate the depth choice maximises.

        ``objective="step"`` or no ``request_ids``: :meth:`expected_committed`. Otherwise the
        saturation-weighted harmonic mean of the per-request ``E_r(k)`` (module docstring), with
        weights ``E_r(built_under)`` (all 1 when ``built_under`` is None).
        """
        if self.objective == "step" or not request_ids:
            return self.expected_committed(request_ids)
        p = self.acceptance.survival_per_request(request_ids)  # [B, K]
        e = 1.0 + np.concatenate([np.zeros((p.shape[0], 1)), np.cumsum(p, axis=1)], axis=1)  # [B, K + 1]
        w = e[:, built_under] if built_under is not None else np.ones(p.shape[0])
        total = float(w.sum())
        return {k: total / float((w / e[:, k]).sum()) for k in self.depths}

    def rates(self, batch_size: int, request_ids: Optional[Sequence[Hashable]] = None) -> Dict[int, float]:
        """``{k: committed tokens per second}`` for the whole batch of ``batch_size`` requests."""
        committed = self.expected_committed(request_ids)
        return {k: batch_size * committed[k] / self.costs.estimate(k, batch_size) for k in self.depths}

    def decided_depth(self, batch_size: int) -> Optional[int]:
        """The depth the rate comparison last settled on for the bucket of ``batch_size``.

        Differs from what :meth:`choose_depth` returned when that step was a probe (profile,
        upper-confidence or refresh) of a neighbour; ``None`` before the bucket's first step.
        """
        return self._current.get(batch_bucket(batch_size))

    def choose_depth(self, batch_size: int, request_ids: Optional[Sequence[Hashable]] = None) -> int:
        """The draft depth for the next decode step of a batch of ``batch_size`` requests.

        Args:
            batch_size: requests in the batch (>= 1).
            request_ids: the batch's request ids (per-request acceptance), or ``None`` (pooled).

        Raises:
            ValueError: ``batch_size < 1``.
        """
        bucket = batch_bucket(batch_size)
        step = self._bucket_steps[bucket] = self._bucket_steps[bucket] + 1
        previous = self._current.get(bucket)
        committed = self.effective_committed(request_ids, previous)
        seconds = {k: self.costs.estimate(k, batch_size) for k in self.depths}
        depth = select_depth(committed, seconds, current=previous, hysteresis=self.hysteresis)
        if self.acceptance.resets != self._resets_seen:  # a shift: probe every bucket afresh
            self._resets_seen = self.acceptance.resets
            self._probe_gap.clear()
        elif depth != previous:  # a move: probe this bucket's new neighbours afresh
            for key in [key for key in self._probe_gap if key[0] == bucket]:
                del self._probe_gap[key]
        self._current[bucket] = depth
        depth = self._explore_depth(bucket, batch_size, depth, step, committed, seconds)
        self._last_run[(bucket, depth)] = step
        self.chosen.setdefault(bucket, Counter())[depth] += 1
        self.cycles += 1
        return depth

    def _log_rate_se(self, j: int, k: int, batch_size: int, committed: Mapping[int, float]) -> float:
        """Standard error of ``log rate(j) - log rate(k)`` (costs and the positions between them)."""
        lo, hi = min(j, k), max(j, k)
        p_se = self.acceptance.survival_se()
        acc = float(sum(p_se[lo:hi])) / committed[hi]  # positions lo+1 .. hi
        cost = math.hypot(self.costs.log_se(j, batch_size), self.costs.log_se(k, batch_size))
        return math.hypot(acc, cost)

    def _explore_depth(self, bucket: int, batch_size: int, depth: int, step: int,
                       committed: Mapping[int, float], seconds: Mapping[int, float]) -> int:
        i = self.depths.index(depth)
        neighbours = [self.depths[j] for j in (i + 1, i - 1) if 0 <= j < len(self.depths)]
        for k in neighbours:
            if (self.costs.count(k, batch_size) < self.profile_cycles
                    and self._profile_tries[(bucket, k)] < self.profile_cycles):
                self._profile_tries[(bucket, k)] += 1
                return k
        if self.explore_z > 0:
            base = math.log(committed[depth] / seconds[depth])
            for k in neighbours:
                gap = self._probe_gap.get((bucket, k), 1)
                if step - self._last_run.get((bucket, k), -gap) < gap:
                    continue
                optimistic = (math.log(committed[k] / seconds[k]) - base
                              + self.explore_z * self._log_rate_se(k, depth, batch_size, committed))
                if optimistic > 0:
                    self._probe_gap[(bucket, k)] = min(2 * gap, self.max_probe_gap)
                    self.probes += 1
                    return k
        if self.refresh_cycles:
            for k in neighbours:
                if step - self._last_run.get((bucket, k), 0) > self.refresh_cycles:
                    return k
        return depth

    # ---- feedback ------------------------------------------------------------------------
    def observe(self, accept_lengths: Sequence[int], depth: int,
                request_ids: Optional[Sequence[Hashable]] = None) -> None:
        """Accepted drafts per request of one verified cycle at ``depth`` (see ``AcceptanceEstimator.observe``)."""
        self.acceptance.observe(accept_lengths, depth, request_ids)

    def record_cycle_cost(self, depth: int, batch_size: int, seconds: float) -> None:
        """One measured (or seeded) full cycle at ``depth`` for ``batch_size`` requests, in seconds."""
        self.costs.record(depth, batch_size, seconds)

    # ---- reporting -----------------------------------------------------------------------
    def metrics(self) -> dict:
        """JSON-ready snapshot: chosen-depth histogram, acceptance curve, measured cycle costs."""
        total: Counter = Counter()
        for counts in self.chosen.values():
            total.update(counts)
        committed = self.expected_committed()
        return {
            "depths": list(self.depths),
            "cycles": self.cycles,
            "chosen_depth_histogram": {str(k): total[k] for k in self.depths},
            "chosen_depth_by_bucket": {
                str(b): {str(k): c[k] for k in self.depths if c[k]} for b, c in sorted(self.chosen.items())
            },
            "acceptance_curve": [round(float(p), 4) for p in self.acceptance.survival()],
            "expected_committed": {str(k): round(v, 4) for k, v in committed.items()},
            "cycle_cost_s": self.costs.as_dict(),
        }

    def format_log_line(self) -> str:
        """One log line: chosen-depth histogram (total, per batch bucket), ``P_i``, cost per bucket (ms)."""
        m = self.metrics()
        hist = " ".join(f"{k}:{n}" for k, n in m["chosen_depth_histogram"].items() if n)
        curve = " ".join(f"{p:.2f}" for p in m["acceptance_curve"])
        costs = "; ".join(
            f"b{b} " + " ".join(f"k{k}={cell['seconds'] * 1e3:.2f}" for k, cell in cells.items())
            for b, cells in m["cycle_cost_s"].items()
        )
        by_bucket = "; ".join(f"b{b} " + " ".join(f"{k}:{n}" for k, n in counts.items())
                              for b, counts in m["chosen_depth_by_bucket"].items())
        return (f"spec depth controller: cycles={m['cycles']} chosen k [{hist}] by bucket [{by_bucket}] "
                f"P_i [{curve}] T_cycle ms [{costs}]")
