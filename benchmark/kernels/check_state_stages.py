"""Whether the chunk-64 state pass gives the shipped table's outputs with other pipelining stages or tiles
(issue 4).

Run on a CUDA device::

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/check_state_stages.py 2x1024 table,fst1,fst2,nofuse

It prints each variant's relative difference (outputs, final states) to the first one; Kimi K3 TP8 shapes
(12 KDA heads x 128), BF16 scratch. On the H200 (Triton 3.6) the state pass with one pipelining stage gives
wrong results and reads shared memory out of bounds under compute-sanitizer (a miscompile; the sm_90 table
runs 3-4 stages): ``benchmark/results/2026-12-02-h200-state_stages_check.txt``.
"""
from __future__ import annotations

import dataclasses
import sys

import torch

from sgl_hybrid_kernel.delta_rule.chunk.rules import target_chunk_launch
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides
from sgl_hybrid_kernel.platform import Target

from prof_chunk_prefill import kimi_k3_prefill_inputs  # noqa: E402 (beside this script)

# launch-table overrides by name: fused KDA state pass on 1 / 2 stages, at 16 columns, and unfused
VARIANTS = dict(
    table={},
    fst1=dict(state_stages_fused=1),
    fst2=dict(state_stages_fused=2),
    fbv16=dict(fuse_output_kda_bv=(16,), state_bv_costs=((16, 1.0),)),
    fbv16st1=dict(fuse_output_kda_bv=(16,), state_bv_costs=((16, 1.0),), state_stages_fused=1),
    nofuse=dict(fuse_output_kda_bv=()),
    nofuse_st1=dict(fuse_output_kda_bv=(), state_stages=1, state_stages_lowp=1),
)


def main():
    dev = "cuda"
    base = target_chunk_launch(Target.of(torch.device(dev)))
    B, T = (int(x) for x in sys.argv[1].split("x"))
    names = sys.argv[2].split(",")
    q, k, v, f, b, A, dtb, cu, pool0, idx = kimi_k3_prefill_inputs(B, T, dev)
    ref = None
    for name in names:  # each variant is a plan: the table row with the variant's fields replaced
        plan = ChunkOverrides(method="parallel", tf32=True, scratch_dtype=torch.bfloat16, group_scan=False,
                              launch=dataclasses.replace(base, **VARIANTS[name]))
        pool = pool0.clone()
        o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=-5.0, plan=plan).float()
        torch.cuda.synchronize()
        if ref is None:
            ref = (o, pool.clone())
        do = ((o - ref[0]).norm() / ref[0].norm()).item()
        ds = ((pool - ref[1]).norm() / ref[1].norm()).item()
        print(name, f"o vs first {do:.2e} state vs first {ds:.2e} nan {bool(o.isnan().any())}", flush=True)


if __name__ == "__main__":
    main()
