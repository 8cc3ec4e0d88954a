"""Profile KDA decode at B=1 (Kimi K3 TP8: 12 heads x 128, safe gate, SGLang's V-major pool) beside the
state read + write floor kernel of ``bench_delta_rule.py`` under Nsight Compute (issue 4):

    PYTHONPATH=sgl-kernel/python ncu --clock-control none --profile-from-start off \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis python3 benchmark/kernels/prof_decode_b1.py

Three launches of each are profiled after 20 warm-up calls, each on another slot of a 1024-slot pool.
"""
import sys, torch
sys.path.insert(0, "benchmark/kernels")
from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton
import bench_delta_rule as bd
DEV = "cuda"
H, K, V = 12, 128, 128
pool = torch.randn(1024, H, V, K, device=DEV)
A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
B = 1
q, k, v = (torch.randn(B, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
f = torch.randn(B, H, K, device=DEV, dtype=torch.bfloat16)
b = torch.randn(B, H, device=DEV, dtype=torch.bfloat16)
o = torch.empty_like(v)
idx = [torch.tensor([i * 97 % 1024], device=DEV, dtype=torch.int32) for i in range(20)]
for i in range(20):
    gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx[i], 1, "kda", -5.0, state_layout="vk", commit=True, out=o)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for i in range(3):
    gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, idx[i + 5], 1, "kda", -5.0, state_layout="vk", commit=True, out=o)
    bd._state_copy_kernel[(K * V // 2048, B * H)](pool, idx[i + 10], pool.stride(0), pool.stride(1), HV=H, KV=K * V, BLOCK=2048, num_warps=4)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done")
