"""Experiment (issue 4, 2026-11-30): does a persistent form of the lanes kernel overlap the state write with the
compute? Plain GDN window (T=5) committing its final state, programs looping over (request, head, tile) items,
with (PREFETCH) or without prefetching the next item's state; against the lanes kernel in the same process.

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/exp_persistent_lanes.py 32

H200 result (2026-11-30-h200-lanes_persistent.json): no gain; kept only as the record of the attempt."""
import triton
import triton.language as tl
from sgl_hybrid_kernel.delta_rule.triton_lanes import _lanes_sum, _lanes_update


@triton.jit
def persist_kernel(qn_ptr, kn_ptr, d_ptr, bq_ptr, v_ptr, o_ptr, state_ptr, state_idx_ptr, s_slot, s_h, s_v: tl.constexpr,
                   TOTAL, T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BV: tl.constexpr, KL: tl.constexpr, V_FIRST: tl.constexpr, PREFETCH: tl.constexpr):
    KC: tl.constexpr = 4 * KL
    KB: tl.constexpr = K // KC
    NVT: tl.constexpr = V // BV
    o_c = tl.arange(0, BV)
    if V_FIRST:
        kidx = tl.arange(0, KB)[None, :, None] * KC + tl.arange(0, KC)[None, None, :] + o_c[:, None, None] * 0
        coff = o_c[:, None, None] * s_v + kidx
    else:
        kidx = tl.arange(0, KB)[:, None, None] * KC + tl.arange(0, KC)[None, None, :] + o_c[None, :, None] * 0
        coff = o_c[None, :, None] * s_v + kidx
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    it = pid
    i_v = it % NVT
    i_bh = it // NVT
    i_b = i_bh // HV
    i_hv = i_bh % HV
    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    S_next = tl.load(state_ptr + slot * s_slot + i_hv * s_h + i_v * BV * s_v + coff, mask=it < TOTAL)
    while it < TOTAL:
        i_v = it % NVT
        i_bh = it // NVT
        i_b = i_bh // HV
        i_hv = i_bh % HV
        i_h = i_hv // (HV // H)
        o_v = i_v * BV + o_c
        p_s = state_ptr + slot * s_slot + i_hv * s_h + i_v * BV * s_v + coff
        S = S_next
        nit = it + nprog
        if PREFETCH:
            nb = (nit // NVT) // HV
            nslot = tl.load(state_idx_ptr + nb, mask=nit < TOTAL, other=0).to(tl.int64)
            S_next = tl.load(state_ptr + nslot * s_slot + ((nit // NVT) % HV) * s_h + (nit % NVT) * BV * s_v + coff,
                             mask=nit < TOTAL)
        for t in tl.static_range(T):
            n = i_b * T + t
            q = tl.load(qn_ptr + (n * H + i_h) * K + kidx)
            k = tl.load(kn_ptr + (n * H + i_h) * K + kidx)
            d = tl.exp(tl.load(d_ptr + n * HV + i_hv))
            beta = tl.load(bq_ptr + (n * HV + i_hv) * 2)
            bqk = tl.load(bq_ptr + (n * HV + i_hv) * 2 + 1)
            v = tl.load(v_ptr + (n * HV + i_hv) * V + o_v).to(tl.float32)
            S, Sd, err = _lanes_update(S, k, v, d, beta, V_FIRST)
            o = _lanes_sum(Sd * q, V_FIRST) + bqk * err
            tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty))
        tl.store(p_s, S)
        if not PREFETCH:
            nb = (nit // NVT) // HV
            nslot = tl.load(state_idx_ptr + nb, mask=nit < TOTAL, other=0).to(tl.int64)
            S_next = tl.load(state_ptr + nslot * s_slot + ((nit // NVT) % HV) * s_h + (nit % NVT) * BV * s_v + coff,
                             mask=nit < TOTAL)
        slot = nslot
        it = nit


import json
import sys

import torch
sys.path.insert(0, "benchmark/kernels")
import bench_delta_rule as bd
from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton, prep_heads_per_program
from sgl_hybrid_kernel.delta_rule.triton_lanes import token_prep_kernel, lanes_v_first

DEV = "cuda"
B = int(sys.argv[1])
w = bd.gdn_verify_window(B)
H, HV, K, V, T, N = w.H, w.HV, w.K, w.V, w.T, w.N
pool, perms, q, k, v, a, b, A, dtb, o = w.pool, w.perms, w.q, w.k, w.v, w.a, w.b, w.A, w.dtb, w.o
qn, kn = (torch.empty(N, H, K, device=DEV) for _ in range(2)); dec = torch.empty(N, HV, device=DEV); bq = torch.empty(N, HV, 2, device=DEV)
hb = prep_heads_per_program(HV, N, 132)

def persist(r, nprog, prefetch, bv=16):
    token_prep_kernel[(N, HV // hb)](q, k, v, a, b, A, dtb, perms[r], qn, kn, dec, bq, bq, K ** -0.5, 0.0, 0, 0,
                                     T=T, H=H, HV=HV, K=K, V=V, BK=K, BVR=V, HB=hb, GATE=2, L2NORM=True, PDL=False, num_warps=2 if hb == 8 else 1)
    total = (V // bv) * B * HV
    persist_kernel[(min(nprog, total),)](qn, kn, dec, bq, v, o, pool, perms[r], pool.stride(0), pool.stride(1), pool.stride(2), total,
                                        T=T, H=H, HV=HV, K=K, V=V, BV=bv, KL=8, V_FIRST=lanes_v_first(), PREFETCH=prefetch, num_warps=1, num_stages=1)

def lanes(r):
    gated_delta_recurrent_triton(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", state_layout="vk", out=o, commit=True, value_tile=16, key_lanes=8)

# correctness vs lanes kernel on a copy
p0 = pool.clone(); lanes(0); o_ref = o.clone(); s_ref = pool[perms[0].long()].clone(); pool.copy_(p0)
persist(0, 132 * 12, True); print("prefetch rel", bd.rel(o.float(), o_ref.float()), bd.rel(pool[perms[0].long()], s_ref)); pool.copy_(p0)
persist(0, 132 * 12, False); print("noprefetch rel", bd.rel(o.float(), o_ref.float()), bd.rel(pool[perms[0].long()], s_ref)); pool.copy_(p0)
res = {}
todo = [("lanes_commit", lanes)] + [(f"persist_p{int(pf)}_x{m}", (lambda pf, m: lambda r: persist(r, 132 * m, pf))(pf, m)) for pf in (True, False) for m in (8, 12, 16)]
plain = lambda r: gated_delta_recurrent_triton(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", state_layout="vk", out=o, commit=False, value_tile=16, key_lanes=8)
todo.append(("lanes_plain", plain))
for name, fn in todo + todo[::-1]:
    res.setdefault(name, []).append(bd.graph_time_us(fn))
print(json.dumps({kk: round(min(vv), 2) for kk, vv in res.items()}, indent=1))
