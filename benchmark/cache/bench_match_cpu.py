"""Scheduler-thread cost of our cache's prefix match: host-aware match vs upstream's plain match.

The scheduler calls the cache's ``match_prefix`` for every request it considers admitting. Ours
(``HybridRadixCache`` in serving mode) runs upstream's device match and then looks for a deeper
resume point in the host tier (:meth:`HybridRadixCache.match_with_host`). This benchmark replays a
trace through our cache over fake pools (``sglang_hybrid.mem_cache.trace_replay``, the real classes,
no tensors) and times, for every request, our host-aware match against upstream's plain
``UnifiedRadixCache.match_prefix`` on the same tree and key, measured just before it (the baseline,
same run; the two run in alternating order). It prints microseconds per match and the ratio ours / upstream per scenario:

* ``host empty``: a host tier configured but nothing evicted yet (unbounded device);
* ``host filled``: a device budget small enough that entries leave for the host and come back.

    python benchmark/cache/bench_match_cpu.py --out benchmark/results/cache_match_cpu.json

Traces: the generated agentic shape of the system benchmark (``--shape``, 91 % reuse) and the
Mooncake conversation trace, both at true lengths (``--limit`` requests each). Sizes: one GPU's
share of Kimi K3 at TP8 with page 1 as served by ``benchmark/gpu/system_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _timed_replay(records, model, device_budget, host_budget):
    """Replay ``records`` through our cache; returns (ours_us, upstream_us, reuse_pct) per-match lists."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache
    from sglang_hybrid.mem_cache.trace_replay import ReplayConfig, replay

    ours, base = [], []
    original = HybridRadixCache.match_with_host

    def plain(self, token_ids):
        t = time.perf_counter()
        UnifiedRadixCache.match_prefix(self, MatchPrefixParams(key=RadixKey(token_ids)))
        base.append((time.perf_counter() - t) * 1e6)

    def timed(self, token_ids, *, load=True):
        # alternate which match runs first (the second one finds the tree's nodes already split and warm)
        first = len(ours) % 2 == 0
        if first:
            plain(self, token_ids)
        t = time.perf_counter()
        out = original(self, token_ids, load=load)
        ours.append((time.perf_counter() - t) * 1e6)
        if not first:
            plain(self, token_ids)
        return out

    HybridRadixCache.match_with_host = timed
    try:
        res = replay(ReplayConfig(policy="hybrid", device_budget_bytes=device_budget,
                                  host_budget_bytes=host_budget, model=model), records)
    finally:
        HybridRadixCache.match_with_host = original
    return ours, base, res


def main(argv=None) -> int:
    from sglang_hybrid.bench import trace_gen
    from sglang_hybrid.bench.trace import DEFAULT_TRACE_PATH
    from sglang_hybrid.bench.manifest import git_commit, machine_info
    from sglang_hybrid.mem_cache.trace_replay import ModelBytes, load_trace

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=120, help="requests per trace")
    ap.add_argument("--shape", default="agentic-long", help="generated shape in benchmark/cache/shapes.json")
    ap.add_argument("--host-gb", type=float, default=16.0)
    ap.add_argument("--filled-device-gb", type=float, default=0.2,
                    help="device budget of the 'host filled' scenario (entries leave for the host)")
    ap.add_argument("--out", default=None, help="result JSON")
    args = ap.parse_args(argv)

    # one GPU's share of Kimi K3 at TP8 as system_bench serves it: page 1, KV 1,152 B/token, 2.44 MB a checkpoint
    model = ModelBytes(kv_bytes_per_token=1152, state_bytes=2_442_240, page_size=1)
    shape = [s for s in trace_gen.load_shapes(os.path.join(HERE, "shapes.json")) if s.name == args.shape]
    if not shape:
        raise SystemExit(f"--shape: no shape named {args.shape!r}")
    tmp = os.path.join(tempfile.mkdtemp(), f"{args.shape}.jsonl")
    trace_gen.write_jsonl(trace_gen.generate(shape[0]), tmp)
    traces = {args.shape: load_trace(tmp, args.limit), "mooncake": load_trace(DEFAULT_TRACE_PATH, args.limit)}
    host = int(args.host_gb * 1e9)
    scenarios = {"host empty": (None, host), "host filled": (int(args.filled_device_gb * 1e9), host)}
    rows = []
    print(f"{'trace':14s} {'scenario':12s} {'mean in':>8s} {'ours us':>9s} {'upstr us':>9s} {'ratio':>6s} "
          f"{'p99 ours':>9s} {'host hit %':>10s}")
    for tname, recs in traces.items():
        mean_in = sum(r["input_length"] for r in recs) / len(recs)
        for sname, (dev_b, host_b) in scenarios.items():
            ours, base, res = _timed_replay(recs, model, dev_b, host_b)
            row = {
                "trace": tname, "scenario": sname, "requests": len(recs), "mean_input_tokens": round(mean_in),
                "device_budget_bytes": dev_b, "host_budget_bytes": host_b,
                "ours_match_us_mean": round(statistics.fmean(ours), 1),
                "upstream_match_us_mean": round(statistics.fmean(base), 1),
                "ours_match_us_p99": round(sorted(ours)[int(0.99 * (len(ours) - 1))], 1),
                "ratio_mean": round(statistics.fmean(ours) / statistics.fmean(base), 2),
                "reuse_pct": round(res.reuse_pct, 2),
                "host_hit_pct": round(100 * res.host_hit_tokens / max(1, res.input_tokens), 2),
            }
            rows.append(row)
            print(f"{tname:14s} {sname:12s} {row['mean_input_tokens']:8d} {row['ours_match_us_mean']:9.1f} "
                  f"{row['upstream_match_us_mean']:9.1f} {row['ratio_mean']:6.2f} {row['ours_match_us_p99']:9.1f} "
                  f"{row['host_hit_pct']:10.2f}", flush=True)
    if args.out:
        doc = {"benchmark": "cache_match_cpu", "git_commit": git_commit(), "machine": machine_info(),
               "args": vars(args), "rows": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
