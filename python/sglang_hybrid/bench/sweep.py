"""AgentX-style sweep: trace replay at several concurrencies, throughput per GPU vs interactivity.

Usage::

    python -m sglang_hybrid.bench.sweep --base-url http://127.0.0.1:30000 \\
        --concurrency 1,2,4,8,16,32,64 --num-requests 500 --length-scale 0.25 \\
        --num-gpus 8 --usd-per-gpu-hour 2.5 --target-interactivity 50

Every replay option (``python -m sglang_hybrid.bench.replay --help``) is
accepted; ``--concurrency`` takes a comma-separated list. Each concurrency C
replays the same trace slice closed-loop at C (``replay.run``), with prompt
seed ``--seed + i`` for the i-th point so that no point finds the previous
point's prompts in the prefix cache (the trace's own sharing pattern is kept
inside each point). Per point:

- throughput: ``total_token_throughput`` (input + output tokens/s) ÷ ``--num-gpus``
  = tokens/s/GPU;
- interactivity: 1 / P90 ITL (tokens/s/user; ITL = gap between
  token-carrying chunks, TTFT excluded);
- tokens per dollar: tokens/s/GPU × 3600 ÷ ``--usd-per-gpu-hour``.

Then the throughput at ``--target-interactivity`` is linearly interpolated
between the two measured points around it (``metrics.interpolate_at_interactivity``;
None outside the measured range), with its tokens per dollar.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import os
import sys
from typing import Any, Dict, List, Optional

from sglang_hybrid.bench import manifest as _manifest
from sglang_hybrid.bench import replay
from sglang_hybrid.bench.abbench import parse_int_list
from sglang_hybrid.bench.metrics import interpolate_at_interactivity, tokens_per_dollar
from sglang_hybrid.bench.resultfile import write_json


def build_parser() -> argparse.ArgumentParser:
    """Replay options plus a concurrency list, GPU count, $/GPU-hour and target interactivity (tokens/s/user)."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_hybrid.bench.sweep",
        description="Concurrency sweep of the trace replay: tokens/s/GPU vs P90 interactivity.",
        parents=[replay.build_parser()],
        conflict_handler="resolve",
    )
    p.add_argument("--concurrency", type=parse_int_list, default=[1, 2, 4, 8],
                   help="comma-separated closed-loop concurrencies, one replay each")
    p.add_argument("--num-gpus", type=float, default=1.0,
                   help="GPUs serving the endpoint; throughputs are divided by it (default 1)")
    p.add_argument("--usd-per-gpu-hour", type=float, default=None,
                   help="price of one GPU-hour in US dollars, for tokens per dollar")
    p.add_argument("--target-interactivity", type=float, default=50.0,
                   help="interactivity (tokens/s/user) at which to interpolate the throughput")
    p.add_argument("--requests-per-stream", type=int, default=0,
                   help="at least this many requests per concurrent stream at every point: a point at C replays "
                        "the first max(--num-requests, N x C) requests, so loaded points last long enough to "
                        "measure (0: --num-requests at every point)")
    p.add_argument("--same-seed", action="store_true",
                   help="use --seed for every point (default: --seed + point index)")
    p.add_argument("--output-json", default=None,
                   help="result file (default runs/sweep-<UTC timestamp>.json)")
    return p


def requests_at(num_requests: Optional[int], per_stream: int, concurrency: int) -> Optional[int]:
    """Requests replayed at one point: ``num_requests`` (None = the whole trace), raised to
    ``per_stream x concurrency`` when ``per_stream`` > 0. Raises ValueError if ``per_stream`` < 0."""
    if per_stream < 0:
        raise ValueError(f"requests_per_stream must be >= 0, got {per_stream}")
    if not per_stream or num_requests is None:
        return num_requests
    return max(num_requests, per_stream * concurrency)


def derive_point(summary: Dict[str, Any], num_gpus: float, usd_per_gpu_hour: Optional[float]) -> Dict[str, Any]:
    """Per-GPU numbers of one replay summary.

    Returns ``total_tok_s_per_gpu`` and ``output_tok_s_per_gpu`` (tokens/s/GPU),
    ``interactivity_p90_tok_s_user`` (tokens/s/user) and
    ``total_tokens_per_usd`` (tokens/$; None without a price).
    """
    tot = summary.get("total_token_throughput")
    out = summary.get("output_token_throughput")
    per_gpu = tot / num_gpus if tot is not None else None
    return {
        "total_tok_s_per_gpu": per_gpu,
        "output_tok_s_per_gpu": out / num_gpus if out is not None else None,
        "interactivity_p90_tok_s_user": summary.get("interactivity_p90_tok_s_user"),
        "total_tokens_per_usd": tokens_per_dollar(per_gpu, usd_per_gpu_hour) if usd_per_gpu_hour else None,
    }


def at_target(points: List[Dict[str, Any]], target: float, usd_per_gpu_hour: Optional[float]) -> Dict[str, Any]:
    """Throughput (tokens/s/GPU) and tokens per dollar at ``target`` interactivity (tokens/s/user)."""
    pairs = [(p["derived"]["interactivity_p90_tok_s_user"], p["derived"]["total_tok_s_per_gpu"]) for p in points]
    tput = interpolate_at_interactivity(pairs, target)
    xs = [x for x, _ in pairs if x is not None]
    return {
        "interactivity_tok_s_user": target,
        "total_tok_s_per_gpu": tput,
        "total_tokens_per_usd": tokens_per_dollar(tput, usd_per_gpu_hour) if usd_per_gpu_hour else None,
        "measured_interactivity_range": [min(xs), max(xs)] if xs else None,
        "note": None if tput is not None else "target outside the measured interactivity range (no extrapolation)",
    }


def run(args: argparse.Namespace, command: List[str]) -> Dict[str, Any]:
    """Replay at every concurrency of ``args.concurrency``; return the result document
    ``{"kind": "sweep", "manifest", "points", "target"}`` (nothing written)."""
    if args.num_gpus <= 0:
        raise SystemExit("--num-gpus must be > 0")
    start_utc = _dt.datetime.now(_dt.timezone.utc)
    points = []
    all_results = []
    first_manifest = None
    for i, c in enumerate(args.concurrency):
        a = copy.copy(args)
        a.concurrency = c
        a.seed = args.seed if args.same_seed else args.seed + i
        a.num_requests = requests_at(args.num_requests, args.requests_per_stream, c)
        a.output_json = None
        print(f">> sweep: concurrency {c} (seed {a.seed}, {a.num_requests or 'all'} requests)", flush=True)
        out = replay.run(a, command)
        if first_manifest is None:
            first_manifest = out["manifest"]
        all_results.extend(out["results"])
        points.append({
            "concurrency": c,
            "seed": a.seed,
            "summary": out["summary"],
            "derived": derive_point(out["summary"], args.num_gpus, args.usd_per_gpu_hour),
            "request_stats": _manifest.request_stats(out["results"]),
            "requests": [r.to_row() for r in out["results"]],
        })
    m = dict(first_manifest)
    m["options"] = vars(args)
    m["start_time_utc"] = start_utc.isoformat()
    m["benchmark"] = "sweep"
    m["request_stats"] = _manifest.request_stats(all_results)
    return {
        "kind": "sweep",
        "manifest": m,
        "points": points,
        "target": at_target(points, args.target_interactivity, args.usd_per_gpu_hour),
    }


def format_points(doc: Dict[str, Any]) -> str:
    """The sweep as a text table, one line per concurrency, then the interpolated target."""
    lines = [f"{'C':>4} {'tok/s/GPU':>11} {'P90 ITL ms':>11} {'tok/s/user':>11} {'TTFT P90 ms':>12} {'tok/$':>12} {'errors':>7}"]
    for p in doc["points"]:
        s, d = p["summary"], p["derived"]
        itl = s.get("itl_p90_s")
        ttft = s.get("ttft_p90_s")
        tpd = d.get("total_tokens_per_usd")
        lines.append(
            f"{p['concurrency']:>4} {_f(d['total_tok_s_per_gpu']):>11} {_f(itl, 1000):>11} "
            f"{_f(d['interactivity_p90_tok_s_user']):>11} {_f(ttft, 1000):>12} {_f(tpd, 1, 0):>12} {s['num_errors']:>7}"
        )
    t = doc["target"]
    lines.append(
        f"at {t['interactivity_tok_s_user']:g} tok/s/user: {_f(t['total_tok_s_per_gpu'])} tok/s/GPU"
        + (f", {_f(t['total_tokens_per_usd'], 1, 0)} tokens/$" if t.get("total_tokens_per_usd") else "")
        + (f" ({t['note']})" if t.get("note") else "")
    )
    return "\n".join(lines)


def _f(v, scale: float = 1.0, nd: int = 2) -> str:
    return "n/a" if v is None else f"{v * scale:.{nd}f}"


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse ``argv``, run the sweep, print and save it; return the result document."""
    cmd_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(cmd_argv)
    args.no_progress = True
    doc = run(args, ["python", "-m", "sglang_hybrid.bench.sweep", *cmd_argv])
    out_path = args.output_json or os.path.join(
        "runs", f"sweep-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    write_json(out_path, doc)
    print(format_points(doc))
    print(f"results written to {out_path}")
    return doc


if __name__ == "__main__":
    main()
