"""What a single copy launch of a KDA decode's bytes reaches (issue 4, 2026-12-03): torch `copy_` and an in-place
`mul_(1.0)` against Triton copies in place / out of place, per-program blocks of 1,024-8,192 floats on 4-8 warps, and a
persistent grid, over the bytes of KDA B = 32 / 64 / 128 (contiguous, graph replay, source / destination pairs rotated).
H200 run: `benchmark/results/2026-12-03-h200-copy_inplace_blocks.json`; run from the repository root with Triton and a GPU."""
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "benchmark/kernels")
import bench_delta_rule as bd  # noqa: E402  (graph_time_us, copy_ceiling_tbs, ROT)

DEV = "cuda"

@triton.jit
def copy_k(src, dst, N, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + off, mask=off < N)
    tl.store(dst + off, x, mask=off < N)

@triton.jit
def copy_persist(src, dst, N, BLOCK: tl.constexpr, NPROG: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    nblk = tl.cdiv(N, BLOCK)
    for b in range(pid, nblk, NPROG):
        off = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(src + off, mask=off < N)
        tl.store(dst + off, x, mask=off < N)

res = {}
ceiling = bd.copy_ceiling_tbs()
res["ceiling"] = ceiling
big = torch.randn(3 * 1024 ** 3 // 4, device=DEV)
for mb_floats, tag in ((32 * 12 * 128 * 128, "kda_b32"), (64 * 12 * 128 * 128, "kda_b64"), (128 * 12 * 128 * 128, "kda_b128")):
    n = mb_floats
    pairs = big.numel() // (2 * n)
    bd.ROT = max(1, min(pairs, 8))
    views = [(big[(2 * r) * n:(2 * r + 1) * n], big[(2 * r + 1) * n:(2 * r + 2) * n]) for r in range(bd.ROT)]
    byt = 2 * n * 4
    frac = lambda us: round(100 * byt / (us * 1e-6) / 1e12 / ceiling, 1)
    row = {}
    row["torch_copy_oop"] = bd.graph_time_us(lambda r: views[r][1].copy_(views[r][0]))
    row["torch_mul_inplace"] = bd.graph_time_us(lambda r: views[r][0].mul_(1.0))
    for blk, nw in ((2048, 4), (1024, 4), (4096, 4), (2048, 8), (8192, 8)):
        g = (triton.cdiv(n, blk),)
        row[f"tri_oop_b{blk}_w{nw}"] = bd.graph_time_us(lambda r: copy_k[g](views[r][0], views[r][1], n, BLOCK=blk, num_warps=nw))
        row[f"tri_inplace_b{blk}_w{nw}"] = bd.graph_time_us(lambda r: copy_k[g](views[r][0], views[r][0], n, BLOCK=blk, num_warps=nw))
    for mult in (4, 8, 16):
        P = 132 * mult
        row[f"tri_persist_inplace_x{mult}"] = bd.graph_time_us(lambda r: copy_persist[(P,)](views[r][0], views[r][0], n, BLOCK=2048, NPROG=P, num_warps=4))
        row[f"tri_persist_oop_x{mult}"] = bd.graph_time_us(lambda r: copy_persist[(P,)](views[r][0], views[r][1], n, BLOCK=2048, NPROG=P, num_warps=4))
    res[tag] = {k: (round(v, 2), frac(v)) for k, v in row.items()}
    print(tag, json.dumps(res[tag], indent=0), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "exp_inplace.json"), "w"), indent=1)
