"""Cross-check our replay client against AIPerf on the same Mooncake trace slice.

Usage::

    python -m sglang_hybrid.bench.aiperf_check --base-url http://127.0.0.1:30000 \\
        --model-path /models/Qwen3-8B --num-requests 200 --length-scale 0.25 \\
        --max-output-len 256 --concurrency 8 --aiperf-bin aiperf

In one run, against the same ``/v1/completions`` endpoint and at the same
closed-loop concurrency:

1. our replay client (``replay.run`` with ``--api openai``, temperature 0,
   ``ignore_eos``) replays the first ``--num-requests`` trace requests scaled
   by ``--length-scale`` / ``--max-output-len``;
2. the same scaled slice is written as a Mooncake JSONL (input length,
   output length, the hash ids used; block size ``b``) and AIPerf replays it
   with ``--custom-dataset-type mooncake_trace --isl-block-size b
   --no-fixed-schedule --concurrency C --request-count N``. AIPerf turns hash
   ids into text blocks of its own (same sharing pattern, other content) and
   the server tokenizes them.

Both clients' throughput, TTFT and ITL go side by side. AIPerf's per-request
records are also re-summarised with our definitions (pooled chunk gaps,
TPOT per request), so definition differences and measurement differences
can be told apart; see docs/bench-suite.md.

AIPerf needs a tokenizer. With ``--model-path DIR`` its tokenizer files are
exposed to AIPerf as a local Hugging Face cache entry ``local/<dir name>``
(``HF_HOME`` in the work directory, ``HF_HUB_OFFLINE=1``), because AIPerf
0.13 cannot load a tokenizer from a plain directory in offline mode; or pass
``--tokenizer`` (any name AIPerf accepts) to skip that.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from sglang_hybrid.bench import replay
from sglang_hybrid.bench.metrics import percentiles
from sglang_hybrid.bench.resultfile import write_json
from sglang_hybrid.bench.trace import load_trace, scale_trace, scaled_block_size

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
    "tokenizer.model", "vocab.json", "merges.txt", "tiktoken.model", "generation_config.json",
)
_FAKE_REVISION = "0" * 40


def build_parser() -> argparse.ArgumentParser:
    """Replay options plus the cross-check's own (AIPerf binary, tokenizer, work dir, timeout in s)."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_hybrid.bench.aiperf_check",
        description="Replay one trace slice with our client and with AIPerf; compare.",
        parents=[replay.build_parser()],
        conflict_handler="resolve",
    )
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop concurrency of both clients")
    p.add_argument("--aiperf-bin", default=None,
                   help="aiperf executable (default: aiperf on PATH, else next to this Python)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer name for AIPerf (default: --model-path exposed as local/<name>)")
    p.add_argument("--work-dir", default=None,
                   help="where the slice, AIPerf artifacts and its log go (default runs/aiperf-<UTC>)")
    p.add_argument("--aiperf-timeout", type=float, default=900.0, help="seconds before AIPerf is killed")
    p.add_argument("--aiperf-request-rate", type=float, default=None,
                   help="also pass --request-rate R --arrival-pattern constant (a cap of R requests/s on top of "
                        "the concurrency). AIPerf 0.13's pure-concurrency mode busy-polls a full core while all "
                        "slots are taken; with a rate it waits on a timer between attempts. Use on hosts where "
                        "client and server share few cores (make bench: 100)")
    p.add_argument("--no-flush-cache", dest="flush_cache", action="store_false",
                   help="do not empty the prefix cache (POST /flush_cache or /reset_prefix_cache) "
                        "before each client's phase")
    p.add_argument("--aiperf-args", default="", help="more AIPerf flags (one string, split on spaces)")
    p.add_argument("--output-json", default=None,
                   help="result file (default <work-dir>/aiperf_crosscheck.json)")
    return p


def find_aiperf(explicit: Optional[str] = None) -> Optional[str]:
    """Path of the aiperf executable: ``explicit`` if it exists, else ``aiperf`` on PATH,
    else next to ``sys.executable``; None when none is found."""
    if explicit:
        return explicit if (os.path.isfile(explicit) or shutil.which(explicit)) else None
    found = shutil.which("aiperf")
    if found:
        return found
    cand = os.path.join(os.path.dirname(sys.executable), "aiperf")
    return cand if os.path.isfile(cand) else None


def write_mooncake_slice(args: argparse.Namespace, path: str) -> int:
    """Write the scaled slice as Mooncake JSONL; return the block size (tokens)."""
    reqs = scale_trace(load_trace(args.trace, args.num_requests), args.length_scale,
                       args.output_scale, args.max_output_len)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in reqs:
            f.write(json.dumps({
                "timestamp": int(round(r.timestamp_s * 1000)),
                "input_length": r.input_len,
                "output_length": r.output_len,
                "hash_ids": list(r.hash_ids),
            }) + "\n")
    return scaled_block_size(args.length_scale)


def local_tokenizer_cache(model_path: str, hf_home: str) -> str:
    """Expose ``model_path``'s tokenizer files as HF cache entry ``local/<name>`` under ``hf_home``.

    Returns the repo id to pass as ``--tokenizer``.
    """
    name = os.path.basename(os.path.normpath(model_path)) or "model"
    repo = os.path.join(hf_home, "hub", f"models--local--{name}")
    snap = os.path.join(repo, "snapshots", _FAKE_REVISION)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(_FAKE_REVISION)
    for fn in TOKENIZER_FILES:
        src = os.path.join(model_path, fn)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(snap, fn))
    return f"local/{name}"


def aiperf_command(
    aiperf_bin: str, args: argparse.Namespace, model: str, tokenizer: str, slice_path: str,
    block_size: int, n_requests: int, artifact_dir: str, extra: Sequence[str] = (),
) -> List[str]:
    """The ``aiperf profile`` command line for the slice (closed loop at ``args.concurrency``,
    optionally capped by ``args.aiperf_request_rate`` requests/s); ``extra``: more AIPerf flags, appended."""
    return [
        aiperf_bin, "profile",
        "--model", model,
        "--tokenizer", tokenizer,
        "--url", args.base_url,
        "--endpoint-type", "completions",
        "--streaming",
        "--input-file", slice_path,
        "--custom-dataset-type", "mooncake_trace",
        "--isl-block-size", str(block_size),
        "--no-fixed-schedule",
        "--concurrency", str(args.concurrency),
        *(["--request-rate", f"{args.aiperf_request_rate:g}", "--arrival-pattern", "constant"]
          if getattr(args, "aiperf_request_rate", None) else []),
        "--request-count", str(n_requests),
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", f"temperature:{args.temperature:g}",
        "--use-server-token-count",
        "--artifact-dir", artifact_dir,
        "--ui-type", "none",
        # our client scrapes nothing either; on a small host these pollers take CPU from the server
        "--no-server-metrics",
        "--no-gpu-telemetry",
        *extra,
    ]


def _metric(d: Dict[str, Any], key: str, stat: str, scale: float = 1.0) -> Optional[float]:
    v = (d.get(key) or {}).get(stat)
    return None if v is None else float(v) * scale


def parse_aiperf_summary(d: Dict[str, Any]) -> Dict[str, Any]:
    """AIPerf's own summary (``profile_export_aiperf.json``) in our units (s, tokens/s).

    AIPerf's ``inter_token_latency`` is per request, (request latency − TTFT)
    / (output tokens − 1), with percentiles across requests: our TPOT. Its
    ``inter_chunk_latency`` pools the gaps between content-carrying chunks.
    """
    ms = 1e-3
    return {
        "num_requests": _metric(d, "request_count", "avg"),
        "num_errors": len(d.get("error_summary") or []),
        "duration_s": _metric(d, "benchmark_duration", "avg"),
        "input_tokens": _metric(d, "total_isl", "avg"),
        "output_tokens": _metric(d, "total_osl", "avg"),
        "output_token_throughput": _metric(d, "output_token_throughput", "avg"),
        "total_token_throughput": _metric(d, "total_token_throughput", "avg"),
        "request_throughput": _metric(d, "request_throughput", "avg"),
        "ttft_p50_s": _metric(d, "time_to_first_token", "p50", ms),
        "ttft_p90_s": _metric(d, "time_to_first_token", "p90", ms),
        "ttft_p99_s": _metric(d, "time_to_first_token", "p99", ms),
        "itl_aiperf_p50_s": _metric(d, "inter_token_latency", "p50", ms),
        "itl_aiperf_p90_s": _metric(d, "inter_token_latency", "p90", ms),
        "itl_aiperf_p99_s": _metric(d, "inter_token_latency", "p99", ms),
        "inter_chunk_p50_s": _metric(d, "inter_chunk_latency", "p50", ms),
        "inter_chunk_p90_s": _metric(d, "inter_chunk_latency", "p90", ms),
        "inter_chunk_p99_s": _metric(d, "inter_chunk_latency", "p99", ms),
        "error_summary": d.get("error_summary"),
        "aiperf_version": d.get("aiperf_version"),
    }


def resummarize_aiperf_records(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """AIPerf's per-request records (``profile_export.jsonl``) summarised with our definitions.

    ITL = every inter-chunk gap pooled over requests (as ``metrics.summarize``);
    TPOT per request = (latency − TTFT) / (output tokens − 1); interactivity
    = 1 / P90 ITL; chunks per request vs output tokens shows how many token
    boundaries AIPerf saw as chunks. Times in s.
    """
    ttft, gaps, tpot, chunks, osl = [], [], [], [], []
    for rec in records:
        m = rec.get("metrics") or {}
        if rec.get("error"):
            continue
        t = (m.get("time_to_first_token") or {}).get("value")
        lat = (m.get("request_latency") or {}).get("value")
        n = (m.get("output_sequence_length") or m.get("output_token_count") or {}).get("value")
        icl = (m.get("inter_chunk_latency") or {}).get("value") or []
        if t is None:
            continue
        ttft.append(t / 1000)
        gaps.extend(g / 1000 for g in icl)
        chunks.append(len(icl) + 1)
        if n:
            osl.append(n)
        if n and n > 1 and lat is not None:
            tpot.append((lat - t) / 1000 / (n - 1))
    tq, gq, pq = percentiles(ttft), percentiles(gaps), percentiles(tpot)
    return {
        "num_records": len(ttft),
        "ttft_p50_s": tq[50], "ttft_p90_s": tq[90], "ttft_p99_s": tq[99],
        "itl_p50_s": gq[50], "itl_p90_s": gq[90], "itl_p99_s": gq[99],
        "interactivity_p90_tok_s_user": 1.0 / gq[90] if gq[90] else None,
        "tpot_p50_s": pq[50], "tpot_p90_s": pq[90],
        "chunks_per_request_mean": float(np.mean(chunks)) if chunks else None,
        "output_tokens_per_request_mean": float(np.mean(osl)) if osl else None,
    }


_LOG_TS = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
_GEN_TPUT = re.compile(r"Decode batch.*gen throughput \(token/s\): ([0-9.]+)")
_PREFILL = re.compile(r"Prefill batch.*#new-token: (\d+), #cached-token: (\d+)")


def server_log_phase_stats(log_path: Optional[str], t0: float, t1: float) -> Optional[Dict[str, Any]]:
    """What an SGLang server logged between epoch times ``t0`` and ``t1`` (s): the median
    of its ``Decode batch ... gen throughput`` lines (tokens/s, server side, independent of
    any client) and the prefill tokens it computed vs found cached. None without a log
    or matching lines. Log timestamps are local time with 1 s resolution."""
    if not log_path or not os.path.isfile(log_path):
        return None
    gen, new_tok, cached_tok = [], 0, 0
    lo, hi = int(t0), int(t1) + 1
    with open(log_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _LOG_TS.match(line)
            if not m:
                continue
            ts = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            if not lo <= ts <= hi:
                continue
            g = _GEN_TPUT.search(line)
            if g:
                gen.append(float(g.group(1)))
            p = _PREFILL.search(line)
            if p:
                new_tok += int(p.group(1))
                cached_tok += int(p.group(2))
    if not gen and not new_tok:
        return None
    return {
        "decode_gen_throughput_p50_tok_s": float(np.median(gen)) if gen else None,
        "decode_log_lines": len(gen),
        "prefill_new_tokens": new_tok,
        "prefill_cached_tokens": cached_tok,
    }


# Endpoints that empty a server's prefix cache: SGLang, vLLM.
FLUSH_ENDPOINTS = ("/flush_cache", "/reset_prefix_cache")


def flush_prefix_cache(base_url: str, timeout_s: float = 30.0) -> Optional[str]:
    """Empty the server's prefix cache (best effort); return the endpoint that answered 200, or None.

    Run before each client's phase so that neither finds prompts of an earlier run
    (e.g. the sweep) in the cache.
    """
    import requests

    for path in FLUSH_ENDPOINTS:
        try:
            if requests.post(base_url + path, timeout=timeout_s).status_code == 200:
                return path
        except requests.RequestException:
            continue
    return None


def run_aiperf(cmd: List[str], env: Dict[str, str], log_path: str, timeout_s: float) -> Optional[str]:
    """Run AIPerf; return None on success, else an error text (exit code and log tail)."""
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"aiperf timed out after {timeout_s:.0f} s"
        except OSError as e:
            return f"cannot run aiperf: {e}"
    if proc.returncode != 0:
        with open(log_path, "r", encoding="utf-8", errors="replace") as f:
            tail = "\n".join(f.read().splitlines()[-25:])
        return f"aiperf exited with code {proc.returncode}:\n{tail}"
    return None


def _ours_summary(summary: Dict[str, Any], wall: float) -> Dict[str, Any]:
    keys = ("num_requests", "num_errors", "input_tokens", "output_tokens", "output_token_throughput",
            "total_token_throughput", "request_throughput", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
            "itl_p50_s", "itl_p90_s", "itl_p99_s", "tpot_p50_s", "tpot_p90_s",
            "interactivity_p90_tok_s_user", "mean_tokens_per_chunk")
    out = {k: summary.get(k) for k in keys}
    out["duration_s"] = wall
    return out


def run(args: argparse.Namespace, command: List[str]) -> Dict[str, Any]:
    """Our client, then AIPerf, on the same slice; return the result document
    ``{"kind": "aiperf_crosscheck", "manifest", "ours", "aiperf", "aiperf_ours_definitions",
    "aiperf_error", "aiperf_command"}``. AIPerf failures are recorded, not raised."""
    start_utc = _dt.datetime.now(_dt.timezone.utc)
    work = os.path.abspath(args.work_dir or os.path.join(
        "runs", f"aiperf-{start_utc.strftime('%Y%m%dT%H%M%SZ')}"))
    os.makedirs(work, exist_ok=True)

    a = copy.copy(args)
    a.api = "openai"
    a.pace = "closed"
    a.output_json = None
    a.no_progress = True
    flushed = [flush_prefix_cache(args.base_url) if args.flush_cache else None]
    print(f">> cross-check: our client, concurrency {a.concurrency}", flush=True)
    cpu0, w0 = time.process_time(), time.time()
    ours = replay.run(a, command)
    ours_cpu, w1 = time.process_time() - cpu0, time.time()
    model = a.model  # resolved from /v1/models by replay.run

    doc: Dict[str, Any] = {
        "kind": "aiperf_crosscheck",
        "manifest": dict(ours["manifest"], benchmark="aiperf_crosscheck"),
        "ours": _ours_summary(ours["summary"], ours["summary"]["wall_time_s"]),
        "aiperf": None,
        "aiperf_ours_definitions": None,
        "aiperf_error": None,
        "aiperf_command": None,
        "ours_cpu_s": ours_cpu,
        "aiperf_cpu_s": None,
        "server_log_ours": server_log_phase_stats(args.server_log, w0, w1),
        "server_log_aiperf": None,
        "cache_flush": flushed,
    }
    aiperf_bin = find_aiperf(args.aiperf_bin)
    if aiperf_bin is None:
        doc["aiperf_error"] = f"aiperf executable not found ({args.aiperf_bin or 'aiperf on PATH'})"
        return doc

    slice_path = os.path.join(work, "slice.jsonl")
    block = write_mooncake_slice(args, slice_path)
    n = sum(1 for _ in open(slice_path))
    env = os.environ.copy()
    tokenizer = args.tokenizer
    if tokenizer is None:
        if not args.model_path:
            doc["aiperf_error"] = "AIPerf needs a tokenizer: pass --model-path or --tokenizer"
            return doc
        hf_home = os.path.join(work, "hf_home")
        tokenizer = local_tokenizer_cache(args.model_path, hf_home)
        env.update(HF_HOME=hf_home, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    art = os.path.join(work, "artifacts")
    cmd = aiperf_command(aiperf_bin, args, model, tokenizer, slice_path, block, n, art, args.aiperf_args.split())
    doc["aiperf_command"] = cmd
    if args.flush_cache:
        flushed.append(flush_prefix_cache(args.base_url))
    print(f">> cross-check: AIPerf, concurrency {args.concurrency}", flush=True)
    t = time.perf_counter()
    ru0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    err = run_aiperf(cmd, env, os.path.join(work, "aiperf.log"), args.aiperf_timeout)
    ru1, w1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    doc["server_log_aiperf"] = server_log_phase_stats(args.server_log, w0, w1)
    doc["aiperf_wall_s"] = time.perf_counter() - t
    # user + system CPU of AIPerf's process tree (children reaped during the run)
    doc["aiperf_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if err:
        doc["aiperf_error"] = err
        return doc
    try:
        with open(os.path.join(art, "profile_export_aiperf.json"), "r", encoding="utf-8") as f:
            doc["aiperf"] = parse_aiperf_summary(json.load(f))
        recs = []
        with open(os.path.join(art, "profile_export.jsonl"), "r", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    recs.append(json.loads(line))
        doc["aiperf_ours_definitions"] = resummarize_aiperf_records(recs)
    except (OSError, ValueError) as e:
        doc["aiperf_error"] = f"cannot read AIPerf artifacts in {art}: {e}"
        return doc
    for side in ("ours", "aiperf"):
        log = doc[f"server_log_{side}"] or {}
        doc[side]["server_decode_tok_s"] = log.get("decode_gen_throughput_p50_tok_s")
        doc[side]["client_cpu_s"] = doc[f"{side}_cpu_s"]
    return doc


COMPARE_ROWS = [
    # (label, unit, scale, ours key, aiperf key, aiperf-records-with-our-definitions key)
    ("requests", "", 1, "num_requests", "num_requests", "num_records"),
    ("errors", "", 1, "num_errors", "num_errors", None),
    ("duration", "s", 1, "duration_s", "duration_s", None),
    ("input tokens", "tok", 1, "input_tokens", "input_tokens", None),
    ("output tokens", "tok", 1, "output_tokens", "output_tokens", None),
    ("output throughput", "tok/s", 1, "output_token_throughput", "output_token_throughput", None),
    ("total throughput", "tok/s", 1, "total_token_throughput", "total_token_throughput", None),
    ("TTFT P50", "ms", 1000, "ttft_p50_s", "ttft_p50_s", "ttft_p50_s"),
    ("TTFT P90", "ms", 1000, "ttft_p90_s", "ttft_p90_s", "ttft_p90_s"),
    ("TTFT P99", "ms", 1000, "ttft_p99_s", "ttft_p99_s", "ttft_p99_s"),
    ("ITL P50 (chunk gaps, pooled)", "ms", 1000, "itl_p50_s", "inter_chunk_p50_s", "itl_p50_s"),
    ("ITL P90 (chunk gaps, pooled)", "ms", 1000, "itl_p90_s", "inter_chunk_p90_s", "itl_p90_s"),
    ("ITL P99 (chunk gaps, pooled)", "ms", 1000, "itl_p99_s", "inter_chunk_p99_s", "itl_p99_s"),
    ("TPOT P50 (per request)", "ms", 1000, "tpot_p50_s", "itl_aiperf_p50_s", "tpot_p50_s"),
    ("TPOT P90 (per request)", "ms", 1000, "tpot_p90_s", "itl_aiperf_p90_s", "tpot_p90_s"),
    ("P90 interactivity", "tok/s/user", 1, "interactivity_p90_tok_s_user", None, "interactivity_p90_tok_s_user"),
    ("server-logged decode throughput P50", "tok/s", 1, "server_decode_tok_s", "server_decode_tok_s", None),
    ("client CPU time", "s", 1, "client_cpu_s", "client_cpu_s", None),
]


def compare_rows(doc: Dict[str, Any]) -> List[List[Optional[float]]]:
    """``[label, unit, ours, aiperf, aiperf-with-our-definitions]`` rows, values scaled to the unit."""
    out = []
    for label, unit, scale, ko, ka, kr in COMPARE_ROWS:
        def get(d, k):
            v = (d or {}).get(k) if k else None
            return None if v is None else v * scale
        out.append([label, unit, get(doc.get("ours"), ko), get(doc.get("aiperf"), ka),
                    get(doc.get("aiperf_ours_definitions"), kr)])
    return out


def format_compare(doc: Dict[str, Any]) -> str:
    """The comparison as a text table."""
    lines = [f"{'metric':<34}{'ours':>12}{'AIPerf':>12}{'AIPerf recs, our defs':>24}"]
    for label, unit, o, a, r in compare_rows(doc):
        name = f"{label} [{unit}]" if unit else label
        lines.append(f"{name:<34}" + "".join(
            f"{('n/a' if v is None else f'{v:.2f}'):>{w}}" for v, w in ((o, 12), (a, 12), (r, 24))))
    if doc.get("aiperf_error"):
        lines.append(f"AIPerf: {doc['aiperf_error']}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse ``argv``, run both clients, print the comparison and save it; return the document."""
    cmd_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(cmd_argv)
    doc = run(args, ["python", "-m", "sglang_hybrid.bench.aiperf_check", *cmd_argv])
    work = os.path.dirname(doc["aiperf_command"][doc["aiperf_command"].index("--input-file") + 1]) \
        if doc.get("aiperf_command") else (args.work_dir or "runs")
    out_path = args.output_json or os.path.join(work, "aiperf_crosscheck.json")
    write_json(out_path, doc)
    print(format_compare(doc))
    print(f"results written to {out_path}")
    return doc


if __name__ == "__main__":
    main()
