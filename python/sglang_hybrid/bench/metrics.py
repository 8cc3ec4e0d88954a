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


def summarize(
    results: List[RequestResult],
    wall_time_s: float,
    theoretical: Tuple[int, int],
) -> Dict[str, Any]:
    """Totals, throughputs and latency percentiles of one run.

    ``theoretical`` is ``(matched tokens, input tokens)`` from
    ``trace.theoretical_reuse``. Token totals and reuse count successful
    requests only. ITL percentiles pool every inter-chunk gap of every
    successful request; interactivity is ``1 / P90 ITL`` (tokens/s seen by
    one user during decode, TTFT excluded). TPOT is per request:
    ``(e2e - ttft) / (output_tokens - 1)``.
    """
    ok = [r for r in results if r.success]
    input_tokens = sum(r.input_len for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    cached_tokens = sum(r.cached_tokens for r in ok)
    achieved = _ratio(cached_tokens, input_tokens)
    theo = _ratio(theoretical[0], theoretical[1])
    reuse_ratio = achieved / theo if (achieved is not None and theo) else None

    ttft = percentiles([r.ttft for r in ok if r.ttft is not None])
    itl_all = [g for r in ok for g in r.itl]
    itl = percentiles(itl_all)
    tpot = percentiles(
        [(r.e2e_latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    )
    chunks = [c for r in ok for c in r.chunk_tokens]
    e2e = percentiles([r.e2e_latency for r in ok if r.e2e_latency is not None])
    wall = wall_time_s if wall_time_s > 0 else None

    return {
        "num_requests": len(results),
        "num_success": len(ok),
        "num_errors": len(results) - len(ok),
        "wall_time_s": wall_time_s,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": cached_tokens,
        "achieved_reuse": achieved,
        "theoretical_reuse": theo,
        "theoretical_matched_tokens": theoretical[0],
        "theoretical_input_tokens": theoretical[1],
        "reuse_ratio": reuse_ratio,
        "total_token_throughput": _ratio(input_tokens + output_tokens, wall) if wall else None,
        "output_token_throughput": _ratio(output_tokens, wall) if wall else None,
        "request_throughput": _ratio(len(ok), wall) if wall else None,
        "ttft_p50_s": ttft[50],
        "ttft_p90_s": ttft[90],
        "ttft_p99_s": ttft[99],
        "itl_p50_s": itl[50],
        "itl_p90_s": itl[90],
        "itl_p99_s": itl[99],
        "tpot_p50_s": tpot[50],
        "tpot_p90_s": tpot[90],
        "e2e_p50_s": e2e[50],
        "e2e_p90_s": e2e[90],
        "interactivity_p90_tok_s_user": (1.0 / itl[90]) if itl[90] else None,
        "mean_tokens_per_chunk": float(np.mean(chunks)) if chunks else None,
    }


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
