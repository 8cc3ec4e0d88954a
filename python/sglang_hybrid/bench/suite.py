"""The whole benchmark suite in one command (``make bench``).

abbench (closed-loop windows), the AgentX-style concurrency sweep of the
trace replay, and the AIPerf cross-check, against one server, then the
Markdown report with plots::

    # CPU, tiny model, short (what `make bench` runs): starts and stops the server itself
    python -m sglang_hybrid.bench.suite --model-path models/kimi-k3-tiny --out-dir runs/bench

    # a running server (GPU), article-length settings
    python -m sglang_hybrid.bench.suite --base-url http://127.0.0.1:30000 \\
        --model-path /models/Kimi-K3 --preset full --num-gpus 8 --usd-per-gpu-hour 2.5

Without ``--base-url`` the server is started with
:class:`~sglang_hybrid.bench.server.LaunchedServer` (``cpu_server_args()``
on ``--device cpu``) and its log is parsed for the kernel-path table.
Results: ``abbench.json``, ``sweep.json``, ``aiperf_crosscheck.json`` and
``report.md`` + PNGs in ``--out-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional

from sglang_hybrid.bench import abbench, aiperf_check, report, sweep
from sglang_hybrid.bench.metrics import format_table
from sglang_hybrid.bench.resultfile import load_json, write_json
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args

# Short settings for 2 CPU cores and the tiny model; article settings for a GPU server.
PRESETS: Dict[str, Dict[str, Any]] = {
    "cpu-short": dict(
        ab_concurrency="1,8", ab_window=20.0, ab_output_len=384, ab_input_len=256, ab_warmup=2,
        sweep_concurrency="1,2,4,8", num_requests=32, length_scale=0.02, max_output_len=32,
        aiperf_concurrency=4, aiperf_request_rate=100.0, aiperf_timeout=240.0, request_timeout=300.0,
    ),
    "full": dict(
        ab_concurrency="1,8,32", ab_window=60.0, ab_output_len=384, ab_input_len=1024, ab_warmup=4,
        sweep_concurrency="1,2,4,8,16,32,64", num_requests=500, length_scale=0.25, max_output_len=256,
        aiperf_concurrency=16, aiperf_request_rate=None, aiperf_timeout=3600.0, request_timeout=1800.0,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The suite's command line: server, preset, output directory, pricing, AIPerf."""
    p = argparse.ArgumentParser(prog="python -m sglang_hybrid.bench.suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True,
                   help="checkpoint dir: served when no --base-url; token range, config hash, AIPerf tokenizer")
    p.add_argument("--base-url", default=None, help="use this running server instead of starting one")
    p.add_argument("--device", default="cpu", help="--device of the server it starts (cpu adds cpu_server_args())")
    p.add_argument("--extra-server-args", default="", help="appended to the flags of the server it starts")
    p.add_argument("--server-log", default="runs/bench-server.log",
                   help="log of the server it starts (or of the running one: read for the kernel-path table)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-short",
                   help="settings below default to this preset's; each one given overrides it")
    group = p.add_argument_group("preset settings (override one value of --preset)")
    for key, value in PRESETS["full"].items():
        kind = str if isinstance(value, str) else float if isinstance(value, float) or value is None else int
        group.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None,
                           help=f"cpu-short: {PRESETS['cpu-short'][key]}, full: {value}")
    p.add_argument("--out-dir", default="runs/bench", help="result JSONs, report.md and PNGs")
    p.add_argument("--num-gpus", type=float, default=1.0, help="divides the sweep's throughputs")
    p.add_argument("--usd-per-gpu-hour", type=float, default=2.0, help="price for tokens per dollar")
    p.add_argument("--target-interactivity", type=float, default=50.0, help="tokens/s/user")
    p.add_argument("--aiperf-bin", default=None, help="aiperf executable (skipped with a note when missing)")
    p.add_argument("--aiperf-work-dir", default="runs/bench-aiperf")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: abbench,sweep,aiperf")
    p.add_argument("--title", default=None, help="report title")
    p.add_argument("--notes", default=None, help="a paragraph for the report")
    return p


def settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The preset's settings with every one given on the command line (e.g. ``--ab-window 5`` in
    ``make bench BENCH_ARGS=...``) replacing the preset's value."""
    merged = dict(PRESETS[args.preset])
    merged.update({k: getattr(args, k) for k in merged if getattr(args, k, None) is not None})
    return merged


def _run_parts(args: argparse.Namespace, base_url: str, server_log: Optional[str]) -> List[str]:
    pr = settings(args)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    os.makedirs(args.out_dir, exist_ok=True)
    paths: List[str] = []
    common = ["--base-url", base_url, "--model-path", args.model_path,
              "--request-timeout", str(pr["request_timeout"])]
    if server_log:
        common += ["--server-log", server_log]

    if "abbench" not in skip:
        argv = common + ["--api", "openai", "--concurrency", pr["ab_concurrency"], "--window", str(pr["ab_window"]),
                         "--output-len", str(pr["ab_output_len"]), "--input-len", str(pr["ab_input_len"]),
                         "--warmup", str(pr["ab_warmup"])]
        a = abbench.build_parser().parse_args(argv)
        t = time.monotonic()
        doc = abbench.run(a, ["python", "-m", "sglang_hybrid.bench.abbench", *argv])
        path = os.path.join(args.out_dir, "abbench.json")
        write_json(path, doc)
        paths.append(path)
        print(format_table([w["summary"] for w in doc["windows"]]))
        print(f">> abbench done in {time.monotonic() - t:.0f} s -> {path}", flush=True)

    replay_args = ["--num-requests", str(pr["num_requests"]), "--length-scale", str(pr["length_scale"]),
                   "--max-output-len", str(pr["max_output_len"]), "--warmup", "2", "--no-progress"]
    if "sweep" not in skip:
        argv = common + replay_args + ["--api", "sglang", "--concurrency", pr["sweep_concurrency"],
                                       "--num-gpus", str(args.num_gpus),
                                       "--usd-per-gpu-hour", str(args.usd_per_gpu_hour),
                                       "--target-interactivity", str(args.target_interactivity)]
        a = sweep.build_parser().parse_args(argv)
        t = time.monotonic()
        doc = sweep.run(a, ["python", "-m", "sglang_hybrid.bench.sweep", *argv])
        path = os.path.join(args.out_dir, "sweep.json")
        write_json(path, doc)
        paths.append(path)
        print(sweep.format_points(doc))
        print(f">> sweep done in {time.monotonic() - t:.0f} s -> {path}", flush=True)

    if "aiperf" not in skip:
        argv = common + replay_args + ["--concurrency", str(pr["aiperf_concurrency"]),
                                       "--work-dir", args.aiperf_work_dir,
                                       "--aiperf-timeout", str(pr["aiperf_timeout"]),
                                       # prompts unlike any sweep point's (seeds 0..n-1)
                                       "--seed", "1000"]
        if args.aiperf_bin:
            argv += ["--aiperf-bin", args.aiperf_bin]
        if pr["aiperf_request_rate"]:
            argv += ["--aiperf-request-rate", str(pr["aiperf_request_rate"])]
        a = aiperf_check.build_parser().parse_args(argv)
        t = time.monotonic()
        doc = aiperf_check.run(a, ["python", "-m", "sglang_hybrid.bench.aiperf_check", *argv])
        path = os.path.join(args.out_dir, "aiperf_crosscheck.json")
        write_json(path, doc)
        paths.append(path)
        print(aiperf_check.format_compare(doc))
        print(f">> AIPerf cross-check done in {time.monotonic() - t:.0f} s -> {path}", flush=True)
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    """Run the suite; return 0 when no request failed (AIPerf problems are recorded, not fatal)."""
    args = build_parser().parse_args(argv)
    t0 = time.monotonic()
    if args.base_url:
        paths = _run_parts(args, args.base_url, args.server_log if os.path.isfile(args.server_log) else None)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.server_log)), exist_ok=True)
        flags = (cpu_server_args() if args.device == "cpu" else ["--device", args.device]) \
            + args.extra_server_args.split()
        print(f">> starting server on {args.model_path} (log: {args.server_log})", flush=True)
        with LaunchedServer(args.model_path, flags, log_path=args.server_log) as server:
            print(f">> server healthy at {server.base_url} after {time.monotonic() - t0:.0f} s", flush=True)
            paths = _run_parts(args, server.base_url, args.server_log)
        print(">> server stopped", flush=True)
    name = os.path.basename(os.path.normpath(args.model_path))
    where = args.base_url or f"a server started here with --device {args.device}"
    title = args.title or f"Benchmark suite: {name}, preset {args.preset}"
    notes = args.notes
    if notes is None:
        notes = f"Model `{args.model_path}` served by {where}; preset `{args.preset}`."
        if args.preset == "cpu-short":
            notes += (" A CPU smoke run of the harness: short windows, a tiny random-weight checkpoint, the"
                      " plain-torch reference kernels, a 2-core class host shared by client and server. The"
                      " numbers say the suite works and how the metrics behave, nothing about GPU serving"
                      " performance or model quality.")
    out = report.write_report(paths, os.path.join(args.out_dir, "report.md"), title, notes)
    print(f">> report: {out} ({time.monotonic() - t0:.0f} s in all)")
    failed = 0
    for p in paths:
        failed += (load_json(p).get("manifest", {}).get("request_stats", {}).get("errors", {}) or {}).get("count", 0)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
