"""Two real server instances on the CPU, with and without one shared store tier (issue 45).

    python benchmark/cache/real_instances.py --model-path models/kimi-k3-tiny [--num-requests 200]

Starts two ``python -m sglang.launch_server`` instances of the tiny Kimi K3 on this machine (small
device pools, so that prefixes leave the device during the run), replays the first requests of a
trace over them round-robin (request i to instance i mod 2, ``sglang_hybrid.bench.replay --base-url
A,B``): by default a generated chat trace (``trace_gen``, shape ``chat-short-prefix`` of
``benchmark/cache/shapes.json``: sessions whose turns extend the previous prompt, interleaved, so a
session's turns land on both instances), or ``--trace FILE``. (The first 80 requests of the
packaged Mooncake trace share prefixes only pairwise: no resume point exists at a shared prefix's
end before its second use, so no cache reuses them on 1 or 2 instances.) It does the same with both instances on one
local-file store (``--hybrid-store file``), once per write policy of the store config:
``write_back`` (an entry is written when it leaves an instance's device) and ``write_through``
(also when the checkpoint is made, so the other instance can resume it at once). Prints and writes
(``--output-json``) reuse (cached / input tokens), the cached tokens per tier and TTFT per run, and
each store run's reuse over the run without it. The simulated many-instance
counterpart is ``replay_instances.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Dict, List

from sglang_hybrid.bench import replay
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args


CONFIGS = ("nostore", "write_back", "write_through")


def _store_flags(tmp: str, policy: str) -> List[str]:
    cfg = os.path.join(tmp, "store.json")
    with open(cfg, "w") as f:
        json.dump({"path": os.path.join(tmp, "store"), "write_policy": policy}, f)
    return ["--hybrid-store", "file", "--hybrid-store-config", cfg]


def run_pair(model: str, config: str, args, log_dir: str) -> Dict:
    """One replay over two fresh instances (``config``: one of :data:`CONFIGS`); returns the replay summary."""
    with tempfile.TemporaryDirectory(prefix="sglang-hybrid-real-instances-") as tmp, ExitStack() as stack:
        flags = cpu_server_args(max_total_tokens=args.max_total_tokens, max_mamba_cache_size=64) + [
            "--hybrid-host-cache-gb", str(args.host_cache_gb)]
        if config != "nostore":
            flags += _store_flags(tmp, config)
        urls = []
        for i in range(2):
            tag = f"{config}-{i}"
            s = stack.enter_context(LaunchedServer(model, flags, log_path=os.path.join(log_dir, f"{tag}.log")))
            urls.append(s.base_url)
        out = os.path.join(log_dir, f"replay-{config}.json")
        return replay.main(["--base-url", ",".join(urls), "--trace", args.trace, "--model-path", model,
                            "--num-requests",
                            str(args.num_requests), "--length-scale", str(args.length_scale), "--max-output-len",
                            str(args.max_output_len), "--concurrency", str(args.concurrency), "--no-progress",
                            "--output-json", out])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--length-scale", type=float, default=0.05)
    p.add_argument("--max-output-len", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-total-tokens", type=int, default=6144,
                   help="each instance's KV pool (tokens): small, so that prefixes leave the device during the run")
    p.add_argument("--host-cache-gb", type=float, default=0.01, help="each instance's host tier (GB)")
    p.add_argument("--trace", default=None, help="JSONL trace (default: generated from --shape)")
    p.add_argument("--shape", default="benchmark/cache/shapes.json:chat-short-prefix",
                   help="MATRIX.json:NAME for the generated trace (sglang_hybrid.bench.trace_gen)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--log-dir", default="runs/real-instances")
    p.add_argument("--output-json", default="benchmark/results/cache_real_instances.json")
    args = p.parse_args(argv)
    os.makedirs(args.log_dir, exist_ok=True)
    if args.trace is None:
        from sglang_hybrid.bench import trace_gen

        (shape,) = trace_gen._select(args.shape)
        args.trace = os.path.join(args.log_dir, f"{shape.name}.jsonl")
        trace_gen.write_jsonl(trace_gen.generate(shape), args.trace)
    t0 = time.monotonic()
    configs = args.configs.split(",")
    if any(c not in CONFIGS for c in configs) or "nostore" not in configs:
        raise SystemExit(f"--configs: names from {', '.join(CONFIGS)}, including nostore (the baseline)")
    runs = {name: run_pair(args.model_path, name, args, args.log_dir) for name in configs}
    keys = ("achieved_reuse", "cached_tokens", "cached_tokens_by_tier", "input_tokens", "num_errors",
            "ttft_p50_s", "ttft_p90_s", "total_token_throughput")
    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, no GPU",
        "command": "python benchmark/cache/real_instances.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "instances": 2, "routing": "round-robin by request index",
        "settings": {k: getattr(args, k) for k in ("trace", "shape", "num_requests", "length_scale", "max_output_len", "concurrency",
                                                   "max_total_tokens", "host_cache_gb")},
        "runs": {name: {k: s.get(k) for k in keys} for name, s in runs.items()},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    base = runs["nostore"].get("achieved_reuse") or 0.0
    result["reuse_vs_nostore"] = {name: ((runs[name].get("achieved_reuse") or 0.0) / base if base > 0 else None)
                                  for name in configs if name != "nostore"}
    os.makedirs(os.path.dirname(args.output_json) or ".", exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for name, r in result["runs"].items():
        print(f"{name:>8}: reuse {100 * (r['achieved_reuse'] or 0):.2f} % of {r['input_tokens']} input tokens, "
              f"by tier {r['cached_tokens_by_tier']}, TTFT p50 {r['ttft_p50_s']}, errors {r['num_errors']}")
    print(f"reuse with the store / without (None: no reuse without it): {result['reuse_vs_nostore']}")
    return 0 if all(r["num_errors"] == 0 for r in result["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
