"""Cycle cost ``T(k, batch)``: a table updated online from timers, with a parametric prior (issue 7).

A *cycle* is one full draft–verify–commit round of a decode batch. We time it as the
interval between the starts of consecutive decode steps (CUDA/HIP events recorded on
the current stream on a GPU, so the interval is device time and needs no
synchronisation; ``time.perf_counter`` on CPU). An interval that ends at a non-decode
step (prefill / extend) is discarded.

Batch sizes are grouped into power-of-two buckets (1, 2, 4, 8, ...; a batch of 5
falls into bucket 8), close to how CUDA graphs pad the batch. Each cell
``(k, bucket)`` is a fast per-bucket level (what moves every depth together) times a
slowly averaged per-depth shape (the relative cost of the depths, which is what the
argmax needs); see :class:`CycleCostTable`. A cell never measured is predicted from the
prior ``T_prior(k, bucket)`` scaled by how the measured cells of that bucket (else of the
neighbouring buckets, interpolated) compare with their priors, so the prior supplies only
the *shape* of the curve.

Only numpy (and torch when CUDA events are used); no SGLang import.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Hashable, List, Optional, Sequence, Tuple


def batch_bucket(batch_size: int) -> int:
    """Smallest power of two ``>= batch_size`` (requests). Raises ``ValueError`` for ``batch_size < 1``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    return 1 << (int(batch_size) - 1).bit_length()


@dataclass(frozen=True)
class ParametricCycleCost:
    """``T(k, b) = fixed + per_draft * k + per_row * b * (k + 1)`` seconds.

    ``fixed``: scheduler, launch and the batch-independent part of one target step;
    ``per_draft``: one draft step; ``per_row``: one verify row (the target runs
    ``b * (k + 1)`` rows). A prior and a simulator curve, not a measurement.
    """

    fixed: float = 1.0e-3
    per_draft: float = 0.1e-3
    per_row: float = 0.01e-3

    def __call__(self, depth: int, batch_size: int) -> float:
        return self.fixed + self.per_draft * depth + self.per_row * batch_size * (depth + 1)


class CycleCostTable:
    """``T(k, bucket)`` in seconds, from measurements and a prior: a fast level times a slow shape.

    Every measured cycle of bucket ``b`` updates two things (in logs, so both are ratios):

    * the *shape* ``S_{k,b}`` of the depth actually run, first: a running mean of its log
      residual against the current level for its first ``shape_memory`` cycles, an EMA with
      weight ``1 / shape_memory`` after that. The relative cost of the depths, which is all
      the argmax needs (a common factor cancels in ``E[committed | k] / T``), is so averaged
      over hundreds of cycles even for a depth that is only probed now and then, instead of
      resting on its last few noisy cycles;
    * then the bucket's *level* ``L_b``, an exponential moving average (weight ``smoothing``)
      of what is left of the residual, whatever the depth: it follows what moves all depths
      together (context length, co-located load, clocks) within a few cycles. Its noise is
      common to every depth of the bucket and does not move the argmax, so it can be fast.

    ``estimate(k, b) = exp(L_b + S_{k,b})``. A cell never measured is predicted from the prior
    ``T_prior(k, b)`` scaled by how the measured cells of that bucket compare with their
    priors; a bucket with no measured cell takes the scale interpolated (in log bucket) from
    the nearest measured buckets below and above, else the nearest one; so the prior supplies
    only the *shape* of the curve.

    ``level_smoothing=0`` and ``shape_memory=1`` give a table that holds each cell's last cycle.

    Args:
        depths: the draft depths that exist (graphs / buffers built).
        prior: ``prior(k, batch_size) -> seconds``; default :class:`ParametricCycleCost`.
        smoothing: EMA weight of the level (0 <= smoothing <= 1).
        shape_memory: cycles a depth's shape is averaged over (>= 1).
        outlier_factor: a cycle above ``outlier_factor`` x the current estimate is clipped
            to it (a stall inside a cycle must not dominate; a lasting change still gets through).
            A depth's first cycle in a bucket where other depths are measured is clipped the same
            way against its prior-scaled estimate: a first cycle that carries one-time work (a
            warm-up, a lazy allocation) would otherwise set the depth's shape, and later cycles
            average it out only as ``1 / n`` (a depth that is only probed kept a cost 1.6x too high
            on the CPU server, 2026-12-03).

    Raises:
        ValueError: empty or negative ``depths``, ``smoothing`` outside [0, 1], ``shape_memory < 1``,
            ``outlier_factor <= 1``.
    """

    def __init__(
        self,
        depths: Sequence[int],
        prior: Optional[Callable[[int, int], float]] = None,
        *,
        smoothing: float = 0.5,
        shape_memory: int = 200,
        outlier_factor: float = 3.0,
    ):
        depths = sorted(set(int(k) for k in depths))
        if not depths or depths[0] < 0:
            raise ValueError(f"depths must be a non-empty set of ints >= 0, got {depths!r}")
        if not 0.0 <= smoothing <= 1.0:
            raise ValueError(f"smoothing must be in [0, 1], got {smoothing!r}")
        if not (isinstance(shape_memory, int) and shape_memory >= 1):
            raise ValueError(f"shape_memory must be an int >= 1 (cycles), got {shape_memory!r}")
        if not outlier_factor > 1.0:
            raise ValueError(f"outlier_factor must be > 1, got {outlier_factor!r}")
        self.depths = depths
        self.prior = prior if prior is not None else ParametricCycleCost()
        self.smoothing = float(smoothing)
        self.shape_memory = int(shape_memory)
        self.outlier_factor = float(outlier_factor)
        self._level: Dict[int, float] = {}  # bucket -> log level
        self._shape: Dict[Tuple[int, int], float] = {}  # (depth, bucket) -> log shape
        self._count: Dict[Tuple[int, int], int] = {}
        self._scale_cache: Dict[int, float] = {}
        self._noise_var = 0.05 ** 2  # per-cycle log-time variance, learnt from the residuals

    def record(self, depth: int, batch_size: int, seconds: float) -> None:
        """Add one measured cycle (``seconds > 0``) at draft depth ``depth`` and batch size ``batch_size``.

        Raises:
            ValueError: unknown ``depth`` or non-positive / non-finite ``seconds``.
        """
        if depth not in self.depths:
            raise ValueError(f"depth {depth!r} is not one of the available depths {self.depths}")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be a positive finite duration, got {seconds!r}")
        bucket = batch_bucket(batch_size)
        key = (int(depth), bucket)
        x = math.log(seconds)
        level = self._level.setdefault(bucket, 0.0)
        shape = self._shape.get(key)
        n = self._count.get(key, 0)
        if shape is None:
            if any(k[1] == bucket for k in self._shape):  # clip against the same bucket's scaled prior
                x = min(x, math.log(self.estimate(depth, batch_size) * self.outlier_factor))
            self._shape[key] = x - level
        else:
            pred = level + shape
            x = min(x, pred + math.log(self.outlier_factor))  # clip a stall
            self._noise_var += 0.01 * ((x - pred) ** 2 - self._noise_var)
            # shape first, against the level the other cycles set; then the level takes the rest
            shape += max(1.0 / (n + 1), 1.0 / self.shape_memory) * (x - pred)
            self._shape[key] = shape
            self._level[bucket] = level + self.smoothing * (x - level - shape)
        self._count[key] = n + 1
        self._scale_cache.clear()

    def count(self, depth: int, batch_size: int) -> int:
        """Measured cycles in the cell of ``(depth, batch_bucket(batch_size))``."""
        return self._count.get((depth, batch_bucket(batch_size)), 0)

    @property
    def noise(self) -> float:
        """Learnt standard deviation of one cycle's log time around its cell (starts at 0.05)."""
        return math.sqrt(self._noise_var)

    def log_se(self, depth: int, batch_size: int) -> float:
        """Standard error of ``log estimate(depth, batch_size)`` relative to the bucket level.

        ``noise / sqrt(min(cycles, shape_memory))`` for a measured cell, ``inf`` for an unmeasured one.
        """
        n = self._count.get((depth, batch_bucket(batch_size)), 0)
        return self.noise / math.sqrt(min(n, self.shape_memory)) if n else math.inf

    def _measured(self, key: Tuple[int, int]) -> float:
        return math.exp(self._level[key[1]] + self._shape[key])

    def _bucket_log_ratio(self, bucket: int) -> Optional[float]:
        logs = [math.log(self._measured(key) / self.prior(key[0], key[1])) for key in self._shape if key[1] == bucket]
        return sum(logs) / len(logs) if logs else None

    def _scale(self, bucket: int) -> float:
        scale = self._scale_cache.get(bucket)
        if scale is None:
            own = self._bucket_log_ratio(bucket)
            if own is None:
                measured = sorted({b for _, b in self._shape})
                below = [b for b in measured if b < bucket]
                above = [b for b in measured if b > bucket]
                if below and above:  # interpolate in log2(bucket)
                    lo, hi = below[-1], above[0]
                    w = (math.log2(bucket) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
                    own = (1 - w) * self._bucket_log_ratio(lo) + w * self._bucket_log_ratio(hi)
                elif below or above:
                    own = self._bucket_log_ratio(below[-1] if below else above[0])
            scale = 1.0 if own is None else math.exp(own)
            self._scale_cache[bucket] = scale
        return scale

    def estimate(self, depth: int, batch_size: int) -> float:
        """Seconds per cycle at ``depth`` for a batch of ``batch_size`` (measured, else scaled prior)."""
        bucket = batch_bucket(batch_size)
        if (depth, bucket) in self._shape:
            return self._measured((depth, bucket))
        return self.prior(depth, bucket) * self._scale(bucket)

    def as_dict(self) -> Dict[str, Dict[str, Dict[str, float]]]:
        """Measured cells: ``{bucket: {depth: {"seconds": estimate, "cycles": n}}}`` (string keys, JSON-ready)."""
        out: Dict[str, Dict[str, Dict[str, float]]] = {}
        for key in sorted(self._shape, key=lambda kv: (kv[1], kv[0])):
            out.setdefault(str(key[1]), {})[str(key[0])] = {"seconds": self._measured(key), "cycles": self._count[key]}
        return out


class CycleTimer:
    """Intervals between consecutive step starts, without synchronising the device.

    ``mark(tag)`` at the start of every step (``tag`` = ``(depth, batch_size)`` for a decode
    step, ``None`` for any other step); ``collect()`` returns ``[(tag, seconds)]`` for each
    finished interval whose start was a decode step. On CUDA / ROCm (``use_device_events``)
    a timing event is recorded on the current stream and read once it has completed
    (``Event.query()``); otherwise ``clock()`` (default ``time.perf_counter``) is read.

    Raises:
        ValueError: ``use_device_events`` without an available CUDA / HIP device.
    """

    def __init__(self, *, use_device_events: bool = False, clock: Callable[[], float] = time.perf_counter,
                 max_pending: int = 64):
        self._events = use_device_events
        if use_device_events:
            import torch

            if not torch.cuda.is_available():
                raise ValueError("use_device_events=True needs a CUDA/HIP device (torch.cuda.is_available() is False)")
            self._torch = torch
        self._clock = clock
        self._pending: Deque[Tuple[Optional[Hashable], object]] = deque(maxlen=max_pending)

    @property
    def uses_device_events(self) -> bool:
        return self._events

    def mark(self, tag: Optional[Hashable]) -> None:
        if self._events:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self._pending.append((tag, event))
        else:
            self._pending.append((tag, self._clock()))

    def collect(self) -> List[Tuple[Hashable, float]]:
        done: List[Tuple[Hashable, float]] = []
        while len(self._pending) >= 2:
            (tag, start), (_, end) = self._pending[0], self._pending[1]
            if self._events:
                if not end.query():  # later events complete later on the same stream
                    break
                seconds = start.elapsed_time(end) * 1e-3
            else:
                seconds = end - start
            self._pending.popleft()
            if tag is not None and seconds > 0:
                done.append((tag, seconds))
        return done
