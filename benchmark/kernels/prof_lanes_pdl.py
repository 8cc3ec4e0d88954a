"""Per-kernel times of the lanes path (prologue ``token_prep_kernel`` + ``gated_delta_verify_lanes_kernel``)
for GDN T=5 verify B = 32 / 128, GDN T=5 deferred B=32 and KDA T=4 verify B = 32 / 128 on a V-major pool
(issue 4, nineteenth round): the torch profiler's eager per-kernel means and a CUDA graph's time per call.
Run it once per Triton / ``SGL_HYBRID_LANES_PDL`` setting; ``PKG`` points at another checkout's
``sgl-kernel/python`` (default: this one's). Needs CUDA.

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/prof_lanes_pdl.py
    SGL_HYBRID_LANES_PDL=0 PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/prof_lanes_pdl.py
"""
import os
import sys

import torch
import triton

sys.path.insert(0, os.environ.get("PKG", "sgl-kernel/python"))
from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton as fn  # noqa: E402

DEV = "cuda"
torch.manual_seed(0)


def case(gate, H, HV, T, B, mode):
    K = V = 128
    slots = 512
    pool = torch.randn(slots, HV, V, K, device=DEV)
    idx = torch.randperm(slots, device=DEV)[:B].to(torch.int32)
    N = B * T
    q, k = (torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(N, HV, V, device=DEV, dtype=torch.bfloat16)
    f = torch.randn(N, HV, *( (K,) if gate == "kda" else ()), device=DEV, dtype=torch.bfloat16)
    b = torch.randn(N, HV, device=DEV, dtype=torch.bfloat16)
    A = torch.rand(HV, device=DEV)
    dtb = torch.randn(HV * (K if gate == "kda" else 1), device=DEV)
    o = torch.empty_like(v)
    rb = torch.zeros(slots, T - 1, HV, K + (K if gate == "kda" else 1) + 1 + V, device=DEV)
    def call():
        if mode == "verify":
            return fn(q, k, v, f, b, A, dtb, pool, idx, T, gate, commit=False, out=o, state_layout="vk")
        return fn(q, k, v, f, b, A, dtb, pool, idx, T, gate, replay_buffer=rb, out=o, state_layout="vk")

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            call()
        torch.cuda.synchronize()
    per = {e.key[:60]: round(e.device_time_total / 20, 2) for e in prof.key_averages() if e.device_time_total > 0}
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(10):
            call()
    g.replay()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(lambda: g.replay(), warmup=20, rep=200, return_mode="median")
    print(triton.__version__, "PDL", os.environ.get("SGL_HYBRID_LANES_PDL", "1"), gate, mode, "B", B, "graph us/call", round(ms * 100, 2), per, flush=True)


# GATES / VERIFY_B / DEFERRED_B (comma lists) narrow the cases, e.g. GATES=gdn VERIFY_B=2,4,32
for gate, H, HV, T in (("gdn", 16, 48, 5), ("kda", 12, 12, 4)):
    if gate not in os.environ.get("GATES", "gdn,kda").split(","):
        continue
    for B in map(int, os.environ.get("VERIFY_B", "32,128").split(",")):
        case(gate, H, HV, T, B, "verify")
    if gate == "gdn":
        for B in map(int, filter(None, os.environ.get("DEFERRED_B", "32").split(","))):
            case(gate, H, HV, T, B, "deferred")
