"""Parallelism benchmark for Kimi K3 (issue 8): DCP for MLA and MoE routed-output ownership.

Two parts:

* ``single`` (one device, or CPU): cost of the exact DCP LSE merge
  (``sgl_hybrid_kernel.dcp.merge_partial_attention``) against a copy of the same
  bytes measured in the same run; compute saved per rank by MoE ownership,
  simulated by timing the replicated ``routed_expert_up_proj`` GEMM
  ``[M, L] x [L, D]`` against one rank's share ``[M, L] x [L, D / tp]``; KV bytes
  per rank under DCP and weight bytes saved by loading only owned rows (analytic).
* ``multi`` (2-8 GPUs, ``torchrun --nproc_per_node N``; NCCL on GPU, gloo on CPU):
  per decode layer at Kimi K3 size, (a) DCP attention over a sharded KV
  (query all-gather, local partial attention, (o, LSE) all-gather, merge)
  checked against full attention on the unsharded history, timed against the
  TP-only layer (replicated KV, no gather) in the same run; (b) the MoE tail:
  plain TP (replicated up-proj, shared all-reduce) vs ownership (owned rows
  folded into the shared partial sum, same all-reduce), checked equal, timed.

Usage::

    python benchmark/parallel/bench_parallel.py single [--device cuda] [--out FILE]
    torchrun --nproc_per_node 8 benchmark/parallel/bench_parallel.py multi [--out FILE]
    # CPU smoke run of the multi part (tiny shapes):
    torchrun --nproc_per_node 2 benchmark/parallel/bench_parallel.py multi --device cpu --tiny

Sizes (Kimi K3, as implied by the article's 3.85 GiB figure, see docs/parallelism.md):
hidden 7168, latent (routed_expert_hidden_size) 3584, 92 MoE layers, MLA row
512 + 64, 64 query heads (8 per rank at TP 8), BF16.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from sgl_hybrid_kernel.dcp import merge_partial_attention
from sgl_hybrid_kernel.mla.reference import mla_attention_absorbed

FULL = dict(hidden=7168, latent=3584, moe_layers=92, kv_lora=512, rope=64, heads=64)
TINY = dict(hidden=256, latent=128, moe_layers=4, kv_lora=64, rope=16, heads=8)


def _timeit(fn, device, iters=20, warmup=3) -> float:
    """Median wall time of ``fn()`` in µs (device-synchronised)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return sorted(times)[len(times) // 2]


def single(args) -> dict:
    dev, dt = args.device, torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    s = TINY if args.tiny else FULL
    out = {"merge": [], "moe_owned_up_proj": [], "kv_bytes_per_rank": [], "weights_saved_per_rank": []}
    Dv = s["kv_lora"]
    for c in (2, 4, 8):
        for rows in (1, 32, 128):
            H = s["heads"] // 8 * c  # the DCP group's heads at TP 8
            o = torch.randn(c, rows, H, Dv, device=dev, dtype=dt)
            lse = torch.randn(c, rows, H, device=dev, dtype=torch.float32)
            t_merge = _timeit(lambda: merge_partial_attention(o, lse), dev)
            dst = torch.empty_like(o)
            t_copy = _timeit(lambda: dst.copy_(o), dev)
            out["merge"].append(dict(c=c, rows=rows, heads=H, dv=Dv, merge_us=t_merge, copy_same_bytes_us=t_copy,
                                     ratio_vs_copy=t_merge / t_copy))
    D, L = s["hidden"], s["latent"]
    w = torch.randn(D, L, device=dev, dtype=dt)
    for M in (1, 32, 128):
        x = torch.randn(M, L, device=dev, dtype=dt)
        t_full = _timeit(lambda: x @ w.t(), dev)
        for tp in (2, 4, 8):
            w_own = w[: D // tp].contiguous()
            t_own = _timeit(lambda: x @ w_own.t(), dev)
            out["moe_owned_up_proj"].append(dict(M=M, tp=tp, replicated_us=t_full, owned_us=t_own,
                                                 saved_per_rank_us=t_full - t_own, ratio=t_own / t_full))
    from sglang_hybrid.parallel import mla_kv_bytes_per_rank, owned_weight_bytes_saved

    for c in (1, 2, 4, 8):
        b = mla_kv_bytes_per_rank(131072, s["kv_lora"] + s["rope"], 1, c, 2)
        out["kv_bytes_per_rank"].append(dict(dcp=c, tokens=131072, bytes_per_mla_layer=b))
    for tp in (2, 4, 8):
        b = owned_weight_bytes_saved(D, L, s["moe_layers"], tp, 2)
        out["weights_saved_per_rank"].append(dict(tp=tp, bytes=b, gib=b / 2**30))
    return out


def multi(args) -> dict:
    dev = args.device
    backend = "nccl" if dev.startswith("cuda") else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if dev.startswith("cuda"):
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = f"cuda:{torch.cuda.current_device()}"
    dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    s = TINY if args.tiny else FULL
    R, P, Hl = s["kv_lora"], s["rope"], s["heads"] // world
    g = torch.Generator(device="cpu").manual_seed(0)  # same history / weights on every rank
    res = {"world": world, "device": torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu", "dcp": [], "moe": []}
    for S in args.context:
        for B in (1, 8):
            lat = torch.randn(B, S, R, generator=g).to(dev, dt)
            kpe = torch.randn(B, S, P, generator=g).to(dev, dt)
            q = torch.randn(B, Hl * world, R + P, generator=g).to(dev, dt)
            mine = slice(rank * Hl, (rank + 1) * Hl)
            keys = torch.arange(rank, S, world, device=dev)
            scale = (128 + P) ** -0.5

            def tp_only():  # replicated KV, this rank's heads, no collective
                return [mla_attention_absorbed(q[b:b + 1, mine, :R], q[b:b + 1, mine, R:], lat[b], kpe[b], scale, S - 1)[0]
                        for b in range(B)]

            def dcp():
                qg = [torch.empty_like(q[:, mine]) for _ in range(world)]
                dist.all_gather(qg, q[:, mine].contiguous())
                qa = torch.cat(qg, dim=1)  # [B, H, R + P]
                part = torch.empty(B, qa.shape[1], R + 1, device=dev, dtype=torch.float32)
                for b in range(B):
                    o, lse = mla_attention_absorbed(qa[b:b + 1, :, :R], qa[b:b + 1, :, R:], lat[b, keys], kpe[b, keys],
                                                    scale, keys.numel() - 1)
                    part[b, :, :R], part[b, :, R] = o[0].float(), lse[0].float()
                parts = [torch.empty_like(part) for _ in range(world)]
                dist.all_gather(parts, part)
                st = torch.stack(parts)
                o, _ = merge_partial_attention(st[..., :R].contiguous(), st[..., R].contiguous())
                return o[:, mine]

            got, want = dcp(), torch.cat(tp_only(), dim=0).float()
            err = (got.float() - want).abs().max().item()
            t_tp, t_dcp = _timeit(tp_only, dev, iters=args.iters), _timeit(dcp, dev, iters=args.iters)
            kv_rows_tp, kv_rows_dcp = S, keys.numel()
            res["dcp"].append(dict(context=S, batch=B, tp_only_us=t_tp, dcp_us=t_dcp, ratio=t_dcp / t_tp,
                                   max_abs_err=err, kv_rows_per_rank_tp=kv_rows_tp, kv_rows_per_rank_dcp=kv_rows_dcp))
    D, L = s["hidden"], s["latent"]
    w_up = torch.randn(D, L, generator=g).to(dev, dt)
    own = slice(rank * D // world, (rank + 1) * D // world)
    w_own = w_up[own].contiguous()
    for M in (1, 32, 128):
        latent = torch.randn(M, L, generator=g).to(dev, dt)
        shared = torch.randn(M, D, generator=g).to(dev, dt) / world  # this rank's partial sum

        def plain():
            red = shared.clone()
            dist.all_reduce(red)
            return latent @ w_up.t() + red

        def owned():
            part = shared.clone()
            part[:, own] += latent @ w_own.t()
            dist.all_reduce(part)
            return part

        err = (plain().float() - owned().float()).abs().max().item()
        t_plain, t_owned = _timeit(plain, dev, iters=args.iters), _timeit(owned, dev, iters=args.iters)
        res["moe"].append(dict(M=M, plain_us=t_plain, owned_us=t_owned, ratio=t_owned / t_plain, max_abs_err=err,
                               up_proj_bytes_per_rank_plain=w_up.numel() * 2, up_proj_bytes_per_rank_owned=w_own.numel() * 2))
    dist.barrier()
    dist.destroy_process_group()
    return res if rank == 0 else {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=["single", "multi"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--context", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", help="write the results JSON here")
    args = ap.parse_args()
    if args.tiny and args.context == [8192, 32768]:
        args.context = [64]
    res = single(args) if args.part == "single" else multi(args)
    if res:
        res["command"] = " ".join(["bench_parallel.py"] + os.sys.argv[1:])
        text = json.dumps(res, indent=1)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
