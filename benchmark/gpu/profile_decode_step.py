"""Per-step GPU profile of Kimi K3 decode as served: ours vs upstream's kernels, same process tree, same run.

    python benchmark/gpu/profile_decode_step.py --out benchmark/results/DATE-h100-k3-decode-profile.json

Builds a config of **one GPU's share of Kimi K3 at TP8** (hidden 7168; MLA 12 heads, latent 512 +
rope 64; KDA 12 heads of 128; three KDA layers then one MLA layer; layer 0 dense; the routed experts
one GPU holds under EP8 with the routed picks that land on it, ``--experts`` / ``--top-k``), serves it
with random weights (``--load-format dummy``) through ``python -m sglang.launch_server`` once per
variant, and for each concurrency C sends C streaming requests (``--input-len`` prompt,
``--output-len`` new tokens, ``ignore_eos``), starts upstream's torch profiler (``/start_profile``,
GPU activity) for ``--steps`` scheduler steps while they decode, and reads the trace:

* ``step_us``: span of the profiled kernels divided by the steps (what one decode step costs on the GPU);
* ``by_op_us``: kernel time per step by op family (KDA, MLA, MoE experts, MoE routing, AttnRes + norms,
  dense GEMMs, other), by kernel name (``CATEGORIES``); ``top_kernels``: the largest kernels;
* ``copies_per_step``: memcpy / memset activity and copy kernels per step, by name (issue 41: copies
  with no consumer should be none);
* ``itl_ms``: median inter-token gap of the streamed requests (profiler off), ``tok_s``: decode tokens/s.

Variants (each the same model, flags and requests): ``upstream`` (upstream's Triton MLA, KDA, routing
and AttnRes; ``SGLANG_HYBRID_UPSTREAM_OPS`` keeps every op we hook), ``ours`` (``sgl_hybrid_mla``,
``--linear-attn-backend sgl_hybrid``, fused KDA decode, our routing and AttnRes),
``ours_unfused_kda`` (ours with the fused KDA decode left out). Ratios are against ``upstream``.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import requests

from sglang_hybrid.bench.manifest import git_commit, git_dirty, machine_info, package_versions
from sglang_hybrid.bench.server import LaunchedServer

from k3_share import add_model_args, plugin_state, write_model  # noqa: E402  (this folder: the script's own directory is on sys.path)

ALL_UPSTREAM = "moe_routing,attn_res,kda_fused_decode"
VARIANTS = {
    "upstream": (["--attention-backend", "triton"], {"SGLANG_HYBRID_UPSTREAM_OPS": ALL_UPSTREAM}),
    "ours": (["--attention-backend", "sgl_hybrid_mla", "--linear-attn-backend", "sgl_hybrid"], {}),
    "ours_unfused_kda": (["--attention-backend", "sgl_hybrid_mla", "--linear-attn-backend", "sgl_hybrid"],
                         {"SGLANG_HYBRID_UPSTREAM_OPS": "kda_fused_decode"}),
}
# kernel name -> op family; first match wins (names of upstream's, fla's, Triton's and cuBLAS kernels)
CATEGORIES = [
    ("kda", r"kda|gated_delta|delta_rule|fused_recurrent|causal_conv|conv1d|chunk_(?:intra|state|gate|o_|fwd|scaled|local)|recompute_w_u|solve_tril|l2norm"),
    ("mla", r"mla|decode_grouped_att|_fwd_kernel|stage[12]|merge_partials|extend_attention|flash|fmha|set_mla_kv|concat_and_cast"),
    ("moe_routing", r"topk|gating|moe_align|sorted_layout|routing|count_and_sort|grouped_topk"),
    ("moe_experts", r"fused_moe|moe_sum|moe_|act_and_mul|silu_and_mul|grouped_gemm"),
    ("attn_res_norm", r"attn_res|rms|norm|_aggregate"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|ampere|Kernel2|splitK|matmul"),
]


def categorise(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return cat
    return "other"


def read_trace(directory: str, steps: int) -> Dict:
    paths = sorted(glob.glob(os.path.join(directory, "**", "*.trace.json*"), recursive=True))
    if not paths:
        raise RuntimeError(f"no profiler trace under {directory}")
    opener = gzip.open if paths[-1].endswith(".gz") else open
    with opener(paths[-1], "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_kernel") and "dur" in e]
    if not kernels:
        raise RuntimeError(f"{paths[-1]}: no kernel events")
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    by_cat: Dict[str, float] = {}
    by_name: Dict[str, float] = {}
    for e in kernels:
        cat = categorise(e["name"])
        by_cat[cat] = by_cat.get(cat, 0.0) + e["dur"]
        by_name[e["name"]] = by_name.get(e["name"], 0.0) + e["dur"]
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
    # copies per step: memcpy / memset activity and copy kernels (torch's elementwise copy, .contiguous())
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset") and "dur" in e]
    copies += [e for e in kernels if re.search(r"copy|CatArray|cat_", e["name"], re.IGNORECASE)]
    copy_names: Dict[str, int] = {}
    for e in copies:
        copy_names[e["name"][:100]] = copy_names.get(e["name"][:100], 0) + 1
    return {"trace": os.path.basename(paths[-1]), "kernels": len(kernels), "step_us": span / steps,
            "busy_us": sum(by_cat.values()) / steps,
            "by_op_us": {k: round(v / steps, 2) for k, v in sorted(by_cat.items())},
            "top_kernels": [{"name": n[:120], "op": categorise(n), "us_per_step": round(v / steps, 2)} for n, v in top],
            "copies_per_step": round(len(copies) / steps, 2),
            "copy_us_per_step": round(sum(e["dur"] for e in copies) / steps, 2),
            "copies_by_name": {n: round(c / steps, 2) for n, c in sorted(copy_names.items(), key=lambda kv: -kv[1])}}


@dataclass
class Stream:
    """One streamed request: ``ttft`` and ``gaps`` between token-carrying chunks (s), tokens received."""

    ttft: Optional[float] = None
    gaps: List[float] = field(default_factory=list)
    tokens: int = 0
    end: Optional[float] = None
    error: Optional[str] = None


def _stream(base: str, input_ids: List[int], output_len: int, out: Stream) -> Stream:
    """``/generate`` with ``stream: true`` and ``ignore_eos`` (requests only: the GPU image has no aiohttp)."""
    t0, last = time.perf_counter(), None
    payload = {"input_ids": input_ids, "stream": True,
               "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}}
    try:
        with requests.post(f"{base}/generate", json=payload, stream=True, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                n = int((json.loads(line[5:]).get("meta_info") or {}).get("completion_tokens", 0))
                if n > out.tokens:
                    now = time.perf_counter()
                    if last is None:
                        out.ttft = now - t0
                    else:
                        out.gaps.append(now - last)
                    last, out.tokens = now, n
        out.end = time.perf_counter() - t0
    except Exception as e:
        out.error = repr(e)
    return out


def _decode(base: str, C: int, input_len: int, output_len: int, seed: int, profile: Dict = None) -> List[Stream]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 900) for _ in range(input_len)] for _ in range(C)]
    results = [Stream() for _ in range(C)]
    with ThreadPoolExecutor(C) as pool:
        futures = [pool.submit(_stream, base, p, output_len, r) for p, r in zip(prompts, results)]
        if profile is not None:
            deadline = time.perf_counter() + 120
            while any(r.ttft is None and r.error is None for r in results) and time.perf_counter() < deadline:
                time.sleep(0.01)  # every prefill done: the profiled steps are decode steps
            requests.post(f"{base}/start_profile", json=profile, timeout=60).raise_for_status()
        results = [f.result() for f in futures]
    bad = [r.error for r in results if r.error]
    if bad:
        raise RuntimeError(f"{len(bad)} request(s) failed: {bad[0]}")
    return results



def run_variant(name: str, model: str, args, log_dir: str) -> Dict:
    flags, env = VARIANTS[name]
    prof_dir = tempfile.mkdtemp(prefix=f"prof-{name}-")
    server_args = ["--load-format", "dummy", "--dtype", "bfloat16", "--cuda-graph-max-bs-decode", str(max(args.concurrency)),
                   "--max-running-requests", str(max(args.concurrency)), "--mem-fraction-static", "0.85",
                   "--context-length", str(args.input_len + args.output_len + 64), *flags]
    env = {**env, "SGLANG_TORCH_PROFILER_DIR": prof_dir}
    out = {"variant": name, "flags": server_args, "env": env, "by_concurrency": {}}
    with LaunchedServer(model, server_args, env=env, timeout=args.boot_timeout,
                        log_path=os.path.join(log_dir, f"server-{name}.log")) as srv:
        base = srv.base_url
        _decode(base, max(args.concurrency), 64, 8, 0)  # warm-up: graphs and kernels compiled
        out["kernel_paths"] = plugin_state(base).get("kernel_paths")
        for C in args.concurrency:
            res = _decode(base, C, args.input_len, args.output_len, C)
            gaps = [g for r in res for g in r.gaps]
            row = {"itl_ms_p50": round(1e3 * statistics.median(gaps), 3),
                   "tok_s": round(sum(r.tokens for r in res) / max(r.end - r.ttft for r in res), 1)}
            d = os.path.join(prof_dir, f"c{C}")
            _decode(base, C, args.input_len, args.output_len, 100 + C,
                    profile={"output_dir": d, "num_steps": args.steps, "activities": ["GPU"], "profile_id": f"{name}-c{C}"})
            time.sleep(2.0)
            row.update(read_trace(d, args.steps))
            out["by_concurrency"][str(C)] = row
            print(f"{name:17s} C={C:<3d} step {row['step_us']:8.1f} us  ITL p50 {row['itl_ms_p50']:.3f} ms  "
                  f"{row['tok_s']:8.1f} tok/s  " + "  ".join(f"{k} {v:.1f}" for k, v in row["by_op_us"].items()),
                  flush=True)
        out["kernel_calls"] = plugin_state(base).get("kernel_calls")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default="upstream,ours,ours_unfused_kda")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=16)
    add_model_args(p)
    p.add_argument("--boot-timeout", type=float, default=400)
    p.add_argument("--log-dir", default=None)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    model = tempfile.mkdtemp(prefix="k3-tp8-share-")
    cfg = write_model(model, args)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="profile-logs-")
    result = {"benchmark": "profile_decode_step", "model": "Kimi K3, one GPU's share at TP8 (random weights)",
              "config": cfg, "args": {k: v for k, v in vars(args).items()}, "variants": {}}
    result["manifest"] = {"command": [sys.executable, *sys.argv], "git_commit": git_commit(), "git_dirty": git_dirty(),
                          "versions": package_versions(), "machine": machine_info(),
                          "warmup": f"{max(args.concurrency)} requests (64 in, 8 out) per server before measuring"}
    for name in args.variants.split(","):
        try:
            result["variants"][name] = run_variant(name, model, args, log_dir)
        except Exception as e:
            result["variants"][name] = {"error": repr(e)}
            print(f"{name}: FAILED {e!r}", flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    base = result["variants"].get("upstream", {}).get("by_concurrency", {})
    for name, v in result["variants"].items():
        for C, row in v.get("by_concurrency", {}).items():
            if C in base:
                row["step_vs_upstream"] = round(base[C]["step_us"] / row["step_us"], 3)
                print(f"{name:17s} C={C:<3s} step time: upstream / {name} = {row['step_vs_upstream']:.3f}x")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if all("error" not in v for v in result["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
