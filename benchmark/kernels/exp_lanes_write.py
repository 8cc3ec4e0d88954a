"""Experiment (issue 4, 2026-12-01): why the state write of a GDN verify window on the lanes kernel does not
overlap its compute (plain window 57.9 us, the same window committing its final state 82.6 us at B=32 while
the state read + write floor is 53.8 us). A trimmed copy of the lanes kernel's PLAIN path (GDN, T tokens,
optional final commit) with switches:

- ``LOAD_EV`` / ``STORE_CM``: eviction policy of the state load, cache modifier of the state store;
- ``FACTOR``: the head's scalar decay kept outside the state (``S = D * U``, ``U += k (beta err / D)^T``):
  3 FMAs per state element and token instead of a multiply, two FMAs and an add-multiply;
- launch options ``maxnreg`` (occupancy) and ``num_warps`` 1.

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/exp_lanes_write.py [B] [--out FILE]
    PYTHONPATH=sgl-kernel/python ncu ... python3 benchmark/kernels/exp_lanes_write.py 32 --ncu NAME,NAME

Times (graph replay, states from HBM) the production lanes kernel plain / committing for T = 1..5, then the
variants, each checked against the production kernel's output and state."""
import json
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "benchmark/kernels")
import bench_delta_rule as bd  # noqa: E402
from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton, prep_heads_per_program  # noqa: E402
from sgl_hybrid_kernel.delta_rule.triton_lanes import _lanes_col, _lanes_sum, _lanes_update, lanes_v_first, token_prep_kernel  # noqa: E402


@triton.jit
def exp_kernel(qn_ptr, kn_ptr, d_ptr, bq_ptr, v_ptr, o_ptr, state_ptr, state_idx_ptr, s_slot, s_h, s_v: tl.constexpr,
               T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               KL: tl.constexpr, V_FIRST: tl.constexpr, COMMIT: tl.constexpr, FACTOR: tl.constexpr,
               LOAD_EV: tl.constexpr, STORE_CM: tl.constexpr, PREFETCH: tl.constexpr, STORE_AT0: tl.constexpr):
    KC: tl.constexpr = 4 * KL
    KB: tl.constexpr = K // KC
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    o_c = tl.arange(0, BV)
    o_v = i_v * BV + o_c
    if V_FIRST:
        kidx = tl.arange(0, KB)[None, :, None] * KC + tl.arange(0, KC)[None, None, :] + o_c[:, None, None] * 0
        off = i_hv * s_h + o_v[:, None, None] * s_v + kidx
    else:
        kidx = tl.arange(0, KB)[:, None, None] * KC + tl.arange(0, KC)[None, None, :] + o_c[None, :, None] * 0
        off = i_hv * s_h + o_v[None, :, None] * s_v + kidx
    slot = tl.load(state_idx_ptr + i_b).to(tl.int64)
    p_s = state_ptr + slot * s_slot + off
    S = tl.load(p_s, eviction_policy=LOAD_EV)
    D = 1.0
    n = i_b * T
    q = tl.load(qn_ptr + (n * H + i_h) * K + kidx)
    k = tl.load(kn_ptr + (n * H + i_h) * K + kidx)
    d = tl.exp(tl.load(d_ptr + n * HV + i_hv))
    beta = tl.load(bq_ptr + (n * HV + i_hv) * 2)
    bqk = tl.load(bq_ptr + (n * HV + i_hv) * 2 + 1)
    v = tl.load(v_ptr + (n * HV + i_hv) * V + o_v).to(tl.float32)
    for t in tl.static_range(T):
        n = i_b * T + t
        if t > 0:
            if not PREFETCH:
                q = tl.load(qn_ptr + (n * H + i_h) * K + kidx)
                k = tl.load(kn_ptr + (n * H + i_h) * K + kidx)
                d = tl.exp(tl.load(d_ptr + n * HV + i_hv))
                beta = tl.load(bq_ptr + (n * HV + i_hv) * 2)
                bqk = tl.load(bq_ptr + (n * HV + i_hv) * 2 + 1)
                v = tl.load(v_ptr + (n * HV + i_hv) * V + o_v).to(tl.float32)
        if PREFETCH:
            if t + 1 < T:
                qx = tl.load(qn_ptr + ((n + 1) * H + i_h) * K + kidx)
                kx = tl.load(kn_ptr + ((n + 1) * H + i_h) * K + kidx)
                dx = tl.exp(tl.load(d_ptr + (n + 1) * HV + i_hv))
                betax = tl.load(bq_ptr + ((n + 1) * HV + i_hv) * 2)
                bqkx = tl.load(bq_ptr + ((n + 1) * HV + i_hv) * 2 + 1)
                vx = tl.load(v_ptr + ((n + 1) * HV + i_hv) * V + o_v).to(tl.float32)
        if FACTOR:
            D = D * d
            err = v - D * _lanes_sum(S * k, V_FIRST)
            o = D * _lanes_sum(S * q, V_FIRST) + bqk * err
            S = S + k * _lanes_col(beta * err / D, V_FIRST)
        else:
            S, Sd, err = _lanes_update(S, k, v, d, beta, V_FIRST)
            o = _lanes_sum(Sd * q, V_FIRST) + bqk * err
        tl.store(o_ptr + (n * HV + i_hv) * V + o_v, o.to(o_ptr.dtype.element_ty))
        if STORE_AT0:
            if t == 0:
                if FACTOR:
                    S = S * D
                    D = 1.0
                tl.store(p_s, S, cache_modifier=STORE_CM)
        if PREFETCH:
            if t + 1 < T:
                q, k, d, beta, bqk, v = qx, kx, dx, betax, bqkx, vx
    if COMMIT:
        if FACTOR:
            S = S * D
        tl.store(p_s, S, cache_modifier=STORE_CM)


@triton.jit
def copy_kernel(pool_ptr, idx_ptr, s_slot, s_h, HV: tl.constexpr, KV: tl.constexpr, BLOCK: tl.constexpr,
                LOAD_EV: tl.constexpr, STORE_CM: tl.constexpr):
    """The bench's state read + write floor (bench_delta_rule._state_copy_kernel) with cache hints."""
    i_b = tl.program_id(1) // HV
    i_h = tl.program_id(1) % HV
    slot = tl.load(idx_ptr + i_b).to(tl.int64)
    off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p = pool_ptr + slot * s_slot + i_h * s_h + off
    tl.store(p, tl.load(p, eviction_policy=LOAD_EV), cache_modifier=STORE_CM)


def copy_floor_us(pool, perms, load_ev, store_cm, blk=2048, warps=4):
    _, HV, K, V = pool.shape
    return bd.graph_time_us(lambda r: copy_kernel[(K * V // blk, perms[0].shape[0] * HV)](
        pool, perms[r], pool.stride(0), pool.stride(1), HV=HV, KV=K * V, BLOCK=blk, LOAD_EV=load_ev, STORE_CM=store_cm,
        num_warps=warps))


B = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else 32
DEV = "cuda"
res = {"B": B, "us": {}, "check": {}}


def window(T):
    w = bd.gdn_verify_window(B, T=T)
    w.qn, w.kn = (torch.empty(w.N, w.H, w.K, device=DEV) for _ in range(2))
    w.dec = torch.empty(w.N, w.HV, device=DEV)
    w.bq = torch.empty(w.N, w.HV, 2, device=DEV)
    w.hb = prep_heads_per_program(w.HV, w.N, 132)
    return w


def prod(w, r, commit):
    gated_delta_recurrent_triton(w.q, w.k, w.v, w.a, w.b, w.A, w.dtb, w.pool, w.perms[r], w.T, "gdn", state_layout="vk",
                                 out=w.o, commit=commit, value_tile=16, key_lanes=8)


def exp(w, r, commit=True, factor=False, load_ev="", store_cm="", maxnreg=None, bv=16, prefetch=False, at0=False):
    token_prep_kernel[(w.N, w.HV // w.hb)](w.q, w.k, w.v, w.a, w.b, w.A, w.dtb, w.perms[r], w.qn, w.kn, w.dec, w.bq, w.bq,
                                           w.K ** -0.5, 0.0, 0, 0, T=w.T, H=w.H, HV=w.HV, K=w.K, V=w.V, BK=w.K, BVR=w.V,
                                           HB=w.hb, GATE=2, L2NORM=True, PDL=False, num_warps=2 if w.hb == 8 else 1)
    kw = {} if maxnreg is None else dict(maxnreg=maxnreg)
    return exp_kernel[(w.V // bv, w.B * w.HV)](w.qn, w.kn, w.dec, w.bq, w.v, w.o, w.pool, w.perms[r], w.pool.stride(0),
                                        w.pool.stride(1), w.pool.stride(2), T=w.T, H=w.H, HV=w.HV, K=w.K, V=w.V, BV=bv,
                                        KL=8, V_FIRST=lanes_v_first(), COMMIT=commit, FACTOR=factor, LOAD_EV=load_ev,
                                        STORE_CM=store_cm, PREFETCH=prefetch, STORE_AT0=at0, num_warps=1, num_stages=1, **kw)


VARIANTS = {
    "copy_pf": dict(prefetch=True),
    "plain_pf": dict(commit=False, prefetch=True),
    "cs": dict(prefetch=True, store_cm=".cs"),
    "ev_first_cs": dict(prefetch=True, load_ev="evict_first", store_cm=".cs"),
    "ev_last_cs": dict(prefetch=True, load_ev="evict_last", store_cm=".cs"),
    "ev_first_wt": dict(prefetch=True, load_ev="evict_first", store_cm=".wt"),
    "factor": dict(prefetch=True, factor=True),
    "factor_plain": dict(commit=False, prefetch=True, factor=True),
    "factor_cs": dict(prefetch=True, factor=True, store_cm=".cs"),
    "factor_ev_first_cs": dict(prefetch=True, factor=True, load_ev="evict_first", store_cm=".cs"),
    "at0_ev_first_cs": dict(commit=False, at0=True, prefetch=True, load_ev="evict_first", store_cm=".cs"),
    "at0_factor_ev_first_cs": dict(commit=False, at0=True, prefetch=True, factor=True, load_ev="evict_first", store_cm=".cs"),
    "nopf_factor_ev_first_cs": dict(factor=True, load_ev="evict_first", store_cm=".cs"),
}

w5 = window(5)
if "--ncu" in sys.argv:
    names = sys.argv[sys.argv.index("--ncu") + 1].split(",")
    calls = {"prod_plain": lambda r: prod(w5, r, False), "prod_commit": lambda r: prod(w5, r, True)}
    calls.update({n: (lambda kw: lambda r: exp(w5, r, **kw))(VARIANTS[n]) for n in VARIANTS})
    for n in names:
        for r in range(5):
            calls[n](r)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for n in names:
        calls[n](6)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    sys.exit(0)

# checks: every variant against the production kernel (same inputs, same slots)
p0 = w5.pool.clone()
prod(w5, 0, True)
o_ref, s_ref = w5.o.clone(), w5.pool[w5.perms[0].long()].clone()
for n, kw in VARIANTS.items():
    w5.pool.copy_(p0)
    try:
        ck = exp(w5, 0, **kw)
    except Exception as e:  # an option this Triton lacks: report and go on
        res["check"][n] = f"error {type(e).__name__}: {str(e)[:160]}"
        continue
    res["check"][n] = dict(out_rel=bd.rel(w5.o.float(), o_ref.float()),
                           state_rel=bd.rel(w5.pool[w5.perms[0].long()], s_ref if kw.get("commit", True) else p0[w5.perms[0].long()]))
    res.setdefault("regs_spills", {})[n] = [getattr(ck, "n_regs", None), getattr(ck, "n_spills", None)]
w5.pool.copy_(p0)
print(json.dumps(res["check"], indent=1), res.get("regs_spills"), flush=True)

todo = []
for T in (1, 2, 3, 4, 5):
    w = w5 if T == 5 else window(T)
    todo += [(f"prod_plain_t{T}", (lambda w: lambda r: prod(w, r, False))(w)),
             (f"prod_commit_t{T}", (lambda w: lambda r: prod(w, r, True))(w))]
res["state_rw_floor_us"] = bd._state_copy_us(w5.pool, w5.perms)
kda_pool = torch.randn(1024, 12, 128, 128, device=DEV)
kda_perms = [torch.randperm(1024, device=DEV)[:B].to(torch.int32) for _ in range(bd.ROT)]
for tag, pool, perms in (("gdn", w5.pool, w5.perms), ("kda", kda_pool, kda_perms)):
    for ev, cm in (("", ""), ("evict_first", ""), ("", ".cs"), ("evict_first", ".cs"), ("evict_first", ".wt")):
        for blk, warps in ((2048, 4), (4096, 8)):
            key = f"copy_floor_{tag}_{ev or 'normal'}_{cm or 'wb'}_blk{blk}"
            res.setdefault("copy_floor_us", {})[key] = [round(copy_floor_us(pool, perms, ev, cm, blk, warps), 2) for _ in range(2)]
            print(key, res["copy_floor_us"][key], flush=True)
del kda_pool
todo += [(n, (lambda kw: lambda r: exp(w5, r, **kw))(kw)) for n, kw in VARIANTS.items() if isinstance(res["check"].get(n), dict)]
for name, fn in todo + todo[::-1]:
    res["us"].setdefault(name, []).append(round(bd.graph_time_us(fn), 2))
    print(name, res["us"][name], flush=True)
res["min_us"] = {k: min(v) for k, v in res["us"].items()}
print(json.dumps(res["min_us"], indent=1))
if "--out" in sys.argv:
    json.dump(res, open(sys.argv[sys.argv.index("--out") + 1], "w"), indent=1)
