"""Cycle cost ``T(k, batch)``: a table updated online from timers, with a parametric prior (issue 7).

A *cycle* is one full draft–verify–commit round of a decode batch. We time it as the
interval between the starts of consecutive decode steps (CUDA/HIP events recorded on
the current stream on a GPU, so the interval is device time and needs no
synchronisation; ``time.perf_counter`` on CPU). An interval that ends at a non-decode
step (prefill / extend) is discarded.

Batch sizes are grouped into power-of-two buckets (1, 2, 4, 8, ...; a batch of 5
falls into bucket 8), close to how CUDA graphs pad the batch. Each cell
``(k, bucket)`` keeps an exponential moving average of its measured cycles. A cell
never measured is predicted from the prior ``T_prior(k, bucket)`` scaled by how the
measured cells of that bucket (else of all buckets) compare with their priors, so
the prior supplies only the *shape* of the curve.

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
    """``T(k, bucket)`` in seconds, from measurements (EMA) and a prior.

    Args:
        depths: the draft depths that exist (graphs / buffers built).
        prior: ``prior(k, batch_size) -> seconds``; default :class:`ParametricCycleCost`.
        smoothing: EMA weight of a new sample (0 < smoothing <= 1).
        outlier_factor: a sample above ``outlier_factor`` × the current estimate is clipped
            to it (a stall inside a cycle must not dominate; a lasting change still gets through).

    Raises:
        ValueError: empty or negative ``depths``, ``smoothing`` outside (0, 1], ``outlier_factor <= 1``.
    """

    def __init__(
        self,
        depths: Sequence[int],
        prior: Optional[Callable[[int, int], float]] = None,
        *,
        smoothing: float = 0.1,
        outlier_factor: float = 3.0,
    ):
        depths = sorted(set(int(k) for k in depths))
        if not depths or depths[0] < 0:
            raise ValueError(f"depths must be a non-empty set of ints >= 0, got {depths!r}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        if not outlier_factor > 1.0:
            raise ValueError(f"outlier_factor must be > 1, got {outlier_factor!r}")
        self.depths = depths
        self.prior = prior if prior is not None else ParametricCycleCost()
        self.smoothing = float(smoothing)
        self.outlier_factor = float(outlier_factor)
        self._est: Dict[Tuple[int, int], float] = {}
        self._count: Dict[Tuple[int, int], int] = {}
        self._scale_cache: Dict[int, float] = {}

    def record(self, depth: int, batch_size: int, seconds: float) -> None:
        """Add one measured cycle (``seconds > 0``) at draft depth ``depth`` and batch size ``batch_size``.

        Raises:
            ValueError: unknown ``depth`` or non-positive / non-finite ``seconds``.
        """
        if depth not in self.depths:
            raise ValueError(f"depth {depth!r} is not one of the available depths {self.depths}")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be a positive finite duration, got {seconds!r}")
        key = (int(depth), batch_bucket(batch_size))
        old = self._est.get(key)
        if old is None:
            self._est[key] = float(seconds)
        else:
            sample = min(float(seconds), self.outlier_factor * old)
            self._est[key] = old + self.smoothing * (sample - old)
        self._count[key] = self._count.get(key, 0) + 1
        self._scale_cache.clear()

    def count(self, depth: int, batch_size: int) -> int:
        """Measured cycles in the cell of ``(depth, batch_bucket(batch_size))``."""
        return self._count.get((depth, batch_bucket(batch_size)), 0)

    def _prior_ratio(self, keys) -> Optional[float]:
        logs = [math.log(self._est[key] / self.prior(key[0], key[1])) for key in keys]
        return math.exp(sum(logs) / len(logs)) if logs else None

    def _scale(self, bucket: int) -> float:
        scale = self._scale_cache.get(bucket)
        if scale is None:
            scale = self._prior_ratio([key for key in self._est if key[1] == bucket])
            if scale is None:
                scale = self._prior_ratio(list(self._est))
            scale = 1.0 if scale is None else scale
            self._scale_cache[bucket] = scale
        return scale

    def estimate(self, depth: int, batch_size: int) -> float:
        """Seconds per cycle at ``depth`` for a batch of ``batch_size`` (measured, else scaled prior)."""
        bucket = batch_bucket(batch_size)
        measured = self._est.get((depth, bucket))
        if measured is not None:
            return measured
        return self.prior(depth, bucket) * self._scale(bucket)

    def as_dict(self) -> Dict[str, Dict[str, Dict[str, float]]]:
        """Measured cells: ``{bucket: {depth: {"seconds": ema, "cycles": n}}}`` (string keys, JSON-ready)."""
        out: Dict[str, Dict[str, Dict[str, float]]] = {}
        for (depth, bucket), est in sorted(self._est.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            out.setdefault(str(bucket), {})[str(depth)] = {"seconds": est, "cycles": self._count[(depth, bucket)]}
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
