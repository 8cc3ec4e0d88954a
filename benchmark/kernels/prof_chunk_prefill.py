"""Profile one chunk-64 KDA prefill call (ours and fla's) under Nsight Compute (issue 4).

Kimi K3 at TP8 (12 KDA heads x 128, safe gate, BF16 activations), as ``bench_delta_rule_chunk.py``'s
``bench_chunk_state``. Both calls are compiled and warmed first; only the calls between
``cudaProfilerStart`` / ``cudaProfilerStop`` are profiled, so run it as::

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy ... \
        python3 benchmark/kernels/prof_chunk_prefill.py --shape 1x65536

Needs a CUDA device and fla-core (only for ``--fla``).
"""

from __future__ import annotations

import argparse

import torch

from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton

LB = -5.0


def kimi_k3_prefill_inputs(B: int, T: int, dev: str = "cuda"):
    """``(q, k, v, f, b, A_log, dt_bias, cu_seqlens, state_pool, state_indices)`` of a Kimi K3 TP8 prefill
    (12 KDA heads x 128, BF16 activations) of ``B`` sequences of ``T`` tokens, seed 0; the pool holds one
    FP32 slot per sequence."""
    H, K, V, N = 12, 128, 128, B * T
    torch.manual_seed(0)
    q, k, v = (torch.randn(N, H, d, device=dev, dtype=torch.bfloat16) for d in (K, K, V))
    f = torch.randn(N, H, K, device=dev, dtype=torch.bfloat16)
    b = torch.randn(N, H, device=dev, dtype=torch.bfloat16)
    A, dtb = torch.rand(H, device=dev), torch.randn(H * K, device=dev)
    cu = torch.arange(0, N + 1, T, device=dev, dtype=torch.int32)
    pool = torch.randn(B, H, K, V, device=dev) * 0.1
    idx = torch.arange(B, device=dev, dtype=torch.int32)
    return q, k, v, f, b, A, dtb, cu, pool, idx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="1x65536", help="BxT")
    ap.add_argument("--fla", action="store_true", help="also profile fla's chunk_kda")
    args = ap.parse_args()
    B, T = (int(x) for x in args.shape.split("x"))
    H, K, V, N = 12, 128, 128, B * T
    q, k, v, f, b, A, dtb, cu, pool, idx = kimi_k3_prefill_inputs(B, T)

    def ours():
        return gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB, plan=ChunkOverrides(method="parallel", tf32=True, scratch_dtype=torch.bfloat16, group_scan=False))

    calls = [ours]
    if args.fla:
        from fla.ops.kda import chunk_kda

        pool_f = pool.clone()

        def fla():
            return chunk_kda(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, H, V), f.view(1, N, H, K),
                             b.view(1, N, H), scale=K ** -0.5, initial_state=pool_f, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                             safe_gate=True, lower_bound=LB, A_log=A, dt_bias=dtb, cu_seqlens=cu.long())

        calls.append(fla)
    for fn in calls:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("done", args.shape)


if __name__ == "__main__":
    main()
