"""Summary metrics of a replay run.

Units: times in seconds, lengths in tokens, throughputs in tokens/s or
requests/s, reuse as a fraction in [0, 1]. Percentiles use
``numpy.percentile`` (linear interpolation).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sglang_hybrid.bench.client import RequestResult

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float], qs: Sequence[int] = PERCENTILES) -> Dict[int, Optional[float]]:
    """``{q: numpy.percentile(values, q)}``; None for every q when empty."""
    if len(values) == 0:
        return {q: None for q in qs}
    arr = np.asarray(values, dtype=np.float64)
    return {q: float(np.percentile(arr, q)) for q in qs}


def _ratio(num: float, den: float) -> Optional[float]:
    return float(num) / float(den) if den else None


class _NoRetokenize:
    """Stands in for the tokenizer upstream's ``calculate_metrics`` retokenizes generated text with
    (only for its ``*_retokenized`` fields, which we do not report: our token counts are the server's)."""

    def encode(self, text, add_special_tokens=False):
        return []


def sglang_serving_metrics(results: Sequence[RequestResult], wall_time_s: float) -> Optional[Dict[str, Any]]:
    """Latency and throughput statistics as ``python -m sglang.bench_serving`` computes them: upstream's
    ``sglang.benchmark.serving.calculate_metrics`` run on our requests (issue 44: the well-kept tool's
    definitions, so figures compare 1:1 with upstream's benchmark).

    Each successful :class:`RequestResult` becomes upstream's ``RequestFuncOutput``: ``ttft``,
    ``latency`` = E2E, ``output_len`` = the server's token count, ``start_time``, and ``itl`` as upstream's
    own streaming client records it: each chunk gap divided by the tokens of the chunk that ends it,
    once per token (token-weighted; :func:`burst_normalised_itl` is the per-chunk version). Input
    lengths come from the requests (``prompt_len``).

    Returns upstream's ``BenchmarkMetrics`` fields as a dict (its units: milliseconds, tokens/s,
    requests/s), or None when no request succeeded or ``wall_time_s`` <= 0.
    """
    ok = [r for r in results if r.success and r.ttft is not None and r.e2e_latency is not None]
    if not ok or wall_time_s <= 0:
        return None
    from dataclasses import asdict as _asdict

    from sglang.benchmark.datasets import DatasetRow
    from sglang.benchmark.serving import RequestFuncOutput, calculate_metrics

    outputs, rows, ok_ids = [], [], {id(r) for r in ok}
    for r in results:
        out = RequestFuncOutput(prompt_len=r.input_len)
        rows.append(DatasetRow(prompt=None, prompt_len=r.input_len, output_len=r.output_len,
                               text_prompt_len=r.input_len, vision_prompt_len=0))
        if id(r) in ok_ids:
            out.success, out.ttft, out.latency = True, r.ttft, r.e2e_latency
            out.output_len, out.start_time = r.output_tokens, r.start_time or 0.0
            out.itl = [gap / n for gap, n in zip(r.itl, r.chunk_tokens[1:]) if n > 0 for _ in range(n)]
        outputs.append(out)
    metrics, _ = calculate_metrics(rows, outputs, wall_time_s, _NoRetokenize(), "sglang")
    return {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in _asdict(metrics).items()
            if "retokenized" not in k}


def summarize(
    results: List[RequestResult],
    wall_time_s: float,
    theoretical: Tuple[int, int],
) -> Dict[str, Any]:
    """Totals, throughputs and latency percentiles of one run.

    ``theoretical`` is ``(matched tokens, input tokens)`` from
    ``trace.theoretical_reuse``. Token totals and reuse count successful
    requests only. TTFT, TPOT (per request: ``(e2e - ttft) / (output_tokens - 1)``)
    and E2E percentiles and the throughputs are upstream's
    (:func:`sglang_serving_metrics`, also kept whole under
    ``sglang_bench_serving``); ``itl_token_*`` is upstream's token-weighted
    ITL. What upstream lacks stays ours: ``itl_*`` percentiles pool every
    inter-chunk gap of every successful request, interactivity is
    ``1 / P90 ITL`` (tokens/s seen by one user during decode, TTFT excluded),
    and the reuse accounting.
    """
    ok = [r for r in results if r.success]
    input_tokens = sum(r.input_len for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    cached_tokens = sum(r.cached_tokens for r in ok)
    tiers: Dict[str, int] = {}
    for r in ok:
        for tier, n in (getattr(r, "cached_tokens_details", None) or {}).items():
            tiers[tier] = tiers.get(tier, 0) + int(n)
    achieved = _ratio(cached_tokens, input_tokens)
    theo = _ratio(theoretical[0], theoretical[1])
    reuse_ratio = achieved / theo if (achieved is not None and theo) else None

    up = sglang_serving_metrics(results, wall_time_s) or {}
    itl_all = [g for r in ok for g in r.itl]
    itl = percentiles(itl_all)
    chunks = [c for r in ok for c in r.chunk_tokens]
    wall = wall_time_s if wall_time_s > 0 else None

    return {
        "num_requests": len(results),
        "num_success": len(ok),
        "num_errors": len(results) - len(ok),
        "wall_time_s": wall_time_s,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": cached_tokens,
        "cached_tokens_by_tier": tiers,
        "achieved_reuse": achieved,
        "theoretical_reuse": theo,
        "theoretical_matched_tokens": theoretical[0],
        "theoretical_input_tokens": theoretical[1],
        "reuse_ratio": reuse_ratio,
        "total_token_throughput": _ratio(input_tokens + output_tokens, wall) if wall else None,
        "output_token_throughput": _ratio(output_tokens, wall) if wall else None,
        "request_throughput": _ratio(len(ok), wall) if wall else None,
        "ttft_p50_s": _s(up, "median_ttft_ms"),
        "ttft_p90_s": _s(up, "p90_ttft_ms"),
        "ttft_p99_s": _s(up, "p99_ttft_ms"),
        "itl_p50_s": itl[50],
        "itl_p90_s": itl[90],
        "itl_p99_s": itl[99],
        "itl_token_p50_s": _s(up, "median_itl_ms"),
        "itl_token_p90_s": _s(up, "p90_itl_ms"),
        "tpot_p50_s": _s(up, "median_tpot_ms"),
        "tpot_p90_s": _s(up, "p90_tpot_ms"),
        "e2e_p50_s": _s(up, "median_e2e_latency_ms"),
        "e2e_p90_s": _s(up, "p90_e2e_latency_ms"),
        "interactivity_p90_tok_s_user": (1.0 / itl[90]) if itl[90] else None,
        "mean_tokens_per_chunk": float(np.mean(chunks)) if chunks else None,
        "sglang_bench_serving": up or None,
    }


def _s(up: Dict[str, Any], key: str) -> Optional[float]:
    """Upstream's millisecond figure ``key`` in seconds (None when absent)."""
    v = up.get(key)
    return None if v is None else v / 1000.0


# (key, label, unit, scale) for the printed table
_ROWS = [
    ("num_requests", "requests", "", 1),
    ("num_success", "successful", "", 1),
    ("num_errors", "errors", "", 1),
    ("wall_time_s", "wall time", "s", 1),
    ("input_tokens", "input tokens", "tok", 1),
    ("output_tokens", "output tokens", "tok", 1),
    ("cached_tokens", "cached tokens", "tok", 1),
    ("achieved_reuse", "achieved prefix reuse", "%", 100),
    ("theoretical_reuse", "theoretical reuse", "%", 100),
    ("reuse_ratio", "achieved / theoretical", "%", 100),
    ("total_token_throughput", "total token throughput", "tok/s", 1),
    ("output_token_throughput", "output token throughput", "tok/s", 1),
    ("request_throughput", "request throughput", "req/s", 1),
    ("ttft_p50_s", "TTFT P50", "ms", 1000),
    ("ttft_p90_s", "TTFT P90", "ms", 1000),
    ("ttft_p99_s", "TTFT P99", "ms", 1000),
    ("itl_p50_s", "ITL P50", "ms", 1000),
    ("itl_p90_s", "ITL P90", "ms", 1000),
    ("itl_p99_s", "ITL P99", "ms", 1000),
    ("tpot_p50_s", "TPOT P50", "ms", 1000),
    ("tpot_p90_s", "TPOT P90", "ms", 1000),
    ("e2e_p50_s", "E2E latency P50", "ms", 1000),
    ("e2e_p90_s", "E2E latency P90", "ms", 1000),
    ("interactivity_p90_tok_s_user", "P90 interactivity", "tok/s/user", 1),
    ("mean_tokens_per_chunk", "mean tokens per chunk", "tok", 1),
]


def format_summary(summary: Dict[str, Any]) -> str:
    """The summary as an aligned two-column text table."""
    lines = []
    width = max(len(label) for _, label, _, _ in _ROWS)
    lines.append("=" * (width + 24))
    for key, label, unit, scale in _ROWS:
        v = summary.get(key)
        if v is None:
            text = "n/a"
        elif isinstance(v, int) and scale == 1:
            text = f"{v}"
        else:
            text = f"{v * scale:.2f}"
        lines.append(f"{label:<{width}}  {text:>12} {unit}")
    lines.append("=" * (width + 24))
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Closed-loop windows (abbench)
# --------------------------------------------------------------------------


def chunk_gaps(results: Sequence[RequestResult]) -> List[float]:
    """True per-chunk ITL: every gap (s) between successive token-carrying
    chunks of every successful request, pooled."""
    return [g for r in results if r.success for g in r.itl]


def burst_normalised_itl(results: Sequence[RequestResult]) -> List[float]:
    """Burst-normalised ITL, a proxy for per-token latency: each chunk gap (s)
    divided by the number of tokens in the chunk that ends it, one value per
    decode chunk, pooled over successful requests.

    A chunk of 4 tokens arriving 40 ms after the previous one gives one value
    of 10 ms. It is a proxy: the server produced those tokens at unknown
    times inside the gap.
    """
    out: List[float] = []
    for r in results:
        if not r.success:
            continue
        for gap, n in zip(r.itl, r.chunk_tokens[1:]):
            if n > 0:
                out.append(gap / n)
    return out


def decode_rate(r: RequestResult) -> Optional[float]:
    """Per-request decode rate (tokens/s): tokens after the first chunk ÷
    (time of the last chunk − time of the first chunk) = ``sum(chunk_tokens[1:]) / sum(itl)``.

    Its denominator is the request's own decode time (TTFT excluded), not
    the run's wall time. None with fewer than two chunks.
    """
    toks = sum(r.chunk_tokens[1:])
    dt = float(sum(r.itl))
    if toks <= 0 or dt <= 0:
        return None
    return toks / dt


def summarize_window(
    results: Sequence[RequestResult], concurrency: int, window_s: float, wall_time_s: float
) -> Dict[str, Any]:
    """Metrics of one closed-loop window (abbench).

    ``results``: every request started inside the window (those in flight at
    its end ran to completion). ``wall_time_s``: window start to the end of
    the last request, tail included. Keys:

    - ``output_token_throughput``: Σ output tokens of successful requests ÷
      ``wall_time_s`` (tokens/s, aggregate over all streams);
    - ``decode_rate_p50_tok_s``: median of :func:`decode_rate` over successful
      requests (tokens/s per request; own denominator);
    - ``ttft_p50_s``, ``ttft_p99_s``: TTFT (s), upstream's :func:`sglang_serving_metrics`; ``ttft_max_s`` ours;
    - ``itl_burst_norm_p50_s``, ``_p99_s``: :func:`burst_normalised_itl` (s/token, proxy);
    - ``chunk_gap_p50_s``, ``_p99_s``, ``_max_s``: :func:`chunk_gaps` (s);
    - ``tpot_p50_s``: (E2E − TTFT) / (output tokens − 1), median (s/token), upstream's;
    - ``sglang_bench_serving``: upstream's whole ``BenchmarkMetrics`` of the window (ms);
    - ``num_requests``, ``num_success``, ``num_errors``, ``output_tokens``,
      ``mean_tokens_per_chunk``, ``tail_s`` (= wall time − window).
    """
    ok = [r for r in results if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    up = sglang_serving_metrics(results, wall_time_s) or {}
    rates = [x for x in (decode_rate(r) for r in ok) if x is not None]
    bn = percentiles(burst_normalised_itl(ok), (50, 99))
    gaps_all = chunk_gaps(ok)
    gaps = percentiles(gaps_all, (50, 99))
    chunks = [c for r in ok for c in r.chunk_tokens]
    return {
        "concurrency": concurrency,
        "window_s": window_s,
        "wall_time_s": wall_time_s,
        "tail_s": wall_time_s - window_s,
        "num_requests": len(results),
        "num_success": len(ok),
        "num_errors": len(results) - len(ok),
        "output_tokens": out_tokens,
        "output_token_throughput": _ratio(out_tokens, wall_time_s) if wall_time_s > 0 else None,
        "decode_rate_p50_tok_s": float(np.median(rates)) if rates else None,
        "ttft_p50_s": _s(up, "median_ttft_ms"),
        "ttft_p99_s": _s(up, "p99_ttft_ms"),
        "ttft_max_s": max(ttfts) if ttfts else None,
        "itl_burst_norm_p50_s": bn[50],
        "itl_burst_norm_p99_s": bn[99],
        "chunk_gap_p50_s": gaps[50],
        "chunk_gap_p99_s": gaps[99],
        "chunk_gap_max_s": max(gaps_all) if gaps_all else None,
        "tpot_p50_s": _s(up, "median_tpot_ms"),
        "mean_tokens_per_chunk": float(np.mean(chunks)) if chunks else None,
        "sglang_bench_serving": up or None,
    }


# (key, label, unit, scale) for the abbench table
WINDOW_ROWS = [
    ("concurrency", "concurrency", "streams", 1),
    ("num_requests", "requests (started in window)", "", 1),
    ("num_errors", "request errors", "", 1),
    ("wall_time_s", "wall time incl. tail", "s", 1),
    ("output_token_throughput", "aggregate output throughput", "tok/s", 1),
    ("decode_rate_p50_tok_s", "median per-request decode rate", "tok/s", 1),
    ("ttft_p50_s", "TTFT P50", "ms", 1000),
    ("ttft_p99_s", "TTFT P99", "ms", 1000),
    ("ttft_max_s", "TTFT max", "ms", 1000),
    ("itl_burst_norm_p99_s", "ITL P99, burst-normalised (proxy)", "ms", 1000),
    ("chunk_gap_p50_s", "chunk gap P50", "ms", 1000),
    ("chunk_gap_p99_s", "chunk gap P99", "ms", 1000),
    ("mean_tokens_per_chunk", "mean tokens per chunk", "tok", 1),
]


def format_table(summaries: Sequence[Dict[str, Any]], rows=WINDOW_ROWS) -> str:
    """Summaries side by side (one column each) as an aligned text table."""
    width = max(len(label) + len(unit) + 3 for _, label, unit, _ in rows)
    lines = []
    for key, label, unit, scale in rows:
        cells = []
        for s in summaries:
            v = s.get(key)
            if v is None:
                cells.append(f"{'n/a':>10}")
            elif isinstance(v, int) and scale == 1:
                cells.append(f"{v:>10d}")
            else:
                cells.append(f"{v * scale:>10.2f}")
        name = f"{label} [{unit}]" if unit else label
        lines.append(f"{name:<{width}}" + "".join(cells))
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Throughput vs interactivity (AgentX-style sweep)
# --------------------------------------------------------------------------


def interpolate_at_interactivity(
    points: Sequence[Tuple[float, float]], target: float
) -> Optional[float]:
    """Throughput at a target interactivity, by linear interpolation.

    ``points``: ``(interactivity, throughput)`` pairs, e.g. (1 / P90 ITL in
    tokens/s/user, total tokens/s/GPU), one per concurrency. Sorted by
    interactivity, each pair of neighbours whose interactivity range holds
    ``target`` gives ``y0 + (y1 - y0) * (target - x0) / (x1 - x0)``; when
    several segments hold it (a non-monotonic curve) the largest throughput
    wins (the best configuration measured at that interactivity). A point
    exactly at ``target`` counts. None outside the measured range: no
    extrapolation.
    """
    pts = sorted((float(x), float(y)) for x, y in points if x is not None and y is not None)
    best: Optional[float] = None
    for x, y in pts:
        if x == target:
            best = y if best is None else max(best, y)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 < target < x1:
            y = y0 + (y1 - y0) * (target - x0) / (x1 - x0)
            best = y if best is None else max(best, y)
    return best


def tokens_per_dollar(tok_s_per_gpu: Optional[float], usd_per_gpu_hour: float) -> Optional[float]:
    """Tokens per US dollar: tokens/s/GPU × 3600 s/h ÷ ($/GPU-hour)."""
    if tok_s_per_gpu is None or not usd_per_gpu_hour or usd_per_gpu_hour <= 0:
        return None
    return tok_s_per_gpu * 3600.0 / usd_per_gpu_hour
