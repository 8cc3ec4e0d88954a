"""Replay a Mooncake-format trace against an SGLang server.

Usage::

    python -m sglang_hybrid.bench.replay --base-url http://127.0.0.1:30000 \\
        --num-requests 200 --length-scale 0.25 --concurrency 8

Sends every trace request to ``POST {base_url}/generate`` (streaming; or
``/v1/completions`` with ``--api openai``) with synthetic prompt tokens that
keep the trace's prefix-sharing pattern (see ``trace.py``), then reports
prefix reuse (achieved vs. theoretical), token throughput, TTFT and ITL
percentiles, and writes a JSON file with a manifest, the summary and one row
per request. See docs/replay.md and docs/bench-suite.md.

Two load modes:

- closed loop (default): ``--concurrency C`` workers, each sends the next
  request in trace order once its previous one has finished;
- ``--pace timestamp --speedup X``: request ``i`` is sent ``timestamp_i / X``
  seconds after the start whether or not earlier ones finished (optionally
  bounded by ``--max-inflight``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import aiohttp
from tqdm import tqdm

from sglang_hybrid.bench import manifest as _manifest
from sglang_hybrid.bench.client import (
    API_CHOICES,
    RequestResult,
    get_server_info,
    list_models,
    send_request,
)
from sglang_hybrid.bench.metrics import format_summary, summarize
from sglang_hybrid.bench.trace import (
    DEFAULT_TRACE_PATH,
    PromptSynthesizer,
    ScaledRequest,
    TokenRange,
    load_trace,
    resolve_token_range,
    scale_trace,
    scaled_block_size,
    theoretical_reuse,
)

WARMUP_INPUT_LEN = 16  # tokens
WARMUP_OUTPUT_LEN = 8  # tokens


def build_parser() -> argparse.ArgumentParser:
    """The replay command line (see docs/replay.md; lengths in tokens, times in s)."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_hybrid.bench.replay",
        description="Replay a Mooncake-format trace against an SGLang /generate endpoint.",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:30000",
                   help="server URL; several, comma-separated: request i goes to URL i mod n (round-robin "
                        "routing over server instances, e.g. ones sharing a --hybrid-store)")
    p.add_argument("--api", choices=API_CHOICES, default="sglang",
                   help="sglang: native POST /generate; openai: POST /v1/completions (vLLM, any "
                        "OpenAI-compatible server)")
    p.add_argument("--model", default=None,
                   help="model name for --api openai (default: the first id of GET /v1/models)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    p.add_argument("--server-log", default=None,
                   help="server log file: its 'kernel path:' lines go into the manifest")
    p.add_argument("--trace", default=DEFAULT_TRACE_PATH, help="JSONL trace path")
    p.add_argument("--num-requests", type=int, default=None, help="first N requests (default all)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="input-length and block-size scale s; block = max(1, round(512*s)) tokens")
    p.add_argument("--output-scale", type=float, default=1.0, help="output-length scale")
    p.add_argument("--max-output-len", type=int, default=None, help="cap on output tokens")
    p.add_argument("--model-path", default=None,
                   help="model dir: config.json vocab_size and tokenizer special ids pick the token range")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="upper bound (exclusive) of synthetic token ids; overrides --model-path")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic token blocks")
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop workers")
    p.add_argument("--pace", choices=["closed", "timestamp"], default="closed",
                   help="closed: closed loop; timestamp: send at trace timestamps / speedup")
    p.add_argument("--speedup", type=float, default=1.0, help="timestamp pacing speedup")
    p.add_argument("--max-inflight", type=int, default=None,
                   help="bound on requests in flight in timestamp pacing")
    p.add_argument("--warmup", type=int, default=0, help="short requests sent first, not counted")
    p.add_argument("--request-timeout", type=float, default=None, help="per-request timeout (s)")
    p.add_argument("--output-json", default=None,
                   help="result file (default runs/replay-<UTC timestamp>.json)")
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    return p


def base_urls(args: argparse.Namespace) -> List[str]:
    """The servers of ``--base-url`` (comma-separated), in order.

    Raises:
        SystemExit: an empty entry.
    """
    urls = [u.strip().rstrip("/") for u in str(args.base_url).split(",")]
    if not all(urls):
        raise SystemExit(f"--base-url has an empty entry: {args.base_url!r}")
    return urls


def _validate(args: argparse.Namespace) -> None:
    base_urls(args)
    if args.length_scale <= 0 or args.output_scale <= 0:
        raise SystemExit("--length-scale and --output-scale must be > 0")
    if args.concurrency < 1:
        raise SystemExit("--concurrency must be >= 1")
    if args.pace == "timestamp" and args.speedup <= 0:
        raise SystemExit("--speedup must be > 0")
    if args.max_inflight is not None and args.max_inflight < 1:
        raise SystemExit("--max-inflight must be >= 1")
    if args.num_requests is not None and args.num_requests < 1:
        raise SystemExit("--num-requests must be >= 1")


# --------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------


def build_manifest(
    args: argparse.Namespace,
    argv: List[str],
    start_utc: _dt.datetime,
    token_range: TokenRange,
    server_info: Optional[Dict[str, Any]],
    results: Optional[List[RequestResult]] = None,
) -> Dict[str, Any]:
    """The run manifest (see ``manifest.base_manifest``) plus the replay's
    block size, token range, and request statistics when ``results`` is given."""
    m = _manifest.base_manifest(
        argv, vars(args), start_utc, server_info, model_path=args.model_path,
        server_log=getattr(args, "server_log", None), seed=args.seed, warmup=args.warmup,
    )
    m["block_size"] = scaled_block_size(args.length_scale)
    m["token_range"] = {
        "lo": token_range.lo,
        "hi": token_range.hi,
        "num_excluded": len(token_range.excluded),
    }
    if results is not None:
        m["request_stats"] = _manifest.request_stats(results)
    return m


# --------------------------------------------------------------------------
# Load generation
# --------------------------------------------------------------------------


async def _run_closed_loop(
    session, args, requests: List[ScaledRequest], synth: PromptSynthesizer,
    results: List[RequestResult], t0: float, bar,
) -> None:
    next_idx = 0

    async def worker() -> None:
        nonlocal next_idx
        while next_idx < len(requests):
            i = next_idx
            next_idx += 1
            await _send_one(session, args, requests[i], synth, results[i], t0)
            bar.update(1)

    await asyncio.gather(*(worker() for _ in range(min(args.concurrency, len(requests)))))


async def _run_paced(
    session, args, requests: List[ScaledRequest], synth: PromptSynthesizer,
    results: List[RequestResult], t0: float, bar,
) -> None:
    sem = asyncio.Semaphore(args.max_inflight) if args.max_inflight else None
    ts0 = min(r.timestamp_s for r in requests)

    async def one(req: ScaledRequest, res: RequestResult) -> None:
        try:
            await _send_one(session, args, req, synth, res, t0)
        finally:
            if sem is not None:
                sem.release()
            bar.update(1)

    tasks = []
    for req, res in zip(requests, results):
        # re-check the clock after waking: a request must never go early, and the loop's timer once
        # woke before perf_counter reached the target (the fresh-clone suite, 2026-12-07: a request
        # paced to 2 ms started at 1.67 ms; test_http_error_is_recorded_and_run_continues)
        send_at = t0 + (req.timestamp_s - ts0) / args.speedup
        while (delay := send_at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        if sem is not None:
            await sem.acquire()
        tasks.append(asyncio.create_task(one(req, res)))
    await asyncio.gather(*tasks)


async def _send_one(session, args, req: ScaledRequest, synth, res: RequestResult, t0: float):
    input_ids = synth.input_ids(req)
    urls = base_urls(args)
    res.base_url = urls[req.index % len(urls)]
    return await send_request(
        args.api, session, res.base_url, input_ids, req.output_len, res, t0,
        args.request_timeout, args.temperature, args.model,
    )


async def resolve_model_name(session, args) -> None:
    """For ``--api openai`` without ``--model``: the first id of ``GET /v1/models`` (else "default")."""
    if args.api == "openai" and not args.model:
        models = await list_models(session, base_urls(args)[0])
        args.model = (models[0].get("id") if models else None) or "default"


async def _replay(
    args, requests: List[ScaledRequest], synth: PromptSynthesizer
) -> Tuple[List[RequestResult], float, Optional[Dict[str, Any]]]:
    """Run warm-up and the trace. Returns (results, wall time in s, server info)."""
    results = [
        RequestResult(index=r.index, timestamp=r.timestamp_s, input_len=r.input_len, output_len=r.output_len)
        for r in requests
    ]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        server_info = await get_server_info(session, base_urls(args)[0])
        await resolve_model_name(session, args)
        for k in range(args.warmup * len(base_urls(args))):
            url = base_urls(args)[k % len(base_urls(args))]
            w = RequestResult(index=-1, timestamp=0.0, input_len=WARMUP_INPUT_LEN, output_len=WARMUP_OUTPUT_LEN)
            await send_request(args.api, session, url, synth.warmup_ids(k, WARMUP_INPUT_LEN),
                               WARMUP_OUTPUT_LEN, w, time.perf_counter(), args.request_timeout,
                               args.temperature, args.model)
            if not w.success:
                print(f"warm-up request {k} failed: {w.error}", file=sys.stderr)
        bar = tqdm(total=len(requests), disable=args.no_progress, desc="replay", unit="req")
        t0 = time.perf_counter()
        try:
            if args.pace == "timestamp":
                await _run_paced(session, args, requests, synth, results, t0, bar)
            else:
                await _run_closed_loop(session, args, requests, synth, results, t0, bar)
        finally:
            bar.close()
        wall = time.perf_counter() - t0
    return results, wall, server_info


def write_result_json(path: str, manifest, summary, results: List[RequestResult]) -> None:
    """Write ``{"manifest", "summary", "requests"}``; one request row per line."""
    head = json.dumps({"manifest": manifest, "summary": summary}, indent=1, default=str)
    rows = ",\n".join(json.dumps(r.to_row(), default=str) for r in results)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head[:-2] + ',\n "requests": [\n' + rows + "\n]}\n")


def run(args: argparse.Namespace, command: List[str]) -> Dict[str, Any]:
    """Run one replay with parsed ``args``; nothing printed or written.

    Returns ``{"manifest", "summary", "results"}`` (``results``: one
    :class:`RequestResult` per trace request, in trace order). ``command``
    is recorded in the manifest.
    """
    _validate(args)
    start_utc = _dt.datetime.now(_dt.timezone.utc)

    records = load_trace(args.trace, args.num_requests)
    if not records:
        raise SystemExit(f"no requests in {args.trace}")
    requests = scale_trace(records, args.length_scale, args.output_scale, args.max_output_len)
    token_range = resolve_token_range(args.model_path, args.vocab_size)
    synth = PromptSynthesizer(scaled_block_size(args.length_scale), token_range, args.seed)
    theo = theoretical_reuse(requests)

    results, wall, server_info = asyncio.run(_replay(args, requests, synth))

    summary = summarize(results, wall, theo)
    manifest = build_manifest(args, command, start_utc, token_range, server_info, results)
    return {"manifest": manifest, "summary": summary, "results": results}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse ``argv``, run the replay, print and save results; return the summary dict."""
    cmd_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(cmd_argv)
    out = run(args, ["python", "-m", "sglang_hybrid.bench.replay", *cmd_argv])
    manifest, summary, results = out["manifest"], out["summary"], out["results"]
    start_utc = _dt.datetime.fromisoformat(manifest["start_time_utc"])
    out_path = args.output_json or os.path.join(
        "runs", f"replay-{start_utc.strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    write_result_json(out_path, manifest, summary, results)

    print(format_summary(summary))
    errors = [r for r in results if not r.success]
    if errors:
        print(f"{len(errors)} request(s) failed; first error: {errors[0].error}", file=sys.stderr)
    print(f"results written to {out_path}")
    return summary


if __name__ == "__main__":
    main()
