"""Soak and load test: trace replay at high concurrency with aborts and bad requests mixed in (issue 11, item 4).

``run_soak`` drives a running SGLang server for a bounded time from
``concurrency`` client threads. Each thread takes the next request of a
Mooncake-format trace (prompt lengths scaled down to fit the context,
synthetic token ids that keep the trace's prefix sharing; ``bench/trace.py``)
and, by a seeded coin (the first request of thread ``w`` is of kind ``w mod 5``, so
every kind occurs even in a short run on a slow machine):

==============  ======================================================  =========================
kind            what the client does                                    counted as fine when
==============  ======================================================  =========================
good            ``/generate`` greedy, ``max_new_tokens`` from the trace  HTTP 200 with that many
                (capped), ``ignore_eos``                                 output tokens
abort_timeout   the same with a client timeout of 0.02-0.8 s             anything (the server must
                (disconnect mid-prefill or mid-decode)                   not be harmed)
abort_stream    ``stream: true``, read 1-3 chunks, close the socket      anything
abort_rid       send with a ``rid``, ``/abort_request`` after 0-0.3 s    HTTP 200 (finished or
                                                                         ``finish_reason`` abort)
bad             one of :data:`BAD_REQUESTS`                              HTTP 4xx with a message
==============  ======================================================  =========================

Afterwards: the server is left idle (upstream's idle memory check runs; with
``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1`` a pool whose free + evictable
+ locked != capacity kills the scheduler), ``/health`` must answer, the RSS of
the server's process tree is read again (psutil), and a sample of the good
requests is replayed one at a time after ``/flush_cache`` (a cold cache, batch
size 1: the cache-off reference). A replayed output that differs is a loss
unless the first differing token is the reference's runner-up with a log-prob
gap below ``tie_tol`` (batch-dependent float rounding on a random-weight model),
which is reported separately as a near tie.

Units: seconds, bytes, tokens.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

import psutil
import requests

from sglang_hybrid.bench.trace import (
    DEFAULT_TRACE_PATH,
    PromptSynthesizer,
    TokenRange,
    load_trace,
    scale_trace,
)

# (name, endpoint, payload or raw text); every one must get a 4xx with a message.
BAD_REQUESTS: Sequence[Tuple[str, str, Any]] = (
    ("malformed json", "/generate", "{not json"),
    ("empty input_ids", "/generate", {"input_ids": [], "sampling_params": {"max_new_tokens": 2}}),
    ("empty text", "/generate", {"text": "", "sampling_params": {"max_new_tokens": 2}}),
    ("id outside vocab", "/generate", {"input_ids": [5, 10**6], "sampling_params": {"max_new_tokens": 2}}),
    ("negative max_new_tokens", "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": -1}}),
    ("huge max_new_tokens", "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 10**12}}),
    ("temperature -1", "/generate", {"input_ids": [5, 6], "sampling_params": {"temperature": -1}}),
    ("top_logprobs_num > vocab", "/generate",
     {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": 10**5, "sampling_params": {"max_new_tokens": 2}}),
    ("empty stop string", "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "stop": ""}}),
    ("empty messages", "/v1/chat/completions", {"model": "m", "messages": []}),
    ("max_tokens 0", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 0}),
)


def server_rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` and all its descendants, in bytes (0 if it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def trace_prompts(
    vocab_hi: int, max_input: int, max_output: int, seed: int = 0, excluded: Sequence[int] = (),
    num_records: int = 400, trace_path: str = DEFAULT_TRACE_PATH,
) -> List[Tuple[List[int], int]]:
    """``(input_ids, max_new_tokens)`` pairs from the trace, scaled so every prompt is ≤ ``max_input`` tokens."""
    records = load_trace(trace_path, num_records)
    longest = max(r.input_length for r in records)
    scale = max_input / longest
    synth = PromptSynthesizer(max(1, round(512 * scale)), TokenRange(10, vocab_hi, tuple(excluded)), seed=seed)
    out = []
    for req in scale_trace(records, scale, output_scale=1.0, max_output_len=max_output):
        ids = synth.input_ids(req)[:max_input]
        if ids:
            out.append((ids, req.output_len))
    return out


class _Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.count: Counter = Counter()
        self.good: List[Tuple[List[int], List[int]]] = []
        self.problems: List[str] = []

    def add(self, key: str, n: int = 1):
        with self.lock:
            self.count[key] += n

    def problem(self, msg: str):
        with self.lock:
            self.count["problems"] += 1
            if len(self.problems) < 20:
                self.problems.append(msg)


def _post(url, payload, timeout, **kw):
    if isinstance(payload, str):
        return requests.post(url, data=payload, headers={"Content-Type": "application/json"}, timeout=timeout, **kw)
    return requests.post(url, json=payload, timeout=timeout, **kw)


def _one(base_url: str, kind: str, prompt: List[int], n_out: int, rng: random.Random, st: _Stats, timeout: float):
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n_out, "ignore_eos": True}}
    st.add(f"sent_{kind}")
    if kind == "good":
        try:
            r = _post(base_url + "/generate", body, timeout)
        except requests.RequestException as exc:
            st.problem(f"good request failed: {exc!r}")
            return
        if r.status_code != 200 or len(r.json().get("output_ids", [])) != n_out:
            st.problem(f"good request: HTTP {r.status_code} {r.text[:200]}")
            return
        st.add("good_ok")
        with st.lock:
            st.good.append((prompt, r.json()["output_ids"]))
    elif kind == "abort_timeout":
        try:
            _post(base_url + "/generate", body, rng.uniform(0.02, 0.8))
        except requests.RequestException:
            st.add("client_disconnects")
    elif kind == "abort_stream":
        try:
            with _post(base_url + "/generate", {**body, "stream": True}, timeout, stream=True) as r:
                k = rng.randint(1, 3)
                for i, _ in enumerate(r.iter_lines()):
                    if i >= k:
                        break
            st.add("client_disconnects")
        except requests.RequestException:
            st.add("client_disconnects")
    elif kind == "abort_rid":
        rid = uuid.uuid4().hex
        done: Dict[str, Any] = {}

        def send():
            try:
                done["r"] = _post(base_url + "/generate", {**body, "rid": rid}, timeout)
            except requests.RequestException as exc:
                done["e"] = exc

        t = threading.Thread(target=send)
        t.start()
        time.sleep(rng.uniform(0.0, 0.3))
        try:
            requests.post(base_url + "/abort_request", json={"rid": rid}, timeout=timeout)
        except requests.RequestException as exc:
            st.problem(f"/abort_request failed: {exc!r}")
        t.join(timeout)
        r = done.get("r")
        if r is None:
            st.problem(f"aborted request got no answer: {done.get('e')!r}")
        elif r.status_code == 200:
            st.add("abort_rid_aborted" if r.json()["meta_info"]["finish_reason"]["type"] == "abort" else "abort_rid_finished")
        else:
            st.problem(f"aborted request: HTTP {r.status_code} {r.text[:200]}")
    else:  # bad
        name, path, payload = BAD_REQUESTS[rng.randrange(len(BAD_REQUESTS))]
        try:
            r = _post(base_url + path, payload, timeout)
        except requests.RequestException as exc:
            st.problem(f"bad request {name!r}: {exc!r}")
            return
        if 400 <= r.status_code < 500 and len(r.text) > 10:
            st.add("bad_rejected_4xx")
        else:
            st.problem(f"bad request {name!r}: HTTP {r.status_code} {r.text[:200]}")


def _healthy(base_url: str, tries: int = 4, wait_s: float = 10.0) -> bool:
    """``/health`` answers 200 within ``tries`` attempts (a loaded CI machine can miss one 20 s heartbeat)."""
    for k in range(tries):
        try:
            if requests.get(base_url + "/health", timeout=60).status_code == 200:
                return True
        except requests.RequestException:
            pass
        if k + 1 < tries:
            time.sleep(wait_s)
    return False


def reference_check(
    base_url: str, sample: Sequence[Tuple[List[int], List[int]]], tie_tol: float = 1e-3, timeout: float = 120.0
) -> Dict[str, Any]:
    """Replay ``(prompt, output_ids)`` pairs one at a time on a flushed cache; count equal, near ties, mismatches."""
    res = {"checked": 0, "equal": 0, "near_ties": 0, "mismatches": []}
    for prompt, got in sample:
        requests.post(base_url + "/flush_cache", timeout=timeout)
        r = _post(base_url + "/generate", {
            "input_ids": prompt, "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"temperature": 0, "max_new_tokens": len(got), "ignore_eos": True}}, timeout)
        r.raise_for_status()
        j = r.json()
        ref = j["output_ids"]
        res["checked"] += 1
        if ref == got:
            res["equal"] += 1
            continue
        k = next(i for i, (a, b) in enumerate(zip(ref, got)) if a != b)
        top2 = j["meta_info"]["output_top_logprobs"][k]
        ids = [t[1] for t in top2]
        if len(top2) == 2 and got[k] in ids and abs(top2[0][0] - top2[1][0]) < tie_tol:
            res["near_ties"] += 1
        else:
            res["mismatches"].append({"prompt_len": len(prompt), "position": k, "served": got[k], "reference": ref[k]})
    return res


def run_soak(
    base_url: str,
    server_pid: int,
    vocab_size: int,
    duration_s: float = 60.0,
    concurrency: int = 16,
    seed: int = 0,
    mix: Optional[Dict[str, float]] = None,
    max_input: int = 200,
    max_output: int = 12,
    excluded_ids: Sequence[int] = (),
    reference_sample: int = 12,
    idle_s: float = 4.0,
    timeout: float = 300.0,
) -> Dict[str, Any]:
    """Run the soak against ``base_url`` and return the summary (see the module docstring).

    ``mix``: probabilities of ``good / abort_timeout / abort_stream / abort_rid / bad``
    (default 0.55 / 0.15 / 0.1 / 0.1 / 0.1). ``excluded_ids``: token ids never put in a
    prompt (e.g. a test's fault-injection trigger). Raises ``ValueError`` for a
    non-positive ``duration_s`` or ``concurrency``.
    """
    if duration_s <= 0 or concurrency <= 0:
        raise ValueError(f"duration_s and concurrency must be positive, got {duration_s}, {concurrency}")
    mix = mix or {"good": 0.55, "abort_timeout": 0.15, "abort_stream": 0.1, "abort_rid": 0.1, "bad": 0.1}
    kinds, weights = list(mix), list(mix.values())
    prompts = trace_prompts(vocab_size, max_input, max_output, seed=seed, excluded=excluded_ids)
    st = _Stats()
    rss_start = server_rss_bytes(server_pid)
    t0 = time.monotonic()
    deadline = t0 + duration_s
    counter = iter(range(10**9))
    counter_lock = threading.Lock()

    def worker(w: int):
        rng = random.Random(seed * 1000 + w)
        first = True
        while time.monotonic() < deadline:
            with counter_lock:
                i = next(counter)
            prompt, n_out = prompts[i % len(prompts)]
            # the first wave covers every kind (worker w starts with kind w mod 5), then the coin decides
            kind = kinds[w % len(kinds)] if first else rng.choices(kinds, weights)[0]
            first = False
            try:
                _one(base_url, kind, prompt, n_out, rng, st, timeout)
            except Exception as exc:  # a client-side bug must show up as a problem, not kill the thread
                st.problem(f"{kind}: client exception {exc!r}")

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    time.sleep(idle_s)  # drain; the idle scheduler runs its (strict) memory check
    healthy_after = _healthy(base_url)
    rss_end = server_rss_bytes(server_pid)
    sample = random.Random(seed).sample(st.good, min(reference_sample, len(st.good)))
    ref = reference_check(base_url, sample, timeout=timeout) if healthy_after else None
    time.sleep(idle_s)
    healthy_final = _healthy(base_url)
    c = st.count
    sent = sum(v for k, v in c.items() if k.startswith("sent_"))
    return {
        "duration_s": round(wall, 1),
        "concurrency": concurrency,
        "requests_sent": sent,
        "by_kind": {k[5:]: v for k, v in sorted(c.items()) if k.startswith("sent_")},
        "good_ok": c["good_ok"],
        "client_disconnects": c["client_disconnects"],
        "abort_rid_aborted": c["abort_rid_aborted"],
        "abort_rid_finished_before_abort": c["abort_rid_finished"],
        "bad_rejected_4xx": c["bad_rejected_4xx"],
        "problems": c["problems"],
        "problem_examples": st.problems,
        "healthy_after_idle": healthy_after and healthy_final,
        "rss_start_bytes": rss_start,
        "rss_end_bytes": rss_end,
        "reference": ref,
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """CLI: start the tiny model's server (strict idle leak check), soak it, print and write the JSON summary."""
    import argparse
    import os
    import platform

    from sglang_hybrid.bench.resultfile import write_json
    from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context-length", type=int, default=256)
    ap.add_argument("--reference-sample", type=int, default=24)
    ap.add_argument("--out", default=None, help="result JSON path")
    args = ap.parse_args(argv)
    with open(os.path.join(args.model_path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    server_args = cpu_server_args(max_total_tokens=4096, max_mamba_cache_size=64) + [
        "--context-length", str(args.context_length), "--page-size", "16", "--chunked-prefill-size", "128"]
    from sglang_hybrid.reliability.idle_audit import AUDIT_ENV, parse_audit_lines

    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1", AUDIT_ENV: "1"}
    with LaunchedServer(args.model_path, server_args, env=env) as s:
        summary = run_soak(s.base_url, s.process.pid, vocab, args.duration, args.concurrency, args.seed,
                           max_input=args.context_length - 60, reference_sample=args.reference_sample)
        with open(s.log_path, errors="replace") as f:
            log = f.read()
        summary["leak_reports_in_log"] = log.count("memory leak detected")
        audits = parse_audit_lines(log)  # free + evictable + locked == capacity, nothing locked (idle_audit.py)
        summary["idle_audits"] = len(audits)
        summary["idle_audit_violations"] = sum(not a["ok"] for a in audits)
        summary["server_alive"] = s.process.poll() is None
    doc = {"kind": "soak", "manifest": {"date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                                        "cpus": os.cpu_count(), "command": "python benchmark/soak/soak.py " + " ".join(argv or [])},
           "server_args": server_args, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.out:
        write_json(args.out, doc)
    return doc
