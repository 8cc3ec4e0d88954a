"""Markdown report with plots from benchmark result files.

Usage::

    python -m sglang_hybrid.bench.report RESULT.json [RESULT.json ...] --out docs/bench/report.md

Accepts abbench, sweep, AIPerf cross-check and plain replay result files
(``resultfile.load_json``). Writes the Markdown file and, next to it, PNG
plots: throughput vs concurrency, throughput vs interactivity, TTFT and ITL
distributions (empirical CDFs).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from sglang_hybrid.bench.resultfile import load_json

PLOT_DPI = 80


def _fmt(v: Any, scale: float = 1.0, nd: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) and scale == 1:
        return f"{v:,}"
    return f"{v * scale:,.{nd}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _rel(path: str, start_dir: str) -> str:
    try:
        return os.path.relpath(path, start_dir)
    except ValueError:
        return path


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log_ms_axis(ax, label: str) -> None:
    """Log x axis with plain-number tick labels (no 10^k clutter)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label)


def _ecdf(ax, values: Sequence[float], label: str, scale: float = 1000.0, **kw) -> None:
    if not values:
        return
    x = np.sort(np.asarray(values, dtype=np.float64)) * scale
    y = np.arange(1, x.size + 1) / x.size
    ax.step(x, y, where="post", label=label, **kw)


def _conc_axis(ax, values: Sequence[int]) -> None:
    """Log-2 concurrency axis labelled with the measured concurrencies."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(values))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()


def plot_throughput_vs_concurrency(ab: List[Dict], sweeps: List[Dict], path: str) -> Optional[str]:
    """abbench aggregate output tokens/s and median decode rate, sweep total tokens/s/GPU, vs concurrency."""
    if not ab and not sweeps:
        return None
    plt = _plt()
    n = int(bool(ab)) + int(bool(sweeps))
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.6), squeeze=False)
    i = 0
    if ab:
        ax = axes[0][i]
        i += 1
        for doc in ab:
            s = [w["summary"] for w in doc["windows"]]
            c = [x["concurrency"] for x in s]
            ax.plot(c, [x["output_token_throughput"] or 0 for x in s], "o-", label="aggregate output tok/s")
            ax.plot(c, [x["decode_rate_p50_tok_s"] or 0 for x in s], "s--",
                    label="median per-request decode rate (tok/s per request)")
        _conc_axis(ax, [x["concurrency"] for d in ab for x in (w["summary"] for w in d["windows"])])
        ax.set_xlabel("concurrency (streams)")
        ax.set_ylabel("tokens/s")
        ax.set_title("abbench (closed loop, fixed windows)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if sweeps:
        ax = axes[0][i]
        for doc in sweeps:
            c = [p["concurrency"] for p in doc["points"]]
            ax.plot(c, [p["derived"]["total_tok_s_per_gpu"] or 0 for p in doc["points"]], "o-",
                    label="total (in+out) tok/s/GPU")
            ax.plot(c, [p["derived"]["output_tok_s_per_gpu"] or 0 for p in doc["points"]], "s--",
                    label="output tok/s/GPU")
        _conc_axis(ax, [p["concurrency"] for d in sweeps for p in d["points"]])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("tokens/s/GPU")
        ax.set_title("trace replay sweep")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path


def plot_interactivity(sweeps: List[Dict], path: str) -> Optional[str]:
    """Throughput per GPU vs P90 interactivity, one point per concurrency, target marked."""
    if not sweeps:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for doc in sweeps:
        pts = [(p["derived"]["interactivity_p90_tok_s_user"], p["derived"]["total_tok_s_per_gpu"], p["concurrency"])
               for p in doc["points"] if p["derived"]["interactivity_p90_tok_s_user"] is not None]
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="measured (label: concurrency)")
        for x, y, c in pts:
            ax.annotate(f"C{c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        t = doc.get("target") or {}
        tx = t.get("interactivity_tok_s_user")
        if tx is not None:
            ax.axvline(tx, color="grey", ls=":", lw=1)
            if t.get("total_tok_s_per_gpu") is not None:
                ax.plot([tx], [t["total_tok_s_per_gpu"]], "r*", ms=11,
                        label=f"interpolated at {tx:g} tok/s/user")
    ax.set_xlabel("P90 interactivity = 1 / P90 ITL (tokens/s/user)")
    ax.set_ylabel("total tokens/s/GPU")
    ax.set_title("throughput vs interactivity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path


def _reuse(rows: Sequence[Dict]) -> Optional[float]:
    """Prefix reuse of successful rows: cached prompt tokens / prompt tokens (None without tokens)."""
    ok = [r for r in rows if r.get("success")]
    total = sum(r.get("prompt_tokens") or r["input_len"] for r in ok)
    return sum(r.get("cached_tokens") or 0 for r in ok) / total if total else None


def _replay_runs(sweeps: List[Dict], reps: List[Dict]) -> List[tuple]:
    """(label, request rows) of every sweep point and replay file."""
    runs = [(f"C{p['concurrency']}", p["requests"]) for d in sweeps for p in d["points"]]
    runs += [(os.path.basename(d.get("_path", "replay")), d.get("requests") or []) for d in reps]
    return [(label, rows) for label, rows in runs if rows]


def plot_cache_hits(sweeps: List[Dict], reps: List[Dict], path: str) -> Optional[str]:
    """Prefix reuse (cached / prompt tokens, from each response's ``cached_tokens``) per sweep point
    and replay run."""
    runs = [(label, _reuse(rows)) for label, rows in _replay_runs(sweeps, reps)]
    runs = [(label, v) for label, v in runs if v is not None]
    if not runs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    ax.bar(range(len(runs)), [100 * v for _, v in runs], color="tab:green")
    ax.set_xticks(range(len(runs)), [label for label, _ in runs], fontsize=7)
    for i, (_, v) in enumerate(runs):
        ax.annotate(f"{100 * v:.1f}", (i, 100 * v), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
    ax.set_ylabel("prefix reuse (% of prompt tokens)")
    ax.set_title("prefix-cache hits")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path


def plot_reuse_over_time(sweeps: List[Dict], reps: List[Dict], path: str) -> Optional[str]:
    """Cumulative prefix reuse against request start time (s from the run's first request), one line
    per sweep point / replay run: how fast the cache warms and whether it holds."""
    runs = []
    for label, rows in _replay_runs(sweeps, reps):
        ok = sorted((r for r in rows if r.get("success") and r.get("start_time") is not None),
                    key=lambda r: r["start_time"])
        if ok:
            runs.append((label, ok))
    if not runs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for label, ok in runs:
        t0, cached, total, xs, ys = ok[0]["start_time"], 0, 0, [], []
        for r in ok:
            cached += r.get("cached_tokens") or 0
            total += r.get("prompt_tokens") or r["input_len"]
            xs.append(r["start_time"] - t0)
            ys.append(100 * cached / total if total else 0.0)
        ax.plot(xs, ys, "-", lw=1.2, label=label)
    ax.set_xlabel("request start (s from the run's first request)")
    ax.set_ylabel("cumulative prefix reuse (%)")
    ax.set_title("prefix reuse over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path


def _ab_rows(doc: Dict, ok_only: bool = True) -> List[tuple]:
    out = []
    for w in doc["windows"]:
        rows = [r for r in w["requests"] if r["success"] or not ok_only]
        out.append((w["summary"]["concurrency"], rows))
    return out


def plot_ttft(ab: List[Dict], sweeps: List[Dict], path: str) -> Optional[str]:
    """Empirical CDFs of TTFT: one curve per abbench window / sweep point."""
    if not ab and not sweeps:
        return None
    plt = _plt()
    n = int(bool(ab)) + int(bool(sweeps))
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.6), squeeze=False)
    i = 0
    for docs, title, getter in (
        (ab, "abbench TTFT", lambda d: _ab_rows(d)),
        (sweeps, "sweep TTFT", lambda d: [(p["concurrency"], [r for r in p["requests"] if r["success"]])
                                          for p in d["points"]]),
    ):
        if not docs:
            continue
        ax = axes[0][i]
        i += 1
        for doc in docs:
            for c, rows in getter(doc):
                _ecdf(ax, [r["ttft"] for r in rows if r["ttft"] is not None], f"C{c}")
        _log_ms_axis(ax, "TTFT (ms, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path


def plot_itl(ab: List[Dict], sweeps: List[Dict], path: str) -> Optional[str]:
    """Empirical CDFs of ITL: true chunk gaps (solid) and burst-normalised gaps (dashed)."""
    if not ab and not sweeps:
        return None
    plt = _plt()
    n = int(bool(ab)) + int(bool(sweeps))
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 3.6), squeeze=False)
    i = 0
    if ab:
        ax = axes[0][i]
        i += 1
        for doc in ab:
            for c, rows in _ab_rows(doc):
                gaps = [g for r in rows for g in r["itl"]]
                bn = [g / k for r in rows for g, k in zip(r["itl"], r["chunk_tokens"][1:]) if k > 0]
                line = ax.step([], [])[0]
                same = bn == gaps  # one token per chunk: nothing to normalise
                _ecdf(ax, gaps, f"C{c} chunk gaps" + (" (= burst-normalised)" if same else ""),
                      color=line.get_color())
                if not same:
                    _ecdf(ax, bn, f"C{c} burst-normalised", color=line.get_color(), ls="--")
        _log_ms_axis(ax, "ITL (ms, log)")
        ax.set_ylabel("fraction of chunk gaps")
        ax.set_title("abbench ITL")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if sweeps:
        ax = axes[0][i]
        for doc in sweeps:
            for p in doc["points"]:
                _ecdf(ax, [g for r in p["requests"] if r["success"] for g in r["itl"]], f"C{p['concurrency']}")
        _log_ms_axis(ax, "ITL, chunk gaps (ms, log)")
        ax.set_ylabel("fraction of chunk gaps")
        ax.set_title("sweep ITL")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------
# Markdown sections
# --------------------------------------------------------------------------


def manifest_section(doc: Dict, out_dir: str) -> str:
    """Key facts of one result's manifest as a Markdown list (+ kernel-path table)."""
    m = doc.get("manifest") or {}
    info = m.get("server_info") or {}
    v = m.get("versions") or {}
    st = m.get("request_stats") or {}
    flags = {k: info.get(k) for k in ("model_path", "device", "dtype", "tp_size", "dp_size",
                                      "max_total_tokens", "max_mamba_cache_size", "mamba_scheduler_strategy",
                                      "chunked_prefill_size", "page_size", "speculative_algorithm",
                                      "attention_backend", "cuda_graph_max_bs", "disable_cuda_graph")
             if k in info}
    lines = [
        f"- file: [`{os.path.basename(doc['_path'])}`]({_rel(doc['_path'], out_dir)}) "
        f"({doc['kind']}, started {m.get('start_time_utc', 'n/a')})",
        "- machine: " + (", ".join(f"{k} {val}" for k, val in (m.get("machine") or {}).items()) or "n/a"),
        f"- git commit: `{m.get('git_commit')}`" + (" (uncommitted changes)" if m.get("git_dirty") else ""),
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- model config sha256: `{m.get('model_config_sha256')}`",
        f"- server flags (selection; the JSON has the full `/get_server_info` answer): "
        + (", ".join(f"`{k}={val}`" for k, val in flags.items()) if flags else "n/a (server exposes none)"),
        f"- prompt seed {m.get('prompt_seed')}, warm-up requests {m.get('warmup_requests')}",
    ]
    pl, ol = st.get("prompt_len"), st.get("output_len")
    if pl:
        lines.append(f"- prompt length (tokens): mean {pl['mean']:.1f}, P50 {pl['p50']:.0f}, max {pl['max']:.0f}; "
                     f"output length: mean {ol['mean']:.1f}, max {ol['max']:.0f}")
    lines.append(f"- burst sizes (tokens per decode chunk: chunks): {st.get('burst_sizes')}")
    lines.append(f"- token counts from: {st.get('token_count_sources')}")
    lines.append(f"- draft acceptance: {st.get('draft_acceptance') or 'null (server reports no verify steps)'}")
    errs = st.get("errors") or {}
    lines.append(f"- errors: {errs.get('count', 'n/a')}" + (f" {errs.get('messages')}" if errs.get("count") else ""))
    kp = m.get("kernel_paths")
    if kp:
        lines.append(f"- kernel paths ({kp['source']}):\n")
        lines.append(_table(["op", "implementation", "reason"],
                            [[r.get("op"), r.get("impl"), r.get("reason")] for r in kp["table"]]))
    else:
        lines.append("- kernel paths: null (the server exposes none)")
    return "\n".join(lines)


def abbench_section(doc: Dict) -> str:
    """Markdown table of an abbench result, one column per window (times in ms, throughputs in tokens/s)."""
    s = [w["summary"] for w in doc["windows"]]
    opts = doc["manifest"].get("options", {})
    head = (f"API `{opts.get('api')}`, window {opts.get('window')} s, output {opts.get('output_len')} tokens "
            f"(ignore_eos), prompt {opts.get('input_len')} tokens, temperature {opts.get('temperature')}.")
    rows = [
        ["requests started in the window", *[_fmt(x["num_requests"]) for x in s]],
        ["request errors", *[_fmt(x["num_errors"]) for x in s]],
        ["wall time incl. tail (s)", *[_fmt(x["wall_time_s"]) for x in s]],
        ["**aggregate output tok/s** (successful tokens ÷ wall time incl. tail)",
         *[_fmt(x["output_token_throughput"]) for x in s]],
        ["median per-request decode rate, tok/s (per request: decode tokens ÷ own decode time)",
         *[_fmt(x["decode_rate_p50_tok_s"]) for x in s]],
        ["TTFT P50 / P99 / max (ms)",
         *[f"{_fmt(x['ttft_p50_s'], 1000, 0)} / {_fmt(x['ttft_p99_s'], 1000, 0)} / {_fmt(x['ttft_max_s'], 1000, 0)}"
           for x in s]],
        ["ITL P99, burst-normalised (ms; proxy: chunk gap ÷ tokens in chunk)",
         *[_fmt(x["itl_burst_norm_p99_s"], 1000) for x in s]],
        ["chunk gap P50 / P99 (ms; true per-chunk ITL)",
         *[f"{_fmt(x['chunk_gap_p50_s'], 1000)} / {_fmt(x['chunk_gap_p99_s'], 1000)}" for x in s]],
        ["mean tokens per chunk", *[_fmt(x["mean_tokens_per_chunk"]) for x in s]],
    ]
    base = s[0]["output_token_throughput"] if s else None
    if base and len(s) > 1:
        rows.append([f"aggregate throughput ÷ C{s[0]['concurrency']} (baseline, same run)",
                     *[_fmt(x["output_token_throughput"] / base if x["output_token_throughput"] else None) + "×"
                       for x in s]])
    return head + "\n\n" + _table(["metric", *[f"C{x['concurrency']}" for x in s]], rows)


def sweep_section(doc: Dict) -> str:
    """Markdown table of a sweep result (tokens/s/GPU, ms, tokens/s/user, tokens/$) and the interpolated target."""
    opts = doc["manifest"].get("options", {})
    head = (f"API `{opts.get('api')}`, first {opts.get('num_requests')} trace requests, length scale "
            f"{opts.get('length_scale')}, output ≤ {opts.get('max_output_len')}, ÷ {opts.get('num_gpus')} GPU(s), "
            f"${opts.get('usd_per_gpu_hour')}/GPU-hour.")
    rows = []
    for p in doc["points"]:
        s, d = p["summary"], p["derived"]
        rows.append([f"C{p['concurrency']}", _fmt(d["total_tok_s_per_gpu"]), _fmt(d["output_tok_s_per_gpu"]),
                     _fmt(s.get("itl_p90_s"), 1000), _fmt(d["interactivity_p90_tok_s_user"]),
                     _fmt(s.get("ttft_p90_s"), 1000, 0), _fmt(s.get("achieved_reuse"), 100, 1),
                     _fmt(d.get("total_tokens_per_usd"), 1, 0), _fmt(s.get("num_errors"))])
    t = doc["target"]
    txt = (f"\n\nAt **{t['interactivity_tok_s_user']:g} tok/s/user** (P90): "
           f"**{_fmt(t['total_tok_s_per_gpu'])} total tok/s/GPU**"
           + (f", {_fmt(t.get('total_tokens_per_usd'), 1, 0)} tokens/$" if t.get("total_tokens_per_usd") else "")
           + (f" — {t['note']}; measured range {[round(x, 1) for x in t['measured_interactivity_range']]}"
              if t.get("note") and t.get("measured_interactivity_range") else "")
           + ". Linear interpolation between the two measured points around the target; "
             "tokens/$ = tok/s/GPU × 3600 ÷ $/GPU-hour.")
    return head + "\n\n" + _table(
        ["C", "total tok/s/GPU", "output tok/s/GPU", "ITL P90 (ms)", "P90 interactivity (tok/s/user)",
         "TTFT P90 (ms)", "prefix reuse (%)", "tokens/$", "errors"], rows) + txt


AIPERF_NOTES = """Metric definitions behind the differences:

- **ITL.** Ours is every gap between token-carrying chunks, pooled over requests (chunks are detected
  from token ids, so a chunk whose text is empty — an incomplete UTF-8 sequence — still counts).
  AIPerf's `inter_token_latency` is per request, (latency − TTFT) / (output tokens − 1), with
  percentiles across requests: that is our **TPOT**, compared on the TPOT rows. AIPerf's pooled
  `inter_chunk_latency` is the analogue of our ITL but only sees chunks whose text is non-empty,
  so with byte-level tokenizers some gaps are merged (fewer, longer gaps; see chunks per request).
- **TTFT.** Both: request sent → first chunk with output. AIPerf's first "token" is the first
  non-empty text; ours is the first chunk with a token id.
- **Throughput.** Both: tokens ÷ benchmark duration. Ours runs from the first request sent to
  the last one finished; AIPerf's from its profiling-phase start to the last response. Token
  counts: ours from returned token ids; AIPerf from the server's `usage` (`--use-server-token-count`).
- **Prompts.** Ours are token ids from our seeded blocks; AIPerf's are text built from its own
  corpus per hash id (same lengths and sharing pattern, other content), tokenized by the server.
- **Load shape.** Both keep C requests in flight (closed loop). AIPerf's pure-concurrency mode
  busy-polls for a free slot (a full core in its timing manager); with `--request-rate R
  --arrival-pattern constant` (see the command) it instead tries on a timer every 1/R s, so a
  freed slot is refilled up to 1/R s later than in our client.
- **Client cost.** Where client and server share the CPU, client CPU time is taken from the
  server and slows the run being measured; both clients' CPU times are in the table."""


def aiperf_section(doc: Dict) -> str:
    """Markdown comparison of our client and AIPerf (ms, tokens/s, s) with the definition notes."""
    from sglang_hybrid.bench.aiperf_check import compare_rows

    rows = [[f"{label} ({unit})" if unit else label, _fmt(o), _fmt(a), _fmt(r)]
            for label, unit, o, a, r in compare_rows(doc)]
    out = [_table(["metric", "ours", "AIPerf (its summary)", "AIPerf records, our definitions"], rows)]
    rd = doc.get("aiperf_ours_definitions") or {}
    if rd.get("chunks_per_request_mean") is not None:
        out.append(f"\nAIPerf saw {rd['chunks_per_request_mean']:.1f} content chunks per request for "
                   f"{rd['output_tokens_per_request_mean']:.1f} output tokens per request; "
                   f"ours: {_fmt((doc.get('ours') or {}).get('mean_tokens_per_chunk'))} tokens per chunk.")
    for side, name in (("ours", "our client's"), ("aiperf", "AIPerf's")):
        st = doc.get(f"server_log_{side}")
        if st:
            out.append(f"Server log during {name} phase: decode `gen throughput` P50 "
                       f"{_fmt(st['decode_gen_throughput_p50_tok_s'])} tok/s over {st['decode_log_lines']} log lines; "
                       f"prefill computed {st['prefill_new_tokens']:,} tokens, found {st['prefill_cached_tokens']:,} cached.")
    so, sa = doc.get("server_log_ours") or {}, doc.get("server_log_aiperf") or {}
    go, ga = so.get("decode_gen_throughput_p50_tok_s"), sa.get("decode_gen_throughput_p50_tok_s")
    if go and ga:
        out.append(f"\n**Reading.** By its own log the server decoded {go / ga:.1f}× "
                   f"{'faster' if go > ga else 'slower'} while our client drove it than while AIPerf did "
                   f"({_fmt(go)} vs {_fmt(ga)} tok/s). Where AIPerf's records re-summarised with our definitions "
                   "match its own summary, the gap is in the server's speed during each run (e.g. client CPU "
                   "load on a shared host), not in metric definitions.")
    if doc.get("aiperf_error"):
        out.append("\nAIPerf did not produce a result:\n\n```\n" + doc["aiperf_error"] + "\n```")
    if doc.get("cache_flush") is not None:
        out.append(f"Prefix cache emptied before each phase (ours, AIPerf): {doc['cache_flush']} "
                   "(endpoint that answered; null = not supported or not asked).")
    if doc.get("aiperf_command"):
        out.append("\nAIPerf command: `" + " ".join(doc["aiperf_command"]) + "`")
    out.append("\n" + AIPERF_NOTES)
    return "\n".join(out)


def write_report(paths: Sequence[str], out: str, title: str, notes: Optional[str] = None) -> str:
    """Load result files, draw the plots next to ``out``, write the Markdown; return ``out``."""
    docs = [load_json(p) for p in paths]
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(out))[0]
    ab = [d for d in docs if d["kind"] == "abbench"]
    sw = [d for d in docs if d["kind"] == "sweep"]
    xc = [d for d in docs if d["kind"] == "aiperf_crosscheck"]
    reps = [d for d in docs if d["kind"] == "replay"]

    def png(name):
        return os.path.join(out_dir, f"{stem}-{name}.png")

    plots = [
        ("Throughput vs concurrency", plot_throughput_vs_concurrency(ab, sw, png("throughput"))),
        ("Throughput vs interactivity", plot_interactivity(sw, png("interactivity"))),
        ("TTFT distribution", plot_ttft(ab, sw, png("ttft"))),
        ("ITL distribution", plot_itl(ab, sw, png("itl"))),
        ("Prefix-cache hits", plot_cache_hits(sw, reps, png("cache-hits"))),
        ("Prefix reuse over time", plot_reuse_over_time(sw, reps, png("reuse-over-time"))),
    ]
    md = [f"# {title}", "", f"Generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by "
          "`python -m sglang_hybrid.bench.report`. Definitions: [docs/bench-suite.md]"
          f"({_rel(os.path.join(_repo_root(), 'docs', 'bench-suite.md'), out_dir)}).", ""]
    if notes:
        md += [notes, ""]
    for d in ab:
        md += ["## abbench: closed loop, fixed windows", "", abbench_section(d), ""]
    for d in sw:
        md += ["## Concurrency sweep of the trace replay (AgentX-style)", "", sweep_section(d), ""]
    for d in xc:
        md += ["## Cross-check with AIPerf (same trace slice, same run)", "", aiperf_section(d), ""]
    for d in reps:
        s = d["summary"]
        md += [f"## Replay `{os.path.basename(d['_path'])}`", "",
               f"{_fmt(s.get('total_token_throughput'))} total tok/s, {_fmt(s.get('output_token_throughput'))} "
               f"output tok/s, TTFT P90 {_fmt(s.get('ttft_p90_s'), 1000)} ms, ITL P90 {_fmt(s.get('itl_p90_s'), 1000)} ms", ""]
    md += ["## Plots", ""]
    for name, p in plots:
        if p:
            md += [f"### {name}", "", f"![{name}]({os.path.basename(p)})", ""]
    md += ["## Run manifests", ""]
    for d in docs:
        md += [manifest_section(d, out_dir), ""]
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    return out


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv: Optional[List[str]] = None) -> str:
    """Parse ``argv``, write the report; return its path."""
    p = argparse.ArgumentParser(prog="python -m sglang_hybrid.bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result JSON files (abbench, sweep, aiperf cross-check, replay)")
    p.add_argument("--out", default="runs/bench-report/report.md", help="Markdown file; PNGs go next to it")
    p.add_argument("--title", default="Benchmark report")
    p.add_argument("--notes", default=None, help="a paragraph put under the title")
    args = p.parse_args(argv)
    out = write_report(args.results, args.out, args.title, args.notes)
    print(f"report written to {out}")
    return out


if __name__ == "__main__":
    main()
