"""Draft acceptance: an online estimator and a benchmark-only synthetic source (issue 7).

Terms. A decode cycle drafts ``k`` tokens; verify accepts the longest correct
prefix of them, ``L`` tokens (``0 <= L <= k``), and commits ``L + 1`` tokens (the
accepted drafts plus the target's bonus/recovery token). For draft position
``i`` (1-based) we estimate ``P_i = P(first i drafts all accepted)``; then
``E[committed | k] = 1 + sum_{i<=k} P_i``.

Estimator. An observation at depth ``k`` says nothing about positions above
``k`` (it is censored there), so we estimate the *conditional* acceptance
``c_i = P(draft i accepted | drafts 1..i-1 accepted)`` from the observations that
reached position ``i`` (depth >= i and ``L >= i - 1``), and multiply:
``P_i = c_1 * ... * c_i`` (the product-limit / Kaplan–Meier construction). Counts
decay geometrically per decode cycle (half-life in cycles), so the estimate
follows drift, and a position that stops being observed slowly returns to its
prior. Priors (pseudo-counts of weight ``prior_weight``): ``c_1`` ← ``prior_accept``;
``c_i`` ← the estimate of ``c_{i-1}`` (a geometric tail for positions never
drafted). Per-request estimates use the pooled ``c_i`` as their prior (weight
``request_weight``), so a new request starts at the pooled curve. With
``adaptive_request_weight`` that weight is set by empirical Bayes from the spread of the
requests' own first-position rates (method of moments for a Beta prior:
``weight = m (1 - m) / v_between - 1``, ``v_between`` = observed variance minus the binomial
part): requests that all accept alike are pulled hard to the pooled curve (their
differences are noise), requests that differ (a mixed workload) keep their own.

Change detection. A long half-life gives a quiet estimate but follows a shift slowly,
a short one the opposite. The pooled counts are therefore kept at two speeds; when the
fast estimate of some ``c_i`` leaves the slow one by more than ``drift_z`` standard
errors (binomial, on the fast counts), the slow counts restart from the fast ones and the
per-request rows from zero (a change-point reset, as in CUSUM-style detectors).

Only numpy; no SGLang import.
"""

from __future__ import annotations

import math
import os
from typing import Dict, Hashable, List, Optional, Sequence

import numpy as np

#: Environment switch that allows :class:`SyntheticAcceptance` outside code that passes ``benchmark_mode=True``.
BENCHMARK_MODE_ENV = "SGLANG_HYBRID_BENCHMARK_MODE"


def _decay_factor(half_life_cycles: float, name: str) -> float:
    if not (half_life_cycles > 0):
        raise ValueError(f"{name} must be > 0 (cycles), got {half_life_cycles!r}")
    return 0.5 ** (1.0 / half_life_cycles)  # 1.0 for math.inf (no decay)


def _as_accept_lengths(accept_lengths: Sequence[int], depth: int) -> np.ndarray:
    lengths = np.asarray(accept_lengths, dtype=np.int64).reshape(-1)
    if lengths.size and (lengths.min() < 0 or lengths.max() > depth):
        raise ValueError(
            f"accept_lengths must lie in [0, depth={depth}] (accepted drafts per request), "
            f"got min {int(lengths.min())}, max {int(lengths.max())}"
        )
    return lengths


class AcceptanceEstimator:
    """Online estimate of ``P_i`` per draft position, pooled and per request.

    Args:
        max_depth: largest draft depth ``k_max`` (positions ``1..k_max`` are tracked).
        half_life_cycles: decay of the pooled counts, in decode cycles (``math.inf``: no decay).
        request_half_life_cycles: decay of a request's own counts, in its observations.
        fast_half_life_cycles: half-life of the fast pooled counts used for change detection.
        drift_z: standard errors between fast and slow ``c_i`` that trigger a reset (``math.inf``: never).
        prior_weight: pseudo-count weight of the priors of the pooled ``c_i``.
        prior_accept: prior of ``c_1`` (before any observation).
        request_weight: pseudo-count weight of the pooled curve in a request's estimate (the
            starting value when adaptive).
        adaptive_request_weight: re-estimate ``request_weight`` from the requests' spread
            (empirical Bayes, clipped to [1, 256]) every 16 cycles once 8 requests have data.
        max_requests: per-request rows kept; the least recently seen are dropped.

    Raises:
        ValueError: for a non-positive ``max_depth``, half-life or weight, or ``prior_accept`` outside [0, 1].
    """

    def __init__(
        self,
        max_depth: int,
        *,
        half_life_cycles: float = 40.0,
        request_half_life_cycles: float = 20.0,
        fast_half_life_cycles: float = 4.0,
        drift_z: float = 4.0,
        prior_weight: float = 2.0,
        prior_accept: float = 0.5,
        request_weight: float = 4.0,
        adaptive_request_weight: bool = True,
        max_requests: int = 4096,
    ):
        if not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if not 0.0 <= prior_accept <= 1.0:
            raise ValueError(f"prior_accept must be in [0, 1], got {prior_accept!r}")
        for name, value in (("prior_weight", prior_weight), ("request_weight", request_weight)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests!r}")
        self.max_depth = max_depth
        self.half_life_cycles = half_life_cycles
        self._gamma = _decay_factor(half_life_cycles, "half_life_cycles")
        self._gamma_req = _decay_factor(request_half_life_cycles, "request_half_life_cycles")
        self._gamma_fast = _decay_factor(fast_half_life_cycles, "fast_half_life_cycles")
        if not drift_z > 0:
            raise ValueError(f"drift_z must be > 0, got {drift_z!r}")
        self.drift_z = float(drift_z)
        self.resets = 0
        self.prior_weight = float(prior_weight)
        self.prior_accept = float(prior_accept)
        self.request_weight = float(request_weight)
        self.adaptive_request_weight = bool(adaptive_request_weight)
        self.max_requests = max_requests
        # pooled decayed counts: den[i-1] = cycles that reached position i, num[i-1] = those accepting it
        self._num = np.zeros(max_depth)
        self._den = np.zeros(max_depth)
        self._fast_num = np.zeros(max_depth)
        self._fast_den = np.zeros(max_depth)
        # per-request rows
        self._row_of: Dict[Hashable, int] = {}
        self._last_seen: List[int] = []
        self._free: List[int] = []
        self._req_num = np.zeros((0, max_depth))
        self._req_den = np.zeros((0, max_depth))
        self._cycle = 0
        self._pooled_cache: Optional[np.ndarray] = None

    # ---- updates -------------------------------------------------------------------------
    def observe(
        self,
        accept_lengths: Sequence[int],
        depth: int,
        request_ids: Optional[Sequence[Hashable]] = None,
    ) -> None:
        """Feed one decode cycle: accepted drafts per request at draft depth ``depth``.

        Args:
            accept_lengths: ``[B]`` ints in ``[0, depth]`` (accepted drafts, bonus token excluded).
            depth: drafts proposed per request in that cycle (0: nothing is learned, counts still decay).
            request_ids: ``[B]`` hashable request ids, or ``None`` (pooled estimate only).

        Raises:
            ValueError: ``depth`` outside ``[0, max_depth]``, a length outside ``[0, depth]``, or
                ``request_ids`` of a different length.
        """
        if not isinstance(depth, (int, np.integer)) or not 0 <= depth <= self.max_depth:
            raise ValueError(f"depth must be an int in [0, {self.max_depth}], got {depth!r}")
        depth = int(depth)
        lengths = _as_accept_lengths(accept_lengths, depth)
        if request_ids is not None and len(request_ids) != lengths.size:
            raise ValueError(
                f"request_ids has {len(request_ids)} entries but accept_lengths has {lengths.size}"
            )
        self._cycle += 1
        self._num *= self._gamma
        self._den *= self._gamma
        self._fast_num *= self._gamma_fast
        self._fast_den *= self._gamma_fast
        self._pooled_cache = None
        if depth == 0 or lengths.size == 0:
            return
        reach, accept = self._reach_accept(lengths, depth)
        accept_sum, reach_sum = accept.sum(axis=0), reach.sum(axis=0)
        self._num[:depth] += accept_sum
        self._den[:depth] += reach_sum
        self._fast_num[:depth] += accept_sum
        self._fast_den[:depth] += reach_sum
        if self._shift_detected(depth):
            self._num[:] = self._fast_num
            self._den[:] = self._fast_den
            self._req_num[:] = 0.0
            self._req_den[:] = 0.0
            self.resets += 1
        if request_ids is not None:
            rows = np.fromiter((self._row(r) for r in request_ids), dtype=np.int64, count=lengths.size)
            self._req_num[rows] *= self._gamma_req
            self._req_den[rows] *= self._gamma_req
            np.add.at(self._req_num[:, :depth], rows, accept)
            np.add.at(self._req_den[:, :depth], rows, reach)
            if self._cycle % 64 == 0:
                self._evict_stale()
            if self.adaptive_request_weight and self._cycle % 16 == 0:
                self._update_request_weight()

    def _update_request_weight(self) -> None:
        rows = np.array(sorted(self._row_of.values()), dtype=np.int64)
        if rows.size == 0:
            return
        den, num = self._req_den[rows, 0], self._req_num[rows, 0]
        ok = den >= 1.0
        if ok.sum() < 8:
            return
        den, rate = den[ok], num[ok] / den[ok]
        m = float((rate * den).sum() / den.sum())
        if not 0.0 < m < 1.0:
            return
        observed = float((den * (rate - m) ** 2).sum() / den.sum())
        binomial = m * (1.0 - m) * float(ok.sum()) / float(den.sum())  # den-weighted mean of m(1-m)/den
        between = observed - binomial
        weight = m * (1.0 - m) / between - 1.0 if between > 0 else math.inf
        self.request_weight = float(min(max(weight, 1.0), 256.0))

    def _shift_detected(self, depth: int) -> bool:
        if math.isinf(self.drift_z):
            return False
        fd = self._fast_den[:depth]
        ok = fd >= 4.0
        if not ok.any():
            return False
        w = self.prior_weight
        slow = (self._num[:depth] + w * 0.5) / (self._den[:depth] + w)
        fast = self._fast_num[:depth] / np.maximum(fd, 1e-12)
        se = np.sqrt(np.maximum(slow * (1.0 - slow), 0.02) / np.maximum(fd, 1e-12))
        return bool(np.any(ok & (np.abs(fast - slow) > self.drift_z * se)))

    @staticmethod
    def _reach_accept(lengths: np.ndarray, depth: int):
        pos = np.arange(1, depth + 1)
        reach = (lengths[:, None] >= pos - 1).astype(np.float64)  # [B, depth]
        accept = (lengths[:, None] >= pos).astype(np.float64)
        return reach, accept

    def _row(self, rid: Hashable) -> int:
        row = self._row_of.get(rid)
        if row is None:
            if self._free:
                row = self._free.pop()
            else:
                row = len(self._last_seen)
                self._last_seen.append(0)
                if row >= self._req_num.shape[0]:
                    grow = max(16, self._req_num.shape[0])
                    self._req_num = np.vstack([self._req_num, np.zeros((grow, self.max_depth))])
                    self._req_den = np.vstack([self._req_den, np.zeros((grow, self.max_depth))])
            self._req_num[row] = 0.0
            self._req_den[row] = 0.0
            self._row_of[rid] = row
        self._last_seen[row] = self._cycle
        return row

    def _evict_stale(self) -> None:
        if len(self._row_of) <= self.max_requests:
            return
        by_age = sorted(self._row_of.items(), key=lambda kv: self._last_seen[kv[1]])
        for rid, row in by_age[: len(self._row_of) - self.max_requests]:
            del self._row_of[rid]
            self._free.append(row)

    def forget_request(self, request_id: Hashable) -> None:
        """Drop a finished request's row (optional; stale rows are also evicted by age)."""
        row = self._row_of.pop(request_id, None)
        if row is not None:
            self._free.append(row)

    # ---- estimates -----------------------------------------------------------------------
    def pooled_conditional(self) -> np.ndarray:
        """``[max_depth]`` float64: pooled ``c_i`` for positions ``1..max_depth``."""
        if self._pooled_cache is None:
            c = np.empty(self.max_depth)
            prior = self.prior_accept
            w = self.prior_weight
            for i in range(self.max_depth):
                c[i] = (self._num[i] + w * prior) / (self._den[i] + w)
                prior = c[i]
            self._pooled_cache = c
        return self._pooled_cache

    def survival_per_request(self, request_ids: Sequence[Hashable]) -> np.ndarray:
        """``[B, max_depth]`` float64: each request's ``P_i`` (a request never observed: the pooled curve).

        A request's conditional ``c_i`` is its own decayed counts with the pooled ``c_i`` as a
        prior of weight ``request_weight``.
        """
        pooled = self.pooled_conditional()
        out = np.tile(np.cumprod(pooled), (len(request_ids), 1))
        rows = [self._row_of.get(r) for r in request_ids]
        at = [i for i, r in enumerate(rows) if r is not None]
        if at:
            known = np.array([rows[i] for i in at], dtype=np.int64)
            w = self.request_weight
            c = (self._req_num[known] + w * pooled) / (self._req_den[known] + w)  # [B_known, K]
            out[at] = np.cumprod(c, axis=1)
        return out

    def survival(self, request_ids: Optional[Sequence[Hashable]] = None) -> np.ndarray:
        """``[max_depth]`` float64: ``P_i`` (first ``i`` drafts accepted), averaged over ``request_ids``.

        With ``request_ids=None`` (or empty): the pooled curve. A request never observed
        contributes the pooled curve.
        """
        if not request_ids:
            return np.cumprod(self.pooled_conditional())
        return self.survival_per_request(request_ids).mean(axis=0)

    def expected_committed(self, depth: int, request_ids: Optional[Sequence[Hashable]] = None) -> float:
        """``1 + sum_{i<=depth} P_i`` tokens per request per cycle (batch mean)."""
        if not 0 <= depth <= self.max_depth:
            raise ValueError(f"depth must be in [0, {self.max_depth}], got {depth!r}")
        return 1.0 + float(self.survival(request_ids)[:depth].sum())

    def survival_se(self) -> np.ndarray:
        """``[max_depth]``: standard error of the pooled ``P_i`` from position ``i``'s own conditional.

        ``se(P_i) = P_i * sqrt((1 - c_i) / (c_i * (n_i + prior_weight)))`` with ``n_i`` the decayed
        count of observations that reached position ``i``. The factors ``c_1 .. c_{i-1}`` scale
        every depth >= i alike, so they are left out: this is the uncertainty of what one more
        draft adds. A position that stops being observed (censored above the depth in use)
        gets more uncertain as its count decays.
        """
        c = np.clip(self.pooled_conditional(), 1e-6, 1.0)
        return np.cumprod(c) * np.sqrt((1.0 - c) / (c * (self._den + self.prior_weight)))

    def effective_counts(self) -> np.ndarray:
        """``[max_depth]``: decayed number of pooled observations that reached each position."""
        return self._den.copy()


class SyntheticAcceptance:
    """Benchmark-only acceptance with given unconditional rates ``a_i = P(first i drafts accepted)``.

    With it, ``E[committed | k] = 1 + a_1 + ... + a_k`` whatever the draft model proposes, so
    a benchmark separates the depth controller's quality from the draft model's (issue 7,
    "Controlled acceptance"; vLLM calls the same idea ``synthetic_acceptance_rates``). It
    changes which tokens get committed and is **not** accuracy-preserving: the constructor
    refuses unless ``benchmark_mode=True`` or ``SGLANG_HYBRID_BENCHMARK_MODE=1``.

    Args:
        rates: ``a_1 >= a_2 >= ... >= a_K``, each in ``[0, 1]``.
        benchmark_mode: the caller declares a benchmark run.

    Raises:
        ValueError: not in benchmark mode; ``rates`` empty, outside [0, 1] or increasing.
    """

    def __init__(self, rates: Sequence[float], *, benchmark_mode: bool = False):
        if not (benchmark_mode or os.environ.get(BENCHMARK_MODE_ENV) == "1"):
            raise ValueError(
                "synthetic acceptance is benchmark-only (it overrides verification and is not "
                "accuracy-preserving): pass benchmark_mode=True or set "
                f"{BENCHMARK_MODE_ENV}=1 in a benchmark run"
            )
        a = np.asarray(list(rates), dtype=np.float64)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"rates must be a non-empty sequence of floats, got {rates!r}")
        if not np.all(np.isfinite(a)) or a.min() < 0.0 or a.max() > 1.0:
            raise ValueError(f"rates must lie in [0, 1], got {a.tolist()}")
        if np.any(np.diff(a) > 0):
            raise ValueError(
                f"rates must be non-increasing (a_i = P(first i drafts accepted)), got {a.tolist()}"
            )
        self.rates = a

    @property
    def max_depth(self) -> int:
        return int(self.rates.size)

    def _check_depth(self, depth: int) -> None:
        if not 0 <= depth <= self.max_depth:
            raise ValueError(f"depth must be in [0, {self.max_depth}], got {depth!r}")

    def expected_committed(self, depth: int) -> float:
        """``1 + a_1 + ... + a_depth`` tokens per request per cycle."""
        self._check_depth(depth)
        return 1.0 + float(self.rates[:depth].sum())

    def conditional(self) -> np.ndarray:
        """``[K]``: ``c_i = a_i / a_{i-1}`` (``a_0 = 1``; 0 after a zero rate)."""
        prev = np.concatenate([[1.0], self.rates[:-1]])
        return np.divide(self.rates, prev, out=np.zeros_like(self.rates), where=prev > 0)

    def accept_lengths(self, depth: int, uniforms: Sequence[float]) -> np.ndarray:
        """``[B]`` int64 accepted drafts for ``B`` uniforms in [0, 1): ``L = #{i <= depth : u < a_i}``.

        Since the ``a_i`` do not increase, ``P(L >= i) = P(u < a_i) = a_i`` exactly.
        """
        self._check_depth(depth)
        u = np.asarray(uniforms, dtype=np.float64).reshape(-1, 1)
        return (u < self.rates[None, :depth]).sum(axis=1).astype(np.int64)

    def sample_accept_lengths(self, depth: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``[n]`` int64 accepted drafts drawn with ``P(L >= i) = a_i`` (``i <= depth``)."""
        return self.accept_lengths(depth, rng.random(n))
