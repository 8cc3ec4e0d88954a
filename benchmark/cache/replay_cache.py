"""Trace-driven prefix-cache benchmark: our HybridRadixCache vs upstream's UnifiedRadixCache.

Both caches are the real classes (upstream sglang 0.5.23 ``UnifiedRadixCache``
with FULL + MAMBA components, extra_buffer, page 64; ours subclasses it), fed
request by request from the whole Mooncake conversation trace at true lengths,
over fake pools that account bytes instead of holding tensors
(``sglang_hybrid.mem_cache.fake_pools``). Byte sizes: Kimi K3 per GPU at TP8
(KV 13,824 B/token, checkpoint 54.3 MB) and a DCP8 variant (KV / 8).

Prints one line per (layout, policy, device budget, host budget) with the
reuse as % of input and as % of the perfect-cache reuse measured on the same
trace, the ratio to upstream at the same budget, and writes JSON + a plot.

    python benchmark/cache/replay_cache.py                       # full matrix (~1 h on one core)
    python benchmark/cache/replay_cache.py --limit 1500 --quick  # a few minutes

Shape matrix (issue 42: never below upstream, on any workload): ``--matrix``
replays every generated shape of ``benchmark/cache/shapes.json``
(:mod:`sglang_hybrid.bench.trace_gen`) and the conversation trace at the device
budgets, TP8 and DCP8, ours and upstream in the same run, and prints ours /
upstream per cell, the worst cell, the mean, and how far the unbounded cache is
from the perfect one:

    python benchmark/cache/replay_cache.py --matrix --jobs 2     # ~15 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

GB = 1_000_000_000


def main(argv=None) -> int:
    from sglang_hybrid.bench.trace import DEFAULT_TRACE_PATH
    from sglang_hybrid.mem_cache.trace_replay import ModelBytes, ReplayConfig, load_trace, perfect_reuse_tokens, replay

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=DEFAULT_TRACE_PATH, help="Mooncake-format JSONL (default: the packaged "
                    "conversation trace, or $SGLANG_HYBRID_TRACE)")
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--device-gb", default="20,40,80,inf", help="device budgets in GB (inf = unbounded)")
    ap.add_argument("--host-gb", default="0,250", help="host budgets in GB for our cache")
    ap.add_argument("--layouts", default="tp8,dcp8")
    ap.add_argument("--quick", action="store_true", help="TP8 only, host tier only at the largest finite budget")
    ap.add_argument("--out", default=None,
                    help="result JSON (default: benchmark/results/cache_replay.json, with --matrix cache_matrix.json)")
    ap.add_argument("--plot", default=os.path.join(REPO, "docs", "bench", "cache_replay.png"))
    ap.add_argument("--matrix", action="store_true", help="run the shape matrix instead of one trace")
    ap.add_argument("--shapes", default=os.path.join(HERE, "shapes.json"), help="matrix file (--matrix)")
    ap.add_argument("--only", default=None, help="comma-separated shape names (--matrix; 'conversation' = the trace)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (--matrix)")
    args = ap.parse_args(argv)
    if args.matrix:
        return run_matrix(args, argv)
    args.out = args.out or os.path.join(REPO, "benchmark", "results", "cache_replay.json")

    devs = [None if d.strip() == "inf" else float(d) for d in args.device_gb.split(",")]
    hosts = [float(h) for h in args.host_gb.split(",")]
    layouts = ["tp8"] if args.quick else [x.strip() for x in args.layouts.split(",")]
    records = load_trace(args.trace, args.limit)
    perfect, total = perfect_reuse_tokens(records)
    perfect_pct = 100.0 * perfect / total
    print(f"trace: {len(records)} requests, {total / 1e6:.1f} M input tokens; perfect-cache reuse {perfect_pct:.2f}%", flush=True)

    runs = []
    result = {
        "benchmark": "benchmark/cache/replay_cache.py",
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, CPU only)",
        "command": "python benchmark/cache/replay_cache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "trace": os.path.relpath(args.trace, REPO) if args.trace.startswith(REPO) else args.trace,
        "requests": len(records),
        "input_tokens": total,
        "perfect_reuse_pct": round(perfect_pct, 3),
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    # finite budgets first, unbounded last (the largest trees); DCP8 changes nothing when
    # nothing is bounded, so its unbounded rows are not re-run
    plan_all = []
    for layout in layouts:
        for dev in devs:
            if dev is None and layout != layouts[0]:
                continue
            plan_all.append((dev is None, layout, dev))
    plan_all.sort(key=lambda x: x[0])
    finite = [d for d in devs if d is not None]
    for _, layout, dev in plan_all:
        model = ModelBytes() if layout == "tp8" else ModelBytes().dcp(8)
        if True:
            plan = [("upstream", 0.0)]
            for h in hosts:
                if h > 0 and (dev is None or (args.quick and dev != max(finite))):
                    continue
                plan.append(("hybrid", h))
            for policy, host in plan:
                cfg = ReplayConfig(
                    policy=policy,
                    device_budget_bytes=None if dev is None else int(dev * GB),
                    host_budget_bytes=int(host * GB),
                    model=model,
                    stride=512,
                )
                r = replay(cfg, records)
                gc.collect()
                d = r.as_dict()
                d.update(layout=layout, reuse_pct_of_perfect=round(100.0 * r.reused_tokens / max(1, perfect), 2))
                runs.append(d)
                print(
                    f"{layout:5s} {policy:8s} device {('inf' if dev is None else f'{dev:.0f}'):>4s} GB host {host:5.0f} GB: "
                    f"reuse {r.reuse_pct:6.2f}% ({d['reuse_pct_of_perfect']:5.1f}% of perfect), "
                    f"host hit {r.host_hit_tokens / max(1, r.reused_tokens) * 100:5.1f}% of reuse, "
                    f"H2D {d['host_to_device_bytes_per_reused_token']:.0f} B/reused tok, "
                    f"cut-backs {r.cut_back_requests}, ckpts {r.checkpoints_stored} (share {r.mean_checkpoint_memory_share:.2f}), "
                    f"{r.seconds:.0f}s",
                    flush=True,
                )
                with open(args.out, "w") as f:  # after every run, so a long run keeps what it measured
                    json.dump(result, f, indent=1)
    # ratios against upstream at the same layout and device budget
    ups = {(x["layout"], x["device_budget_gb"]): x["reuse_pct"] for x in runs if x["policy"] == "upstream"}
    print("\nratio ours / upstream (same layout, device budget, same run):")
    for x in runs:
        if x["policy"] == "hybrid":
            u = ups.get((x["layout"], x["device_budget_gb"]))
            x["ratio_vs_upstream"] = round(x["reuse_pct"] / u, 3) if u else None
            print(f"  {x['layout']} device {x['device_budget_gb']} GB host {x['host_budget_gb']} GB: {x['ratio_vs_upstream']}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    if args.plot:
        _plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _matrix_cell(job):
    """One (shape, layout, budget) cell: upstream and ours on the same records."""
    shape_name, layout, dev_gb, trace_path, shapes_path, limit = job
    from sglang_hybrid.bench.trace_gen import generate, load_shapes
    from sglang_hybrid.mem_cache.trace_replay import ModelBytes, ReplayConfig, load_trace, perfect_reuse_tokens, replay

    if trace_path is not None:
        records = load_trace(trace_path, limit)
    else:
        records = generate(next(s for s in load_shapes(shapes_path) if s.name == shape_name))
    perfect, total = perfect_reuse_tokens(records)
    model = ModelBytes() if layout == "tp8" else ModelBytes().dcp(8)
    row = {"shape": shape_name, "layout": layout, "device_budget_gb": dev_gb,
           "requests": len(records), "input_tokens": total, "perfect_reuse_pct": round(100.0 * perfect / total, 3)}
    t0 = time.time()
    for policy in ("upstream", "hybrid"):
        cfg = ReplayConfig(policy=policy, device_budget_bytes=None if dev_gb is None else int(dev_gb * GB), model=model, stride=512)
        r = replay(cfg, records)
        row[policy] = {"reuse_pct": round(r.reuse_pct, 3), "kv_match_discarded_tokens": r.kv_match_discarded_tokens,
                       "checkpoints_stored": r.checkpoints_stored, "seconds": round(r.seconds, 1)}
        gc.collect()
    up, ours = row["upstream"]["reuse_pct"], row["hybrid"]["reuse_pct"]
    row["ratio"] = round(ours / up, 4) if up > 0 else (1.0 if ours == 0 else float("inf"))
    row["seconds"] = round(time.time() - t0, 1)
    return row


def run_matrix(args, argv) -> int:
    """The shape matrix (see the module docstring); writes ``--out`` (default cache_matrix.json)."""
    from concurrent.futures import ProcessPoolExecutor

    from sglang_hybrid.bench.trace_gen import load_shapes

    devs = [None if d.strip() == "inf" else float(d) for d in args.device_gb.split(",")]
    layouts = [x.strip() for x in args.layouts.split(",")]
    names = [s.name for s in load_shapes(args.shapes)] + ["conversation"]
    if args.only:
        want = [x.strip() for x in args.only.split(",")]
        bad = [w for w in want if w not in names]
        if bad:
            raise SystemExit(f"--only: unknown shape(s) {bad}; known: {names}")
        names = want
    jobs = []
    for name in names:
        trace = args.trace if name == "conversation" else None
        for layout in layouts:
            for dev in devs:
                if dev is None and layout != layouts[0]:
                    continue  # unbounded: the layout changes nothing
                jobs.append((name, layout, dev, trace, args.shapes, args.limit if trace else None))
    out = args.out or os.path.join(REPO, "benchmark", "results", "cache_matrix.json")
    result = {
        "benchmark": "benchmark/cache/replay_cache.py --matrix",
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, CPU only)",
        "command": "python benchmark/cache/replay_cache.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "shapes_file": os.path.relpath(args.shapes, REPO),
        "cells": [],
    }
    print(f"{'shape':22s} {'layout':5s} {'GB':>4s} {'perfect':>7s} {'upstream':>8s} {'ours':>7s} {'ratio':>6s}", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # generated shapes in parallel; the conversation trace (12k requests, 145 M tokens: GBs per
    # replay) one cell at a time. The JSON is rewritten after every cell.
    small = [j for j in jobs if j[3] is None]
    big = [j for j in jobs if j[3] is not None]
    for batch, workers in ((small, max(1, args.jobs)), (big, 1)):
        if not batch:
            continue
        # one worker: in this process (a fork of a process that already runs threads, e.g. a test
        # worker after server tests, can deadlock in the child)
        ex = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
        try:
            rows = ex.map(_matrix_cell, batch) if ex is not None else map(_matrix_cell, batch)
            for row in rows:
                result["cells"].append(row)
                gb = "inf" if row["device_budget_gb"] is None else f"{row['device_budget_gb']:.0f}"
                print(f"{row['shape']:22s} {row['layout']:5s} {gb:>4s} {row['perfect_reuse_pct']:7.2f} "
                      f"{row['upstream']['reuse_pct']:8.2f} {row['hybrid']['reuse_pct']:7.2f} {row['ratio']:6.3f}", flush=True)
                result["summary"] = summarize_matrix(result["cells"])
                with open(out, "w") as f:
                    json.dump(result, f, indent=1)
        finally:
            if ex is not None:
                ex.shutdown()
    summary = result["summary"]
    w = summary["worst_cell"]
    print(f"\nworst cell: {w['shape']} {w['layout']} {w['device_budget_gb']} GB: ours / upstream = {w['ratio']:.3f}")
    print(f"mean ours / upstream over {summary['cells']} cells: {summary['mean_ratio']:.3f}")
    print(f"unbounded, largest gap to the perfect cache: {summary['max_unbounded_gap_pct']:.3f} points of input "
          f"({summary['max_unbounded_gap_shape']})")
    print(f"wrote {out}")
    return 0


def summarize_matrix(cells):
    """Worst cell, mean ratio and the unbounded cache's largest gap to perfect (percentage points of input)."""
    worst = min(cells, key=lambda c: c["ratio"])
    unb = [c for c in cells if c["device_budget_gb"] is None]
    gaps = [(c["perfect_reuse_pct"] - c["hybrid"]["reuse_pct"], c["shape"]) for c in unb] or [(0.0, None)]
    gap = max(gaps)
    return {
        "cells": len(cells),
        "worst_cell": {k: worst[k] for k in ("shape", "layout", "device_budget_gb", "ratio")},
        "mean_ratio": round(sum(c["ratio"] for c in cells) / len(cells), 4),
        "max_unbounded_gap_pct": round(gap[0], 4),
        "max_unbounded_gap_shape": gap[1],
    }


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    series = {}
    for x in result["runs"]:
        if x["device_budget_gb"] is None:
            continue
        key = f"{x['layout']} {x['policy']}" + (f" +{x['host_budget_gb']:.0f} GB host" if x["host_budget_gb"] else "")
        series.setdefault(key, []).append((x["device_budget_gb"], x["reuse_pct"]))
    for key, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key, linestyle="--" if "upstream" in key else "-")
    ax.axhline(result["perfect_reuse_pct"], color="gray", linewidth=0.8)
    ax.text(ax.get_xlim()[0], result["perfect_reuse_pct"], " perfect cache", va="bottom", fontsize=8, color="gray")
    ax.set_xlabel("device cache budget per GPU (GB)")
    ax.set_ylabel("reused input tokens (%)")
    ax.set_title(f"Mooncake conversation trace, {result['requests']} requests")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
