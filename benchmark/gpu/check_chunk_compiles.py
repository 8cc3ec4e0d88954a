"""GPU check: after ``delta_rule.chunk.variants.ensure_compiled``, no batch shape compiles a new binary.

    PYTHONPATH=sgl-kernel/python python benchmark/gpu/check_chunk_compiles.py --out result.json

For Kimi K3's KDA (TP8 share: 12 heads of 128, bounded gate) and Qwen3.8's GDN (16 / 32 heads of 128),
BF16 activations and an FP32 state pool: count the Triton binaries of the chunk-prefill kernels, run the
warm-up, then run ``--batches`` random batches (1 to 64 sequences, 1 to 6,000 tokens each, with and without
checkpoints) through the wrapper and count again. Needs only torch, Triton and the kernel package.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from sgl_hybrid_kernel.delta_rule.chunk import triton_chunk, triton_chunk_group_scan, triton_chunk_parallel, variants
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton

MODULES = (triton_chunk_parallel, triton_chunk_group_scan, triton_chunk)


def binaries() -> dict:
    """{kernel name: compiled binaries} over the chunk modules' JIT functions (Triton's per-device caches)."""
    out = {}
    for m in MODULES:
        for obj in vars(m).values():
            caches = getattr(obj, "device_caches", None)
            if type(obj).__name__ != "JITFunction" or caches is None:
                continue
            n = 0
            for v in caches.values():
                c = v[0] if isinstance(v, tuple) else v
                n += len(c) if hasattr(c, "__len__") else 0
            out[obj.fn.__name__] = n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rng = random.Random(0)
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "models": {}}
    for name, (H, HV, K, V, gate, lb) in {"kimi_k3_tp8_kda": (12, 12, 128, 128, "kda", -5.0),
                                          "qwen38_tp1_gdn": (16, 32, 128, 128, "gdn", None)}.items():
        bf = torch.bfloat16
        fshape = (HV, K) if gate == "kda" else (HV,)
        A_log = torch.zeros(HV, dtype=torch.float32, device=dev)
        dt_bias = torch.zeros(HV * K if gate == "kda" else HV, dtype=torch.float32, device=dev)
        pool = torch.zeros(65, HV, V, K, dtype=torch.float32, device=dev)
        ckpt_pool = torch.zeros(65, HV, V, K, dtype=torch.float32, device=dev)

        def tensors(n):
            return (torch.randn(n, H, K, dtype=bf, device=dev), torch.randn(n, H, K, dtype=bf, device=dev),
                    torch.randn(n, HV, V, dtype=bf, device=dev), 0.1 * torch.randn(n, *fshape, dtype=bf, device=dev),
                    torch.randn(n, HV, dtype=bf, device=dev))

        before = binaries()
        t0 = time.perf_counter()
        q, k, v, f, b = tensors(4)
        variants.ensure_compiled(q, k, v, f, b, A_log, dt_bias, pool, gate, lb)
        warm_s = time.perf_counter() - t0
        warm = binaries()
        seen = []
        for _ in range(args.batches):
            s = rng.choice([1, 2, 3, 4, 8, 16, 33, 64])
            lens = [rng.randint(1, 6000) if rng.random() < 0.3 else rng.randint(1, 300) for _ in range(s)]
            while sum(lens) > 16384:
                lens.pop()
            ck = rng.random() < 0.5
            n = sum(lens)
            q, k, v, f, b = tensors(n)
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
            gated_delta_chunk_triton(q, k, v, f, b, A_log, dt_bias, cu, pool,
                                     torch.arange(len(lens), dtype=torch.int32, device=dev),
                                     torch.ones(len(lens), dtype=torch.int32, device=dev), gate, lb, state_layout="vk",
                                     checkpoints=[(i, x, i) for i, x in enumerate(lens)] if ck else (),
                                     checkpoint_pool=ckpt_pool if ck else None, seq_lens_cpu=lens)
            seen.append({"sequences": len(lens), "tokens": n, "checkpoints": ck})
        torch.cuda.synchronize()
        after = binaries()
        new = {kname: after[kname] - warm.get(kname, 0) for kname in after if after[kname] != warm.get(kname, 0)}
        report["models"][name] = {
            "warmup_binaries": sum(warm.values()) - sum(before.values()), "warmup_s": round(warm_s, 2),
            "batches": len(seen), "new_binaries_after_warmup": new, "ok": not new,
        }
        print(name, json.dumps(report["models"][name]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0 if all(m["ok"] for m in report["models"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
