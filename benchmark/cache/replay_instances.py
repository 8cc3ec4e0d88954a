"""The cache trace replay over several server instances, with and without one shared store tier (issue 45).

Each instance is our hybrid cache with its own device budget and host tier (Kimi K3 per GPU at TP8 by
default); requests go round-robin or to the instance a cache-aware router would pick (longest resume
point, balanced); with ``--store`` every instance writes resume points (KV pages + checkpoint, marker
last) to one store when they leave its device, and reads them on a miss. Prints and writes reuse, the
store's share of it and store bytes per reused token. Accounting over fake pools, like
``replay_cache.py``: no payload moves, no timing.

    python benchmark/cache/replay_instances.py [--instances 4] [--device-gb 40] [--host-gb 100] [--limit N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

GB = 1_000_000_000
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main(argv=None) -> int:
    from sglang_hybrid.bench.trace import DEFAULT_TRACE_PATH
    from sglang_hybrid.mem_cache.trace_replay import ROUTINGS, ReplayConfig, load_trace, replay_instances

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=DEFAULT_TRACE_PATH)
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--device-gb", type=float, default=40.0, help="device cache budget per instance")
    ap.add_argument("--host-gb", type=float, default=100.0, help="host tier per instance")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmark", "results", "cache_replay_instances.json"))
    args = ap.parse_args(argv)
    records = load_trace(args.trace, args.limit)
    cfg = ReplayConfig("hybrid", int(args.device_gb * GB), host_budget_bytes=int(args.host_gb * GB))
    runs = []
    for routing in ROUTINGS:
        for store in (False, True):
            t = time.time()
            r = replay_instances(cfg, records, args.instances, routing, store)
            r["seconds"] = round(time.time() - t, 1)
            runs.append(r)
            print(f"{routing:11s} store {'on ' if store else 'off'}: reuse {r['reuse_pct']:6.2f}% "
                  f"(store {100 * r['store_hit_tokens'] / max(1, r['input_tokens']):5.2f} pts, "
                  f"{r['store_bytes_per_reused_token'] / 1e3:.1f} KB/reused token), per instance "
                  f"{r['per_instance_reuse_pct']}, requests {r['per_instance_requests']}, {r['seconds']} s", flush=True)
    doc = {
        "benchmark": "cache_replay_instances", "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {os.cpu_count()} cores", "command": " ".join(["python", *sys.argv]),
        "trace": os.path.basename(args.trace), "requests": len(records), "instances": args.instances,
        "device_gb_per_instance": args.device_gb, "host_gb_per_instance": args.host_gb,
        "model": "Kimi K3 per GPU at TP8 (KV 13,824 B/token, checkpoint 54.3 MB)", "runs": runs,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for routing in ROUTINGS:
        off, on = [r for r in runs if r["routing"] == routing]
        print(f"{routing}: store on / off reuse {on['reuse_pct'] / max(1e-9, off['reuse_pct']):.2f}x")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
