"""Sweep the value-tile width BV of our decode / verify / fused-decode kernels on a GPU.

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/sweep_value_tile.py

Same method as bench_delta_rule_recurrent.py (graph replay, rotated slots over a pool > L2).
"""

import json
import sys

import torch

sys.path.insert(0, "benchmark/kernels")
from bench_delta_rule_recurrent import DEV, LB, ROT, SLOTS, graph_time_us  # noqa: E402

from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides  # noqa: E402
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton, replay_commit  # noqa: E402
from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode  # noqa: E402

rows = []
H, K, V, W = 12, 128, 128, 4
C = 3 * H * K
pool = torch.randn(SLOTS, H, V, K, device=DEV)
A, dtb, nw = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV), torch.rand(V, device=DEV)
conv = torch.randn(SLOTS, W - 1, C, device=DEV, dtype=torch.bfloat16)
cw = torch.randn(C, W, device=DEV, dtype=torch.bfloat16)
for B in (1, 32, 128):
    perms = [torch.randperm(SLOTS, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
    x = torch.randn(B, C, device=DEV, dtype=torch.bfloat16)
    f1 = torch.randn(B, H * K, device=DEV, dtype=torch.bfloat16)
    b1 = torch.randn(B, H, device=DEV, dtype=torch.bfloat16)
    g1 = torch.randn(B, H * V, device=DEV, dtype=torch.bfloat16)
    out = torch.empty(B, H, V, device=DEV, dtype=torch.bfloat16)
    for bv in (4, 8, 16, 32, 64):
        for T in (1, 4):
            N = B * T
            q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
            f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
            o = torch.empty_like(v)
            t = graph_time_us(lambda r: gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, perms[r], T, "kda", LB,
                                                                    state_layout="vk", commit=T == 1, out=o,
                                                                    plan=RecurrentOverrides(value_tile=bv)))
            rows.append(dict(op=f"kda_t{T}", B=B, BV=bv, us=t))
        if bv >= 8:
            t = graph_time_us(lambda r: kda_fused_decode(x, conv, cw, f1, b1, A, dtb, pool, perms[r], g1, nw, 1e-5, LB,
                                                         value_tile=bv, out=out))
            rows.append(dict(op="kda_fused", B=B, BV=bv, us=t))
# GDN, fla layout [K, V]
H2, HV = 16, 48
slots = 256
pool2 = torch.randn(slots, HV, K, V, device=DEV)
A2, dt2 = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
for B in (1, 32):
    perms = [torch.randperm(slots, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
    for bv in (4, 8, 16, 32, 64):
        for T in (1, 5):
            N = B * T
            q, k = (torch.randn(N, H2, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(N, HV, V, device=DEV, dtype=torch.bfloat16)
            a, b = (torch.randn(N, HV, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            o = torch.empty_like(v)
            t = graph_time_us(lambda r: gated_delta_recurrent_triton(q, k, v, a, b, A2, dt2, pool2, perms[r], T, "gdn",
                                                                    commit=T == 1, out=o,
                                                                    plan=RecurrentOverrides(value_tile=bv)))
            rows.append(dict(op=f"gdn_t{T}", B=B, BV=bv, us=t))
            if T == 5:
                rb = torch.empty(slots, T - 1, HV, K + 2 + V, device=DEV)
                acc = torch.randint(1, T + 1, (B,), device=DEV, dtype=torch.int32)

                def deferred(r):
                    gated_delta_recurrent_triton(q, k, v, a, b, A2, dt2, pool2, perms[r], T, "gdn", replay_buffer=rb, out=o,
                                                 plan=RecurrentOverrides(value_tile=bv))
                    replay_commit(pool2, perms[r], acc, rb, K, "gdn", plan=RecurrentOverrides(value_tile=bv))

                rows.append(dict(op="gdn_t5_deferred", B=B, BV=bv, us=graph_time_us(deferred)))
for r in rows:
    print(r)
json.dump(rows, open(sys.argv[1] if len(sys.argv) > 1 else "sweep.json", "w"), indent=1)
