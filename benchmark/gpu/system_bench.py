"""System benchmark on one GPU, served: upstream's kernels and cache vs ours vs each of our parts alone.

    python benchmark/gpu/system_bench.py --out benchmark/results/DATE-h100-k3-system.json \\
        --variants upstream,ours,ours_kernels,ours_cache

Issue 41 item 3, with the model of the decode-step profile: **one GPU's share of Kimi K3 at TP8**
(``k3_share.py``: hidden 7168, 12 MLA + 12 KDA heads, three KDA layers per MLA layer, 112 routed
experts top-2) with random weights (``--load-format dummy``), served through
``python -m sglang.launch_server`` once per variant with the same flags, pool sizes and requests:

* ``upstream``: upstream's Triton MLA, KDA, routing and AttnRes (``SGLANG_HYBRID_UPSTREAM_OPS``
  keeps every op we hook) and upstream's own cache (``--radix-cache-backend upstream``:
  ``UnifiedRadixCache`` with its Mamba component);
* ``ours``: our kernels (``sgl_hybrid_mla``, ``--linear-attn-backend sgl_hybrid``, routing, AttnRes,
  fused KDA decode where upstream's CUDA one does not cover the step) and the hybrid radix cache
  with a host tier (``--hybrid-host-cache-gb``);
* ``ours_kernels``: our kernels with upstream's cache; ``ours_cache``: upstream's kernels with our cache.

Load, in this order on every server (``sglang_hybrid.bench``, the same clients ``make bench`` uses):

1. **abbench** closed loop at ``--ab-concurrency`` (C1/C8/C32): fixed windows, random prompts
   that never repeat (no prefix reuse), ``ignore_eos``;
2. **AgentX-style replay sweep** of the Mooncake conversation trace (the package's copy, first
   ``--mooncake-requests`` requests, lengths x ``--length-scale``) at ``--sweep-concurrency``;
3. the same sweep of a **generated agentic trace** (``trace_gen`` shape ``--agentic-shape``: long
   tool contexts, many turns; its theoretical prefix reuse is printed and recorded, > 90 % for the
   default slice).

Per variant: abbench windows (tokens/s, TTFT / ITL percentiles), each sweep's points
(tokens/s/GPU, P90 interactivity, TTFT / ITL percentiles, achieved vs theoretical reuse, cached
tokens by tier) and its throughput interpolated at ``--target-interactivity`` (tokens/s/user),
prefix reuse over time (``--reuse-bin-s`` bins), kernel paths and call counts from
``/get_server_info``. Then ratios against ``upstream``: abbench output tokens/s per C, sweep
throughput per C, and throughput at equal interactivity (the target when both curves reach it,
else the interactivity of upstream's most loaded point; ``None`` when a curve does not reach it).

Speculative decoding is off: with random weights a draft model's acceptance means nothing, so
accept length and the depth controller are measured on the trained tiny models instead
(docs/speculative.md). A model of 4 layers decodes far faster than Kimi K3's 61, so tokens/s/user
here is not comparable to the articles' 50 tokens/s/user target; the ratios at equal
interactivity are what carries over.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

from sglang_hybrid.bench import abbench, sweep, trace_gen
from sglang_hybrid.bench.manifest import git_commit, git_dirty, machine_info, model_config_hash, package_versions
from sglang_hybrid.bench.metrics import interpolate_at_interactivity
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from sglang_hybrid.bench.trace import load_trace, scale_request, theoretical_reuse

from k3_share import add_model_args, plugin_state, write_model  # noqa: E402  (this folder: the script's own directory is on sys.path)

ALL_UPSTREAM = "moe_routing,attn_res,kda_fused_decode"
OUR_KERNELS = ["--attention-backend", "sgl_hybrid_mla", "--linear-attn-backend", "sgl_hybrid"]
UPSTREAM_KERNELS = ["--attention-backend", "triton"]
UPSTREAM_CACHE = ["--radix-cache-backend", "upstream"]
# name -> (server flags, environment, what it is); "{host_gb}" is replaced by --host-cache-gb
VARIANTS = {
    "upstream": (UPSTREAM_KERNELS + UPSTREAM_CACHE, {"SGLANG_HYBRID_UPSTREAM_OPS": ALL_UPSTREAM},
                 "upstream's kernels + upstream's cache"),
    "ours": (OUR_KERNELS + ["--hybrid-host-cache-gb", "{host_gb}"], {},
             "our kernels + hybrid radix cache with host tier"),
    "ours_kernels": (OUR_KERNELS + UPSTREAM_CACHE, {}, "our kernels + upstream's cache"),
    "ours_cache": (UPSTREAM_KERNELS + ["--hybrid-host-cache-gb", "{host_gb}"],
                   {"SGLANG_HYBRID_UPSTREAM_OPS": ALL_UPSTREAM}, "upstream's kernels + hybrid radix cache with host tier"),
}
SGLANG_TORCH = "2.14."  # the torch sglang 0.5.23 and its compiled extensions are built for
MOONCAKE = os.path.join(os.path.dirname(trace_gen.__file__), "traces", "mooncake_conversation_trace.jsonl")
SHAPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cache", "shapes.json")


def _alive(srv: LaunchedServer, when: str) -> None:
    """Raise ``RuntimeError`` (the variant is recorded as failed) when the server process has exited."""
    rc = srv.process.poll() if srv.process is not None else None
    if rc is not None:
        raise RuntimeError(f"server exited with code {rc} {when}; log tail:\n{srv.log_tail(30)}")



_COMPILE_RE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] Triton kernel '([^']+)' took ([\d.]+) s "
                         r"to compile after serving started")


def serving_compiles(log_path: str, phases: List[tuple]) -> List[Dict[str, Any]]:
    """Upstream's "Triton kernel 'X' took Y s to compile after serving started" lines of a server log,
    each with the driver phase it fell in (``phases``: ``(name, start, end)`` wall-clock seconds; the
    log's local-time stamps have 1 s resolution; before every phase: ``boot``; none: ``between``)."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read().replace("\0", "")
    except OSError:
        return []
    out = []
    for stamp, kernel, secs in _COMPILE_RE.findall(text):
        t = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
        where = "boot" if not phases or t < phases[0][1] - 1 else "between"
        for label, start, end in phases:
            if start - 1 <= t <= end + 1:
                where = label
                break
        out.append({"kernel": kernel, "s": float(secs), "at": stamp, "phase": where})
    return out


def reuse_over_time(rows: List[Dict[str, Any]], bin_s: float) -> List[Dict[str, Any]]:
    """Prefix reuse per ``bin_s``-second bin of request start time: ``cached / input`` tokens of the
    successful requests that started in the bin (``rows``: ``RequestResult.to_row()`` dicts)."""
    bins: Dict[int, List[int]] = {}
    for r in rows:
        if not r.get("success") or r.get("start_time") is None:
            continue
        b = bins.setdefault(int(r["start_time"] // bin_s), [0, 0, 0])
        b[0] += int(r.get("cached_tokens") or 0)
        b[1] += int(r.get("input_len") or 0)
        b[2] += 1
    return [{"t_s": k * bin_s, "requests": v[2], "reuse": (v[0] / v[1]) if v[1] else None}
            for k, v in sorted(bins.items())]


def _slim_sweep(doc: Dict[str, Any], bin_s: float) -> Dict[str, Any]:
    """The sweep document without per-request rows (kept only as reuse-over-time bins per point)."""
    points = []
    for p in doc["points"]:
        q = {k: v for k, v in p.items() if k != "requests"}
        q["reuse_over_time"] = reuse_over_time(p.get("requests") or [], bin_s)
        points.append(q)
    return {"points": points, "target": doc["target"], "manifest": doc["manifest"]}


def _slim_abbench(doc: Dict[str, Any]) -> Dict[str, Any]:
    windows = [{k: v for k, v in w.items() if k not in ("requests", "results")} for w in doc["windows"]]
    return {"windows": windows, "manifest": doc["manifest"]}


def server_args_for(args, flags: List[str], max_c: int) -> List[str]:
    """The launch flags of one variant: the shared ones (dtype, CUDA graphs up to ``max_c``, running
    requests, memory fraction, context length, and the pools: ``--max-total-tokens`` KV tokens and
    ``--max-mamba-cache-size`` state slots, each left to the server when 0) and then the variant's
    ``flags``. ``--device cpu``: ``cpu_server_args()`` without the kernel flags (a smoke run)."""
    if args.device == "cpu":  # a smoke run of the driver on a small checkpoint (kernel flags do not apply)
        flags = [f for f in flags if f not in UPSTREAM_KERNELS + OUR_KERNELS]
        return [*cpu_server_args(), "--max-running-requests", str(max_c), *flags]
    out = ["--load-format", "dummy", "--dtype", "bfloat16", "--cuda-graph-max-bs-decode", str(max_c),
           "--max-running-requests", str(max_c), "--mem-fraction-static", str(args.mem_fraction_static),
           "--context-length", str(args.context_length)]
    if args.model_path:
        out = out[2:]  # a real checkpoint: its own weights
    if args.max_total_tokens:
        out += ["--max-total-tokens", str(args.max_total_tokens)]
    if args.max_mamba_cache_size:
        out += ["--max-mamba-cache-size", str(args.max_mamba_cache_size)]
    return out + list(flags)


def variant_server(name: str, key: str, model: str, args) -> LaunchedServer:
    """The (not yet started) server of variant ``name``; its log is ``server-<key>.log`` in ``--log-dir``."""
    flags, env, _ = VARIANTS[name]
    flags = [f.replace("{host_gb}", str(args.host_cache_gb)) for f in flags]
    max_c = max(args.ab_concurrency + args.sweep_concurrency)
    return LaunchedServer(model, server_args_for(args, flags, max_c), env={**env, **args.server_env},
                          timeout=args.boot_timeout, log_path=os.path.join(args.log_dir, f"server-{key}.log"))


def boot_all(servers: Dict[str, LaunchedServer]) -> Dict[str, Any]:
    """``--parallel-boot``: start every server at once (their compiles and CUDA-graph captures overlap) and
    wait for all; ``{key: boot seconds}`` or ``{key: exception}`` for a server that did not come up."""
    def start(key):
        t0 = time.perf_counter()
        servers[key].start()
        return round(time.perf_counter() - t0, 1)

    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        futures = {key: pool.submit(start, key) for key in servers}
    out: Dict[str, Any] = {}
    for key, fut in futures.items():
        try:
            out[key] = fut.result()
        except Exception as e:  # recorded as that variant's error
            out[key] = e
    return out


@contextlib.contextmanager
def _started(server: LaunchedServer):
    """A server ``boot_all`` started: yielded as is, stopped on exit."""
    try:
        yield server
    finally:
        server.stop()


def run_variant(name: str, model: str, args, work: str, key: Optional[str] = None,
                booted: Optional[LaunchedServer] = None, boot_s: Optional[float] = None) -> Dict[str, Any]:
    """Serve ``model`` with variant ``name`` and run abbench and both replay sweeps against it. ``booted``: a
    server ``boot_all`` started (stopped here after the measurement), with its ``boot_s``."""
    key = key or name
    _, _, what = VARIANTS[name]
    server = booted or variant_server(name, key, model, args)
    server_args, env, log = server.server_args, server.env, server.log_path
    out: Dict[str, Any] = {"variant": name, "what": what, "flags": server_args, "env": env}
    t0 = time.perf_counter()
    phases: List[tuple] = []  # (name, start, end) in wall-clock seconds, for the compile attribution

    def phase(label: str, fn):
        start = time.time()
        try:
            return fn()
        finally:
            phases.append((label, start, time.time()))

    traces = (("mooncake", MOONCAKE, args.mooncake_requests), ("agentic", args.agentic_trace, args.agentic_requests))
    with (_started(booted) if booted is not None else server) as srv:
        base = srv.base_url
        out["boot_s"] = boot_s if booted is not None else round(time.perf_counter() - t0, 1)
        if booted is not None:
            out["boot"] = "parallel: every server of this call started at once, measured one at a time"
        out["kernel_paths"] = plugin_state(base).get("kernel_paths")
        common = ["--base-url", base, "--api", "sglang", "--model-path", model, "--server-log", log]
        if args.prime:
            # unmeasured: every abbench C for a short window and the most loaded sweep point of each trace,
            # so kernels Triton compiles for new shapes are compiled before anything is measured
            _alive(srv, "before priming")
            top = max(args.sweep_concurrency)
            phase("prime", lambda: (
                abbench.main([*common, "--concurrency", ",".join(map(str, args.ab_concurrency)), "--window", "2",
                              "--output-len", str(args.ab_output_len), "--input-len", str(args.ab_input_len),
                              "--warmup", "0", "--output-json", os.path.join(work, f"prime-abbench-{name}.json")]),
                [sweep.main([*common, "--trace", path, "--num-requests", str(2 * top), "--length-scale",
                             str(args.length_scale), "--max-output-len", str(args.max_output_len), "--concurrency",
                             str(top), "--warmup", "0", "--no-progress",
                             "--output-json", os.path.join(work, f"prime-{trace_name}-{name}.json")])
                 for trace_name, path, _ in traces]))
        _alive(srv, "before abbench")
        ab = phase("abbench", lambda: abbench.main(
            [*common, "--concurrency", ",".join(map(str, args.ab_concurrency)),
             "--window", str(args.ab_window), "--output-len", str(args.ab_output_len),
             "--input-len", str(args.ab_input_len), "--warmup", str(args.warmup),
             "--output-json", os.path.join(work, f"abbench-{name}.json")]))
        out["abbench"] = _slim_abbench(ab)
        out["sweeps"] = {}
        for trace_name, path, n in traces:
            _alive(srv, f"before the {trace_name} sweep")
            doc = phase(f"sweep-{trace_name}", lambda path=path, n=n, trace_name=trace_name: sweep.main(
                [*common, "--trace", path, "--num-requests", str(n), "--requests-per-stream",
                 str(args.requests_per_stream), "--length-scale", str(args.length_scale),
                 "--max-output-len", str(args.max_output_len),
                 "--concurrency", ",".join(map(str, args.sweep_concurrency)), "--warmup", str(args.warmup),
                 "--target-interactivity", str(args.target_interactivity), "--no-progress",
                 "--output-json", os.path.join(work, f"sweep-{trace_name}-{name}.json")]))
            out["sweeps"][trace_name] = _slim_sweep(doc, args.reuse_bin_s)
        _alive(srv, "after the sweeps")
        out["kernel_calls"] = plugin_state(base).get("kernel_calls")
    out["serving_compiles"] = serving_compiles(log, phases)
    measured = [c for c in out["serving_compiles"] if c["phase"] not in ("boot", "prime")]
    if measured:
        print(f"!! {name}: {len(measured)} Triton compile(s) while measuring, {sum(c['s'] for c in measured):.1f} s "
              f"({', '.join(sorted({c['kernel'] for c in measured}))}): those points include the stall", flush=True)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def _curve(v: Dict[str, Any], trace_name: str) -> List[tuple]:
    pts = v.get("sweeps", {}).get(trace_name, {}).get("points", [])
    return [(p["derived"]["interactivity_p90_tok_s_user"], p["derived"]["total_tok_s_per_gpu"]) for p in pts]


def compare(base: Dict[str, Any], other: Dict[str, Any], target: float) -> Dict[str, Any]:
    """Ratios ``other / base``: abbench output tokens/s per C, sweep tokens/s/GPU per C, and
    tokens/s/GPU at equal P90 interactivity (``target`` when both curves reach it, else the
    interactivity of ``base``'s most loaded point)."""
    res: Dict[str, Any] = {"abbench_output_tok_s": {}, "sweeps": {}}
    bw = {w["summary"]["concurrency"]: w["summary"] for w in base.get("abbench", {}).get("windows", [])}
    for w in other.get("abbench", {}).get("windows", []):
        c = w["summary"]["concurrency"]
        a, b = bw.get(c, {}).get("output_token_throughput"), w["summary"].get("output_token_throughput")
        res["abbench_output_tok_s"][str(c)] = round(b / a, 3) if a and b else None
    for trace_name in ("mooncake", "agentic"):
        cb, co = _curve(base, trace_name), _curve(other, trace_name)
        if not cb or not co:
            continue
        per_c = {}
        pb = base["sweeps"][trace_name]["points"]
        po = {p["concurrency"]: p for p in other["sweeps"][trace_name]["points"]}
        for p in pb:
            q = po.get(p["concurrency"])
            a, b = p["derived"]["total_tok_s_per_gpu"], (q or {}).get("derived", {}).get("total_tok_s_per_gpu")
            per_c[str(p["concurrency"])] = round(b / a, 3) if a and b else None
        at = []
        loaded = min((x for x, _ in cb if x is not None), default=None)
        for x in (target, loaded):
            if x is None:
                continue
            tb, to = interpolate_at_interactivity(cb, x), interpolate_at_interactivity(co, x)
            at.append({"interactivity_tok_s_user": round(x, 2), "base_tok_s_per_gpu": tb, "tok_s_per_gpu": to,
                       "ratio": round(to / tb, 3) if tb and to else None})
        res["sweeps"][trace_name] = {"tok_s_per_gpu_by_concurrency": per_c, "at_equal_interactivity": at}
    return res


def plot(result: Dict[str, Any], out_dir: str, stem: str) -> List[str]:
    """PNG plots of a result document in ``out_dir``: per trace, tokens/s/GPU vs P90 interactivity
    (one curve per variant, points labelled by concurrency) and prefix reuse over time at the
    most loaded sweep point (one curve per variant). Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    ok = {n: v for n, v in result["variants"].items() if "error" not in v}
    for trace_name in ("mooncake", "agentic"):
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
        for name, v in ok.items():
            pts = v.get("sweeps", {}).get(trace_name, {}).get("points", [])
            xy = sorted((p["derived"]["interactivity_p90_tok_s_user"], p["derived"]["total_tok_s_per_gpu"],
                         p["concurrency"]) for p in pts if p["derived"]["interactivity_p90_tok_s_user"])
            if not xy:
                continue
            line, = ax.plot([x for x, _, _ in xy], [y for _, y, _ in xy], "o-", label=name)
            for x, y, c in xy:
                ax.annotate(f"C{c}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6,
                            color=line.get_color())
            loaded = max(pts, key=lambda p: p["concurrency"])
            r = [(b["t_s"], b["reuse"]) for b in loaded.get("reuse_over_time", []) if b["reuse"] is not None]
            if r:
                bx.plot([t for t, _ in r], [100 * u for _, u in r], ".-", color=line.get_color(),
                        label=f"{name} (C{loaded['concurrency']})")
        theo = result.get("traces", {}).get(trace_name, {}).get("theoretical_reuse")
        if theo is not None:
            bx.axhline(100 * theo, color="grey", ls=":", lw=1, label="theoretical (whole slice)")
        ax.set_xlabel("P90 interactivity = 1 / P90 ITL (tokens/s/user)")
        ax.set_ylabel("total tokens/s/GPU")
        ax.set_title(f"{trace_name} replay: throughput vs interactivity")
        bx.set_xlabel("request start (s)")
        bx.set_ylabel("prefix reuse (% of input tokens)")
        bx.set_title(f"{trace_name} replay: reuse over time")
        for a in (ax, bx):
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}-{trace_name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="result JSON (rewritten after every variant)")
    p.add_argument("--variants", default="upstream,ours,ours_kernels,ours_cache",
                   help=f"comma-separated, from {', '.join(VARIANTS)}; ratios are against 'upstream' (merged from "
                        "--merge when this run has none); a name given again runs again as name#2 (e.g. upstream "
                        "first and last: upstream#2 / upstream is the baseline's drift over the run)")
    p.add_argument("--merge", default=None, help="an earlier result JSON whose variants join this one (same model)")
    add_model_args(p)
    p.add_argument("--ab-concurrency", type=abbench.parse_int_list, default=[1, 8, 32])
    p.add_argument("--ab-window", type=float, default=8.0, help="abbench window (s)")
    p.add_argument("--ab-input-len", type=int, default=1024)
    p.add_argument("--ab-output-len", type=int, default=128)
    p.add_argument("--sweep-concurrency", type=abbench.parse_int_list, default=[8, 16, 32, 64])
    p.add_argument("--mooncake-requests", type=int, default=64,
                   help="Mooncake requests at the least loaded point (raised to --requests-per-stream x C above it)")
    p.add_argument("--agentic-shape", default="agentic-long", help=f"shape name in {os.path.normpath(SHAPES)}")
    p.add_argument("--agentic-requests", type=int, default=384)
    p.add_argument("--length-scale", type=float, default=0.125)
    p.add_argument("--max-output-len", type=int, default=64)
    p.add_argument("--target-interactivity", type=float, default=50.0)
    p.add_argument("--requests-per-stream", type=int, default=8,
                   help="sweep points replay at least this many requests per stream (C64: 512); 0: the fixed counts")
    p.add_argument("--prime", action=argparse.BooleanOptionalAction, default=True,
                   help="before measuring, drive every abbench C and the most loaded sweep point unmeasured, so "
                        "Triton compiles for new shapes happen first (those still seen while measuring are "
                        "recorded per phase in serving_compiles)")
    p.add_argument("--warmup", type=int, default=2, help="requests of the measured shapes sent first, not counted")
    p.add_argument("--reuse-bin-s", type=float, default=2.0)
    p.add_argument("--host-cache-gb", type=float, default=16.0)
    p.add_argument("--mem-fraction-static", type=float, default=0.85)
    p.add_argument("--context-length", type=int, default=20480)
    p.add_argument("--max-total-tokens", type=int, default=131_072,
                   help="KV pool in tokens for every variant (0: the server sizes it from memory, 43 M tokens for "
                        "the 4-layer share on an H200, so nothing is ever evicted and a host tier is never used; "
                        "the default is about the agentic slice's unique input tokens, ~129k for 512 requests, so "
                        "both caches evict and a host tier can bring entries back)")
    p.add_argument("--max-mamba-cache-size", type=int, default=512,
                   help="recurrent-state slots for every variant (running requests and cached checkpoints; 0: "
                        "the server's choice)")
    p.add_argument("--model-path", default=None,
                   help="serve this checkpoint (its own weights) instead of the generated K3 share with random weights")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run of the driver (cpu_server_args(), kernel flags dropped), not a measurement")
    p.add_argument("--boot-timeout", type=float, default=400)
    p.add_argument("--parallel-boot", action="store_true",
                   help="start every variant's server at once (compiles and CUDA-graph captures overlap), then "
                        "measure them one at a time while the others idle; --mem-fraction-static is divided "
                        "among them")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--plot-only", default=None, metavar="RESULT_JSON",
                   help="only draw the plots of an earlier result into --out (a folder); needs matplotlib")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot_only:
        with open(args.plot_only) as f:
            stem = os.path.splitext(os.path.basename(args.plot_only))[0]
            print("\n".join(plot(json.load(f), args.out, stem)))
        return 0
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(VARIANTS)}")
    args.server_env = {}
    torch_version = importlib.metadata.version("torch")
    if not torch_version.startswith(SGLANG_TORCH):
        # sglang 0.5.23's bundled Rust TreeCore (UnifiedRadixCache, i.e. upstream's cache) is built against
        # torch 2.14 and segfaults in its first insert on another torch (seen with 2.11 on the H100 image)
        args.server_env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
        print(f"torch {torch_version}: upstream's cache uses its Python TreeCore (the Rust one is built for "
              f"torch {SGLANG_TORCH})", flush=True)
    work = tempfile.mkdtemp(prefix="system-bench-")
    args.log_dir = args.log_dir or work
    os.makedirs(args.log_dir, exist_ok=True)
    if args.model_path:
        model = args.model_path
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
    else:
        model = os.path.join(work, "k3-tp8-share")
        cfg = write_model(model, args)
    args.agentic_trace = os.path.join(work, f"{args.agentic_shape}.jsonl")
    shapes = [s for s in trace_gen.load_shapes(SHAPES) if s.name == args.agentic_shape]
    if not shapes:
        raise SystemExit(f"--agentic-shape: no shape named {args.agentic_shape!r} in {SHAPES}")
    trace_gen.write_jsonl(trace_gen.generate(shapes[0]), args.agentic_trace)
    reuse = {}
    for name, path, n in (("mooncake", MOONCAKE, args.mooncake_requests), ("agentic", args.agentic_trace, args.agentic_requests)):
        reqs = [scale_request(r, args.length_scale, 1.0, args.max_output_len) for r in load_trace(path, n)]
        hit, tot = theoretical_reuse(reqs)
        reuse[name] = {"requests": n, "theoretical_reuse": round(hit / tot, 4), "input_tokens": tot,
                       "unique_input_tokens": tot - hit, "max_input_len": max(r.input_len for r in reqs)}
        print(f"{name}: {n} requests, theoretical prefix reuse {100 * hit / tot:.1f} %, {tot - hit:,} unique "
              f"input tokens (KV pool: {args.max_total_tokens or 'server-sized'})", flush=True)
    result: Dict[str, Any] = {
        "benchmark": "system_bench", "model": args.model_path or "Kimi K3, one GPU's share at TP8 (random weights)", "config": cfg,
        "traces": reuse, "args": {k: v for k, v in vars(args).items()}, "variants": {},
        "manifest": {"command": [sys.executable, *sys.argv], "git_commit": git_commit(), "git_dirty": git_dirty(),
                     "versions": package_versions(), "machine": machine_info(),
                     "model_config_hash": model_config_hash(model)["sha256"],
                     "speculative": "off (random weights: acceptance would mean nothing)",
                     "server_env": args.server_env,
                     "warmup": f"{args.warmup} requests of the measured shapes before abbench and before each sweep point"},
    }
    if args.merge:
        with open(args.merge) as f:
            earlier = json.load(f)
        if earlier.get("manifest", {}).get("model_config_hash") != result["manifest"]["model_config_hash"]:
            raise SystemExit(f"--merge {args.merge}: a different model config")
        result["variants"].update(earlier.get("variants", {}))
        result["merged_from"] = {"file": os.path.basename(args.merge), "manifest": earlier.get("manifest")}
    keys = run_keys(names, result["variants"])
    servers: Dict[str, LaunchedServer] = {}
    boots: Dict[str, Any] = {}
    if args.parallel_boot:
        args.mem_fraction_static = round(args.mem_fraction_static / len(names), 3)
        servers = {key: variant_server(name, key, model, args) for name, key in zip(names, keys)}
        print(f"=== booting {', '.join(keys)} at once", flush=True)
        boots = boot_all(servers)
        print("    boot s: " + ", ".join(f"{k} {v if not isinstance(v, Exception) else 'failed'}"
                                          for k, v in boots.items()), flush=True)
    try:
        for name, key in zip(names, keys):
            print(f"=== {key}: {VARIANTS[name][2]}", flush=True)
            try:
                if isinstance(boots.get(key), Exception):
                    raise boots[key]
                result["variants"][key] = run_variant(name, model, args, work, key, servers.get(key), boots.get(key))
            except Exception as e:  # keep the other variants' results; the error is recorded
                traceback.print_exc()
                result["variants"][key] = {"variant": name, "error": repr(e)}
            _write(args.out, result, args.target_interactivity)
    finally:
        for srv in servers.values():
            srv.stop()
    _write(args.out, result, args.target_interactivity, show=True)
    return 0 if all("error" not in result["variants"][k] for k in keys) else 1


def run_keys(names: List[str], earlier: Dict[str, Any]) -> List[str]:
    """Result keys of ``names`` in order: a variant's first run is its name, a repeat (in this run or
    of a merged one) ``name#2``, ``name#3``, ... ``upstream#2`` against ``upstream`` (in ``vs_upstream``)
    is the drift of the baseline over the run: 1.0 where nothing drifted."""
    seen: Dict[str, int] = {}
    for k in earlier:
        base = k.split("#")[0]
        seen[base] = seen.get(base, 0) + 1
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def _write(path: str, result: Dict[str, Any], target: float, show: bool = False) -> None:
    base = result["variants"].get("upstream")
    result["vs_upstream"] = {}
    if base and "error" not in base:
        for name, v in result["variants"].items():
            if name != "upstream" and "error" not in v:
                result["vs_upstream"][name] = compare(base, v, target)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if show:
        print(json.dumps(result["vs_upstream"], indent=1))


if __name__ == "__main__":
    sys.exit(main())
