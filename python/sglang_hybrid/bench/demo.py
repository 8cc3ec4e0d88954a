"""The main job in one command (``make demo``).

Starts ``python -m sglang.launch_server`` on the tiny Kimi K3 checkpoint (CPU),
replays the first requests of the Mooncake conversation trace against it with
:mod:`sglang_hybrid.bench.replay`, prints the summary and stops the server.
Defaults finish in a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from sglang_hybrid.bench import replay
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--length-scale", type=float, default=0.05)
    p.add_argument("--max-output-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--output-json", default=None)
    p.add_argument("--server-log", default="runs/demo-server.log")
    p.add_argument("--extra-server-args", default="", help="appended to the server flags (one string)")
    args = p.parse_args(argv)

    import os

    os.makedirs(os.path.dirname(args.server_log) or ".", exist_ok=True)
    # Pools big enough that the first few hundred requests' prefixes are not
    # evicted before their continuations arrive (~170 MB KV + ~130 MB states).
    server_args = cpu_server_args(max_total_tokens=262144, max_mamba_cache_size=1024) + args.extra_server_args.split()
    print(f">> starting server on {args.model_path} (log: {args.server_log})", flush=True)
    t0 = time.monotonic()
    with LaunchedServer(args.model_path, server_args, log_path=args.server_log) as server:
        print(f">> server healthy at {server.base_url} after {time.monotonic() - t0:.0f} s", flush=True)
        replay_args = [
            "--base-url", server.base_url,
            "--model-path", args.model_path,
            "--num-requests", str(args.num_requests),
            "--length-scale", str(args.length_scale),
            "--max-output-len", str(args.max_output_len),
            "--concurrency", str(args.concurrency),
        ]
        if args.output_json:
            replay_args += ["--output-json", args.output_json]
        summary = replay.main(replay_args)
    print(">> server stopped", flush=True)
    return 0 if summary.get("num_errors", 1) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
