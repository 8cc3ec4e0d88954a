"""Regenerate the GPU suite's fixtures on a CPU machine: the CPU reference models' greedy tokens.

    .venv/bin/python test/gpu/make_fixtures.py [--models kimi-k3-tiny,qwen38-tiny,...]

For each tiny checkpoint (``gpu_cases.model_paths``) this starts the real
``python -m sglang.launch_server`` on the CPU twice, both with the radix cache off
(``--disable-radix-cache``): in BF16, whose greedy tokens of every prompt of
``gpu_cases.PROMPTS`` (one request at a time) go to ``fixtures/<model>.json``
together with the checkpoint's digest; and in FP32 with layer taps on
(``SGLANG_HYBRID_LAYER_TAPS``), whose per-layer tensors of ``gpu_cases.TAP_PROMPT``
go to ``fixtures/<model>-taps.pt`` (the layer-parity oracle; FP32 so that a BF16
GPU run is compared with the exact reference, not with another rounding). The
FP32 greedy tokens are stored too, to tell a near-tie from a fault.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("", os.path.join("..", "srt", "server"), os.path.join("..", "srt", "models"),
            os.path.join("..", "srt", "speculative")):
    sys.path.insert(0, os.path.normpath(os.path.join(HERE, sub)))

import torch  # noqa: E402

import gpu_cases  # noqa: E402
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args  # noqa: E402
from sglang_hybrid.tools import layer_taps  # noqa: E402


def _serve(model_dir: str, dtype: str, taps_dir=None):
    """``{prompt name: continuation}`` (``gpu_cases.continuation``) from a CPU reference server."""
    env = {layer_taps.TAPS_ENV: taps_dir} if taps_dir else {}
    args = cpu_server_args(dtype=dtype) + ["--disable-radix-cache", "--context-length", "4096"]
    with LaunchedServer(model_dir, args, env=env, timeout=900) as server:
        return {name: gpu_cases.continuation(gpu_cases.generate(server.base_url, p, **gpu_cases.LOGPROBS)[0])
                for name, p in gpu_cases.PROMPTS.items()}


def make(name: str, model_dir: str) -> None:
    os.makedirs(gpu_cases.FIXTURES, exist_ok=True)
    bf16 = _serve(model_dir, "bfloat16")
    with tempfile.TemporaryDirectory() as taps:
        fp32 = _serve(model_dir, "float32", taps)
        ref = layer_taps.find_pass(layer_taps.load_passes(taps), gpu_cases.PROMPTS[gpu_cases.TAP_PROMPT])
        if ref is None:
            raise RuntimeError(f"{name}: no tapped pass of the {gpu_cases.TAP_PROMPT!r} prompt")
        torch.save(ref, os.path.join(gpu_cases.FIXTURES, f"{name}-taps.pt"))
    fixture = {
        "model": name,
        "checkpoint_sha256": gpu_cases.checkpoint_digest(model_dir),
        "new_tokens": gpu_cases.NEW_TOKENS,
        "fp32": fp32,
        "bf16": bf16,
        "regenerate": "python test/gpu/make_fixtures.py --models " + name,
    }
    with open(os.path.join(gpu_cases.FIXTURES, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    # the CPU reference's own BF16 run against its FP32 run, under the rule the GPU tests apply
    for k in bf16:
        v = gpu_cases.compare_continuations(bf16[k], fp32[k])
        print(f"{name} {k:>8}: BF16 vs FP32 {v.describe()}", flush=True)


def main() -> int:
    paths = gpu_cases.model_paths()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(paths), help=f"comma-separated, of: {', '.join(paths)}")
    args = ap.parse_args()
    for name in args.models.split(","):
        if name not in paths:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(paths)}")
        make(name, paths[name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
