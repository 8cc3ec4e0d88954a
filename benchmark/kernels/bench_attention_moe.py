"""H200 benchmark of the issue-5 kernels (MLA decode, DCP merge, AttnRes + RMSNorm, MoE routing, QSA), one run.

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/bench_attention_moe.py --out DIR [--only a,b] [--sweep]

Sections (each writes ``DIR/kernels_<section>.json`` and survives the others failing):

* ``correctness``: every kernel on the GPU in BF16 / FP8 against the plain-torch
  references (fresh random inputs, NaN-prefilled outputs), the AttnRes running
  residual bit-exact in BF16, routing ids equal to the reference.
* ``mla``: the copy ceiling (device-to-device copy, read + write bytes), then MLA
  decode (12 heads, latent 512 + rope 64, page size 1) timed by CUDA-graph replay
  over rotated caches (8 rotations: the B=1 cache, 38 MB, would sit in the 60 MB
  L2), against the naive torch baseline (bmm - softmax - bmm over a contiguous
  latent cache, graph replay) and the single-partition run of the same kernel.
  Roofline = cache bytes / copy ceiling. ``--sweep`` adds tiles and partition counts.
* ``attn_res``: fused AttnRes + RMSNorm vs the unfused torch sequence, hidden 7168, 8 banked rows.
* ``routing``: the two-launch routing vs a plain torch pipeline (scores, torch.topk,
  renormalise, sort + bincount + cumsum layout), Kimi K3 and Qwen configs, M = 5/40/64.
* ``qsa``: dense special case vs sparse path at C32 x 5 verification positions, 2,000 visible tokens,
  with the read-only gather ceiling of the same K/V bytes through the same page tables, the merge
  launches alone, and (``QSA_PREV_KERNEL=file``: a previous ``triton_qsa.py`` + wrapper in one file)
  the previous kernel's launches in the same run. ``--sweep`` adds partitions / tiles / merge kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
import triton
import triton.language as tl

from sgl_hybrid_kernel.attn_res.fused import attn_res_rmsnorm_triton
from sgl_hybrid_kernel.attn_res.fused_reference import attn_res_rmsnorm_reference
from sgl_hybrid_kernel.dcp.merge import merge_partial_attention_triton
from sgl_hybrid_kernel.dcp.reference import merge_partial_attention_reference
from sgl_hybrid_kernel.mla.attention import choose_num_splits, choose_tile, default_tile, mla_attention_paged_triton
from sgl_hybrid_kernel.mla.reference import mla_attention_paged_reference
from sgl_hybrid_kernel.moe.routing import fused_moe_routing_triton
from sgl_hybrid_kernel.moe.routing_reference import expert_sorted_layout_reference, route_tokens_reference
from sgl_hybrid_kernel.qsa.attention import choose_qsa_splits, dense_programs_per_sm
from sgl_hybrid_kernel.qsa.attention import default_tile as qsa_tile
from sgl_hybrid_kernel.qsa.attention import qsa_attention_triton
from sgl_hybrid_kernel.qsa.reference import qsa_attention_reference

DEV = "cuda"
BF16 = torch.bfloat16
R, P = 512, 64


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def graph_time_us(fn_per_rot, rot, reps=30):
    """Capture ``rot`` calls in one CUDA graph; median replay time per call in µs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for r in range(rot):
            fn_per_rot(r)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(rot):
            fn_per_rot(r)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / rot)
    times.sort()
    del g
    return times[len(times) // 2]


def copy_ceiling_tbs():
    x = torch.empty(2 * 1024**3 // 4, dtype=torch.float32, device=DEV).uniform_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    del x, y
    return 2 * 2 * 1024**3 / (ms * 1e-3) / 1e12


# ----------------------------------------------------------------------------- correctness
def sec_correctness():
    torch.manual_seed(0)
    out = {}
    # MLA decode / extend, BF16 and FP8 caches, Kimi K3 dims, head counts
    lens = [1, 700, 3000, 0, 129]
    B, ps = len(lens), 16
    max_pages = max(-(-L // ps) for L in lens)
    pages = B * max_pages + 4
    cache = torch.randn(pages, ps, R + P, device=DEV)
    pt = torch.randperm(pages, device=DEV)[: B * max_pages].view(B, max_pages).int()
    kv_lens = torch.tensor(lens, device=DEV, dtype=torch.int32)
    worst = {}
    for H in (1, 4, 8, 12, 16, 32, 64, 128):
        q = torch.randn(B, H, R + P, device=DEV).to(BF16)
        ref = mla_attention_paged_reference(q.float(), cache.to(BF16).float(), pt, kv_lens, 0.07, ps)
        for splits in (1, 7):
            o = torch.full((B, H, R), float("nan"), device=DEV, dtype=BF16)
            lse = torch.full((B, H), float("nan"), device=DEV)
            hb, rows = choose_tile(H, 1)
            mla_attention_paged_triton(q, cache.to(BF16), pt, kv_lens, 0.07, ps, num_splits=splits, out=o, lse_out=lse,
                                       **default_tile("cuda", rows, R))
            ok = kv_lens > 0
            worst[f"h{H}_s{splits}"] = (rel(o[ok], ref[0][ok]), float((lse[ok] - ref[1][ok]).abs().max()),
                                        bool(torch.equal(o[~ok].float(), torch.zeros_like(o[~ok].float()))))
    out["mla_decode_bf16_rel_err_lse_abs_err_empty_is_zero"] = worst
    q = torch.randn(B, 12, R + P, device=DEV).to(BF16)
    scale = float(cache.abs().max()) / 448.0
    fp8 = (cache / scale).to(torch.float8_e4m3fn)
    ref8 = mla_attention_paged_reference(q.float(), fp8.float(), pt, kv_lens, 0.07, ps, kv_scale=scale)
    o8, l8 = mla_attention_paged_triton(q, fp8, pt, kv_lens, 0.07, ps, kv_scale=scale, num_splits=4,
                                        **default_tile("cuda", 16, R, kv_fp8=True))
    ok = kv_lens > 0
    out["mla_decode_fp8_rel_err"] = rel(o8[ok], ref8[0][ok])
    qo = torch.tensor([0, 1, 40, 41, 41, 170], device=DEV, dtype=torch.int32)  # new rows per request (<= kv_lens)
    qe = torch.randn(170, 12, R + P, device=DEV).to(BF16)
    lens_e = torch.tensor([1, 700, 3000, 0, 129], device=DEV, dtype=torch.int32)
    refe = mla_attention_paged_reference(qe.float(), cache.to(BF16).float(), pt, lens_e, 0.07, ps, qo)
    oe, le = mla_attention_paged_triton(qe, cache.to(BF16), pt, lens_e, 0.07, ps, qo, max_seqlen_q=129, num_splits=2,
                                        **default_tile("cuda", 64, R))
    out["mla_extend_rel_err"] = rel(oe, refe[0])
    # DCP merge with empty shards
    o_parts = torch.randn(8, 64, 12, R, device=DEV)
    lse_parts = torch.randn(8, 64, 12, device=DEV)
    lse_parts[3] = float("-inf")
    o_parts[3] = float("nan")
    lse_parts[:, 5] = float("-inf")
    mo, ml = merge_partial_attention_triton(o_parts, lse_parts)
    ro, rl = merge_partial_attention_reference(o_parts, lse_parts)
    out["dcp_merge_rel_err"] = rel(mo, ro)
    out["dcp_merge_nan_free"] = bool(not mo.isnan().any() and not ml.isnan().any())
    # AttnRes: running residual bit-exact in BF16
    T, NB, D = 33, 9, 7168
    prefix, addend = (torch.randn(T, D, device=DEV) * 30).to(BF16), torch.randn(T, D, device=DEV).to(BF16)
    bank = torch.randn(T, NB, D, device=DEV).to(BF16)
    nw, proj, ow = torch.rand(D, device=DEV) + 0.5, torch.randn(1, D, device=DEV) * 0.02, (torch.rand(D, device=DEV) + 0.5).to(BF16)
    bk, br = bank.clone(), bank.clone()
    fo, fh = attn_res_rmsnorm_triton(prefix, addend, bk, 8, nw, proj, ow, 1e-6, write_bank=True)
    ro, rh = attn_res_rmsnorm_reference(prefix, addend, br, 8, nw, proj, ow, 1e-6, write_bank=True)
    out["attn_res_head_bit_exact_bf16"] = bool(torch.equal(fh, rh) and torch.equal(bk, br))
    out["attn_res_normed_rel_err_bf16"] = rel(fo, ro)
    # routing ids vs reference (Kimi K3 and Qwen configs, with NaN / inf rows)
    for name, E, k, cfg in (("k3", 896, 16, dict(scoring_func="sigmoid", shared_expert_weight=1.0, routed_scaling_factor=2.8)),
                            ("qwen", 512, 10, dict(scoring_func="softmax", shared_expert_weight=1.0))):
        logits = torch.randn(64, E, device=DEV)
        logits[3] = float("nan")
        logits[4, :100] = 1.0
        bias = torch.randn(E, device=DEV) * 0.01 if name == "k3" else None
        r = fused_moe_routing_triton(logits, k, correction_bias=bias, **cfg)
        w, ids = route_tokens_reference(logits, k, correction_bias=bias, **cfg)
        lay = expert_sorted_layout_reference(ids, E + 1, 16)
        fin = torch.isfinite(logits).all(-1)
        out[f"routing_{name}_ids_equal"] = bool(torch.equal(r.ids, ids))
        out[f"routing_{name}_layout_equal"] = all(bool(torch.equal(a, b)) for a, b in zip(lay, (r.sorted_ids, r.block_expert, r.num_rows)))
        out[f"routing_{name}_weights_max_abs_err"] = float((r.weights[fin] - w[fin]).abs().max())
    # QSA dense == sparse == reference
    Bq, Tq, Hq, Hkv, Dh, ratio = 6, 5, 24, 2, 128, 4
    Lq = [2000, 37, 1500, 5, 64, 900]
    slots = Bq * 2048
    kc = torch.randn(slots, Hkv, Dh, device=DEV).to(BF16)
    vc = torch.randn(slots, Hkv, Dh, device=DEV).to(BF16)
    ptq = torch.randperm(slots, device=DEV)[: Bq * 2048].view(Bq, 2048).int()
    kvq = torch.tensor(Lq, device=DEV, dtype=torch.int32)
    qoq = torch.arange(0, (Bq + 1) * Tq, Tq, device=DEV, dtype=torch.int32)
    qq = torch.randn(Bq * Tq, Hq, Dh, device=DEV).to(BF16)
    idx = torch.full((Bq * Tq, 512), -1, device=DEV, dtype=torch.int32)
    for b, L in enumerate(Lq):
        for t in range(Tq):
            nvis = -(-(L - Tq + t + 1) // ratio)
            idx[b * Tq + t, :nvis] = torch.randperm(nvis, device=DEV).int()
    refq = qsa_attention_reference(qq.float(), kc.float(), vc.float(), ptq, kvq, qoq, 0.088)
    dq = qsa_attention_triton(qq, kc, vc, ptq, kvq, qoq, 0.088, Tq, 1, None, ratio, **qsa_tile("cuda", False))
    sq = qsa_attention_triton(qq, kc, vc, ptq, kvq, qoq, 0.088, Tq, 1, idx, ratio, num_splits=2, **qsa_tile("cuda", True))
    dq4 = qsa_attention_triton(qq, kc, vc, ptq, kvq, qoq, 0.088, Tq, 1, None, ratio, num_splits=4, **qsa_tile("cuda", False))
    out["qsa_dense_rel_err"], out["qsa_sparse_rel_err"] = rel(dq[0], refq[0]), rel(sq[0], refq[0])
    out["qsa_dense_4_partitions_rel_err"] = rel(dq4[0], refq[0])
    for name, kw in (("dcp_merge", dict(merge_block_h=0)), ("qsa_merge_8_heads", dict(merge_block_h=8)),
                     ("qsa_merge_3_partitions", dict(num_splits=3)),
                     ("16_partitions", dict(num_splits=16))):  # 16: partitions past the short requests stay empty
        nan_o = torch.full_like(dq[0], float("nan"))
        kw = {**qsa_tile("cuda", False), "num_splits": 4, "block_indices": None, **kw}
        got = qsa_attention_triton(qq, kc, vc, ptq, kvq, qoq, 0.088, Tq, 1, compress_ratio=ratio, out=nan_o, **kw)
        out[f"qsa_dense_{name}_rel_err"] = rel(got[0], refq[0])
        out[f"qsa_dense_{name}_lse_max_abs_err"] = float((got[1] - refq[1]).abs().max())
    out["qsa_dense_lse_max_abs_err"] = float((dq[1] - refq[1]).abs().max())
    return out


# ----------------------------------------------------------------------------- MLA decode
def _mla_setup(B, L, rot, dtype=BF16):
    """``rot`` disjoint token-slot page tables over one pool (page size 1), and contiguous caches for the baseline."""
    pool = torch.randn(rot * B * L, R + P, device=DEV).to(dtype) if dtype != torch.float8_e4m3fn else \
        torch.randn(rot * B * L, R + P, device=DEV).to(BF16).to(torch.float8_e4m3fn)
    perm = torch.randperm(rot * B * L, device=DEV, dtype=torch.int64)
    tables = [perm[r * B * L : (r + 1) * B * L].view(B, L).to(torch.int32).sort(dim=1).values for r in range(rot)]
    return pool, tables


def sec_mla(ceiling, sweep):
    rows = []
    H = 12
    for B, L, rot in ((32, 32768, 2), (1, 32768, 8), (32, 1024, 8), (8, 8192, 8)):
        pool, tables = _mla_setup(B, L, rot)
        kv_lens = torch.full((B,), L, device=DEV, dtype=torch.int32)
        q = torch.randn(B, H, R + P, device=DEV).to(BF16)
        o = torch.empty(B, H, R, device=DEV, dtype=BF16)
        lse = torch.empty(B, H, device=DEV)
        bytes_ = B * L * (R + P) * 2
        roof_us = bytes_ / (ceiling * 1e12) * 1e6
        auto = choose_num_splits(B, H, L)
        tile = default_tile("cuda", 16, R)
        ws = (torch.empty(B, H, 128, R, device=DEV), torch.empty(B, H, 128, device=DEV))

        def run(splits, **kw):
            t = dict(tile)
            t.update(kw)
            return graph_time_us(lambda r: mla_attention_paged_triton(q, pool, tables[r], kv_lens, 0.07, 1, num_splits=splits,
                                                                       out=o, lse_out=lse, workspace=ws, **t), rot)

        repeats = sorted(run(auto) for _ in range(3))  # three graph medians: the run-to-run spread
        ours = repeats[1]
        single = run(1)
        # naive torch baseline over a contiguous latent cache (bmm - softmax - bmm), same rotations
        cont = [pool[tables[r].long()] for r in range(min(rot, 2 if B * L * rot > 2**26 else rot))]
        nrot = len(cont)

        def naive(r):
            kv = cont[r]
            s = torch.bmm(q, kv.transpose(1, 2)).float() * 0.07
            p = torch.softmax(s, -1).to(BF16)
            torch.bmm(p, kv[:, :, :R], out=o)

        base = graph_time_us(naive, nrot)
        del cont
        row = dict(B=B, L=L, heads=H, splits=auto, ours_us=ours, ours_repeats_us=repeats, single_partition_us=single, naive_torch_us=base,
                   roofline_us=roof_us, pct_roofline=100 * roof_us / ours, speedup_vs_naive=base / ours,
                   speedup_vs_single_partition=single / ours)
        if sweep:
            sw = {}
            for s_ in sorted({1, 2, 4, 8, 16, 32, 64, 128, auto}):
                if B * s_ <= 4096:
                    sw[f"splits{s_}"] = run(s_)
            near = sorted({auto, max(1, auto // 2), min(128, auto * 2)})
            for s_ in near:
                for bn, w, st in ((32, 8, 2), (32, 4, 2), (32, 8, 4), (64, 8, 3), (64, 8, 4), (16, 4, 3)):
                    key = f"splits{s_}_bn{bn}_w{w}_st{st}"
                    try:
                        sw[key] = run(s_, block_n=bn, num_warps=w, num_stages=st)
                    except Exception as exc:  # a tile that does not fit is reported, not fatal
                        sw[key] = f"{type(exc).__name__}: {str(exc)[:100]}"
            sw["cdna_tile"] = run(auto, **default_tile("rocm", 16, R))
            try:
                sw[f"splits{auto}_bn32_w4_st2_valuecols128"] = run(auto, block_n=32, num_warps=4, num_stages=2, value_cols=128)
            except Exception as exc:
                sw[f"splits{auto}_bn32_w4_st2_valuecols128"] = f"{type(exc).__name__}: {str(exc)[:100]}"
            row["sweep_us"] = sw
            row["best_sweep"] = min(((v, k) for k, v in sw.items() if isinstance(v, float)))
        rows.append(row)
        print("mla", json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "sweep_us"}), flush=True)
        del pool, tables
        torch.cuda.empty_cache()
    # FP8 cache (per-tensor scale), B=32 at 32K
    B, L = 32, 32768
    pool, tables = _mla_setup(B, L, 2, torch.float8_e4m3fn)
    q = torch.randn(B, H, R + P, device=DEV).to(BF16)
    o = torch.empty(B, H, R, device=DEV, dtype=BF16)
    lse = torch.empty(B, H, device=DEV)
    kv_lens = torch.full((B,), L, device=DEV, dtype=torch.int32)
    auto = choose_num_splits(B, H, L)

    def run8(splits, **kw):
        t = dict(default_tile("cuda", 16, R, kv_fp8=True))
        t.update(kw)
        return graph_time_us(lambda r: mla_attention_paged_triton(q, pool, tables[r], kv_lens, 0.07, 1, kv_scale=0.01,
                                                                  num_splits=splits, out=o, lse_out=lse, **t), 2)

    t8 = run8(auto)
    roof8 = B * L * (R + P) / (ceiling * 1e12) * 1e6
    row = dict(B=B, L=L, heads=H, kv="fp8_e4m3", splits=auto, ours_us=t8, roofline_us=roof8, pct_roofline=100 * roof8 / t8)
    if sweep:
        sw = {}
        for s_ in (8, 16):
            for kw in (dict(block_n=32, num_warps=8, num_stages=2), dict(block_n=32, num_warps=4, num_stages=2),
                       dict(block_n=64, num_warps=8, num_stages=3), dict(block_n=32, num_warps=8, num_stages=2, score_chunk=128),
                       dict(block_n=16, num_warps=4, num_stages=3, score_chunk=64, value_cols=128)):
                key = f"splits{s_}_" + "_".join(f"{k}{v}" for k, v in kw.items())
                try:
                    sw[key] = run8(s_, **kw)
                except Exception as exc:
                    sw[key] = f"{type(exc).__name__}: {str(exc)[:100]}"
        row["sweep_us"] = sw
    rows.append(row)
    print("mla fp8", json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k != "sweep_us"}), flush=True)
    return rows


# ----------------------------------------------------------------------------- AttnRes
def sec_attn_res():
    rows = []
    D, NB, nvb = 7168, 9, 8
    for T in (1, 32, 256):
        rot = 8
        sets = [((torch.randn(T, D, device=DEV) * 10).to(BF16), torch.randn(T, D, device=DEV).to(BF16),
                 torch.randn(T, NB, D, device=DEV).to(BF16)) for _ in range(rot)]
        nw, proj, ow = (torch.rand(D, device=DEV) + 0.5).to(BF16), (torch.randn(1, D, device=DEV) * 0.02).to(BF16), (torch.rand(D, device=DEV) + 0.5).to(BF16)
        cw = (nw.float() * proj.float().reshape(-1)).contiguous()
        out, head = torch.empty(T, D, device=DEV, dtype=BF16), torch.empty(T, D, device=DEV, dtype=BF16)
        fused = graph_time_us(lambda r: attn_res_rmsnorm_triton(sets[r][0], sets[r][1], sets[r][2], nvb, nw, proj, ow, 1e-6,
                                                                out=out, head_out=head, score_weight=cw), rot)
        unfused = graph_time_us(lambda r: attn_res_rmsnorm_reference(sets[r][0], sets[r][1], sets[r][2], nvb, nw, proj, ow, 1e-6), rot)
        row = dict(T=T, hidden=D, banked=nvb, fused_us=fused, unfused_torch_us=unfused, speedup=unfused / fused,
                   bytes_per_call=T * D * 2 * (nvb + 2 + 2))
        rows.append(row)
        print("attn_res", json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return rows


# ----------------------------------------------------------------------------- routing
def torch_routing_pipeline(logits, k, scoring, bias, shared, scale, block):
    """The plain torch baseline: scores, torch.topk, renormalise, shared slot, sort/bincount/cumsum layout."""
    scores = logits.float().sigmoid() if scoring == "sigmoid" else logits.float().softmax(-1)
    choice = scores + bias if bias is not None else scores
    ids = torch.topk(choice, k, dim=-1).indices
    w = scores.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scale
    M, E = logits.shape
    if shared is not None:
        ids = torch.cat([ids, torch.full((M, 1), E, device=ids.device, dtype=ids.dtype)], 1)
        w = torch.cat([w, torch.full((M, 1), shared, device=w.device)], 1)
    layout = expert_sorted_layout_reference(ids.to(torch.int32), E + 1, block)
    return w, ids, layout


def sec_routing(sweep=False):
    from sgl_hybrid_kernel.moe.triton_routing import SCORING_SIGMOID, SCORING_SOFTMAX, moe_gating_topk_kernel

    rows = []
    for name, E, k, scoring, scale in (("kimi_k3", 896, 16, "sigmoid", 2.8), ("qwen38", 512, 10, "softmax", 1.0)):
        bias = torch.randn(E, device=DEV) * 0.01 if scoring == "sigmoid" else None
        for M in (5, 40, 64, 160):
            rot = 8
            logits = [torch.randn(M, E, device=DEV) for _ in range(rot)]

            def ours_fn(**kw):
                return graph_time_us(lambda r: fused_moe_routing_triton(logits[r], k, scoring, bias, shared_expert_weight=1.0,
                                                                        routed_scaling_factor=scale, **kw), rot, reps=100)

            ours = ours_fn()
            base = graph_time_us(lambda r: torch_routing_pipeline(logits[r], k, scoring, bias, 1.0, scale, 16), rot, reps=100)
            # launch 1 alone (gating + top-k), same arguments as the wrapper passes
            w = torch.empty(M, k + 1, device=DEV)
            ids = torch.empty(M, k + 1, device=DEV, dtype=torch.int32)
            bias_t = bias if bias is not None else w

            def gate(r):
                moe_gating_topk_kernel[(M,)](logits[r], bias_t, w, ids, E, k + 1, k + 1, scale, 1.0,
                                             TOPK=k, KPAD=triton.next_power_of_2(k + 1), G=1, EG=E, GPAD=1,
                                             EGPAD=triton.next_power_of_2(E), TOPK_GROUP=1,
                                             SCORING=SCORING_SIGMOID if scoring == "sigmoid" else SCORING_SOFTMAX,
                                             HAS_BIAS=bias is not None, RENORM=True, SHARED=1, num_warps=4)

            gating = graph_time_us(gate, rot, reps=100)
            row = dict(config=name, experts=E, top_k=k, M=M, ours_us=ours, gating_launch_only_us=gating,
                       torch_pipeline_us=base, speedup=base / ours)
            if sweep:
                row["sweep_us"] = {f"gate_w{gw}_layout_w{lw}_eb{eb}": ours_fn(num_warps=gw, layout_warps=lw, layout_block=eb)
                                   for gw, lw, eb in ((4, 8, 1024), (4, 4, 1024), (4, 8, 512), (4, 16, 1024), (8, 8, 1024),
                                                      (2, 8, 1024), (4, 4, 512))}
            rows.append(row)
            print("routing", json.dumps({kk: round(v, 2) if isinstance(v, float) else v for kk, v in row.items()}), flush=True)
    return rows


# ----------------------------------------------------------------------------- QSA
@triton.jit
def _paged_gather_read_kernel(k_ptr, v_ptr, pt_ptr, sink_ptr, L, stride_pt, stride_s, NUM_SPLITS: tl.constexpr,
                              HEAD_COLS: tl.constexpr, BLOCK_N: tl.constexpr, NS: tl.constexpr):
    """Read-only ceiling of the dense walk's bytes: each K/V row of request ``b`` (``HEAD_COLS`` columns of
    the slot row, from column ``h * HEAD_COLS``) gathered through the page table, summed, one FP32 per program."""
    b, h, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, HEAD_COLS)
    split_len = tl.cdiv(tl.cdiv(L, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * split_len
    hi = tl.minimum(lo + split_len, L)
    acc = tl.zeros([BLOCK_N, HEAD_COLS], tl.float32)
    for j0 in tl.range(lo, hi, BLOCK_N, num_stages=NS):
        pos = j0 + offs_n
        ok = pos < hi
        slot = tl.load(pt_ptr + b * stride_pt + pos, mask=ok, other=0).to(tl.int64)
        off = slot[:, None] * stride_s + h * HEAD_COLS + offs_c[None, :]
        acc += tl.load(k_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
        acc += tl.load(v_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(sink_ptr + (b * tl.num_programs(1) + h) * NUM_SPLITS + sp, tl.sum(tl.sum(acc, axis=1), axis=0))


QSA_DENSE_SWEEP = (  # (splits, block_n, warps, stages, merge): merge 0 = DCP merge kernel, h = qsa_merge_kernel, h heads
    [(s, 64, 4, 3, 4) for s in (2, 3, 4, 8)] + [(4, 64, 4, 3, 0), (4, 64, 4, 3, 8), (4, 64, 4, 2, 4), (4, 64, 8, 3, 4), (2, 64, 4, 4, 4)]
    + [(s, 32, 4, 3, 4) for s in (4, 6, 8)] + [(s, 32, 4, 4, 4) for s in (4, 8)]
)


def sec_qsa(sweep):
    rows = []
    B, T, Hq, Hkv, Dh, ratio, L = 32, 5, 24, 2, 128, 4, 2000
    rot = 4
    slots = rot * B * 2048
    kc = torch.randn(slots, Hkv, Dh, device=DEV).to(BF16)
    vc = torch.randn(slots, Hkv, Dh, device=DEV).to(BF16)
    perm = torch.randperm(slots, device=DEV)
    tables = [perm[r * B * 2048 : (r + 1) * B * 2048].view(B, 2048).int() for r in range(rot)]
    kv = torch.full((B,), L, device=DEV, dtype=torch.int32)
    qo = torch.arange(0, (B + 1) * T, T, device=DEV, dtype=torch.int32)
    q = torch.randn(B * T, Hq, Dh, device=DEV).to(BF16)
    idx = torch.full((B * T, 512), -1, device=DEV, dtype=torch.int32)
    for t in range(T):
        nvis = -(-(L - T + t + 1) // ratio)
        idx[t::T, :nvis] = torch.arange(nvis, device=DEV, dtype=torch.int32)
    o = torch.empty(B * T, Hq, Dh, device=DEV, dtype=BF16)
    lse = torch.empty(B * T, Hq, device=DEV)

    def run(indices, splits=1, **tile):
        return graph_time_us(lambda r: qsa_attention_triton(q, kc, vc, tables[r], kv, qo, 0.088, T, 1, indices, ratio,
                                                            out=o, lse_out=lse, num_splits=splits, **tile), rot)

    dense_tile = qsa_tile("cuda", False)
    auto = choose_qsa_splits(B * Hkv, L, programs_per_sm=dense_programs_per_sm("cuda"))  # what qsa.dispatch picks
    auto_sparse = choose_qsa_splits(B * T * Hkv, idx.shape[1] * ratio)
    # the previous default dense launch (8 partitions, 32-position tile, DCP merge): same-run reference point
    dense_previous = run(None, 8, block_n=32, num_warps=4)
    dense = run(None, auto, **dense_tile)
    dense1 = run(None, 1, **dense_tile)
    sparse = run(idx, auto_sparse, **qsa_tile("cuda", True))
    dense_again = run(None, auto, **dense_tile)  # repeat: the spread between two timings of one version
    sparse_again = run(idx, auto_sparse, **qsa_tile("cuda", True))
    kv_bytes = B * L * Hkv * Dh * 2 * 2  # K and V of every visible position read once (BF16)
    # ceilings: the same K/V bytes gathered through the same (random, page size 1) tables, read-only
    sink = torch.empty(B * Hkv * 64, device=DEV)
    ceil = {}
    for both_heads in (False, True):  # one program per KV head (256 B of each slot row) or per slot row (512 B)
        for splits in (8, 16, 32):
            for ns in (1, 3):
                heads = 1 if both_heads else Hkv
                ceil[f"gather_{'slot_row' if both_heads else 'head_row'}_s{splits}_ns{ns}"] = graph_time_us(
                    lambda r: _paged_gather_read_kernel[(B, heads, splits)](
                        kc, vc, tables[r], sink, L, tables[r].stride(0), kc.stride(0), NUM_SPLITS=splits,
                        HEAD_COLS=Dh * (2 if both_heads else 1), BLOCK_N=32, NS=ns, num_warps=8 if both_heads else 4), rot)
    seq = torch.arange(B * 2048, device=DEV, dtype=torch.int32).view(B, 2048)
    ceil["gather_contiguous_s16_ns3"] = graph_time_us(
        lambda r: _paged_gather_read_kernel[(B, Hkv, 16)](kc[r * B * 2048:], vc[r * B * 2048:], seq, sink, L, seq.stride(0),
                                                         kc.stride(0), NUM_SPLITS=16, HEAD_COLS=Dh, BLOCK_N=32, NS=3), rot)
    best_ceiling = min(v for k, v in ceil.items() if not k.startswith("gather_contiguous"))
    # the second launch of the split dense path alone (LSE merge of the FP32 partials), both merge kernels
    from sgl_hybrid_kernel.dcp.merge import merge_partials_strided
    from sgl_hybrid_kernel.qsa.triton_qsa import qsa_merge_kernel

    merge = {}
    for S in (2, 4, 8, 16):
        part = torch.randn(B * T, Hq, S, Dh, device=DEV)
        part_lse = torch.randn(B * T, Hq, S, device=DEV)
        merge[f"dcp_merge_s{S}"] = graph_time_us(lambda r: merge_partials_strided(part, part_lse, o, lse, split_dim=2), rot)
        for bh in (4, 8):
            merge[f"qsa_merge_s{S}_h{bh}"] = graph_time_us(lambda r: qsa_merge_kernel[(B * T, triton.cdiv(Hq, bh))](
                part, part_lse, o, lse, Hq, S, part.stride(0), part.stride(1), part_lse.stride(0), part_lse.stride(1),
                o.stride(0), o.stride(1), lse.stride(0), DV=Dh, BLOCK_S=triton.next_power_of_2(S), BLOCK_H=bh,
                num_warps=4), rot)
    row = dict(B=B, T=T, q_heads=Hq, kv_heads=Hkv, head_dim=Dh, visible=L, dense_splits=auto, dense_tile=dense_tile,
               dense_us=dense, dense_repeat_us=dense_again, dense_previous_default_us=dense_previous,
               dense_one_partition_us=dense1, sparse_splits=auto_sparse, sparse_us=sparse, sparse_repeat_us=sparse_again,
               speedup_dense_vs_sparse=sparse / dense, speedup_repeat=sparse_again / dense_again,
               kv_bytes=kv_bytes, gather_ceiling_us=best_ceiling, gather_ceiling_tbs=kv_bytes / best_ceiling / 1e6,
               dense_tbs=kv_bytes / dense / 1e6, ceilings_us=ceil, merge_launch_only_us=merge)
    prev_path = os.environ.get("QSA_PREV_KERNEL")  # a previous kernel + wrapper file: its launches in this run
    if prev_path:
        import importlib.util

        spec = importlib.util.spec_from_file_location("qsa_prev_kernel", prev_path)
        prev = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(prev)

        def run_prev(indices, splits, **tile):
            return graph_time_us(lambda r: prev.qsa_attention_triton(q, kc, vc, tables[r], kv, qo, 0.088, T, 1, indices, ratio,
                                                                     out=o, lse_out=lse, num_splits=splits, **tile), rot)

        row["prev_kernel"] = os.path.basename(prev_path)
        row["prev_kernel_sparse_us"] = run_prev(idx, auto_sparse, **prev.default_tile("cuda", True))
        prev_splits = (choose_qsa_splits(B * Hkv, L, programs_per_sm=prev.dense_programs_per_sm("cuda"))
                       if hasattr(prev, "dense_programs_per_sm") else 8)  # the previous file's own dispatch choice
        row["prev_kernel_dense_splits"] = prev_splits
        row["prev_kernel_dense_us"] = run_prev(None, prev_splits, **prev.default_tile("cuda", False))
        row["dense_after_prev_us"] = run(None, auto, **dense_tile)
        row["sparse_after_prev_us"] = run(idx, auto_sparse, **qsa_tile("cuda", True))
    if sweep:
        sw = {}
        for splits, bn, w, st, mb in QSA_DENSE_SWEEP:
            key = f"dense_s{splits}_bn{bn}_w{w}_st{st}_m{mb}"
            try:
                sw[key] = run(None, splits, block_n=bn, num_warps=w, num_stages=st, merge_block_h=mb)
            except Exception as exc:  # e.g. out of shared memory: recorded, not fatal
                sw[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
        for splits in (2, 4):
            for bn, w, st in ((32, 4, 2), (64, 4, 2)):
                sw[f"sparse_s{splits}_bn{bn}_w{w}_st{st}"] = run(idx, splits, block_n=bn, num_warps=w, num_stages=st)
        row["sweep_us"] = sw
        timed = {k: v for k, v in sw.items() if isinstance(v, float)}
        row["best_dense"] = min((v, k) for k, v in timed.items() if k.startswith("dense"))
        row["best_sparse"] = min((v, k) for k, v in timed.items() if k.startswith("sparse"))
        print("qsa sweep", json.dumps(sorted(((round(v, 2), k) for k, v in timed.items())), indent=0), flush=True)
    rows.append(row)
    print("qsa", json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k != "sweep_us"}), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--only", default="correctness,mla,attn_res,routing,qsa")
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), sweep=args.sweep)
    ceiling = None
    for sec in args.only.split(","):
        t0 = time.time()
        try:
            if sec == "correctness":
                res = sec_correctness()
            elif sec == "mla":
                ceiling = ceiling or copy_ceiling_tbs()
                res = dict(copy_ceiling_tbs=ceiling, rows=sec_mla(ceiling, args.sweep))
            elif sec == "attn_res":
                res = sec_attn_res()
            elif sec == "routing":
                res = sec_routing(args.sweep)
            elif sec == "qsa":
                res = sec_qsa(args.sweep)
            else:
                raise ValueError(sec)
        except Exception:
            res = dict(error=traceback.format_exc()[-3000:])
            print(sec, "FAILED", res["error"], flush=True)
        with open(os.path.join(args.out, f"kernels_{sec}.json"), "w") as f:
            json.dump(dict(meta=meta, section=sec, seconds=time.time() - t0, result=res), f, indent=1)
        print(f"== {sec} done in {time.time() - t0:.0f} s", flush=True)
        if sec == "correctness":
            print(json.dumps(res, indent=0)[:3000], flush=True)


if __name__ == "__main__":
    main()
