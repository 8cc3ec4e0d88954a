"""Profile the Qwen3.8 GDN verify window (T=5, B=32, 48 value heads x 128, SGLang's V-major pool) under
Nsight Compute (issue 4: where the plain and the deferred-commit verify spend their time):

    PYTHONPATH=sgl-kernel/python ncu --clock-control none --profile-from-start off \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section InstructionStats python3 benchmark/kernels/prof_verify_b32.py [VARIANTS]

VARIANTS (comma list, default ``plain,deferred,fused``): ``plain`` (no state written), ``deferred``
(token 0 committed, records kept), ``fused`` (the previous window's replay fused into a deferred
window), or ``kw:<name>=<int>;...`` extra keyword arguments of ``gated_delta_recurrent_triton`` for a
plain window. Each is profiled once after 10 warm-up calls, on batches of slots spread over a 1024-slot pool.
"""
import sys

import torch

from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton

DEV = "cuda"
H, HV, K, V, T, B = 16, 48, 128, 128, 5, 32
variants = (sys.argv[1] if len(sys.argv) > 1 else "plain,deferred,fused").split(",")
pool = torch.randn(1024, HV, V, K, device=DEV) * 0.1
A, dtb = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
N = B * T
q, k = (torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
v = torch.randn(N, HV, V, device=DEV, dtype=torch.bfloat16)
f, b = (torch.randn(N, HV, device=DEV, dtype=torch.bfloat16) for _ in range(2))
o = torch.empty_like(v)
rw = K + 1 + 1 + V
rec = [torch.zeros(1024, T - 1, HV, rw, device=DEV) for _ in range(2)]
acc = torch.full((B,), 3, device=DEV, dtype=torch.int32)
idx = [torch.randperm(1024, device=DEV)[:B].to(torch.int32) for _ in range(12)]


def call(name, i):
    kw = dict(state_layout="vk", out=o)
    if name == "plain":
        kw.update(commit=False)
    elif name == "deferred":
        kw.update(replay_buffer=rec[0])
    elif name == "fused":
        kw.update(replay_buffer=rec[0], replay_prev=rec[1], accept_prev=acc)
    else:
        kw.update(commit=False, wide=True, **{p.split("=")[0]: int(p.split("=")[1]) for p in name[3:].split(";")})
    gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx[i], T, "gdn", None, **kw)


for name in variants:
    for i in range(10):
        call(name, i)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name in variants:
    call(name, 11)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", variants)
