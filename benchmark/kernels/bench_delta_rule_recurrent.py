"""Decode / verify benchmark of our KDA / GDN Triton kernels against fla-core 0.6.0 (H200 / H100).

Run on a CUDA machine (the device tool), with fla-core importable:

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/bench_delta_rule_recurrent.py --out results.json

1. correctness on the GPU (``bench_delta_rule_common.check_correctness``): decode, verify, fused decode,
   deferred-commit replay (bit-exact vs snapshots), chunked prefill;
2. the copy ceiling (device-to-device copy, read + write bytes);
3. decode / verify timed by CUDA-graph replay over a state pool several times larger than L2, with the batch's
   slots rotated between replays; fla timed the same way in the same run;
4. ``bench_recurrent_sweep`` (issue 4): decode / verify / deferred-commit verify per plan (value tile, warps:
   ``RecurrentOverrides``), the default plans, an older checkout's package (``--recurrent-baseline``) and fla in
   one process, plus the state read + write floor of the same slots.

Cases (the sweep's tiles) are data: ``delta_rule_recurrent_cases.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import types

import torch
import triton
import triton.language as tl

import bench_delta_rule_common as common
from bench_delta_rule_common import (DEV, LB, _deferred_exact, _save_partial, check_correctness, load_cases, rel)
from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton, replay_commit
from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode

CASES = load_cases("recurrent")
SWEEP_TILES = CASES["SWEEP_TILES"]  # (BV, warps[, preload]) per (case kind, per-channel decay); None = the default


ROT = 8  # index sets rotated inside one graph


SLOTS = 1024  # pool slots: KDA 1024 x 12 x 128 x 128 x 4 B = 805 MB >> 60 MB L2


def graph_time_us(fn_per_rot, reps=50):
    """Capture ROT calls (one per rotated index set) in one graph; median replay time / ROT in µs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for r in range(ROT):
            fn_per_rot(r)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(ROT):
            fn_per_rot(r)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / ROT)
    times.sort()
    return times[len(times) // 2]


def copy_ceiling_tbs():
    x = torch.empty(2 * 1024**3 // 4, dtype=torch.float32, device=DEV).uniform_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e12


# ----------------------------------------------------------------------------- timing
def bench_decode_verify(results, ceiling):
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    rows = []
    H, K, V = 12, 128, 128
    pool = torch.randn(SLOTS, H, V, K, device=DEV)
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    for B in (1, 32, 128):
        perms = [torch.randperm(SLOTS, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
        for T in (1, 4):
            N = B * T
            q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
            f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
            o = torch.empty_like(v)
            ours = graph_time_us(lambda r: gated_delta_recurrent_triton(
                q, k, v, f, b, A, dtb, pool, perms[r], T, "kda", LB, state_layout="vk", commit=(T == 1), out=o))
            try:
                q4, k4, v4, f4 = (t.view(B, T, H, -1) for t in (q, k, v, f))
                b4 = b.view(B, T, H)
                perms64 = [p.long() for p in perms]
                starts = [int(torch.randint(0, SLOTS - B + 1, (1,))) for _ in range(ROT)]

                def fla_call(r):
                    if T == 1:  # serving-style decode: state pool + slot indices, updated in place
                        fused_recurrent_kda_fwd(q4, k4, v4, f4, b4, A_log=A, dt_bias=dtb, initial_state=pool, scale=K ** -0.5,
                                                inplace_final_state=True, state_v_first=True, ssm_state_indices=perms64[r],
                                                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                                use_beta_sigmoid_in_kernel=True, lower_bound=LB)
                    else:  # verify window: B rows of the pool (contiguous, rotated), final state out
                        fused_recurrent_kda_fwd(q4, k4, v4, f4, b4, A_log=A, dt_bias=dtb,
                                                initial_state=pool[starts[r] : starts[r] + B], scale=K ** -0.5,
                                                inplace_final_state=False, output_final_state=True, state_v_first=True,
                                                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                                use_beta_sigmoid_in_kernel=True, lower_bound=LB)

                fla = graph_time_us(fla_call)
            except Exception as exc:  # report the failure, keep going
                fla = None
                print("fla kda", B, T, type(exc).__name__, str(exc)[:200])
            bytes_ = B * H * K * V * 4 * 2
            rows.append(dict(op="kda_decode" if T == 1 else f"kda_verify_t{T}", B=B, ours_us=ours, fla_us=fla,
                             ours_frac_copy_ceiling=bytes_ / (ours * 1e-6) / 1e12 / ceiling))
            print(rows[-1])
    results["kda_decode_verify"] = rows


def bench_fused_decode(results, ceiling):
    """KDA fused decode (conv + norms + gates + recurrence + gated RMSNorm), graph replay; since 2026-12-01
    the states come from HBM: ``_hbm_rot`` slot sets per graph (before, 8 sets kept B=1's states in L2)."""
    global ROT
    rot_before = ROT
    rows = []
    H, K, V, W = 12, 128, 128, 4
    C = 3 * H * K
    ssm = torch.randn(SLOTS, H, V, K, device=DEV)
    conv = torch.randn(SLOTS, W - 1, C, device=DEV, dtype=torch.bfloat16)
    cw = torch.randn(C, W, device=DEV, dtype=torch.bfloat16)
    A, dtb, nw = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV), torch.rand(V, device=DEV)
    for B in (1, 32, 128):
        ROT = _hbm_rot(B, H * K * V * 4, SLOTS)
        perms = [torch.randperm(SLOTS, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
        x = torch.randn(B, C, device=DEV, dtype=torch.bfloat16)
        f = torch.randn(B, H * K, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(B, H, device=DEV, dtype=torch.bfloat16)
        g = torch.randn(B, H * V, device=DEV, dtype=torch.bfloat16)
        out = torch.empty(B, H, V, device=DEV, dtype=torch.bfloat16)
        t = graph_time_us(lambda r: kda_fused_decode(x, conv, cw, f, b, A, dtb, ssm, perms[r], g, nw, 1e-5, LB, out=out))
        bytes_ = B * H * K * V * 4 * 2
        rows.append(dict(op="kda_fused_decode", B=B, ours_us=t, ours_frac_copy_ceiling=bytes_ / (t * 1e-6) / 1e12 / ceiling))
        print(rows[-1])
    results["kda_fused_decode"] = rows
    results["kda_fused_decode_rotation"] = "index sets per graph: _hbm_rot (>= 4x L2 of states per replay)"
    ROT = rot_before


def bench_gdn(results, ceiling):
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd

    rows = []
    H, HV, K, V = 16, 48, 128, 128
    slots = 256  # 256 x 3 MiB = 768 MB
    pool = torch.randn(slots, HV, K, V, device=DEV)
    A, dtb = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
    for B in (1, 32):
        perms = [torch.randperm(slots, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
        starts = [int(torch.randint(0, slots - B + 1, (1,))) for _ in range(ROT)]
        for T in (1, 5):
            N = B * T
            q, k = (torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(N, HV, V, device=DEV, dtype=torch.bfloat16)
            a, b = (torch.randn(N, HV, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            o = torch.empty_like(v)
            ours = graph_time_us(lambda r: gated_delta_recurrent_triton(
                q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", commit=(T == 1), out=o))
            row = dict(op="gdn_decode" if T == 1 else f"gdn_verify_t{T}", B=B, ours_us=ours)
            if T > 1:
                inter = torch.empty(N, HV, K, V, device=DEV)
                inter_idx = torch.arange(N, device=DEV, dtype=torch.int32)
                row["ours_all_snapshots_us"] = graph_time_us(lambda r: gated_delta_recurrent_triton(
                    q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", commit=False, inter_state=inter,
                    inter_indices=inter_idx, out=o))
                rb = [torch.zeros(slots, T - 1, HV, K + 1 + 1 + V, device=DEV) for _ in range(2)]
                acc = torch.randint(1, T + 1, (B,), device=DEV, dtype=torch.int32)

                def deferred(r):
                    gated_delta_recurrent_triton(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", replay_buffer=rb[0], out=o)
                    replay_commit(pool, perms[r], acc, rb[0], K, "gdn", num_k_heads=H)

                row["ours_deferred_verify_plus_commit_us"] = graph_time_us(deferred)

                def deferred_fused(r):
                    # steady state: replay the previous window's accepted prefix in the
                    # same launch (ping-pong buffers); no separate commit pass
                    gated_delta_recurrent_triton(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", replay_buffer=rb[r % 2],
                                                 replay_prev=rb[1 - r % 2], accept_prev=acc, out=o)

                row["ours_deferred_fused_replay_us"] = graph_time_us(deferred_fused)
            try:
                q4, k4 = (t.view(B, T, H, K) for t in (q, k))
                v4 = v.view(B, T, HV, V)
                a4, b4 = (t.view(B, T, HV) for t in (a, b))

                def fla_call(r):
                    fused_recurrent_gated_delta_rule_fwd(q4, k4, v4, g=a4, beta=b4, A_log=A, dt_bias=dtb, scale=K ** -0.5,
                                                         initial_state=pool[starts[r] : starts[r] + B], output_final_state=True,
                                                         use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)

                row["fla_us"] = graph_time_us(fla_call)
            except Exception as exc:
                row["fla_us"] = None
                print("fla gdn", B, T, type(exc).__name__, str(exc)[:300])
            row["ours_frac_copy_ceiling"] = B * HV * K * V * 4 * 2 / (ours * 1e-6) / 1e12 / ceiling
            rows.append(row)
            print(row)
    results["gdn_decode_verify"] = rows


def bench_decode_b1_value_tiles(results, ceiling):
    """KDA decode at B=1 (12 heads x 128, state from a pool larger than L2, graph replay) for
    value tiles 4..64 (12 x 128 / BV programs), against the tuned table's default tile."""
    rows = []
    H, K, V = 12, 128, 128
    pool = torch.randn(SLOTS, H, V, K, device=DEV)
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    perms = [torch.randperm(SLOTS, device=DEV)[:1].to(torch.int32) for _ in range(ROT)]
    q, k, v = (torch.randn(1, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
    f = torch.randn(1, H, K, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(1, H, device=DEV, dtype=torch.bfloat16)
    o = torch.empty_like(v)
    for bv in (None, 4, 8, 16, 32, 64):
        try:
            kw = {} if bv is None else dict(plan=RecurrentOverrides(value_tile=bv))
            t = graph_time_us(lambda r: gated_delta_recurrent_triton(
                q, k, v, f, b, A, dtb, pool, perms[r], 1, "kda", LB, state_layout="vk", out=o, **kw))
            t2 = graph_time_us(lambda r: gated_delta_recurrent_triton(
                q, k, v, f, b, A, dtb, pool, perms[r], 1, "kda", LB, state_layout="vk", out=o, **kw))
        except Exception as exc:
            print("decode bv", bv, type(exc).__name__, str(exc)[:200])
            continue
        rows.append(dict(op="kda_decode", B=1, value_tile=bv or "table", programs=H * triton.cdiv(V, bv) if bv else None,
                         ours_us=t, ours_us_repeat=t2))
        print(rows[-1], flush=True)
    results["kda_decode_b1_value_tiles"] = rows


@triton.jit
def _state_copy_kernel(pool_ptr, idx_ptr, dst_ptr, s_slot, s_h, HV: tl.constexpr, KV: tl.constexpr, BLOCK: tl.constexpr,
                       HINTS: tl.constexpr = False):
    """Read and write back one (request, head) state in place (``dst_ptr`` = ``pool_ptr``; else to the same
    offsets of another pool): the bytes a decode step must move. ``HINTS``: the decode's cache hints
    (evict-first load, streaming store)."""
    i_b = tl.program_id(1) // HV
    i_h = tl.program_id(1) % HV
    slot = tl.load(idx_ptr + i_b).to(tl.int64)
    off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    o = slot * s_slot + i_h * s_h + off
    if HINTS:
        x = tl.load(pool_ptr + o, mask=off < KV, eviction_policy="evict_first")
        tl.store(dst_ptr + o, x, mask=off < KV, cache_modifier=".cs")
    else:
        x = tl.load(pool_ptr + o, mask=off < KV)
        tl.store(dst_ptr + o, x, mask=off < KV)


def _state_copy_us(pool, perms, blk=2048, warps=4, dst=None, hints=False):
    """Graph-replay time of reading + writing the batch's states (the decode's memory floor, same pool and slots)."""
    _, HV, K, V = pool.shape
    dst = pool if dst is None else dst
    return graph_time_us(lambda r: _state_copy_kernel[(K * V // blk, perms[r].shape[0] * HV)](
        pool, perms[r], dst, pool.stride(0), pool.stride(1), HV=HV, KV=K * V, BLOCK=blk, HINTS=hints, num_warps=warps))


def _load_baseline_recurrent(path):
    """``(gated_delta_recurrent_triton, replay_commit)`` of another checkout's package at ``path``."""
    import importlib
    import sys

    mine = {n: m for n, m in sys.modules.items() if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")}
    for n in mine:
        del sys.modules[n]
    sys.path.insert(0, path)
    try:
        mod = importlib.import_module("sgl_hybrid_kernel.delta_rule.recurrent.wrapper")
    finally:
        sys.path.remove(path)
        for n in [n for n in sys.modules if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")]:
            del sys.modules[n]
        sys.modules.update(mine)
    return mod.gated_delta_recurrent_triton, mod.replay_commit


SWEEP_CASES = None  # main(): --sweep-cases (substrings of case names to run; None = all)


RECURRENT_BASELINE = None  # main(): --recurrent-baseline


SWEEP_DEFAULT_ONLY = False  # main(): --sweep-tiles default (time the defaults, the baseline and fla only)


SWEEP_DECODE_BATCHES = None  # main(): --sweep-decode-batches (decode cases' batch sizes; None = KDA 1/32/128, GDN 1/32)


SWEEP_DEFERRED_BATCHES = None  # main(): --sweep-deferred-batches (GDN T=5 deferred / fused-replay cases; None = 32, fused also 1)


SWEEP_VERIFY_BATCHES = None  # main(): --sweep-verify-batches (KDA T=4 and GDN plain T=5 verify; None = KDA 1/32/128, GDN 32)


SWEEP_VERIFY_TOKENS = None  # main(): --sweep-verify-tokens (T of the KDA and GDN plain verify / KDA snapshot cases; None = 4 / 5)


WIDE_VARIANTS = []  # main(): --wide-variants BVxWARPS[kKL],... tiles of the one-warp kernel (or of the lanes kernel: kKL)


CHUNK_VARIANTS = []  # main(): --chunk-variants BVxWARPS:PREC,... chunk-form windows (triton_window.py) timed beside the tiles


L2_BYTES = 60 * 1024 ** 2  # H200


def _hbm_rot(batch, slot_bytes, slots):
    """Index sets per graph for ``bench_recurrent_sweep``: enough that one replay touches >= 4x L2 of
    states (issue 4: measure from HBM; with 8 sets a small batch's states stayed in L2, e.g. KDA B=1:
    8 x 0.79 MB), at least 8 and at most ``slots // batch``."""
    return max(8, min(slots // batch, -(-4 * L2_BYTES // (batch * slot_bytes))))


def gdn_verify_window(B, T=5, slots=1024, H=16, HV=48, K=128, V=128):
    """Inputs of a Qwen3.8 GDN verify window on SGLang's V-major pool for the one-off profiling scripts
    (prof_deferred_gap.py, exp_persistent_lanes.py at tag lab-history-2026-12-07): a pool >> L2, ``_hbm_rot`` rotated slot sets (sets
    the module's ``ROT`` for ``graph_time_us``), BF16 q / k / v / gate / beta, an output buffer."""
    global ROT
    w = types.SimpleNamespace(B=B, T=T, H=H, HV=HV, K=K, V=V, N=B * T, slots=slots)
    w.pool = torch.randn(slots, HV, V, K, device=DEV) * 0.1
    ROT = _hbm_rot(B, HV * K * V * 4, slots)
    w.perms = [torch.randperm(slots, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
    w.q, w.k = (torch.randn(w.N, H, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    w.v = torch.randn(w.N, HV, V, device=DEV, dtype=torch.bfloat16)
    w.a, w.b = (torch.randn(w.N, HV, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    w.A, w.dtb = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
    w.o = torch.empty_like(w.v)
    return w


def bench_copy_sizes(results, ceiling):
    """A contiguous copy of as many bytes as a decode step reads (and writes), timed like the decode cases
    (graph replay, ``_hbm_rot`` source / destination pairs per graph so that one replay touches >= 4x L2),
    against the 2 GiB copy ceiling: what fraction of the ceiling a single launch of that size reaches
    (issue 4's decode goal is >= 90 % of the ceiling at B >= 32). Sizes: the FP32 states of KDA (Kimi K3
    TP8, 12 heads x 128 x 128) at B = 1 / 32 / 64 / 128 / 256 / 512 and GDN (Qwen3.8, 48 value heads) at B = 32 / 128."""
    global ROT
    rows = []
    results["copy_sizes"] = rows
    head = 128 * 128 * 4
    big = torch.empty(3 * 1024 ** 3 // 4, dtype=torch.float32, device=DEV)
    for tag, hv, B in (("kda", 12, 1), ("kda", 12, 32), ("kda", 12, 64), ("kda", 12, 128), ("kda", 12, 256), ("kda", 12, 512),
                       ("gdn", 48, 32), ("gdn", 48, 128)):
        n = B * hv * head // 4  # floats per direction
        pairs = big.numel() // (2 * n)
        ROT = max(1, min(pairs, _hbm_rot(B, hv * head, 10 ** 9)))
        views = [(big[(2 * r) * n:(2 * r + 1) * n], big[(2 * r + 1) * n:(2 * r + 2) * n]) for r in range(ROT)]
        us = graph_time_us(lambda r: views[r][1].copy_(views[r][0]))
        rows.append(dict(case=f"{tag}_B{B}", bytes_moved=2 * n * 4, rot=ROT, copy_us=us,
                         frac_ceiling=2 * n * 4 / (us * 1e-6) / 1e12 / ceiling))
        print(f"== contiguous copy {tag} B={B}: {2 * n * 4 / 1e6:.1f} MB moved, {us:.2f} us, "
              f"{100 * rows[-1]['frac_ceiling']:.1f} % of the ceiling", flush=True)
    del big, views
    torch.cuda.empty_cache()
    # the decode's own floor kernel (read + write back in place, _state_copy_kernel) on slots that are
    # adjacent in the pool vs on the random slots the decode cases use: in place vs scattered
    for tag, hv, slots, B in (("kda", 12, SLOTS, 32), ("kda", 12, SLOTS, 128), ("gdn", 48, 256, 32)):
        pool = torch.randn(slots, hv, 128, 128, device=DEV)
        ROT = _hbm_rot(B, hv * head, slots)
        rnd = [torch.randperm(slots, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
        adj = [((torch.arange(B, device=DEV) + r * B) % slots).to(torch.int32) for r in range(ROT)]
        row = dict(case=f"{tag}_B{B}_in_place", bytes_moved=2 * B * hv * head, rot=ROT,
                   adjacent_slots_us=_state_copy_us(pool, adj), random_slots_us=_state_copy_us(pool, rnd))
        for key in ("adjacent_slots_us", "random_slots_us"):
            row[key.replace("_us", "_frac_ceiling")] = row["bytes_moved"] / (row[key] * 1e-6) / 1e12 / ceiling
        if tag == "kda":  # the floor kernel's shape, out of place, and the decode's cache hints
            other = torch.empty_like(pool)
            for blk, nw in ((512, 1), (1024, 1), (2048, 1), (1024, 2), (512, 4), (1024, 4), (2048, 4), (4096, 4), (1024, 8),
                            (8192, 8), (16384, 8)):
                row[f"random_b{blk}_w{nw}_us"] = _state_copy_us(pool, rnd, blk, nw)
            row["adjacent_b1024_w4_us"] = _state_copy_us(pool, adj, 1024, 4)
            row["random_hints_us"] = _state_copy_us(pool, rnd, hints=True)
            row["random_out_of_place_us"] = _state_copy_us(pool, rnd, dst=other)
            del other
            print("   ", {k: round(v, 2) for k, v in row.items() if k.startswith(("random_", "adjacent_b")) and k.endswith("_us")},
                  flush=True)
        rows.append(row)
        print(f"== in-place floor copy {tag} B={B}: adjacent slots {row['adjacent_slots_us']:.2f} us "
              f"({100 * row['adjacent_slots_frac_ceiling']:.1f} %), random slots {row['random_slots_us']:.2f} us "
              f"({100 * row['random_slots_frac_ceiling']:.1f} %)", flush=True)
        del pool
        torch.cuda.empty_cache()


def bench_recurrent_sweep(results, ceiling):
    """Decode / verify / deferred-commit verify (issue 4), graph replay, states from a pool >> L2:
    value tile x warps per case, the package's default, the baseline package's default (same
    process) and fla; the state read + write floor of the same slots; per-variant output check
    against the baseline's default output (relative difference)."""
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    global ROT
    rot_before = ROT
    results["recurrent_sweep_rotation"] = "index sets per graph: _hbm_rot (>= 4x L2 of states per replay)"
    base_fn, base_commit = _load_baseline_recurrent(RECURRENT_BASELINE) if RECURRENT_BASELINE else (None, None)
    rows = []
    results["recurrent_sweep"] = rows
    torch.manual_seed(0)

    def run_case(tag, B, T, pool, perms, call, tiles, fla_call=None, check=None):
        if SWEEP_CASES is not None and not any(c in tag for c in SWEEP_CASES):
            return
        row = dict(case=tag, B=B, T=T, variants={})
        bytes_ = B * pool.shape[1] * pool.shape[2] * pool.shape[3] * 4 * 2
        row["state_rw_floor_us"] = _state_copy_us(pool, perms)
        row["state_rw_floor_frac_ceiling"] = bytes_ / (row["state_rw_floor_us"] * 1e-6) / 1e12 / ceiling
        ref = check(base_fn if base_fn else gated_delta_recurrent_triton, {}) if check else None
        tiles = [None] if SWEEP_DEFAULT_ONLY else tiles
        todo = ([("baseline", base_fn, {})] if base_fn else []) + [
            ("default" if t is None else f"bv{t[0]}_w{t[1]}" + ("_tok" if len(t) > 2 and not t[2] else ""),
             gated_delta_recurrent_triton,
             {} if t is None else dict(plan=RecurrentOverrides(value_tile=t[0], num_warps=t[1],
                                                               **({"preload": t[2]} if len(t) > 2 else {}))))
            for t in tiles]
        if WIDE_VARIANTS:  # decode too (T = 1): the same kernel, one token
            todo += [(f"wide_bv{bv}_w{nw}" + (f"_kl{kl}" if kl else ""), gated_delta_recurrent_triton,
                      dict(plan=RecurrentOverrides(wide=True, value_tile=bv, num_warps=nw,
                                                   **({"key_lanes": int(str(kl).split("s")[0])} if kl else {}),
                                                   **({"num_stages": int(str(kl).split("s")[1])} if "s" in str(kl) else {}))))
                     for bv, nw, kl in WIDE_VARIANTS]
        if T > 1:
            todo += [(f"chunk_bv{bv}_w{nw}_{prec}", gated_delta_recurrent_triton,
                      dict(plan=RecurrentOverrides(form="chunk", value_tile=bv, num_warps=nw, dot_precision=prec)))
                     for bv, nw, prec in CHUNK_VARIANTS]
        # Two timings per variant, the second round in reverse order, plus one discarded timing first,
        # so that no variant is always timed first: at B=1 one launch's figure moves by 0.2-0.3 us
        # between timings and runs (H200, 2026-11-30: the default and the identical explicit
        # launch 2.80 vs 2.56 us in one run, both ~2.8 us in the next).
        if todo:
            try:
                graph_time_us(lambda r: call(todo[0][1], r, todo[0][2]))
            except Exception:
                pass
        runs = {}
        for name, fn, kw in todo + todo[::-1]:
            if runs.get(name) is None and name in runs:
                continue  # failed in the first round
            try:
                runs.setdefault(name, []).append(graph_time_us(lambda r: call(fn, r, kw)))
            except Exception as exc:
                print(tag, B, T, name, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                runs[name] = None
        for name, fn, kw in todo:
            ts = runs.get(name)
            if not ts:
                continue
            v = dict(us=min(ts), us_runs=ts, frac_ceiling=bytes_ / (min(ts) * 1e-6) / 1e12 / ceiling)
            if check is not None and name != "baseline":
                try:
                    v["rel_diff_vs_baseline"] = rel(check(fn, kw), ref)
                except Exception as exc:
                    print(tag, B, T, name, "check FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                    continue
            row["variants"][name] = v
        if fla_call is not None:
            try:
                row["fla_us"] = graph_time_us(fla_call)
            except Exception as exc:
                print("fla", tag, B, T, type(exc).__name__, str(exc)[:200], flush=True)
        best = min(((n, v["us"]) for n, v in row["variants"].items() if n != "baseline"), key=lambda x: x[1], default=None)
        row["best"] = best
        rows.append(row)
        _save_partial(results)
        print(f"== {tag} B={B} T={T}: floor {row['state_rw_floor_us']:.2f} us, fla {row.get('fla_us')}, best {best}", flush=True)
        for n, v in row["variants"].items():
            print(f"   {n:10s} {v['us']:8.2f} us  {100 * v['frac_ceiling']:5.1f}%  diff {v.get('rel_diff_vs_baseline', '-')}", flush=True)

    # KDA, Kimi K3 TP8: 12 heads x 128, safe gate, SGLang's V-major pool
    H, K, V = 12, 128, 128
    pool = torch.randn(SLOTS, H, V, K, device=DEV)
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    # the output check's pool: at least 160 slots, and one per request of the largest batch asked for
    small = torch.randn(max(160, *(SWEEP_DECODE_BATCHES or ()), *(SWEEP_VERIFY_BATCHES or ())), H, V, K, device=DEV)
    # (T, mode): decode, plain verify windows, and the snapshot windows SGLang's target_verify asks for (the
    # state after every token written: B * T states; the all-modes binary)
    for T, snapshots in ((1, False), (SWEEP_VERIFY_TOKENS or 4, False), (SWEEP_VERIFY_TOKENS or 4, True)):
        for B in (SWEEP_DECODE_BATCHES or (1, 32, 128)) if T == 1 else (SWEEP_VERIFY_BATCHES or (1, 32, 128)):
            tag = "kda_decode" if T == 1 else (f"kda_snapshots_t{T}" if snapshots else f"kda_verify_t{T}")
            if SWEEP_CASES is not None and not any(c in tag for c in SWEEP_CASES):
                continue
            ROT = _hbm_rot(B, H * K * V * 4, SLOTS)
            perms = [torch.randperm(SLOTS, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
            N = B * T
            q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
            f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
            o = torch.empty_like(v)
            cidx = torch.randperm(small.shape[0], device=DEV)[:B].to(torch.int32)
            snap = dict(inter_state=torch.empty((N, H, V, K), device=DEV),
                        inter_indices=torch.arange(N, device=DEV, dtype=torch.int32)) if snapshots else {}

            def call(fn, r, kw):
                return fn(q, k, v, f, b, A, dtb, pool, perms[r], T, "kda", LB, state_layout="vk", commit=(T == 1), out=o,
                          **snap, **kw)

            def check(fn, kw):
                p = small.clone()
                sp = dict(snap, inter_state=torch.zeros_like(snap["inter_state"])) if snapshots else {}
                out = fn(q, k, v, f, b, A, dtb, p, cidx, T, "kda", LB, state_layout="vk", commit=(T == 1), **sp, **kw).float()
                return torch.cat([out.flatten(), p[cidx.long()].flatten()] + ([sp["inter_state"].flatten()] if snapshots else []))

            q4, k4, v4, f4 = (t.view(B, T, H, -1) for t in (q, k, v, f))
            b4 = b.view(B, T, H)
            perms64 = [p.long() for p in perms]
            starts = [int(torch.randint(0, SLOTS - B + 1, (1,))) for _ in range(ROT)]

            def fla_call(r):
                if T == 1:
                    fused_recurrent_kda_fwd(q4, k4, v4, f4, b4, A_log=A, dt_bias=dtb, initial_state=pool, scale=K ** -0.5,
                                            inplace_final_state=True, state_v_first=True, ssm_state_indices=perms64[r],
                                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                            use_beta_sigmoid_in_kernel=True, lower_bound=LB)
                else:
                    fused_recurrent_kda_fwd(q4, k4, v4, f4, b4, A_log=A, dt_bias=dtb, initial_state=pool[starts[r]: starts[r] + B],
                                            scale=K ** -0.5, inplace_final_state=False, output_final_state=True,
                                            state_v_first=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                            use_beta_sigmoid_in_kernel=True, lower_bound=LB)

            run_case(tag, B, T, pool, perms, call, SWEEP_TILES[("decode" if T == 1 else "verify", int(B == 1))],
                     fla_call, check)
    del pool, small
    torch.cuda.empty_cache()

    # GDN, Qwen3.8: 16 k-heads, 48 v-heads x 128; SGLang's V-major pool (what serving runs) and fla's K-major one
    H, HV, K, V = 16, 48, 128, 128
    gdn_slots = 256  # 256 x 48 x 128 x 128 x 4 B = 805 MB >> 60 MB L2; twice the batch above 128
    A, dtb = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
    decode_cases = tuple((b, 1, "decode", "vk") for b in (SWEEP_DECODE_BATCHES or (1, 32)))
    verify_cases = tuple((b, SWEEP_VERIFY_TOKENS or 5, "verify", "vk") for b in (SWEEP_VERIFY_BATCHES or (32,)))
    if SWEEP_DEFERRED_BATCHES:
        deferred_cases = tuple((b, 5, m, "vk") for m in ("deferred", "deferred_fused", "snapshots") for b in SWEEP_DEFERRED_BATCHES)
    else:
        deferred_cases = ((1, 5, "deferred_fused", "vk"), (32, 5, "deferred", "vk"), (32, 5, "deferred_fused", "vk"))
    for B, T, mode, layout in decode_cases + verify_cases + deferred_cases + ((32, 5, "deferred_fused", "kv"),):
        tag = f"gdn_{mode}" + ("" if T == 1 else f"_t{T}") + f"_{layout}"
        if SWEEP_CASES is not None and not any(c in tag for c in SWEEP_CASES):
            continue  # nothing allocated for a case left out
        slots = max(gdn_slots, 2 * B)
        if layout == "vk":
            pool, small = torch.randn(slots, HV, V, K, device=DEV), torch.randn(max(64, B), HV, V, K, device=DEV)
        else:
            pool, small = torch.randn(slots, HV, K, V, device=DEV), torch.randn(max(64, B), HV, K, V, device=DEV)
        ROT = _hbm_rot(B, HV * K * V * 4, slots)
        perms = [torch.randperm(slots, device=DEV)[:B].to(torch.int32) for _ in range(ROT)]
        starts = [int(torch.randint(0, slots - B + 1, (1,))) for _ in range(ROT)]
        N = B * T
        q, k = (torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(N, HV, V, device=DEV, dtype=torch.bfloat16)
        a, b = (torch.randn(N, HV, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        o = torch.empty_like(v)
        rb = [torch.zeros(slots, max(T - 1, 1), HV, K + 1 + 1 + V, device=DEV) for _ in range(2)]
        acc = torch.randint(1, T + 1, (B,), device=DEV, dtype=torch.int32)
        cidx = torch.randperm(small.shape[0], device=DEV)[:B].to(torch.int32)
        snap = torch.empty((B * T,) + tuple(pool.shape[1:]), device=DEV) if mode == "snapshots" else None
        sidx = torch.arange(B * T, device=DEV, dtype=torch.int32)

        def call(fn, r, kw):
            if mode == "decode":
                return fn(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", commit=True, out=o, state_layout=layout, **kw)
            if mode == "verify":
                return fn(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", commit=False, out=o, state_layout=layout, **kw)
            if mode == "deferred":  # token 0's state committed, inputs of 1..T-1 kept; no replay in this launch
                return fn(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", replay_buffer=rb[0], out=o, state_layout=layout, **kw)
            if mode == "snapshots":  # what SGLang's target_verify asks: the state after every token (B * T states written)
                return fn(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", commit=False, inter_state=snap, inter_indices=sidx,
                          out=o, state_layout=layout, **kw)
            return fn(q, k, v, a, b, A, dtb, pool, perms[r], T, "gdn", replay_buffer=rb[r % 2], replay_prev=rb[1 - r % 2],
                      accept_prev=acc, out=o, state_layout=layout, **kw)

        def check(fn, kw):
            p = small.clone()
            if mode == "deferred":
                out = fn(q, k, v, a, b, A, dtb, p, cidx, T, "gdn", replay_buffer=torch.zeros_like(rb[0][:small.shape[0]]),
                         state_layout=layout, **kw)
            elif mode == "deferred_fused":  # two windows: the second replays the first's accepted prefix
                r1, r2 = (torch.zeros_like(rb[0][:small.shape[0]]) for _ in range(2))  # a row per slot of `small`
                fn(q, k, v, a, b, A, dtb, p, cidx, T, "gdn", replay_buffer=r1, state_layout=layout, **kw)
                out = fn(q, k, v, a, b, A, dtb, p, cidx, T, "gdn", replay_buffer=r2, replay_prev=r1, accept_prev=acc,
                         state_layout=layout, **kw)
            elif mode == "snapshots":
                sp = torch.zeros_like(snap)
                out = fn(q, k, v, a, b, A, dtb, p, cidx, T, "gdn", commit=False, inter_state=sp, inter_indices=sidx,
                         state_layout=layout, **kw)
                return torch.cat([out.float().flatten(), sp.flatten()])
            else:
                out = fn(q, k, v, a, b, A, dtb, p, cidx, T, "gdn", commit=(mode == "decode"), state_layout=layout, **kw)
            return torch.cat([out.float().flatten(), p[cidx.long()].flatten()])

        q4, k4 = (t.view(B, T, H, K) for t in (q, k))
        v4 = v.view(B, T, HV, V)
        a4, b4 = (t.view(B, T, HV) for t in (a, b))

        fpool = pool if layout == "kv" else pool.view(slots, HV, K, V)  # fla reads [K, V]; same bytes

        def fla_call(r):
            fused_recurrent_gated_delta_rule_fwd(q4, k4, v4, g=a4, beta=b4, A_log=A, dt_bias=dtb, scale=K ** -0.5,
                                                 initial_state=fpool[starts[r]: starts[r] + B], output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)

        run_case(tag, B, T, pool, perms, call,
                 SWEEP_TILES[("decode" if T == 1 else "verify", int(B == 1))], fla_call, check)
        del pool, small
        torch.cuda.empty_cache()
    ROT = rot_before


def main():
    global RECURRENT_BASELINE, SWEEP_DEFAULT_ONLY, SWEEP_CASES
    global SWEEP_DECODE_BATCHES, SWEEP_VERIFY_BATCHES, SWEEP_DEFERRED_BATCHES, SWEEP_VERIFY_TOKENS
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_delta_rule_recurrent.json")
    p.add_argument("--only", default=None, help="comma list: correctness,deferred_exact,bench_decode_verify,"
                   "bench_fused_decode,bench_gdn,bench_decode_b1_value_tiles,bench_recurrent_sweep,bench_copy_sizes")
    p.add_argument("--tag", default="", help="label stored in the JSON (e.g. 'baseline' for an older checkout's package)")
    p.add_argument("--recurrent-baseline", default=None, help="path holding an older checkout's sgl_hybrid_kernel: its "
                   "decode / verify wrapper is timed in bench_recurrent_sweep as variant 'baseline'")
    p.add_argument("--sweep-tiles", default="all", choices=("all", "default"), help="bench_recurrent_sweep: every "
                   "(value tile, warps) of SWEEP_TILES, or the defaults only")
    p.add_argument("--sweep-cases", default=None, help="bench_recurrent_sweep: comma list of substrings of the case "
                   "names to run (e.g. 'verify,deferred'; default: all)")
    p.add_argument("--chunk-variants", default="", help="bench_recurrent_sweep: comma list of BVxWARPS:PREC (e.g. "
                   "32x4:ieee,32x4:tf32x3): chunk-form verify windows timed beside the recurrent tiles")
    p.add_argument("--sweep-decode-batches", default=None, help="bench_recurrent_sweep: comma list of batch sizes of "
                   "the decode cases (default: KDA 1,32,128; GDN 1,32)")
    p.add_argument("--sweep-verify-batches", default=None, help="bench_recurrent_sweep: comma list of batch sizes of "
                   "the plain verify cases, KDA T=4 and GDN T=5 (default: KDA 1,32,128; GDN 32)")
    p.add_argument("--sweep-verify-tokens", type=int, default=None, help="bench_recurrent_sweep: tokens per request "
                   "(1 + drafts) of the KDA / GDN plain verify and KDA snapshot cases (default: 4 / 5)")
    p.add_argument("--sweep-deferred-batches", default=None, help="bench_recurrent_sweep: comma list of batch sizes of "
                   "the GDN T=5 deferred-commit and fused-replay cases (default: 32, the fused replay also 1)")
    p.add_argument("--lanes-exact", default="", help="deferred_exact: comma list of BVxKL (value tile x key lanes): "
                   "also check the lanes kernel (triton_lanes.py) bit for bit at those tiles")
    p.add_argument("--wide-variants", default="", help="bench_recurrent_sweep: comma list of BVxWARPS, tiles of the "
                   "one-warp per-token kernel (gated_delta_verify_wide_kernel; the 2026-11-30 sweeps also varied its input "
                   "prefetch, since removed: it won every row), or BVxWARPSkKL[sSTAGES]: the lanes kernel (triton_lanes.py) "
                   "at BV columns with KL lanes on the keys (and STAGES software-pipelining stages)")
    args = p.parse_args()
    SWEEP_DECODE_BATCHES = tuple(int(x) for x in args.sweep_decode_batches.split(",")) if args.sweep_decode_batches else None
    SWEEP_VERIFY_BATCHES = tuple(int(x) for x in args.sweep_verify_batches.split(",")) if args.sweep_verify_batches else None
    SWEEP_DEFERRED_BATCHES = tuple(int(x) for x in args.sweep_deferred_batches.split(",")) if args.sweep_deferred_batches else None
    SWEEP_VERIFY_TOKENS = args.sweep_verify_tokens
    if SWEEP_VERIFY_TOKENS is not None and not 2 <= SWEEP_VERIFY_TOKENS <= 16:
        raise ValueError(f"--sweep-verify-tokens must be in 2..16, got {SWEEP_VERIFY_TOKENS}")
    WIDE_VARIANTS[:] = [(int(x.split("x")[0]), int(x.split("x")[1].split("k")[0]), x.split("k")[1] if "k" in x else 0)
                        for x in args.wide_variants.split(",") if x]
    CHUNK_VARIANTS[:] = [(int(x.split(":")[0].split("x")[0]), int(x.split(":")[0].split("x")[1]), x.split(":")[1])
                         for x in args.chunk_variants.split(",") if x]
    RECURRENT_BASELINE = args.recurrent_baseline
    SWEEP_DEFAULT_ONLY = args.sweep_tiles == "default"
    SWEEP_CASES = args.sweep_cases.split(",") if args.sweep_cases else None
    common.PARTIAL_OUT = args.out
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "time": time.strftime("%Y-%m-%d %H:%M:%S"), "tag": args.tag}
    only = args.only.split(",") if args.only else None
    if only is None or "correctness" in only:
        check_correctness(results)
    if only is not None and "deferred_exact" in only:  # the serving-shape bit-exact checks alone (B=8, and GDN B=1)
        results["deferred_exact"] = {f"{g}_{lay}_t{t}_b{b}": _deferred_exact(g, h, hv, t, lay, B=b) for g, h, hv, t, lay, b in (
            ("gdn", 16, 48, 5, "vk", 8), ("gdn", 16, 48, 5, "kv", 8), ("kda", 12, 12, 4, "vk", 8), ("gdn", 16, 48, 5, "vk", 1))}
        for lv in (x for x in args.lanes_exact.split(",") if x):  # the lanes kernel at explicit tiles
            bv, kl = (int(y) for y in lv.split("x"))
            for g, h, hv, t, b in (("gdn", 16, 48, 5, 8), ("gdn", 16, 48, 5, 32), ("kda", 12, 12, 4, 8)):
                results["deferred_exact"][f"{g}_vk_t{t}_b{b}_lanes_bv{bv}_kl{kl}"] = _deferred_exact(
                    g, h, hv, t, "vk", B=b, plan=RecurrentOverrides(value_tile=bv, key_lanes=kl))
        print("deferred_exact", results["deferred_exact"], flush=True)
    ceiling = copy_ceiling_tbs()
    results["copy_ceiling_tb_s"] = ceiling
    print("copy ceiling TB/s", ceiling)
    for fn in (bench_decode_verify, bench_fused_decode, bench_gdn, bench_decode_b1_value_tiles, bench_recurrent_sweep,
               bench_copy_sizes):
        if only is not None and fn.__name__ not in only:
            continue
        try:
            fn(results, ceiling)
        except Exception as exc:
            print(fn.__name__, "FAILED", type(exc).__name__, str(exc)[:500])
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
