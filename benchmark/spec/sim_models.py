"""Models for the depth-controller simulator: acceptance traces, cycle-cost curves, baseline policies.

Everything here is a *model* (issue 7, "Benchmark"): no GPU is touched (the measured table is read from JSON).

* Acceptance traces give each request's conditional acceptance ``c_i(t)`` (draft ``i``
  accepted given ``1..i-1`` were), ``c_i = p * rho**(i-1)``; ``p`` per request, possibly
  drifting with simulated time.
* Cycle-cost curves ``T(k, b)`` in seconds: two parametric ones, a roofline model of
  one H200 serving a Qwen3.8-Flash-Next-like MoE with an MTP draft (parameters below), and
  a table measured on the H200 (:class:`MeasuredCost`, benchmark/spec/bench_cycle_cost_h200.py).
* Baseline policies: every fixed depth, upstream's EMA policy reimplemented from its
  documented behaviour, the per-step oracle and the saturated-loop oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

import numpy as np

K_MAX = 7
DEPTHS = list(range(K_MAX + 1))


# ---- acceptance traces -----------------------------------------------------------------------
@dataclass(frozen=True)
class AcceptanceTrace:
    """``kind``: high | low | mixed | drifting. ``period_s``: drifting phase length (simulated seconds)."""

    kind: str
    period_s: float = 0.0

    def new_request(self, rng: np.random.Generator):
        """``(p, rho)`` of a new request (``p``: first-draft acceptance; for drifting, an offset)."""
        if self.kind == "high":
            return rng.uniform(0.82, 0.95), 0.97
        if self.kind == "low":
            return rng.uniform(0.15, 0.40), 0.90
        if self.kind == "mixed":
            return (0.92 if rng.random() < 0.5 else 0.30), 0.95
        if self.kind == "drifting":
            return rng.uniform(-0.05, 0.05), 0.96
        raise ValueError(f"unknown acceptance trace kind {self.kind!r}")

    def conditional(self, p: np.ndarray, rho: np.ndarray, t: float) -> np.ndarray:
        """``[B, K_MAX]`` conditional acceptance of the active requests at simulated time ``t``."""
        if self.kind == "drifting":
            base = 0.90 if int(t // self.period_s) % 2 == 0 else 0.35
            p = base + p
        pos = np.arange(K_MAX)
        return np.clip(p[:, None] * rho[:, None] ** pos[None, :], 0.0, 1.0)


# ---- cycle-cost curves ----------------------------------------------------------------------
@dataclass(frozen=True)
class LinearCost:
    """``T = fixed + per_draft * k + per_row * b * (k + 1)`` seconds (parametric)."""

    fixed: float
    per_draft: float
    per_row: float

    def __call__(self, k: int, b: int) -> float:
        return self.fixed + self.per_draft * k + self.per_row * b * (k + 1)


@dataclass(frozen=True)
class MoERooflineCost:
    """Roofline model of one draft–verify–commit cycle on one H200 (not a measurement).

    Target: a Qwen3.8-Flash-Next-like hybrid MoE (seeds-digest: 48 layers, 36 GDN + 12 QSA,
    residual 2560, 512 experts top-10 + 1 shared, vocabulary 248,320) with *assumed*
    expert width 512, 30 M dense parameters per layer, FP8 experts and BF16 dense weights.
    Per step: weight bytes (dense + the experts the ``rows`` tokens touch:
    ``E * (1 - (1 - topk/E) ** rows)`` per layer) + LM head + per-request recurrent state
    (36 GDN layers x 3 MiB read + written once: deferred commit) + QSA KV; time =
    max(bytes / bandwidth, FLOPs / achievable FLOP/s). Draft: one MTP layer + the LM head
    per draft step at ``b`` rows. Bandwidth 4.2 TB/s = the copy ceiling our H200 kernel
    benchmark measured (docs/benchmarks.md); 495 TFLOP/s = half the BF16 dense peak.
    """

    layers: int = 48
    gdn_layers: int = 36
    qsa_layers: int = 12
    d: int = 2560
    experts: int = 512
    topk: int = 10
    expert_width: int = 512
    dense_params_per_layer: float = 30e6
    vocab: int = 248_320
    gdn_state_bytes: float = 3 * 2**20
    qsa_kv_bytes_per_request_layer: float = 2048 * 1024
    bandwidth: float = 4.2e12
    flops: float = 495e12
    step_overhead_s: float = 250e-6
    draft_launch_s: float = 20e-6

    def _expert_bytes(self) -> float:
        return 3 * self.d * self.expert_width * 1.0  # FP8

    def _touched(self, rows: int) -> float:
        return self.experts * (1.0 - (1.0 - self.topk / self.experts) ** rows)

    def _step(self, rows: int, requests: int, layers: int, state: bool) -> float:
        eb = self._expert_bytes()
        weights = layers * (2.0 * self.dense_params_per_layer + (self._touched(rows) + 1) * eb)
        lm_head = 2.0 * self.vocab * self.d
        traffic = weights + lm_head
        if state:
            traffic += requests * (2 * self.gdn_layers * self.gdn_state_bytes
                                   + self.qsa_layers * self.qsa_kv_bytes_per_request_layer)
        per_row_flops = 2.0 * (layers * (self.dense_params_per_layer + (self.topk + 1) * eb)
                               + self.vocab * self.d)
        return max(traffic / self.bandwidth, rows * per_row_flops / self.flops)

    def __call__(self, k: int, b: int) -> float:
        target = self._step(b * (k + 1), b, self.layers, state=True)
        draft = k * (self._step(b, b, 1, state=False) + self.draft_launch_s)
        return self.step_overhead_s + draft + target


@dataclass(frozen=True)
class MeasuredCost:
    """``T(k, b)`` from a measured table (``benchmark/results/*-h200-spec_cycle_cost.json``).

    Rows ``{"batch", "k", "cycle_s"}``; between measured batch sizes ``T`` is interpolated
    linearly in ``b`` (each depth separately); outside them it raises ``ValueError``.
    """

    path: str

    def _table(self):
        table = _MEASURED.get(self.path)
        if table is None:
            import json

            with open(self.path) as f:
                rows = json.load(f)["rows"]
            batches = sorted({r["batch"] for r in rows})
            depths = sorted({r["k"] for r in rows})
            grid = np.full((len(depths), len(batches)), np.nan)
            for r in rows:
                grid[depths.index(r["k"]), batches.index(r["batch"])] = r["cycle_s"]
            if np.isnan(grid).any():
                raise ValueError(f"{self.path}: the (k, batch) grid is incomplete")
            table = _MEASURED[self.path] = (np.array(batches, dtype=float), depths, grid)
        return table

    def __call__(self, k: int, b: int) -> float:
        batches, depths, grid = self._table()
        if not batches[0] <= b <= batches[-1] or k not in depths:
            raise ValueError(f"(k={k}, b={b}) is outside the measured table {self.path}")
        return float(np.interp(b, batches, grid[depths.index(k)]))


_MEASURED: Dict[str, tuple] = {}


# ---- policies -------------------------------------------------------------------------------
class Policy:
    name = "policy"

    def choose(self, b: int, rids: Sequence[int], true_c: np.ndarray) -> int:
        raise NotImplementedError

    def feedback(self, accept: np.ndarray, k: int, rids: Sequence[int], seconds: float, b: int) -> None:
        pass


class FixedPolicy(Policy):
    def __init__(self, k: int):
        self.k = k
        self.name = f"fixed-k{k}"

    def choose(self, b, rids, true_c):
        return self.k


class OraclePolicy(Policy):
    """Best depth per step with the true acceptance of the batch and the true (noise-free) cost."""

    name = "oracle"

    def __init__(self, cost: Callable[[int, int], float]):
        self.cost = cost

    def choose(self, b, rids, true_c):
        committed = 1.0 + np.concatenate([[0.0], np.cumprod(true_c, axis=1).mean(axis=0).cumsum()])
        return max(DEPTHS, key=lambda k: committed[k] / self.cost(k, b))


class SaturatedOraclePolicy(Policy):
    """Best depth per step for a *saturated* closed loop, with the true acceptance and cost.

    Maximises ``sum_r w_r / (T(k, b) * sum_r w_r / E_r(k))`` with ``w_r = E_r(k_prev)``: the
    long-run rate when finished requests are replaced at once (requests that accept little
    stay longer, so the batch over-represents them; ``w_r`` undoes that). Same objective as
    our controller's ``objective="saturated"``, here with the truth instead of estimates.
    """

    name = "oracle-saturated"

    def __init__(self, cost: Callable[[int, int], float]):
        self.cost = cost
        self.k_prev = None

    def choose(self, b, rids, true_c):
        p = np.cumprod(true_c, axis=1)
        e = 1.0 + np.concatenate([np.zeros((p.shape[0], 1)), p.cumsum(axis=1)], axis=1)
        w = e[:, self.k_prev] if self.k_prev is not None else np.ones(p.shape[0])
        self.k_prev = max(DEPTHS, key=lambda k: w.sum() / (self.cost(k, b) * (w / e[:, k]).sum()))
        return self.k_prev


#: upstream 0.5.23's documented default per-batch-size candidates (DEFAULT_ADAPTIVE_CONFIG), as data
UPSTREAM_DEFAULT_SLOTS = {
    1: dict(candidates=[1, 3, 5, 7], up=0.0, down=-0.25),
    8: dict(candidates=[0, 1, 3], up=0.0, down=0.0),
    32: dict(candidates=[0, 1], up=0.0, down=0.0),
    64: dict(candidates=[0], up=0.0, down=0.0),
}
FLAT_SLOTS = {1: dict(candidates=DEPTHS, up=0.0, down=-0.25)}


@dataclass
class _EmaSlot:
    candidates: List[int]
    up: float
    down: float
    depth: int
    ema: float
    verifies: int = 0


class UpstreamEmaPolicy(Policy):
    """Upstream's adaptive policy, rewritten from its documented behaviour (not its code).

    Per batch-size slot (the largest configured size <= the batch): an EMA (weight 0.2) of the
    batch-mean accepted drafts, updated after each verify at depth > 0. After 10 warm-up
    verifies the slot re-decides every 5th verify: from depth 0 it probes the next candidate
    up; otherwise it steps down while the EMA is at most (lower candidate - 0.5 + down
    hysteresis; 0.5 + down for a lower candidate of 0), else steps up while the EMA exceeds
    (current - 0.5 + up hysteresis): about "one draft beyond the observed accept length",
    blind to cost. Starts at ``initial`` (else the middle candidate), EMA = depth - 1.
    """

    def __init__(self, slots: Dict[int, dict], initial: int = 3, name: str = "ema-upstream"):
        self.name = name
        self._keys = sorted(slots)
        self._slots = {}
        for key, cfg in slots.items():
            cands = sorted(cfg["candidates"])
            depth = initial if initial in cands else cands[len(cands) // 2]
            self._slots[key] = _EmaSlot(cands, cfg["up"], cfg["down"], depth, float(depth - 1))

    def _slot(self, b: int) -> _EmaSlot:
        key = max([k for k in self._keys if k <= b] or [self._keys[0]])
        return self._slots[key]

    def choose(self, b, rids, true_c):
        return self._slot(b).depth

    def feedback(self, accept, k, rids, seconds, b):
        s = self._slot(b)
        if s.depth > 0:
            s.ema = 0.8 * s.ema + 0.2 * float(np.mean(accept))
        s.verifies += 1
        if s.verifies <= 10 or (s.verifies - 10) % 5:
            return
        i = s.candidates.index(s.depth)
        if s.depth == 0:
            i = min(i + 1, len(s.candidates) - 1)
            if s.candidates[i] > 0 and s.ema < 0:
                s.ema = float(s.candidates[i] - 1)
            s.depth = s.candidates[i]
            return
        start = i
        while i > 0:
            lower = s.candidates[i - 1]
            limit = (0.5 if lower == 0 else lower - 0.5) + s.down
            if s.ema <= limit:
                i -= 1
            else:
                break
        if i == start:
            while i < len(s.candidates) - 1 and s.ema > s.candidates[i] - 0.5 + s.up:
                i += 1
        s.depth = s.candidates[i]


class ControllerPolicy(Policy):
    """Our :class:`DepthController`: sees only accept lengths and measured (noisy) cycle times."""

    name = "cycle-cost"

    def __init__(self, controller):
        self.controller = controller
        self.decided: List[int] = []  # per cycle: the depth decided on (the run depth unless a probe)

    def choose(self, b, rids, true_c):
        k = self.controller.choose_depth(b, rids)
        self.decided.append(self.controller.decided_depth(b))
        return k

    def feedback(self, accept, k, rids, seconds, b):
        self.controller.observe(accept, k, rids)
        self.controller.record_cycle_cost(k, b, seconds)
