"""Run manifest shared by every benchmark client (replay, abbench, sweep, AIPerf cross-check).

A manifest records what is needed to reproduce and to trust one result: the
command and options, git commit, package versions, the server's full flags
(its ``/get_server_info`` answer), the model config hash, the kernel-path
table, the prompt seed and warm-up, and statistics of what was actually sent
and received (prompt/output lengths, burst sizes, draft acceptance, errors).

Lengths are in tokens; nothing here measures time.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import re
import socket
import subprocess
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from sglang_hybrid.bench.client import RequestResult

DEFAULT_PACKAGES = ("sglang-hybrid", "sglang", "torch", "aiohttp", "numpy")

# One line per op, written by sgl_hybrid_kernel.dispatch.record_choice:
# "kernel path: kda_decode       -> torch      (CPU platform: plain-torch reference)"
_KERNEL_LINE = re.compile(r"kernel path:\s*(\S+)\s*->\s*(\S+)\s*\((.*)\)\s*$")


def git_commit(path: Optional[str] = None) -> Optional[str]:
    """HEAD of the git repository holding ``path`` (default: this package), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=path or os.path.dirname(os.path.abspath(__file__)),
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode != 0:
            return None
        return out.stdout.strip() or None
    except Exception:
        return None


def git_dirty(path: Optional[str] = None) -> Optional[bool]:
    """True when tracked files differ from HEAD (``git status --porcelain -uno``), None if unknown."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "-uno"],
            cwd=path or os.path.dirname(os.path.abspath(__file__)),
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode != 0:
            return None
        return bool(out.stdout.strip())
    except Exception:
        return None


def package_version(dist: str) -> Optional[str]:
    """Installed version of distribution ``dist``, or None."""
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def package_versions(dists: Sequence[str] = DEFAULT_PACKAGES) -> Dict[str, Optional[str]]:
    """``{"python": ..., dist: version}``; dashes in keys become underscores."""
    out: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for d in dists:
        out[d.replace("-", "_")] = package_version(d)
    return out


def sha256_file(path: str) -> Optional[str]:
    """sha256 hex digest of a file, or None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def model_config_hash(
    model_path: Optional[str], server_info: Optional[Dict[str, Any]] = None
) -> Dict[str, Optional[str]]:
    """sha256 of ``config.json``: from ``model_path``, else from the server's
    ``model_path`` when that directory exists on this machine.

    Returns ``{"sha256": ..., "path": ...}`` (both None when unavailable).
    """
    candidates = [model_path]
    if isinstance(server_info, dict):
        candidates.append(server_info.get("model_path"))
    for cand in candidates:
        if cand and os.path.isfile(os.path.join(cand, "config.json")):
            path = os.path.join(cand, "config.json")
            return {"sha256": sha256_file(path), "path": os.path.abspath(path)}
    return {"sha256": None, "path": None}


def parse_kernel_paths(log_text: str) -> List[Dict[str, str]]:
    """The ``kernel path: OP -> IMPL (REASON)`` lines of a server log, last one per op, sorted by op."""
    table: Dict[str, Dict[str, str]] = {}
    for line in log_text.splitlines():
        m = _KERNEL_LINE.search(line)
        if m:
            table[m.group(1)] = {"op": m.group(1), "impl": m.group(2), "reason": m.group(3)}
    return [table[k] for k in sorted(table)]


def kernel_paths(
    server_info: Optional[Dict[str, Any]] = None, server_log: Optional[str] = None
) -> Optional[Dict[str, Any]]:
    """The server's kernel-path table, or None when it exposes none.

    Sources, in order: a ``kernel_paths`` entry of the server info; the
    ``kernel path:`` lines that ``sgl_hybrid_kernel.dispatch.record_choice``
    logs (``server_log``: path of the server's log file). Returns
    ``{"source": ..., "table": [{"op", "impl", "reason"}, ...]}``.
    """
    if isinstance(server_info, dict) and server_info.get("kernel_paths"):
        return {"source": "server_info", "table": server_info["kernel_paths"]}
    if server_log and os.path.isfile(server_log):
        with open(server_log, "r", encoding="utf-8", errors="replace") as f:
            table = parse_kernel_paths(f.read())
        if table:
            return {"source": f"server log {server_log}", "table": table}
    return None


def length_stats(values: Iterable[float]) -> Optional[Dict[str, float]]:
    """``{count, min, mean, p50, p90, max}`` of token lengths, None when empty."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return None
    return {
        "count": int(arr.size),
        "min": float(arr.min()),
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "max": float(arr.max()),
    }


def burst_sizes(results: Sequence[RequestResult]) -> Dict[str, int]:
    """Histogram ``{tokens per chunk: number of chunks}`` over the decode chunks
    (every token-carrying chunk after the first) of successful requests."""
    hist = Counter(c for r in results if r.success for c in r.chunk_tokens[1:])
    return {str(k): hist[k] for k in sorted(hist)}


def draft_acceptance(results: Sequence[RequestResult]) -> Optional[Dict[str, Any]]:
    """Speculative-decoding acceptance from the server's per-request ``spec_verify_ct``.

    ``accept_length`` = Σ output tokens / Σ verify steps over the successful
    requests that report verify steps (tokens per target-model forward, the
    bonus token included). None when no request reports any.
    """
    rows = [r for r in results if r.success and r.spec_verify_ct]
    if not rows:
        return None
    steps = sum(r.spec_verify_ct for r in rows)
    toks = sum(r.output_tokens for r in rows)
    return {
        "requests": len(rows),
        "verify_steps": steps,
        "output_tokens": toks,
        "accept_length": toks / steps,
    }


def error_summary(results: Sequence[RequestResult], max_kinds: int = 5) -> Dict[str, Any]:
    """``{"count": failed requests, "messages": {message (first 300 chars): count}}`` (most frequent first)."""
    msgs = Counter((r.error or "unknown")[:300] for r in results if not r.success)
    return {"count": sum(msgs.values()), "messages": dict(msgs.most_common(max_kinds))}


def token_count_sources(results: Sequence[RequestResult]) -> Dict[str, int]:
    """How many requests counted their tokens from each source (see ``client``)."""
    return dict(Counter(str(r.token_count_source) for r in results))


def request_stats(results: Sequence[RequestResult]) -> Dict[str, Any]:
    """What was sent and received: prompt/output length stats (successful
    requests; prompt = ``input_len`` as sent), burst sizes, draft acceptance,
    token-count sources and errors."""
    ok = [r for r in results if r.success]
    return {
        "prompt_len": length_stats(r.input_len for r in ok),
        "output_len": length_stats(r.output_tokens for r in ok),
        "burst_sizes": burst_sizes(results),
        "draft_acceptance": draft_acceptance(results),
        "token_count_sources": token_count_sources(results),
        "errors": error_summary(results),
    }


def machine_info() -> Dict[str, Any]:
    """Where the client ran: CPU model, logical cores, memory (GiB), GPUs listed by
    ``nvidia-smi -L`` / ``rocm-smi`` (empty list when none answers)."""
    cpu = None
    try:
        with open("/proc/cpuinfo", "r") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo", "r") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = round(int(line.split()[1]) / 2**20, 1)
                    break
    except (OSError, ValueError):
        pass
    gpus: List[str] = []
    for cmd in (["nvidia-smi", "-L"], ["rocm-smi", "--showproductname"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            if out.returncode == 0:
                gpus = [ln.strip() for ln in out.stdout.splitlines() if ln.strip().startswith(("GPU", "card"))]
                if gpus:
                    break
        except Exception:
            continue
    return {"platform": platform.platform(), "cpu": cpu, "logical_cores": os.cpu_count(),
            "mem_gib": mem, "gpus": gpus}


def base_manifest(
    command: List[str],
    options: Dict[str, Any],
    start_utc: _dt.datetime,
    server_info: Optional[Dict[str, Any]],
    model_path: Optional[str] = None,
    server_log: Optional[str] = None,
    seed: Optional[int] = None,
    warmup: Optional[int] = None,
) -> Dict[str, Any]:
    """The keys every result file shares.

    ``server_info`` is kept whole (for SGLang every launch flag); ``seed``
    is the prompt seed and ``warmup`` the number of uncounted warm-up
    requests. ``kernel_paths`` and ``draft_acceptance`` are None when the
    server exposes nothing.
    """
    cfg = model_config_hash(model_path, server_info)
    return {
        "command": command,
        "options": options,
        "start_time_utc": start_utc.isoformat(),
        "hostname": socket.gethostname(),
        "machine": machine_info(),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "versions": package_versions(),
        "model_config_sha256": cfg["sha256"],
        "model_config_path": cfg["path"],
        "prompt_seed": seed,
        "warmup_requests": warmup,
        "kernel_paths": kernel_paths(server_info, server_log),
        "server_info": server_info,
    }
