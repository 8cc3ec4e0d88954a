"""Where the deferred-commit verify window loses time against the plain one (issue 4, lanes kernel,
Qwen3.8 GDN T=5, 48 value heads x 128, SGLang's V-major pool, graph replay, states from a pool >> L2):

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/prof_deferred_gap.py [B] [--out FILE]

Times, in one process: the plain window (PLAIN binary, no state written); the all-modes binary doing
the same plain work (snapshot mode with every snapshot index -1: no state written); the plain window
committing its final state (PLAIN binary, one state write at the end); the deferred window (all-modes
binary, token 0's state written after token 0, records from the prologue); and the fused replay.
"""
import json
import sys

import torch

sys.path.insert(0, "benchmark/kernels")
import bench_delta_rule as bd  # noqa: E402
from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton  # noqa: E402

DEV = "cuda"
B = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else 32
w = bd.gdn_verify_window(B)
H, HV, K, V, T, N, slots = w.H, w.HV, w.K, w.V, w.T, w.N, w.slots
pool, perms, q, k, v, a, b, A, dtb, o = w.pool, w.perms, w.q, w.k, w.v, w.a, w.b, w.A, w.dtb, w.o
rb = [torch.zeros(slots, T - 1, HV, K + 2 + V, device=DEV) for _ in range(2)]
acc = torch.randint(1, T + 1, (B,), device=DEV, dtype=torch.int32)
snap = torch.empty(8, HV, V, K, device=DEV)
none_idx = torch.full((N,), -1, device=DEV, dtype=torch.int32)
kw = dict(state_layout="vk", out=o, value_tile=16, key_lanes=8)
cases = {
    "plain": dict(commit=False),
    "allmodes_no_write": dict(commit=False, inter_state=snap, inter_indices=none_idx),
    "plain_commit_at_end": dict(commit=True),
    "deferred": dict(replay_buffer=rb[0]),
}


def run(name, r):
    extra = dict(cases[name]) if name in cases else dict(replay_buffer=rb[r % 2], replay_prev=rb[1 - r % 2], accept_prev=acc)
    gated_delta_recurrent_triton(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", **kw, **extra)


res = {"B": B, "rot": bd.ROT, "us": {}}
names = list(cases) + ["fused"]
for name in names + names[::-1]:
    res["us"].setdefault(name, []).append(bd.graph_time_us(lambda r: run(name, r)))
print(json.dumps(res, indent=1))
if "--out" in sys.argv:
    json.dump(res, open(sys.argv[sys.argv.index("--out") + 1], "w"), indent=1)
