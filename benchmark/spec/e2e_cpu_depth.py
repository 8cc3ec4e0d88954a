"""End-to-end on CPU: does the cycle-cost controller pick a different draft depth at batch 1 and batch 8? (issue 7)

    .venv/bin/python benchmark/spec/e2e_cpu_depth.py [--duration 60] [--out FILE]

One real ``python -m sglang.launch_server`` serving the tiny Qwen3.8-Flash-Next with its MTP
head as draft (the checkpoint of test/srt/speculative/test_qwen38_spec_server.py: the random
MTP head made to agree with the target most of the time), with upstream's adaptive
speculation (``--speculative-adaptive``, candidate depths from ``--depths``) and our policy
(``--speculative-depth-controller cycle-cost``). Two closed-loop phases of ``--duration``
seconds each: 1 client, then 8 clients, each sending greedy requests of random prompts
back to back. The controller's periodic log line (every 5 s here,
``SGLANG_HYBRID_SPEC_DEPTH_LOG_INTERVAL_S``) gives the chosen-depth histogram per batch
bucket, the estimated acceptance curve and the measured cycle cost per (depth, bucket);
the script reads the last line after each phase and writes them with the phase's
throughput to JSON. It reports what the controller chose; it makes no speed claim (no
baseline policy is run).

Acceptance: by default the benchmark-only controlled acceptance
(``--speculative-synthetic-acceptance``, ``SGLANG_HYBRID_BENCHMARK_MODE=1``; not
accuracy-preserving) with the article's reference rates ``0.80, 0.66, 0.54`` (3.00 committed
tokens per cycle at 3 drafts), so the depth chosen at each batch size reflects the measured
cycle costs, not the random draft model; ``--synthetic ""`` uses the draft's own acceptance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for sub in ("test/srt/speculative", "test/srt/server", "test/srt/models"):
    sys.path.insert(0, os.path.join(ROOT, sub))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args  # noqa: E402

LOG_RE = re.compile(r"spec depth controller: cycles=(\d+) chosen k \[([^\]]*)\] by bucket \[([^\]]*)\] "
                    r"P_i \[([^\]]*)\] T_cycle ms \[([^\]]*)\]")


def parse_log_line(line: str) -> dict:
    """The fields of one ``spec depth controller:`` log line (see ``DepthController.format_log_line``)."""
    m = LOG_RE.search(line)
    if m is None:
        raise ValueError(f"line: not a depth-controller log line: {line[:200]!r}")

    def hist(text):
        return {int(k): int(n) for k, n in (item.split(":") for item in text.split())}

    by_bucket = {}
    for part in filter(None, (p.strip() for p in m.group(3).split(";"))):
        bucket, _, rest = part.partition(" ")
        by_bucket[int(bucket[1:])] = hist(rest)
    costs = {}
    for part in filter(None, (p.strip() for p in m.group(5).split(";"))):
        bucket, _, rest = part.partition(" ")
        costs[int(bucket[1:])] = {int(kv.split("=")[0][1:]): float(kv.split("=")[1]) for kv in rest.split()}
    return {"cycles": int(m.group(1)), "chosen": hist(m.group(2)), "chosen_by_bucket": by_bucket,
            "acceptance_curve": [float(x) for x in m.group(4).split()], "cycle_ms": costs}


def last_controller_line(log_path: str):
    line = None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for text in f:
            if "spec depth controller: cycles=" in text:
                line = text
    return None if line is None else parse_log_line(line)


def closed_loop(url: str, clients: int, duration_s: float, max_new_tokens: int, seed: int) -> dict:
    stop = time.monotonic() + duration_s
    done = {"requests": 0, "tokens": 0, "accept": []}
    lock = threading.Lock()

    def client(i):
        rng = random.Random(seed * 100 + i)
        while time.monotonic() < stop:
            ids = [rng.randrange(10, 900) for _ in range(rng.randrange(16, 48))]
            payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                                             "ignore_eos": True}}
            r = requests.post(url + "/generate", json=payload, timeout=900)
            r.raise_for_status()
            out = r.json()
            with lock:
                done["requests"] += 1
                done["tokens"] += len(out["output_ids"])
                meta = out.get("meta_info", {})
                if "spec_verify_ct" in meta and meta["spec_verify_ct"]:
                    done["accept"].append(meta["completion_tokens"] / meta["spec_verify_ct"])

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    accept = done.pop("accept")
    return {**done, "wall_s": wall, "tokens_per_s": done["tokens"] / wall,
            "mean_committed_per_verify": sum(accept) / len(accept) if accept else None}


def diff_hist(after: dict, before: dict) -> dict:
    out = {}
    for bucket, counts in after.items():
        prev = before.get(bucket, {})
        d = {k: n - prev.get(k, 0) for k, n in counts.items() if n - prev.get(k, 0)}
        if d:
            out[bucket] = d
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per phase")
    ap.add_argument("--depths", default="0,1,2,3", help="candidate draft depths (states built for each)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--synthetic", default="0.8,0.66,0.54",
                    help="controlled acceptance rates a_1,a_2,... (benchmark-only); empty: the draft's own")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmark", "results",
                                                  "2026-11-29-e2e-cpu-spec-depth-qwen38-tiny.json"))
    args = ap.parse_args(argv)
    from test_qwen38_spec_server import tiny_qwen38_agreeing_mtp  # the checkpoint the K4 server test uses

    model = tiny_qwen38_agreeing_mtp()
    depths = sorted({int(x) for x in args.depths.split(",")})
    cfg = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({str(b): {"candidate_steps": depths} for b in (1, 8)}, cfg)
    cfg.close()
    spec = ["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "1",
            "--speculative-num-steps", str(max(depths)), "--speculative-num-draft-tokens", str(max(depths) + 1),
            "--speculative-adaptive", "--speculative-adaptive-config", cfg.name,
            "--speculative-depth-controller", "cycle-cost",
            "--disable-cuda-graph", "--enable-metrics", "--max-running-requests", "8"]
    env = {"SGLANG_HYBRID_SPEC_DEPTH_LOG_INTERVAL_S": "5"}
    if args.synthetic:
        spec += ["--speculative-synthetic-acceptance", args.synthetic]
        env["SGLANG_HYBRID_BENCHMARK_MODE"] = "1"
    out = {"what": "tiny Qwen3.8-Flash-Next + MTP draft on CPU, cycle-cost depth controller, closed loop at 1 and "
                   "8 clients", "depths": depths, "server_args": cpu_server_args() + spec,
           "synthetic_acceptance": args.synthetic or None, "phases": []}
    t_start = time.perf_counter()
    with LaunchedServer(model, cpu_server_args() + spec, env=env, timeout=600) as server:
        before = {}
        for clients in (1, 8):
            phase = closed_loop(server.base_url, clients, args.duration, args.max_new_tokens, seed=clients)
            time.sleep(6.0)  # one more log interval, so the last line covers the phase
            line = last_controller_line(server.log_path)
            if line is None:
                raise RuntimeError(f"no 'spec depth controller' log line in {server.log_path}: is the "
                                   "cycle-cost policy installed (needs --speculative-adaptive)?")
            phase.update(clients=clients, chosen_by_bucket_in_phase=diff_hist(line["chosen_by_bucket"], before),
                         controller=line)
            before = line["chosen_by_bucket"]
            out["phases"].append(phase)
            print(f"clients={clients}: {phase['tokens_per_s']:.1f} tok/s, chosen k by bucket "
                  f"{phase['chosen_by_bucket_in_phase']}, P_i {line['acceptance_curve']}, T ms {line['cycle_ms']}",
                  flush=True)
        with open(server.log_path, encoding="utf-8", errors="replace") as f:
            out["policy_log"] = [x.strip() for x in f if "speculative depth controller" in x][:3]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    modal = {p["clients"]: max(((k, n) for c in p["chosen_by_bucket_in_phase"].values() for k, n in c.items()),
                               key=lambda kn: kn[1], default=(None, 0))[0] for p in out["phases"]}
    out["modal_depth_by_clients"] = modal
    out["depth_changes_with_batch"] = modal.get(1) != modal.get(8)
    out["manifest"] = {"command": " ".join(["benchmark/spec/e2e_cpu_depth.py"] + (argv or sys.argv[1:])),
                       "git_commit": commit, "machine": f"{platform.machine()} {os.cpu_count()} cpu",
                       "wall_s": time.perf_counter() - t_start, "time": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                                      time.gmtime())}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"modal depth: 1 client -> {modal.get(1)}, 8 clients -> {modal.get(8)}; wrote {os.path.relpath(args.out)}")
    return out


if __name__ == "__main__":
    main()
