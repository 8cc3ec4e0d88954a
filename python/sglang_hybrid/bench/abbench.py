"""abbench: closed-loop decode benchmark in fixed time windows, one per concurrency.

Usage::

    python -m sglang_hybrid.bench.abbench --base-url http://127.0.0.1:30000 \\
        --concurrency 1,8,32 --window 60 --output-len 384 --input-len 1024

For each concurrency C: C streams start together; each stream sends a
request, waits until it has finished, and sends the next one, as long as the
window (``--window`` s, from the common start) is open. No request starts
after the window closes; requests in flight at that moment run to completion
and count. Every request asks for exactly ``--output-len`` tokens
(``ignore_eos``) at ``--temperature`` (0.2 by default) with a random prompt of
``--input-len`` token ids that depends only on (seed, C, stream, request
number) — the same seed gives the same prompts on every run, and no prompt
repeats, so no run is helped by the prefix cache.

Reported per window (see ``metrics.summarize_window``): aggregate output
tokens/s (successful tokens ÷ wall time including the tail), the median
per-request decode rate (own denominator), TTFT max/P50/P99, burst-normalised
ITL P99 (a per-token proxy) and the true per-chunk gaps, request errors.
Tokens are counted from returned token ids, not stream events
(``--api openai``: ``/v1/completions`` with per-token fields; ``--api sglang``:
``/generate`` ``meta_info.completion_tokens``); see ``client.py`` and
docs/bench-suite.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import aiohttp
import numpy as np

from sglang_hybrid.bench import manifest as _manifest
from sglang_hybrid.bench.client import (
    API_CHOICES,
    RequestResult,
    get_server_info,
    list_models,
    send_request,
)
from sglang_hybrid.bench.metrics import format_table, summarize_window
from sglang_hybrid.bench.resultfile import write_json
from sglang_hybrid.bench.trace import TokenRange, resolve_token_range

WARMUP_OUTPUT_LEN = 8  # tokens; warm-up prompts have the measured --input-len
_PROMPT_STREAM = 7  # entropy tag separating abbench prompts from replay blocks and warm-ups


def parse_int_list(text: str) -> List[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return vals


class ClosedLoopPrompts:
    """Deterministic random prompts: request ``k`` of stream ``s`` at concurrency ``c``
    gets ``input_len`` token ids drawn uniformly from ``token_range`` by
    ``numpy.random.default_rng([seed, 7, c, s, k])``."""

    def __init__(self, input_len: int, token_range: TokenRange, seed: int = 0):
        if input_len < 1:
            raise ValueError("input_len must be >= 1")
        self.input_len = input_len
        self.seed = seed
        self._allowed = token_range.allowed_ids()

    def prompt(self, concurrency: int, stream: int, k: int) -> List[int]:
        """Prompt token ids (``input_len`` of them) of request ``k`` of ``stream`` at ``concurrency``."""
        rng = np.random.default_rng([self.seed, _PROMPT_STREAM, concurrency, stream, k])
        return self._allowed[rng.integers(0, self._allowed.size, size=self.input_len)].tolist()

    def warmup(self, k: int) -> List[int]:
        """A warm-up prompt of the measured length (``input_len``: the prefill shapes, kernels and
        graphs a measured request needs are then compiled before the first window), from its own RNG
        stream, so it shares no prefix with a measured prompt."""
        rng = np.random.default_rng([self.seed, _PROMPT_STREAM, 0, 2**32, k])
        return self._allowed[rng.integers(0, self._allowed.size, size=self.input_len)].tolist()


def build_parser() -> argparse.ArgumentParser:
    """The abbench command line (see ``--help``; times in s, lengths in tokens)."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_hybrid.bench.abbench",
        description="Closed-loop decode benchmark in fixed windows at several concurrencies.",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--api", choices=API_CHOICES, default="openai",
                   help="openai: POST /v1/completions (SGLang, vLLM, ...); sglang: native POST /generate")
    p.add_argument("--model", default=None,
                   help="model name for --api openai (default: the first id of GET /v1/models)")
    p.add_argument("--concurrency", type=parse_int_list, default=[1, 8, 32],
                   help="comma-separated concurrencies, one window each (default 1,8,32)")
    p.add_argument("--window", type=float, default=60.0,
                   help="window length in s; requests started before its end finish and count")
    p.add_argument("--output-len", type=int, default=384, help="output tokens per request (ignore_eos)")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request")
    p.add_argument("--temperature", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--model-path", default=None,
                   help="model dir: token range from config/tokenizer; config hash in the manifest")
    p.add_argument("--vocab-size", type=int, default=None, help="upper bound (exclusive) of prompt token ids")
    p.add_argument("--warmup", type=int, default=2,
                   help="requests of the measured --input-len (8 output tokens) sent first, not counted")
    p.add_argument("--logprobs", action="store_true",
                   help="--api openai: also request logprobs (another per-token source; costs server time)")
    p.add_argument("--request-timeout", type=float, default=None, help="per-request timeout (s)")
    p.add_argument("--server-log", default=None,
                   help="server log file: its 'kernel path:' lines go into the manifest")
    p.add_argument("--output-json", default=None,
                   help="result file (default runs/abbench-<UTC timestamp>.json)")
    return p


def _validate(args: argparse.Namespace) -> None:
    if args.window <= 0:
        raise SystemExit("--window must be > 0")
    if args.output_len < 1 or args.input_len < 1:
        raise SystemExit("--output-len and --input-len must be >= 1")
    if args.warmup < 0:
        raise SystemExit("--warmup must be >= 0")


async def run_window(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    concurrency: int,
    prompts: ClosedLoopPrompts,
) -> Tuple[List[RequestResult], List[Tuple[int, int]], float]:
    """One closed-loop window at ``concurrency`` streams.

    Returns ``(results, [(stream, k), ...], wall time in s)``: results in
    start order; wall time from the common start to the end of the last
    request (tail included).
    """
    results: List[RequestResult] = []
    who: List[Tuple[int, int]] = []
    t0 = time.perf_counter()
    window_end = t0 + args.window

    async def stream(s: int) -> None:
        k = 0
        while time.perf_counter() < window_end:
            ids = prompts.prompt(concurrency, s, k)
            r = RequestResult(index=len(results), timestamp=0.0, input_len=len(ids),
                              output_len=args.output_len)
            results.append(r)
            who.append((s, k))
            await send_request(args.api, session, args.base_url, ids, args.output_len, r, t0,
                               args.request_timeout, args.temperature, args.model, args.logprobs)
            k += 1

    await asyncio.gather(*(stream(s) for s in range(concurrency)))
    return results, who, time.perf_counter() - t0


async def _run_all(args, prompts: ClosedLoopPrompts):
    windows = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        server_info = await get_server_info(session, args.base_url)
        models = await list_models(session, args.base_url)
        if args.api == "openai" and not args.model:
            args.model = (models[0].get("id") if models else None) or "default"
        for k in range(args.warmup):
            w = RequestResult(index=-1, timestamp=0.0, input_len=prompts.input_len, output_len=WARMUP_OUTPUT_LEN)
            await send_request(args.api, session, args.base_url, prompts.warmup(k), WARMUP_OUTPUT_LEN, w,
                               time.perf_counter(), args.request_timeout, args.temperature, args.model)
            if not w.success:
                print(f"warm-up request {k} failed: {w.error}", file=sys.stderr)
        for c in args.concurrency:
            print(f">> abbench: concurrency {c}, window {args.window:g} s", flush=True)
            results, who, wall = await run_window(session, args, c, prompts)
            windows.append((c, results, who, wall))
    return windows, server_info, models


def run(args: argparse.Namespace, command: List[str]) -> Dict[str, Any]:
    """Run every window with parsed ``args``; nothing printed but progress, nothing written.

    Returns the result document ``{"kind": "abbench", "manifest", "windows"}``
    with one ``{"summary", "request_stats", "requests"}`` entry per
    concurrency (``requests``: JSON rows with ``stream`` and ``seq``).
    """
    _validate(args)
    start_utc = _dt.datetime.now(_dt.timezone.utc)
    token_range = resolve_token_range(args.model_path, args.vocab_size)
    prompts = ClosedLoopPrompts(args.input_len, token_range, args.seed)
    windows, server_info, models = asyncio.run(_run_all(args, prompts))

    out_windows = []
    all_results: List[RequestResult] = []
    for c, results, who, wall in windows:
        rows = []
        for r, (s, k) in zip(results, who):
            row = r.to_row()
            row["stream"], row["seq"] = s, k
            rows.append(row)
        out_windows.append({
            "summary": summarize_window(results, c, args.window, wall),
            "request_stats": _manifest.request_stats(results),
            "requests": rows,
        })
        all_results.extend(results)

    m = _manifest.base_manifest(command, vars(args), start_utc, server_info, model_path=args.model_path,
                                server_log=args.server_log, seed=args.seed, warmup=args.warmup)
    m["benchmark"] = "abbench"
    m["served_models"] = models
    m["token_range"] = {"lo": token_range.lo, "hi": token_range.hi, "num_excluded": len(token_range.excluded)}
    m["request_stats"] = _manifest.request_stats(all_results)
    return {"kind": "abbench", "manifest": m, "windows": out_windows}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Parse ``argv``, run, print the table and save the JSON; return the result document."""
    cmd_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(cmd_argv)
    doc = run(args, ["python", "-m", "sglang_hybrid.bench.abbench", *cmd_argv])
    out_path = args.output_json or os.path.join(
        "runs", f"abbench-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    write_json(out_path, doc)
    print(format_table([w["summary"] for w in doc["windows"]]))
    print("median decode rate: per request, tokens after the first chunk / (last chunk - first chunk) time;"
          " ITL burst-normalised = chunk gap / tokens in the chunk (proxy)")
    errs = doc["manifest"]["request_stats"]["errors"]
    if errs["count"]:
        print(f"{errs['count']} request(s) failed: {errs['messages']}", file=sys.stderr)
    print(f"results written to {out_path}")
    return doc


if __name__ == "__main__":
    main()
