"""H200 benchmark of our KDA / GDN Triton kernels against fla-core 0.6.0, in one run.

Run on a CUDA machine (the device tool), with fla-core importable:

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/bench_delta_rule.py --out results.json

1. correctness on the GPU (fresh random inputs, vs the plain-torch references):
   decode, verify, fused decode, deferred-commit replay (bit-exact vs snapshots),
   chunked prefill;
2. the copy ceiling (device-to-device copy, read + write bytes);
3. decode / verify timed by CUDA-graph replay over a state pool several times
   larger than L2, with the batch's slots rotated between replays; fla timed the
   same way in the same run; chunked prefill timed eagerly;
4. ``bench_recurrent_sweep`` (issue 4): decode / verify / deferred-commit verify per
   (value tile, warps), the package's defaults, an older checkout's package
   (``--recurrent-baseline``) and fla in one process, plus the state read + write
   floor of the same slots.
"""

from __future__ import annotations

import argparse
import json
import time
import types

import torch
import triton
import triton.language as tl

from sgl_hybrid_kernel.delta_rule.chunk import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.recurrent import gated_delta_recurrent_triton, replay_commit
from sgl_hybrid_kernel.delta_rule.reference import gated_delta_recurrent
from sgl_hybrid_kernel.gdn import gdn_gate
from sgl_hybrid_kernel.kda import kda_gate
from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode
from sgl_hybrid_kernel.norm import gated_rms_norm, l2_norm

DEV = "cuda"
LB = -5.0
ROT = 8  # index sets rotated inside one graph
SLOTS = 1024  # pool slots: KDA 1024 x 12 x 128 x 128 x 4 B = 805 MB >> 60 MB L2


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


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


# ----------------------------------------------------------------------------- correctness
def _deferred_exact(gate, H, HV, T, layout, B=8, K=128, V=128, **kw):
    """Deferred commit at a serving shape (BF16 activations, default tiles or ``kw``'s, e.g.
    ``value_tile`` / ``key_lanes``, passed to every call of the window): token 0's outputs equal the
    snapshot verify's, the replayed states equal the snapshots, and a second window with the replay
    fused stores the state a snapshot window started from the snapshot states reaches after its token 0,
    and every output equals the snapshot windows' (``*_rel``: how far apart, 0 when equal); all bit for bit."""
    g = torch.Generator(device=DEV).manual_seed(11)
    N = B * T
    gk = 1 if gate == "gdn" else K

    def window():
        q, k = (torch.randn(N, H, K, device=DEV, generator=g).to(torch.bfloat16) for _ in range(2))
        v = torch.randn(N, HV, V, device=DEV, generator=g).to(torch.bfloat16)
        f = torch.randn(*((N, HV) if gate == "gdn" else (N, HV, K)), device=DEV, generator=g).to(torch.bfloat16)
        b = torch.randn(N, HV, device=DEV, generator=g).to(torch.bfloat16)
        return q, k, v, f, b

    w1, w2 = window(), window()
    slots = max(24, 2 * B)
    A = torch.rand(HV, device=DEV, generator=g)
    dtb = torch.randn(HV if gate == "gdn" else HV * K, device=DEV, generator=g)
    lb = None if gate == "gdn" else LB
    pool = torch.randn(slots, HV, K, V, device=DEV, generator=g) * 0.1
    idx = torch.randperm(slots, device=DEV)[:B].to(torch.int32)
    acc = torch.randint(1, T + 1, (B,), device=DEV, dtype=torch.int32)
    inter = torch.zeros(N, HV, K, V, device=DEV)
    p_snap = pool.clone()
    o_s = gated_delta_recurrent_triton(*w1, A, dtb, p_snap, idx, T, gate, lb, state_layout=layout, commit=False,
                                       inter_state=inter, inter_indices=torch.arange(N, device=DEV, dtype=torch.int32), **kw)
    p_def = pool.clone()
    rb1, rb2 = (torch.zeros(slots, T - 1, HV, K + gk + 1 + V, device=DEV) for _ in range(2))
    o_d = gated_delta_recurrent_triton(*w1, A, dtb, p_def, idx, T, gate, lb, state_layout=layout, replay_buffer=rb1, **kw)
    p_fused = p_def.clone()
    replay_commit(p_def, idx, acc, rb1, K, gate, state_layout=layout, num_k_heads=H, lower_bound=lb, **kw)
    snaps = torch.stack([inter[i * T + int(a) - 1] for i, a in enumerate(acc.tolist())])
    p_ref = pool.clone()
    p_ref[idx.long()] = snaps
    # the reference window writes snapshots too, so it runs the all-modes binary the fused window runs
    # (a plain window may take another kernel: the lanes kernel's PLAIN binary, recurrent.pick_lanes_tile)
    inter2 = torch.zeros_like(inter)
    o2_ref = gated_delta_recurrent_triton(*w2, A, dtb, p_ref, idx, T, gate, lb, state_layout=layout, commit=True,
                                          inter_state=inter2,
                                          inter_indices=torch.arange(N, device=DEV, dtype=torch.int32), **kw)
    o2_f = gated_delta_recurrent_triton(*w2, A, dtb, p_fused, idx, T, gate, lb, state_layout=layout, replay_buffer=rb2,
                                        replay_prev=rb1, accept_prev=acc, **kw)
    tok0 = lambda o: o.view(B, T, *o.shape[1:])[:, 0]  # noqa: E731
    return dict(token0_outputs=bool(torch.equal(tok0(o_s), tok0(o_d))), outputs=bool(torch.equal(o_s, o_d)),
                outputs_rel=rel(o_d.float(), o_s.float()), replayed_states=bool(torch.equal(p_def[idx.long()], snaps)),
                fused_token0_outputs=bool(torch.equal(tok0(o2_ref), tok0(o2_f))),
                fused_stored_states=bool(torch.equal(p_fused[idx.long()], inter2[torch.arange(B, device=DEV) * T])),
                fused_outputs=bool(torch.equal(o2_ref, o2_f)), fused_vs_ref_rel=rel(o2_f.float(), o2_ref.float()))


def check_correctness(results):
    torch.manual_seed(0)
    out = {}
    B, T, H, K, V = 4, 4, 3, 64, 64
    N = B * T
    q, k, v = (torch.randn(N, H, d, device=DEV) for d in (K, K, V))
    f, b = torch.randn(N, H, K, device=DEV), torch.randn(N, H, device=DEV)
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    pool = torch.randn(16, H, V, K, device=DEV)
    idx = torch.tensor([3, 9, -1, 12], device=DEV)
    p = pool.clone()
    inter = torch.zeros(N, H, V, K, device=DEV)
    o = gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, p, idx, T, "kda", LB, state_layout="vk",
                                     commit=False, inter_state=inter, inter_indices=torch.arange(N, device=DEV))
    errs = []
    for i, s in enumerate(idx.tolist()):
        sl = slice(i * T, (i + 1) * T)
        if s < 0:
            errs.append(float(o[sl].abs().max()))
            continue
        ro, _, _ = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], kda_gate(f[sl], A, dtb, LB),
                                         torch.sigmoid(b[sl]), initial_state=pool[s].transpose(-1, -2), acc_dtype=torch.float64)
        errs.append(rel(o[sl], ro))
    out["kda_verify_rel_err"] = max(errs)
    # deferred commit, bit-exact against all snapshots (GDN, GVA)
    HV = 6
    v2 = torch.randn(N, HV, V, device=DEV)
    a2, b2 = torch.randn(N, HV, device=DEV), torch.randn(N, HV, device=DEV)
    A2, dt2 = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
    pool2 = torch.randn(16, HV, K, V, device=DEV)
    idx2 = torch.tensor([3, 9, 5, 12], device=DEV)
    inter2 = torch.zeros(N, HV, K, V, device=DEV)
    p_snap, p_def = pool2.clone(), pool2.clone()
    o_s = gated_delta_recurrent_triton(q, k, v2, a2, b2, A2, dt2, p_snap, idx2, T, "gdn", commit=False,
                                       inter_state=inter2, inter_indices=torch.arange(N, device=DEV), value_tile=4)
    rb = torch.zeros(16, T - 1, HV, K + 1 + 1 + V, device=DEV)
    o_d = gated_delta_recurrent_triton(q, k, v2, a2, b2, A2, dt2, p_def, idx2, T, "gdn", replay_buffer=rb, value_tile=4)
    acc = torch.tensor([1, 4, 2, 3], device=DEV, dtype=torch.int32)
    replay_commit(p_def, idx2, acc, rb, K, "gdn", value_tile=4, num_k_heads=H, activation_dtype=torch.float32)
    out["deferred_outputs_bit_exact"] = bool(torch.equal(o_s, o_d))
    # fused replay: a second window that first rebuilds the first window's accepted state
    w2 = [torch.randn_like(t) for t in (q, k, v2, a2, b2)]
    p_ref = pool2.clone()
    for i, (s, a) in enumerate(zip(idx2.tolist(), acc.tolist())):
        p_ref[s] = inter2[i * T + int(a) - 1]
    o2_ref = gated_delta_recurrent_triton(*w2, A2, dt2, p_ref, idx2, T, "gdn", commit=True, value_tile=4)
    p_fused = pool2.clone()
    rb1, rb2 = torch.zeros_like(rb), torch.zeros_like(rb)
    gated_delta_recurrent_triton(q, k, v2, a2, b2, A2, dt2, p_fused, idx2, T, "gdn", replay_buffer=rb1, value_tile=4)
    o2_f = gated_delta_recurrent_triton(*w2, A2, dt2, p_fused, idx2, T, "gdn", replay_buffer=rb2, replay_prev=rb1,
                                        accept_prev=acc, value_tile=4)
    out["fused_replay_outputs_bit_exact"] = bool(torch.equal(o2_ref, o2_f))
    out["deferred_states_bit_exact"] = all(
        bool(torch.equal(p_def[s], inter2[i * T + int(a) - 1])) for i, (s, a) in enumerate(zip(idx2.tolist(), acc.tolist()))
    )
    # the same three checks at the serving shapes, BF16 activations, the wrappers' default tiles
    for gate_, H_, HV_, T_, layout in (("gdn", 16, 48, 5, "vk"), ("gdn", 16, 48, 5, "kv"), ("kda", 12, 12, 4, "vk")):
        out[f"deferred_bit_exact_{gate_}_{layout}_t{T_}"] = _deferred_exact(gate_, H_, HV_, T_, layout)
    # fused decode vs reference chain
    Bd, Hd, Kd = 5, 4, 64
    C = 3 * Hd * Kd
    x = torch.randn(Bd, C, device=DEV)
    conv = torch.randn(8, 3, C, device=DEV)
    cw = torch.randn(C, 4, device=DEV) * 0.5
    fd, bd = torch.randn(Bd, Hd * Kd, device=DEV), torch.randn(Bd, Hd, device=DEV)
    Ad, dtd = torch.rand(Hd, device=DEV), torch.randn(Hd * Kd, device=DEV)
    ssm = torch.randn(8, Hd, Kd, Kd, device=DEV)
    idd = torch.tensor([1, 4, -1, 6, 2], device=DEV)
    gate, nw = torch.randn(Bd, Hd * Kd, device=DEV), torch.rand(Kd, device=DEV) + 0.5
    c2, s2 = conv.clone(), ssm.clone()
    worst = 0.0
    for _ in range(3):  # repeated calls also check the arrival counters reset
        od = kda_fused_decode(x, c2, cw, fd, bd, Ad, dtd, s2, idd, gate, nw, 1e-5, LB, value_tile=8)
    c3, s3 = conv.clone(), ssm.clone()
    from sgl_hybrid_kernel.conv.reference import causal_conv1d_step

    for _ in range(3):
        for i, s in enumerate(idd.tolist()):
            if s < 0:
                continue
            y = causal_conv1d_step(x[i : i + 1], cw, c3, torch.tensor([s], device=DEV))
            qq, kk, vv = y.split([Hd * Kd] * 3, -1)
            ro, S, _ = gated_delta_recurrent(l2_norm(qq.view(1, Hd, Kd)), l2_norm(kk.view(1, Hd, Kd)), vv.view(1, Hd, Kd),
                                             kda_gate(fd[i : i + 1].view(1, Hd, Kd), Ad, dtd, LB), torch.sigmoid(bd[i : i + 1]),
                                             initial_state=s3[s].transpose(-1, -2))
            s3[s] = S.transpose(-1, -2)
            if _ == 2:
                worst = max(worst, rel(od[i], gated_rms_norm(ro[0], gate[i].view(Hd, Kd), nw, 1e-5, "sigmoid")))
    out["fused_decode_rel_err"] = worst
    out["fused_decode_state_rel_err"] = rel(s2, s3)
    # chunked prefill vs FP64
    lens = [300, 64, 1000]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEV, dtype=torch.int32)
    Nc = sum(lens)
    qc, kc, vc = (torch.randn(Nc, H, d, device=DEV) for d in (K, K, V))
    fc, bc = torch.randn(Nc, H, K, device=DEV), torch.randn(Nc, H, device=DEV)
    poolc = torch.randn(8, H, K, V, device=DEV)
    idc = torch.tensor([1, 5, 2], device=DEV)
    pc = poolc.clone()
    refs = []
    for i, s in enumerate(idc.tolist()):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        refs.append(gated_delta_recurrent(l2_norm(qc[sl]), l2_norm(kc[sl]), vc[sl], kda_gate(fc[sl], A, dtb, LB),
                                          torch.sigmoid(bc[sl]), initial_state=poolc[s], acc_dtype=torch.float64)[:2])
    for method in ("sequential", "parallel"):
        for tf32 in (False, True):
            for sd in ((None,) if method == "sequential" else (None, torch.bfloat16)):
                pc = poolc.clone()
                oc = gated_delta_chunk_triton(qc, kc, vc, fc, bc, A, dtb, cu, pc, idc, gate="kda", lower_bound=LB, tf32=tf32,
                                              method=method, scratch_dtype=sd)
                errs = []
                for i, s in enumerate(idc.tolist()):
                    sl = slice(int(cu[i]), int(cu[i + 1]))
                    errs += [rel(oc[sl], refs[i][0]), rel(pc[s], refs[i][1])]
                tag = "" if method == "sequential" else "parallel_" + ("bf16scratch_" if sd else "")
                out[f"chunk_{tag}rel_err_{'tf32' if tf32 else 'fp32'}"] = max(errs)
    # What serving runs: BF16 activations, method/tf32 left to "auto" (chunk-64 form with TF32 on CUDA),
    # with checkpoints at chunk boundaries; FP64 reference on the same BF16-rounded inputs.
    qb, kb, vb, fb, bb = (t.to(torch.bfloat16) for t in (qc, kc, vc, fc, bc))
    pc, ck = poolc.clone(), torch.zeros(3, H, K, V, device=DEV)
    ckpts = [(0, 256, 0), (2, 640, 1), (2, 1000, 2)]
    ob = gated_delta_chunk_triton(qb, kb, vb, fb, bb, A, dtb, cu, pc, idc, gate="kda", lower_bound=LB,
                                  checkpoints=ckpts, checkpoint_pool=ck)
    errs = []
    for i, s in enumerate(idc.tolist()):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        pos = [p for (seq, p, _) in ckpts if seq == i]
        ro, rs, saved = gated_delta_recurrent(l2_norm(qb[sl].float()), l2_norm(kb[sl].float()), vb[sl].float(),
                                              kda_gate(fb[sl].float(), A, dtb, LB), torch.sigmoid(bb[sl].float()),
                                              initial_state=poolc[s], acc_dtype=torch.float64, save_positions=pos)
        errs += [rel(ob[sl].float(), ro), rel(pc[s], rs)]
        errs += [rel(ck[slot], saved[j]) for j, (_, _, slot) in enumerate([c for c in ckpts if c[0] == i])]
    out["chunk_auto_bf16_serving_rel_err"] = max(errs)
    # the same for GDN (Qwen3.8: 16 q / k heads, 48 value heads; scalar gate), BF16 activations
    Hg, HVg = 16, 48
    qg, kg_ = (torch.randn(Nc, Hg, K, device=DEV).to(torch.bfloat16) for _ in range(2))
    vg = torch.randn(Nc, HVg, V, device=DEV).to(torch.bfloat16)
    ag, bg = (torch.randn(Nc, HVg, device=DEV).to(torch.bfloat16) for _ in range(2))
    Ag, dtg = torch.rand(HVg, device=DEV), torch.randn(HVg, device=DEV)
    poolg = torch.randn(8, HVg, K, V, device=DEV) * 0.1
    refs = []
    for i, s in enumerate(idc.tolist()):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        qn, kn = (l2_norm(x[sl].float()).repeat_interleave(HVg // Hg, 1) for x in (qg, kg_))
        refs.append(gated_delta_recurrent(qn, kn, vg[sl].float(), gdn_gate(ag[sl].float(), Ag, dtg),
                                          torch.sigmoid(bg[sl].float()), initial_state=poolg[s], acc_dtype=torch.float64)[:2])
    for tag, sd in (("auto_bf16_serving", None), ("bf16in_fp32scratch", torch.float32)):  # serving: BF16 scratch
        pg = poolg.clone()
        og = gated_delta_chunk_triton(qg, kg_, vg, ag, bg, Ag, dtg, cu, pg, idc, gate="gdn", scratch_dtype=sd)
        errs = []
        for i, s in enumerate(idc.tolist()):
            sl = slice(int(cu[i]), int(cu[i + 1]))
            errs += [rel(og[sl].float(), refs[i][0]), rel(pg[s], refs[i][1])]
        out[f"chunk_gdn_{tag}_rel_err"] = max(errs)
    from sgl_hybrid_kernel.dispatch import chosen_paths
    from sgl_hybrid_kernel.delta_rule.dispatch import choose_chunk

    choose_chunk(qb, vb, pc)
    out["chunk_auto_bf16_choice"] = next((f"{c.impl}: {c.reason}" for c in chosen_paths() if c.op == "delta_rule_prefill"), None)
    results["correctness"] = out
    print("correctness", json.dumps(out))


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


PREFILL_SHAPES = ((1, 65536), (8, 16384))
# (name, keyword arguments of gated_delta_chunk_triton); the fastest is reported as "ours"
PREFILL_VARIANTS = [
    ("sequential_bt16", dict(method="sequential", tf32=True)),
    # chunk-64 form at the launch table of chunk_parallel.CHUNK_LAUNCH for this device (spill-free in compile_gate)
    ("parallel_tf32_bf16scratch_table", dict(method="parallel", tf32=True, scratch_dtype=torch.bfloat16)),
    ("parallel_tf32_fp32scratch_table", dict(method="parallel", tf32=True, scratch_dtype=torch.float32)),
]
PROFILE = True


def bench_prefill(results):
    from fla.ops.kda import chunk_kda

    rows = []
    H, K, V = 12, 128, 128
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    for B, T in PREFILL_SHAPES:
        N = B * T
        q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
        f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
        cu = torch.arange(0, N + 1, T, device=DEV, dtype=torch.int32)
        pool = torch.zeros(B, H, K, V, device=DEV)
        idx = torch.arange(B, device=DEV, dtype=torch.int32)
        row = dict(op="kda_chunk_prefill", B=B, T=T, variants={})
        best = None
        for name, kw in PREFILL_VARIANTS:
            try:
                ms = triton.testing.do_bench(lambda: gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda",
                                                                             lower_bound=LB, **kw), warmup=25, rep=200,
                                             return_mode="median")
            except Exception as exc:
                print("variant", name, "FAILED", type(exc).__name__, str(exc)[:300])
                continue
            row["variants"][name] = dict(ms=ms, mtok_s=N / (ms * 1e-3) / 1e6, **{a: str(x) for a, x in kw.items()})
            if best is None or ms < best[1]:
                best = (name, ms, kw)
            print(B, T, name, f"{ms:.3f} ms", f"{N / (ms * 1e-3) / 1e6:.2f} Mtok/s", flush=True)
        name, ms, kw = best
        row.update(ours_variant=name, ours_ms=ms, ours_mtok_s=N / (ms * 1e-3) / 1e6)
        if PROFILE:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB, **kw)
                torch.cuda.synchronize()
            row["kernel_us_per_call"] = {e.key: e.device_time_total / 3 for e in prof.key_averages() if e.device_time_total > 0}
            print(row["kernel_us_per_call"])
        pool.zero_()
        o_ours = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB, **kw)
        s_ours = pool.clone()
        try:
            cu64 = cu.long()

            def fla_call():
                chunk_kda(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, H, V), f.view(1, N, H, K), b.view(1, N, H),
                          scale=K ** -0.5, initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
                          use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LB,
                          A_log=A, dt_bias=dtb, cu_seqlens=cu64)

            fms = triton.testing.do_bench(fla_call, warmup=100, rep=500, return_mode="median")
            row.update(fla_ms=fms, fla_mtok_s=N / (fms * 1e-3) / 1e6, ours_vs_fla=fms / ms)
            pool.zero_()
            o_fla, s_fla = chunk_kda(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, H, V), f.view(1, N, H, K),
                                     b.view(1, N, H), scale=K ** -0.5, initial_state=pool, output_final_state=True,
                                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                     safe_gate=True, lower_bound=LB, A_log=A, dt_bias=dtb, cu_seqlens=cu64)
            row.update(rel_diff_o_vs_fla=rel(o_ours, o_fla.view(N, H, V)), rel_diff_state_vs_fla=rel(s_ours, s_fla))
        except Exception as exc:
            row.update(fla_ms=None)
            print("fla chunk", type(exc).__name__, str(exc)[:300])
        rows.append(row)
        print(row)
    results["prefill"] = rows


GROUP_SCAN_SHAPES = ((1, 4096), (1, 65536))
# chunks of 64 tokens per group; None = chunk_group_scan.auto_group_chunks for this device
GROUP_SCAN_CHUNKS = {4096: (None, 4, 8, 16), 65536: (None, 32, 64, 128)}


def _save_partial(results):
    """Write ``results`` to ``PARTIAL_OUT`` (if set) now, so a run cut short by the device call's limit keeps
    what it measured."""
    if PARTIAL_OUT:
        with open(PARTIAL_OUT, "w") as fh:
            json.dump(results, fh, indent=1)


def _kernel_us(fn, calls=3):
    """Per-call device time of each kernel launched by ``fn`` (profiler), and their sum in µs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}
    return per, sum(per.values())


def bench_group_scan(results):
    """Group-scan mode of the chunk-64 prefill (issue 4) vs the plain chunk-64 pass vs fla chunk_kda,
    Kimi K3 TP8 (12 KDA heads x 128, safe gate), B=1, BF16 activations, TF32 products, BF16
    intermediates; eager (do_bench median) and the profiler's sum of kernel times."""
    from fla.ops.kda import chunk_kda

    from sgl_hybrid_kernel.delta_rule import chunk_group_scan as gs_mod
    from sgl_hybrid_kernel.delta_rule.chunk_group_scan import auto_group_chunks

    rows = []
    H, K, V = 12, 128, 128
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    cus = torch.cuda.get_device_properties(0).multi_processor_count
    for B, T in GROUP_SCAN_SHAPES:
        N = B * T
        q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
        f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
        cu = torch.arange(0, N + 1, T, device=DEV, dtype=torch.int32)
        pool0 = torch.randn(B, H, K, V, device=DEV) * 0.1
        pool = pool0.clone()
        idx = torch.arange(B, device=DEV, dtype=torch.int32)
        base = dict(gate="kda", lower_bound=LB, method="parallel", tf32=True, scratch_dtype=torch.bfloat16)
        auto = auto_group_chunks([T] * B, H, V, 16, cus)
        row = dict(op="kda_chunk_prefill_group_scan", B=B, T=T, H=H, K=K, V=V, auto_group_chunks=auto, variants={})
        variants = [("plain", dict(group_scan=False), None)]
        variants += [(f"group_scan_L{gc or auto}{'_auto' if gc is None else ''}", dict(group_scan=True, group_chunks=gc or auto),
                      None) for gc in GROUP_SCAN_CHUNKS[T] if (gc or auto)]
        # 32-column state / summary tiles (half the re-reads of w, k and G; sm_90 KDA state pass spill-free at 32)
        lbig = GROUP_SCAN_CHUNKS[T][2]
        variants += [("plain_bv32", dict(group_scan=False, value_tile=32), None),
                     (f"group_scan_L{lbig}_bv32", dict(group_scan=True, group_chunks=lbig, value_tile=32), 32)]
        outs = {}
        for name, kw, sbv in variants:
            gs_mod.SUMMARY_BV_OVERRIDE = sbv
            call = lambda: gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, **base, **kw)  # noqa: E731
            try:
                ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
                ms2 = triton.testing.do_bench(call, warmup=10, rep=200, return_mode="median")
                per, tot = _kernel_us(call)
            except Exception as exc:
                print("variant", name, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                continue
            pool.copy_(pool0)
            o = gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, **base, **kw)
            outs[name] = (o.float(), pool.clone())
            row["variants"][name] = dict(ms=ms, ms_repeat=ms2, mtok_s=N / (ms * 1e-3) / 1e6, kernel_sum_us=tot,
                                         kernel_us_per_call=per, **{a: str(x) for a, x in kw.items()})
            print(B, T, name, f"{ms:.3f} ms (repeat {ms2:.3f})", f"kernels {tot:.1f} us", f"{N / (ms * 1e-3) / 1e6:.2f} Mtok/s",
                  flush=True)
        gs_mod.SUMMARY_BV_OVERRIDE = None
        cu64 = cu.long()

        def fla_call():
            return chunk_kda(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, H, V), f.view(1, N, H, K), b.view(1, N, H),
                             scale=K ** -0.5, initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
                             use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LB,
                             A_log=A, dt_bias=dtb, cu_seqlens=cu64)

        try:
            fms = triton.testing.do_bench(fla_call, warmup=100, rep=500, return_mode="median")
            fper, ftot = _kernel_us(fla_call)
            row.update(fla_ms=fms, fla_mtok_s=N / (fms * 1e-3) / 1e6, fla_kernel_sum_us=ftot)
            pool.copy_(pool0)
            o_fla, s_fla = fla_call()
            o_fla = o_fla.view(N, H, V).float()
        except Exception as exc:
            o_fla = None
            row.update(fla_ms=None)
            print("fla chunk", type(exc).__name__, str(exc)[:300])
        for name, (o, s) in outs.items():
            r = row["variants"][name]
            if row.get("fla_ms"):
                r["vs_fla"] = row["fla_ms"] / r["ms"]
                r["kernel_sum_vs_fla"] = row["fla_kernel_sum_us"] / r["kernel_sum_us"]
            if "plain" in row["variants"]:
                r["vs_plain"] = row["variants"]["plain"]["ms"] / r["ms"]
                r["rel_diff_o_vs_plain"] = rel(o, outs["plain"][0])
                r["rel_diff_state_vs_plain"] = rel(s, outs["plain"][1])
            if o_fla is not None:
                r["rel_diff_o_vs_fla"] = rel(o, o_fla)
                r["rel_diff_state_vs_fla"] = rel(s, s_fla)
        if T == 4096:  # long memory (raw gate - 6: decay ~0.99 per token): group scan vs plain vs FP64 recurrence
            fl = f - 6.0
            cks = [(0, 1024, 0), (0, 1040, 1), (0, 2048, 2), (0, T, 3)]
            s0 = (torch.randn(H, K, V, device=DEV) * 0.1)
            ro, rS, rck = gated_delta_recurrent(l2_norm(q.float()), l2_norm(k.float()), v.float(), kda_gate(fl.float(), A, dtb, LB),
                                                torch.sigmoid(b.float()), initial_state=s0, acc_dtype=torch.float64,
                                                save_positions=[p for _, p, _ in cks])
            lm = {}
            for name, kw in (("plain", dict(group_scan=False)), ("group_scan_L4", dict(group_scan=True, group_chunks=4)),
                             ("group_scan_L16", dict(group_scan=True, group_chunks=16))):
                cp = torch.full((len(cks), H, K, V), float("nan"), device=DEV)
                pool[0] = s0
                o = gated_delta_chunk_triton(q, k, v, fl, b, A, dtb, cu, pool, idx, checkpoints=cks, checkpoint_pool=cp, **base, **kw)
                lm[name] = dict(rel_o_vs_fp64=rel(o, ro), rel_state_vs_fp64=rel(pool[0], rS),
                                rel_ckpt_vs_fp64=max(rel(cp[i], rck[i]) for i in range(len(cks))), ckpt_nan=bool(cp.isnan().any()),
                                o_nan=bool(o.isnan().any()))
                if name != "plain":
                    lm[name]["rel_o_vs_plain"] = rel(o, lm["plain"]["_o"])
                lm[name]["_o"] = o.float()
            # how much the start state still weighs at the end (0: a group scan bug would be invisible)
            _, _, r0 = gated_delta_recurrent(l2_norm(q.float()), l2_norm(k.float()), v.float(), kda_gate(fl.float(), A, dtb, LB),
                                             torch.sigmoid(b.float()), initial_state=None, acc_dtype=torch.float64,
                                             save_positions=[1024])
            for d in lm.values():
                d.pop("_o")
            row["long_memory_check"] = dict(variants=lm, rel_state_at_1024_change_from_initial_state=rel(r0[0], rck[0]))
            print("long-memory check", row["long_memory_check"], flush=True)
        if T == 4096:  # checkpoints on group boundaries (L = 16: 1,024 / 2,048) and inside groups, vs the plain pass
            cks = [(0, 1024, 0), (0, 1040, 1), (0, 2048, 2), (0, 3000 // 16 * 16, 3), (0, T, 4)]
            got = []
            for kw in (dict(group_scan=False), dict(group_scan=True, group_chunks=16)):
                cp = torch.full((5, H, K, V), float("nan"), device=DEV)
                pool.copy_(pool0)
                gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, idx, checkpoints=cks, checkpoint_pool=cp, **base, **kw)
                got.append((cp, pool.clone()))
            row["checkpoints_rel_diff_vs_plain"] = rel(got[1][0], got[0][0])
            row["checkpoint_at_end_vs_final_state"] = rel(got[1][0][4], got[1][1][0])
            row["checkpoints_nan"] = bool(got[1][0].isnan().any())
        rows.append(row)
        print({k_: v_ for k_, v_ in row.items() if k_ != "variants"}, flush=True)
        for name, r in row["variants"].items():
            print(f"  {name}: {r['ms']:.3f} ms, vs fla {r.get('vs_fla', float('nan')):.2f}x, vs plain "
                  f"{r.get('vs_plain', float('nan')):.2f}x, rel o/state vs plain {r.get('rel_diff_o_vs_plain', -1):.1e}/"
                  f"{r.get('rel_diff_state_vs_plain', -1):.1e}, vs fla {r.get('rel_diff_o_vs_fla', -1):.1e}", flush=True)
        del q, k, v, f, b
    results["group_scan"] = rows


HOST_SHAPES = ((1, 4096), (1, 65536))
# group-scan variants of bench_prefill_host at T: chunks of 64 tokens per group (64: one group at 4K)
HOST_GROUP_CHUNKS = {4096: (64, 32, 22, 16, 8)}  # other T: plain pass only
HOST_HEADS = (12, 128, 128)  # KDA heads, key and value head dims (Kimi K3 TP8)
HOST_BASELINE = None  # main(): --prefill-baseline (an older checkout's package, timed in the same process)


def _load_package(path):
    """Every ``sgl_hybrid_kernel`` module of the checkout at ``path`` (its ``delta_rule`` chunk
    wrappers imported), as a ``sys.modules`` dict; ours are restored afterwards. Time its calls
    inside ``_package(mods)``, which swaps the dict in, so its lazy imports resolve to its own modules."""
    import importlib
    import sys

    mine = {n: m for n, m in sys.modules.items() if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")}
    for n in mine:
        del sys.modules[n]
    sys.path.insert(0, path)
    try:
        for name in ("chunk", "chunk_parallel", "chunk_group_scan", "dispatch"):
            importlib.import_module(f"sgl_hybrid_kernel.delta_rule.{name}")
        theirs = {n: m for n, m in sys.modules.items() if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")}
    finally:
        sys.path.remove(path)
        for n in [n for n in sys.modules if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")]:
            del sys.modules[n]
        sys.modules.update(mine)
    return theirs


class _package:
    def __init__(self, mods):
        self.mods = mods

    def __enter__(self):
        import sys

        if self.mods:
            self.saved = {n: sys.modules.get(n) for n in self.mods}
            sys.modules.update(self.mods)

    def __exit__(self, *exc):
        import sys

        if self.mods:
            for n, m in self.saved.items():
                if m is None:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = m


def _host_numbers(call, reps=30):
    """``(host_us, syncs)``: host wall time per call while issuing ``reps`` calls back to back (no sync
    between them: with no host sync inside ``call`` this is the host's own work, since the GPU only has
    to keep up), and the synchronizing CUDA calls one call makes (``torch.cuda.set_sync_debug_mode``)."""
    import warnings

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6, sum("synchroniz" in str(w.message) for w in got)


def bench_prefill_host(results):
    """Host overhead of the chunk-64 prefill and its group-scan mode (issue 4), B=1, Kimi K3 TP8
    (12 KDA heads x 128, safe gate, BF16 activations, TF32, BF16 intermediates): eager ``do_bench``
    median, the profiler's kernel sum, host time per call and host syncs per call, for this package
    (with and without ``seq_lens_cpu``), an older checkout's (``--prefill-baseline``, same process)
    and fla ``chunk_kda``; outputs of each compared with the plain pass and fla."""
    from fla.ops.kda import chunk_kda

    base_mods = _load_package(HOST_BASELINE) if HOST_BASELINE else None
    impls = [("new", None)] + ([("before", base_mods)] if base_mods else [])
    rows = []
    results["prefill_host"] = rows
    H, K, V = HOST_HEADS
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    for B, T in HOST_SHAPES:
        N = B * T
        q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
        f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
        cu = torch.arange(0, N + 1, T, device=DEV, dtype=torch.int32)
        pool0 = torch.randn(B, H, K, V, device=DEV) * 0.1
        pool = pool0.clone()
        idx = torch.arange(B, device=DEV, dtype=torch.int32)
        cu64 = cu.long()
        base = dict(gate="kda", lower_bound=LB, method="parallel", tf32=True, scratch_dtype=torch.bfloat16)
        row = dict(op="kda_chunk_prefill_host", B=B, T=T, H=H, K=K, V=V, baseline=HOST_BASELINE,
                   baseline_file=base_mods["sgl_hybrid_kernel.delta_rule.chunk"].__file__ if base_mods else None, variants={})
        rows.append(row)

        def fla_call():
            return chunk_kda(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, H, V), f.view(1, N, H, K), b.view(1, N, H),
                             scale=K ** -0.5, initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
                             use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LB,
                             A_log=A, dt_bias=dtb, cu_seqlens=cu64)

        o_fla = s_fla = None
        # fla at every shape: the eager ratio with host lengths is the serving one
        try:
            fms = triton.testing.do_bench(fla_call, warmup=50, rep=150, return_mode="median")
            fper, ftot = _kernel_us(fla_call)
            fhost, fsync = _host_numbers(fla_call)
            pool.copy_(pool0)
            o_fla, s_fla = fla_call()
            o_fla = o_fla.view(N, H, V).float()
            row.update(fla_ms=fms, fla_mtok_s=N / (fms * 1e-3) / 1e6, fla_kernel_sum_us=ftot, fla_host_us=fhost,
                       fla_syncs=fsync)
            print(B, T, f"fla {fms:.3f} ms, kernels {ftot:.0f} us, host {fhost:.0f} us/call, syncs {fsync}", flush=True)
        except Exception as exc:
            print("fla chunk", type(exc).__name__, str(exc)[:300], flush=True)
        variants = [("plain", dict(group_scan=False))]
        variants += [(f"group_scan_L{gc}", dict(group_scan=True, group_chunks=gc)) for gc in HOST_GROUP_CHUNKS.get(T, ())]
        ref = None
        for impl, mods in impls:
            for lens_cpu in ((False, True) if impl == "new" else (False,)):
                for name, kw in variants:
                    if lens_cpu:
                        kw = dict(kw, seq_lens_cpu=[T] * B)
                    tag = f"{impl}{'_lenscpu' if lens_cpu else ''}:{name}"
                    with _package(mods):
                        fn = sys_modules_chunk_fn()
                        call = lambda: fn(q, k, v, f, b, A, dtb, cu, pool, idx, **base, **kw)  # noqa: E731
                        try:
                            call()
                            ms = triton.testing.do_bench(call, warmup=20, rep=120, return_mode="median")
                            ms2 = triton.testing.do_bench(call, warmup=5, rep=120, return_mode="median")
                            per, tot = _kernel_us(call)
                            host, syncs = _host_numbers(call)
                            pool.copy_(pool0)
                            o = call().float()
                        except Exception as exc:
                            print("variant", tag, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                            continue
                    r = dict(ms=ms, ms_repeat=ms2, mtok_s=N / (ms * 1e-3) / 1e6, kernel_sum_us=tot, host_us=host, syncs=syncs,
                             launches=sum(1 for kname in per if "kernel" in kname), kernel_us_per_call=per,
                             nan=bool(o.isnan().any() or pool.isnan().any()))
                    if ref is None:
                        ref = (o, pool.clone())
                    r["rel_diff_o_vs_new_plain"] = rel(o, ref[0])
                    r["rel_diff_state_vs_new_plain"] = rel(pool, ref[1])
                    if row.get("fla_ms"):
                        r["vs_fla"] = row["fla_ms"] / ms
                        r["rel_diff_o_vs_fla"] = rel(o, o_fla)
                        r["rel_diff_state_vs_fla"] = rel(pool, s_fla)
                    row["variants"][tag] = r
                    _save_partial(results)
                    print(f"  {B} {T} {tag}: {ms:.3f} ms (repeat {ms2:.3f}), {r.get('vs_fla', float('nan')):.2f}x fla, "
                          f"kernels {tot:.0f} us, host {host:.0f} us/call, syncs {syncs}, rel o vs new plain "
                          f"{r['rel_diff_o_vs_new_plain']:.1e}, vs fla {r.get('rel_diff_o_vs_fla', -1):.1e}", flush=True)
        del q, k, v, f, b
        torch.cuda.empty_cache()


def sys_modules_chunk_fn():
    """``gated_delta_chunk_triton`` of the package now in ``sys.modules`` (ours, or a baseline's under ``_package``)."""
    import sys

    return sys.modules["sgl_hybrid_kernel.delta_rule.chunk"].gated_delta_chunk_triton


CHUNK_STATE_SHAPES = ((1, 4096), (1, 65536), (8, 16384))
# (name, ChunkLaunch fields replaced on this device's entry); fields the package does not have are skipped,
# so the same list runs against an older checkout (--chunk-state-baseline) for a same-run comparison
CHUNK_STATE_VARIANTS = [
    ("table", {}),
    # eighteenth round (issue 4): Triton 3.8 (the pinned torch's) lowers the gate cumsum's tl.cumsum with
    # branches and twice the shuffles of 3.6, and holds the inverse launch's ten blocks to 255 registers:
    # the scan as a running sum over rows (8 rows' loads issued together), the inverse's M blocks stored
    # once formed (A blocks loaded first: 2; by row block: 1)
    ("rows128_w4", dict(cumsum_row_loop=True, cumsum_bk=128, cumsum_warps=4)),
    ("rows128_w2", dict(cumsum_row_loop=True, cumsum_bk=128, cumsum_warps=2)),
    ("rows64_w2", dict(cumsum_row_loop=True, cumsum_bk=64, cumsum_warps=2)),
    ("rows64_w1", dict(cumsum_row_loop=True, cumsum_bk=64, cumsum_warps=1)),
    ("rows32_w1", dict(cumsum_row_loop=True, cumsum_bk=32, cumsum_warps=1)),
    ("cs32_w4", dict(cumsum_bk=32, cumsum_warps=4)),
    ("cs32_w8", dict(cumsum_bk=32, cumsum_warps=8)),
    ("inv_s1", dict(intra_inv_stream=1)),
    ("inv_s1_w1", dict(intra_inv_stream=1, intra_inv_warps=1)),
    ("inv_s1_w4", dict(intra_inv_stream=1, intra_inv_warps=4)),
    ("inv_s2", dict(intra_inv_stream=2)),
    ("inv_s2_w4", dict(intra_inv_stream=2, intra_inv_warps=4)),
    ("aqk_st2", dict(intra_aqk_stages=2)),
    # fifteenth round (issue 4): the gate cumsum's exponential / reciprocal with their fix-ups, as before
    # (cumsum_fast_exp is the sm_90 table's default since; the same for the w / u step's exponentials was
    # timed too: 895 -> 886 us at B=8, within the spread, option removed; 2026-12-01-h200-prefill_fexp.json)
    ("cumsum_fixup_exp", dict(cumsum_fast_exp=False)),
    # seventeenth round (issue 4): the fused KDA state pass on 2 pipelining stages and on 16-column tiles (one
    # stage, 64 KB of shared memory and two programs per SM, gives wrong results under the H200's Triton 3.6:
    # check_state_stages.py; the 3xTF32 diagonal inverses in the inverse launch instead of the A programs were
    # slower: commit fe51bae)
    ("fst2", dict(state_stages_fused=2)),
    ("fbv16_st2", dict(fuse_output_kda_bv=(16,), state_bv_costs=((16, 1.0),), state_stages_fused=2)),
    # the A programs' diagonal inverses as FP32 FMA products, as before (intra_diag_inv_x3 is the sm_90 default)
    ("diag_ieee", dict(intra_diag_inv_x3=False)),
    # the inverse launch on one warp per program (H200, Triton 3.6: 307 -> 256 us at B=8 T=16K; spills 28 B
    # under Triton 3.8, so not in the table); q e^G written by the w / u programs instead of the A programs
    # was slower (net +181 us: commit 2350d82, taken back)
    ("inv_w1", dict(intra_inv_warps=1)),
    # fourteenth round (issue 4): gate cumsum channel blocks / warps (the merged inverse, the 8-warp fused
    # KDA state pass and the register caps of that round were taken back: commits eddf5ea, 5d4d286; docs/kernels.md)
    ("cs128", dict(cumsum_bk=128)),
    ("cs128_w8", dict(cumsum_bk=128, cumsum_warps=8)),
    ("cs32_w2", dict(cumsum_bk=32, cumsum_warps=2)),
    ("cs64_w2", dict(cumsum_bk=64, cumsum_warps=2)),
    ("cs64_w8", dict(cumsum_bk=64, cumsum_warps=8)),
    # twelfth round (issue 4): KDA A programs with k and q unstacked (A from three TF32 products, Aqk from one;
    # intra_aqk_tf32) and the state pass forming KDA's output at 32-column tiles (fuse_output_kda_bv)
    ("stacked_aqk", dict(intra_aqk_tf32=False, fuse_output_kda_bv=())),
    ("nofuse_kda", dict(fuse_output_kda_bv=())),
    ("fuse_kda_bv16", dict(fuse_output_kda_bv=(16, 32))),
    ("fuse_kda_b4", dict(state_bv_costs=((16, 1.0), (32, 1.27)))),
    ("aqk_st3", dict(intra_aqk_stages=3)),
    ("st1", dict(state_stages=1)),
    ("st2", dict(state_stages=2)),
    ("st4", dict(state_stages=4)),
    ("late", dict(state_early=False)),
    # in-chunk kernel (issue 4): products building A and its block inverse on the tensor cores as
    # 3xTF32 (FP32 operands split hi + lo, FP32 accumulation) instead of FP32 FMA; key block 16
    ("intra_x3", dict(intra_precision="tf32x3")),
    ("intra_ieee", dict(intra_precision="ieee")),
    ("intra_kd16", dict(intra_kd=16)),
    ("intra_x3_kd16", dict(intra_precision="tf32x3", intra_kd=16)),
    # split in-chunk step (issue 4): A / Aqk as [16, 16] blocks j <= i, one program per (chunk, head,
    # 16-row block) with `intra_a_warps` and key blocks of `intra_a_kd`; then the block inverse and
    # w / u / kg per (chunk, head) with `intra_solve_warps`
    # (2026-11-30: 8 / 4 / 2 warps took 7.9 / 2.9 / 1.5 ms for A at B=1, 64K; key blocks of 8 do not compile)
    ("split_a4_kd16", dict(intra_split=True, intra_a_warps=4, intra_a_kd=16, intra_solve_warps=8)),
    ("split_a2_kd16", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8)),
    ("split_a1_kd16", dict(intra_split=True, intra_a_warps=1, intra_a_kd=16, intra_solve_warps=8)),
    # state pass with the state / v_new rounded to the BF16 scratch in its products (state_lowp)
    ("split_a2_lowp", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8, state_lowp=True)),
    ("split_a2_lowp_sw4", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8, state_lowp=True,
                               state_warps=4)),
    ("split_a2_lowp_bv32", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8, state_lowp=True,
                                state_bv=32)),
    # the inverse as a third launch (ten 16x16 blocks, intra_inv_warps per (chunk, head)) before w / u / kg
    ("split_a2_inv4", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8, intra_inv=True,
                           intra_inv_warps=4)),
    ("split_a2_inv8", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8, intra_inv=True,
                           intra_inv_warps=8)),
    ("split_a2_inv4_lowp", dict(intra_split=True, intra_a_warps=2, intra_a_kd=16, intra_solve_warps=8, intra_inv=True,
                                intra_inv_warps=4, state_lowp=True)),
    # output step (2026-11-30, second round): (q e^G) h_c over key blocks (output_kd) with pipelining
    # stages, value tile, warps; output_lowp: q e^G and Aqk rounded to the BF16 scratch (as fla's step)
    ("out_table_kd32", dict(output_kd=32, output_stages=2)),
    ("out_lowp_kd128", dict(output_lowp=True)),
    ("out_lowp_bv32_w8_kd32_st2", dict(output_lowp=True, output_kd=32, output_stages=2)),
    ("out_lowp_bv64_w8_kd32_st2", dict(output_lowp=True, value_tile=64, output_kd=32, output_stages=2)),
    ("out_lowp_bv128_w8_kd32_st2", dict(output_lowp=True, value_tile=128, output_kd=32, output_stages=2)),
    ("out_lowp_bv128_w8_kd32_st3", dict(output_lowp=True, value_tile=128, output_kd=32, output_stages=3)),
    ("out_lowp_bv128_w4_kd32_st2", dict(output_lowp=True, value_tile=128, output_warps=4, output_kd=32, output_stages=2)),
    ("out_lowp_bv64_w4_kd32_st2", dict(output_lowp=True, value_tile=64, output_warps=4, output_kd=32, output_stages=2)),
    ("out_lowp_bv128_w4_kd32_st3", dict(output_lowp=True, value_tile=128, output_warps=4, output_kd=32, output_stages=3)),
    ("out_lowp_bv128_w4_kd16_st3", dict(output_lowp=True, value_tile=128, output_warps=4, output_kd=16, output_stages=3)),
    # w / u steps over the table as BF16 products (2026-11-30: the diagonal 16x16 inverses as 3xTF32
    # were also timed, variants inv_x3*, slower: option removed)
    # (2026-12-01) KDA decays formed from the raw gate in the A, w / u and output steps, with no gate cumsum
    # launch and no FP32 G: 1.35-1.47x slower at B=8 T=16K and B=1 T=64K (the A programs 2x), option removed;
    # benchmark/results/2026-12-01-h200-prefill_gate_recompute.json, docs/kernels.md eleventh round
    ("solve_lowp", dict(intra_solve_lowp=True)),
    ("solve_lowp_w4", dict(intra_solve_lowp=True, intra_solve_warps=4)),
    ("solve_lowp_bv64", dict(intra_solve_lowp=True, intra_bv=64)),
    # A / Aqk build's pipelining stages and the output loop's (over the shipped table; spill-free on sm_90)
    ("a_st2", dict(intra_a_stages=2)),
    ("a_st4", dict(intra_a_stages=4)),
    ("a_w2", dict(intra_arow_warps=2)),
    ("a_w4", dict(intra_arow_warps=4)),
    ("a_norowspec", dict(intra_a_rowspec=False)),
    ("out_st4", dict(output_stages=4)),
    # A / Aqk build and the block inverse in one launch per (chunk, head) (2026-11-30, third round) was
    # slower at every spill-free shape (benchmark/results/2026-11-30-h200-prefill_ainv_sweep.json; removed).
    # Stacked A / Aqk programs (intra_a_stacked): key blocks outside the column blocks, [k; q] as one 32-row
    # operand, row factors once per key block, per-pair [KD] factors only; warps x pipelining stages
    ("stacked_w2_s2", dict(intra_a_stacked=True, intra_a_warps=2, intra_a_stages=2)),
    ("stacked_w2_s3", dict(intra_a_stacked=True, intra_a_warps=2, intra_a_stages=3)),
    ("stacked_w2_s4", dict(intra_a_stacked=True, intra_a_warps=2, intra_a_stages=4)),
    ("stacked_w4_s2", dict(intra_a_stacked=True, intra_a_warps=4, intra_a_stages=2)),
    ("stacked_w4_s3", dict(intra_a_stacked=True, intra_a_warps=4, intra_a_stages=3)),
    ("stacked_w4_s4", dict(intra_a_stacked=True, intra_a_warps=4, intra_a_stages=4)),
    # + the 16x16 diagonal inverses in the stacked A programs (intra_diag_inv), inverse launch warps,
    # 32-column state tiles (more value tiles per sequence: B=8 fills fewer waves per tile)
    ("stk_dinv", dict(intra_a_stacked=True, intra_a_warps=2, intra_a_stages=2, intra_diag_inv=True)),
    ("stk_dinv_inv8", dict(intra_a_stacked=True, intra_a_warps=2, intra_a_stages=2, intra_diag_inv=True,
                           intra_inv_warps=8)),
    # (stk_sbv32 / stk_dinv_sbv32, state_bv=32: the FP32-scratch state pass needs 238,592 B of shared memory
    # on the H200's triton 3.6, over its 232,448: dropped)
    ("a_st3", dict(intra_a_stages=3)),
    # state pass tiles (2026-11-30, fourth round; BF16 scratch as timed: the FP32-scratch pass needs more
    # shared memory at 32 columns): 32 columns, warps, whole-K key block
    ("sbv32", dict(state_bv=32)),
    ("sbv32_sw4", dict(state_bv=32, state_warps=4)),
    ("sw4", dict(state_warps=4)),
    ("skd128_sw4", dict(state_kd=128, state_warps=4)),
    ("skd128", dict(state_kd=128)),
    # fifth round: the stacked A programs specialised per row block (static column-block tests, one
    # code path each), key blocks of 32, the block-inverse merges as chained 3xTF32 products
    ("a_rowspec", dict(intra_a_rowspec=True)),
    ("a_rowspec_w4", dict(intra_a_rowspec=True, intra_a_warps=4)),
    ("a_rowspec_st3", dict(intra_a_rowspec=True, intra_a_stages=3)),
    ("a_kd32", dict(intra_a_kd=32)),
    ("inv_chain", dict(intra_inv_chain=True)),
    ("rowspec_chain", dict(intra_a_rowspec=True, intra_inv_chain=True)),
    # over the table with those three (row-specialised A programs on 3 stages, chained inverse):
    # column factors e^{G_r - G_s} in one exponential per pair element, and stages
    ("a_direct", dict(intra_a_direct=True)),
    ("a_direct_st4", dict(intra_a_direct=True, intra_a_stages=4)),
    ("a_direct_st2", dict(intra_a_direct=True, intra_a_stages=2)),
    # the pieces one at a time off the shipped table (same process), and B=1 state-pass parallelism
    # (8-column tiles: 192 programs; 2 stages: less shared memory per program)
    ("no_direct", dict(intra_a_direct=False)),
    ("no_rowspec", dict(intra_a_rowspec=False, intra_a_direct=False, intra_a_stages=2)),
    ("no_chain", dict(intra_inv_chain=False)),
    ("sbv8_st2", dict(state_bv=8, state_stages=2)),
    # the inverse stored as BF16 for the w / u step (which rounds it to BF16 anyway), inverse warps
    ("inv_lowp", dict(intra_inv_lowp=True)),
    ("inv_lowp_w2", dict(intra_inv_lowp=True, intra_inv_warps=2)),
    ("inv_lowp_solve_w4", dict(intra_inv_lowp=True, intra_solve_warps=4)),
    # over the table with those (BF16 inverse on 2 warps): the w / u step's warps, the inverse's old warps
    ("solve_w4", dict(intra_solve_warps=4)),
    ("inv_w4", dict(intra_inv_warps=4)),
    # state pass tiles where the batch already fills the SMs (B=8: 768 programs of 16 columns)
    ("sbv32_st2", dict(state_bv=32, state_stages=2)),
    ("sbv64", dict(state_bv=64)),
    # sixth round (over the table): the gate cumsum's channel block / warps, the A build without
    # pipelining or on one warp, the state pass with 4 stages (last: a state-pass variant may lose the
    # context), and, for information only, every in-chunk product as one TF32 product as fla does
    # (not the issue's FP32-input contract for A and its inverse)
    ("cs_bk128_w4", dict(cumsum_bk=128, cumsum_warps=4)),
    ("cs_bk128_w8", dict(cumsum_bk=128, cumsum_warps=8)),
    ("cs_bk32_w2", dict(cumsum_bk=32, cumsum_warps=2)),
    ("cs_w8", dict(cumsum_warps=8)),
    ("a_st1", dict(intra_a_stages=1)),
    ("a_w1", dict(intra_a_warps=1)),
    ("solve_w4_cs128", dict(intra_solve_warps=4, cumsum_bk=128, cumsum_warps=8)),
    ("fla_prec", dict(intra_precision="tf32")),
    ("sst4", dict(state_stages=4)),
    # over the table with those kept (A programs on one warp, w / u on 4 warps, 4 state-pass stages with
    # 16-bit scratch): each taken back, more stages, and the state tiles re-timed at 4+ stages
    ("sst3", dict(state_stages_lowp=3)),
    ("sst5", dict(state_stages_lowp=5)),
    ("arow_w2", dict(intra_arow_warps=2)),
    ("solve_w8", dict(intra_solve_warps=8)),
    ("sbv16_only", dict(state_bv_costs=())),
    ("sbv32_only", dict(state_bv_costs=(), state_bv=32)),
    ("sbv32_sst5", dict(state_bv_costs=(), state_bv=32, state_stages_lowp=5)),
    ("sst6", dict(state_stages_lowp=6)),
    ("sbv16_sst6", dict(state_bv_costs=(), state_stages_lowp=6)),
    # (2026-11-30, sixth round: Aqk written as BF16 and q e^G / q's norm factor written by the stacked A
    # programs for the output step, options output_aqk_lowp / output_qg: the output step gained up to
    # 200 us at B=8 but the A programs lost as much (more registers); removed, see
    # benchmark/results/2026-11-30-h200-prefill_output_bytes_attempt.json)
    # (the stacked A programs' 16x16 diagonal inverses as 3xTF32 products, option intra_diag_x3: A build
    # 951 -> 954 us at B=1, 1,843 -> 1,883 at B=8 on one warp, slower on two; removed, see
    # benchmark/results/2026-11-30-h200-prefill_diag_x3_attempt.json)
    # (seventh round: a KDA state pass that forms the output, with q e^G written by the w / u step or the gate
    # cumsum, options fuse_output_waves / state_bv_fused_max / fused_aqk_lowp: B=8 T=16K 4,973 -> 4,869 us at
    # best, slower at B=1 and with every other producer; GDN keeps it (fuse_output_gdn, bench_gdn_prefill); the
    # KDA form removed, see benchmark/results/2026-11-30-h200-prefill_fused_output_r1.json .. _r4.json)
]


def _fp64_chunk_err(fn):
    """Max relative error (outputs and final states) of ``fn`` (a ``gated_delta_chunk_triton``) in the
    chunk-64 form with TF32 products and FP32 inputs / intermediates against the FP64 recurrence, on a
    varlen batch of 300 + 64 + 1000 tokens (12 KDA heads x 128, safe gate): the numerics of a launch variant."""
    H, K, V = 12, 128, 128
    g = torch.Generator(device=DEV).manual_seed(7)
    cu = torch.tensor([0, 300, 364, 1364], device=DEV, dtype=torch.int32)
    q, k, v = (torch.randn(1364, H, d, device=DEV, generator=g) for d in (K, K, V))
    f, b = torch.randn(1364, H, K, device=DEV, generator=g), torch.randn(1364, H, device=DEV, generator=g)
    A, dtb = torch.rand(H, device=DEV, generator=g), torch.randn(H * K, device=DEV, generator=g)
    pool0 = torch.randn(3, H, K, V, device=DEV, generator=g)
    idx = torch.arange(3, device=DEV, dtype=torch.int32)
    pool = pool0.clone()
    o = fn(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB, method="parallel", tf32=True, group_scan=False)
    errs = []
    for i in range(3):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        ro, rs = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], kda_gate(f[sl], A, dtb, LB), torch.sigmoid(b[sl]),
                                       initial_state=pool0[i], acc_dtype=torch.float64)[:2]
        errs += [rel(o[sl], ro), rel(pool[i], rs)]
    return max(errs)


PARTIAL_OUT = None  # main(): --out, rewritten after every chunk-state variant


def _context_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error that leaves the process's context unusable (an illegal memory
    access or another sticky error: every later launch fails with it)."""
    text = f"{type(exc).__name__}: {exc}"
    return "illegal memory access" in text or "unspecified launch failure" in text or "misaligned address" in text


def _compiled_entries(module):
    """``{id: (kernel name, compiled kernel)}`` of every compiled Triton kernel of ``module``."""
    out = {}
    for name, fn in vars(module).items():
        caches = getattr(fn, "device_caches", None)
        if caches and name.endswith("_kernel"):
            for dc in caches.values():
                for ck in dc[0].values():
                    out[id(ck)] = (name, ck)
    return out


def _compiled_resources(module, before):
    """``{kernel: {"regs", "spills", "shared"}}`` of the kernels of ``module`` compiled since ``before``
    (:func:`_compiled_entries`): this device's Triton as launched, what the CPU compile gate cannot see."""
    out = {}
    try:
        for key, (name, ck) in _compiled_entries(module).items():
            if key not in before:
                ck._init_handles()
                out[name] = dict(regs=ck.n_regs, spills=ck.n_spills, shared=ck.metadata.shared)
    except Exception as exc:  # a Triton version without these fields: say so, do not fail the run
        out["error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
    return out


def _load_baseline(path):
    """``gated_delta_chunk_triton`` and ``chunk_parallel`` of another checkout's package (``path``
    holds ``sgl_hybrid_kernel``), imported beside this one: the baseline timed in the same process."""
    import importlib
    import sys

    mine = {n: m for n, m in sys.modules.items() if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")}
    for n in mine:
        del sys.modules[n]
    sys.path.insert(0, path)
    try:
        fn = importlib.import_module("sgl_hybrid_kernel.delta_rule.chunk").gated_delta_chunk_triton
        mod = importlib.import_module("sgl_hybrid_kernel.delta_rule.chunk_parallel")
    finally:
        sys.path.remove(path)
        for n in [n for n in sys.modules if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")]:
            del sys.modules[n]
        sys.modules.update(mine)
    return fn, mod


def bench_chunk_state(results, variants=None, baseline=None):
    """Chunk-64 prefill (issue 4), Kimi K3 TP8 (12 KDA heads x 128, safe gate, BF16 activations, TF32
    products, BF16 intermediates): launch-table variants of the state pass (value tile, warps,
    pipelining stages) and the in-chunk kernel's warps, vs fla ``chunk_kda`` in the same process, both given
    host lengths as serving gives them (before 2026-12-02 neither was: each call then read the offsets back,
    one sync per call, and under Triton 3.8 our eager figure exceeded our kernel sum by 0.16-0.44 ms, fla's
    by none);
    eager ``do_bench`` median and the profiler's per-kernel times; relative difference to fla.
    ``baseline``: path of an older checkout's package, timed as variant ``baseline`` (its table)."""
    import dataclasses

    from fla.ops.kda import chunk_kda

    from sgl_hybrid_kernel.delta_rule import chunk_parallel as cp_mod
    from sgl_hybrid_kernel.delta_rule import triton_chunk_parallel as tcp_mod
    from sgl_hybrid_kernel.platform import device_platform

    base_fn = _load_baseline(baseline)[0] if baseline else None
    key = device_platform(torch.device(DEV)).key
    base = cp_mod.device_chunk_launch(torch.device(DEV))
    fields = {f.name for f in dataclasses.fields(base)}
    rows = []
    results["chunk_state"] = rows
    fp64_errs = {}
    compiled = {}  # variant -> registers / spills / shared memory of the kernels its first call compiled
    H, K, V = 12, 128, 128
    A, dtb = torch.rand(H, device=DEV), torch.randn(H * K, device=DEV)
    for B, T in CHUNK_STATE_SHAPES:
        N = B * T
        q, k, v = (torch.randn(N, H, d, device=DEV, dtype=torch.bfloat16) for d in (K, K, V))
        f = torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(N, H, device=DEV, dtype=torch.bfloat16)
        cu = torch.arange(0, N + 1, T, device=DEV, dtype=torch.int32)
        pool0 = torch.randn(B, H, K, V, device=DEV) * 0.1
        pool = pool0.clone()
        idx = torch.arange(B, device=DEV, dtype=torch.int32)
        cu64, cu_cpu = cu.long(), cu.long().cpu()
        lens = [T] * B  # host lengths for both, as serving passes them (without: one .tolist() sync per call)

        def fla_call():
            return chunk_kda(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, H, V), f.view(1, N, H, K), b.view(1, N, H),
                             scale=K ** -0.5, initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
                             use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LB,
                             A_log=A, dt_bias=dtb, cu_seqlens=cu64, cu_seqlens_cpu=cu_cpu)

        fms = triton.testing.do_bench(fla_call, warmup=50, rep=300, return_mode="median")
        fper, ftot = _kernel_us(fla_call)
        pool.copy_(pool0)
        o_fla, s_fla = fla_call()
        o_fla = o_fla.view(N, H, V).float()
        row = dict(op="kda_chunk_prefill_state_pass", B=B, T=T, H=H, K=K, V=V, host_lengths=True, launch_base=str(base), fla_ms=fms,
                   fla_mtok_s=N / (fms * 1e-3) / 1e6, fla_kernel_sum_us=ftot, fla_kernel_us_per_call=fper, variants={})
        rows.append(row)
        print(B, T, f"fla {fms:.3f} ms, kernels {ftot:.1f} us", flush=True)
        runs = [("baseline", None)] if baseline else []
        for name, over in runs + list(variants or CHUNK_STATE_VARIANTS):
            if over is None:
                fn = base_fn
            elif not set(over) <= fields:
                continue
            else:
                fn = gated_delta_chunk_triton
                cp_mod.CHUNK_LAUNCH[key] = dataclasses.replace(base, **over)
            call = lambda: fn(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB,  # noqa: E731
                              method="parallel", tf32=True, scratch_dtype=torch.bfloat16, group_scan=False,
                              seq_lens_cpu=lens)
            before = _compiled_entries(tcp_mod)
            try:
                ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
                compiled.setdefault(name, _compiled_resources(tcp_mod, before))
                per, tot = _kernel_us(call)
                pool.copy_(pool0)
                o = call().float()
            except Exception as exc:
                print("variant", name, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                if _context_lost(exc):  # every later launch in this process would fail too: say so once
                    print(f"CUDA context lost at variant {name}: the remaining variants of this run are skipped; "
                          "rerun them without it", flush=True)
                    row["context_lost_at"] = name
                    cp_mod.CHUNK_LAUNCH[key] = base
                    return
                continue
            if name not in fp64_errs:  # the same launch's numerics at every shape: check once
                try:  # FP32 inputs / scratch: a variant may not fit there (e.g. shared memory)
                    fp64_errs[name] = _fp64_chunk_err(fn)
                except Exception as exc:
                    fp64_errs[name] = f"FAILED {type(exc).__name__}: {str(exc)[:200]}"
            fp64_err = fp64_errs[name]
            state_us = sum(t for kname, t in per.items() if "chunk_state" in kname)
            intra_us = sum(t for kname, t in per.items() if "chunk_intra" in kname)
            r = dict(overrides=over if over is not None else f"package at {baseline}", ms=ms, mtok_s=N / (ms * 1e-3) / 1e6, vs_fla=fms / ms, kernel_sum_us=tot,
                     kernel_sum_vs_fla=ftot / tot, state_us=state_us, intra_us=intra_us, kernel_us_per_call=per,
                     rel_diff_o_vs_fla=rel(o, o_fla), rel_diff_state_vs_fla=rel(pool, s_fla), fp64_rel_err_tf32_fp32in=fp64_err,
                     nan=bool(o.isnan().any() or pool.isnan().any()))
            r["compiled"] = compiled.get(name)
            row["variants"][name] = r
            _save_partial(results)
            fp64_txt = f"{fp64_err:.1e}" if isinstance(fp64_err, float) else fp64_err
            print(f"  {B} {T} {name}: {ms:.3f} ms ({r['vs_fla']:.3f}x fla), kernels {tot:.0f} us (state {state_us:.0f}, "
                  f"intra {intra_us:.0f}), rel o/state vs fla {r['rel_diff_o_vs_fla']:.1e}/{r['rel_diff_state_vs_fla']:.1e}, "
                  f"vs FP64 {fp64_txt}", flush=True)
        cp_mod.CHUNK_LAUNCH[key] = base
        del q, k, v, f, b
        torch.cuda.empty_cache()


GDN_PREFILL_SHAPES = ((1, 32768), (4, 8192))
GDN_KEEP = None  # main(): --gdn-variants
# state-pass tiles / stages for GDN (48 value heads: pick_state_tile takes 64 columns already at B=1, a rule
# fitted on KDA); sixth round of issue 4
GDN_PREFILL_VARIANTS = [
    ("table", {}),
    # eighteenth round (issue 4): under Triton 3.8 (see CHUNK_STATE_VARIANTS); a_select: the stacked A programs'
    # [k; q] loaded through a per-row pointer select, as before intra_a_join (not yet timed against it)
    ("a_select", dict(intra_a_join=False)),
    ("inv_s1", dict(intra_inv_stream=1)),
    ("inv_s1_w4", dict(intra_inv_stream=1, intra_inv_warps=4)),
    ("inv_s2", dict(intra_inv_stream=2)),
    ("a_st2", dict(intra_a_stages=2)),
    ("a_st4", dict(intra_a_stages=4)),
    ("a_w2", dict(intra_arow_warps=2)),
    ("a_w4", dict(intra_arow_warps=4)),
    ("a_norowspec", dict(intra_a_rowspec=False)),
    ("sbv16", dict(state_bv_costs=())),
    ("sbv32", dict(state_bv_costs=(), state_bv=32)),
    ("sst3", dict(state_stages_lowp=3)),
    # (seventh round) the state pass forms the output (fuse_output_gdn, the table's default now): taken back,
    # and on 2 pipelining stages
    ("nofuse", dict(fuse_output_gdn=False)),
    ("fuse_st2", dict(state_stages_fused=2)),
    ("diag_ieee", dict(intra_diag_inv_x3=False)),
    # (A / Aqk of a whole chunk per program as k k^T and q k^T, the diagonal inverses left to the inverse
    # launch: A build 839 -> 657 us on 8 warps, inverse 308 -> 1,069 us at B=1 T=32K; removed, see
    # benchmark/results/2026-11-30-h200-gdn_prefill_whole_chunk_attempt.json)
]


def bench_gdn_prefill(results, baseline=None):
    """Chunk-64 GDN prefill (issue 4, op 5), Qwen3.8-Flash-Next per GPU (16 q / k heads, 48 value heads, 128 x
    128, BF16 activations, raw gate and beta activated in the kernels, TF32 products, BF16 scratch, host
    lengths) vs fla ``chunk_gated_delta_rule`` (GVA, gate and beta sigmoid in its kernels, host lengths) in
    the same process: eager ``do_bench`` median, the profiler's per-kernel times, relative difference of
    outputs and final states to fla. ``baseline``: an older checkout's package, timed as ``baseline``."""
    import dataclasses

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from sgl_hybrid_kernel.delta_rule import chunk_parallel as cp_mod
    from sgl_hybrid_kernel.platform import device_platform

    base_fn = _load_baseline(baseline)[0] if baseline else None
    key = device_platform(torch.device(DEV)).key
    base = cp_mod.device_chunk_launch(torch.device(DEV))
    rows = []
    results["gdn_prefill"] = rows
    H, HV, K, V = 16, 48, 128, 128
    A, dtb = torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)
    for B, T in GDN_PREFILL_SHAPES:
        N = B * T
        q, k = (torch.randn(N, H, K, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(N, HV, V, device=DEV, dtype=torch.bfloat16)
        a, b = (torch.randn(N, HV, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        lens = [T] * B
        cu = torch.arange(0, N + 1, T, device=DEV, dtype=torch.int32)
        cu64, cu_cpu = cu.long(), cu.long().cpu()
        pool0 = torch.randn(B, HV, K, V, device=DEV) * 0.1
        pool = pool0.clone()
        idx = torch.arange(B, device=DEV, dtype=torch.int32)

        def fla_call():
            return chunk_gated_delta_rule(q.view(1, N, H, K), k.view(1, N, H, K), v.view(1, N, HV, V), a.view(1, N, HV),
                                          b.view(1, N, HV), scale=K ** -0.5, initial_state=pool, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                          use_gate_in_kernel=True, A_log=A, dt_bias=dtb, cu_seqlens=cu64,
                                          cu_seqlens_cpu=cu_cpu)

        fms = triton.testing.do_bench(fla_call, warmup=25, rep=200, return_mode="median")
        fper, ftot = _kernel_us(fla_call)
        pool.copy_(pool0)
        o_fla, s_fla = fla_call()
        o_fla = o_fla.view(N, HV, V).float()
        row = dict(op="gdn_chunk_prefill", B=B, T=T, H=H, HV=HV, K=K, V=V, launch_base=str(base), fla_ms=fms,
                   fla_mtok_s=N / (fms * 1e-3) / 1e6, fla_kernel_sum_us=ftot, fla_kernel_us_per_call=fper, variants={})
        rows.append(row)
        print("gdn", B, T, f"fla {fms:.3f} ms, kernels {ftot:.1f} us", flush=True)
        runs = ([("baseline", None)] if baseline else []) + [x for x in GDN_PREFILL_VARIANTS if GDN_KEEP is None or x[0] in GDN_KEEP]
        for name, over in runs:
            fn = base_fn if over is None else gated_delta_chunk_triton
            if over is not None:
                cp_mod.CHUNK_LAUNCH[key] = dataclasses.replace(base, **over)
            call = lambda: fn(q, k, v, a, b, A, dtb, cu, pool, idx, gate="gdn", method="parallel", tf32=True,  # noqa: E731
                              scratch_dtype=torch.bfloat16, group_scan=False, seq_lens_cpu=lens)
            try:
                ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
                per, tot = _kernel_us(call)
                pool.copy_(pool0)
                o = call().float()
            except Exception as exc:
                print("gdn variant", name, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                if _context_lost(exc):
                    cp_mod.CHUNK_LAUNCH[key] = base
                    return
                continue
            r = dict(overrides=over if over is not None else f"package at {baseline}", ms=ms, mtok_s=N / (ms * 1e-3) / 1e6,
                     vs_fla=fms / ms, kernel_sum_us=tot, kernel_sum_vs_fla=ftot / tot, kernel_us_per_call=per,
                     rel_diff_o_vs_fla=rel(o, o_fla), rel_diff_state_vs_fla=rel(pool, s_fla),
                     nan=bool(o.isnan().any() or pool.isnan().any()))
            row["variants"][name] = r
            _save_partial(results)
            print(f"  gdn {B} {T} {name}: {ms:.3f} ms ({r['vs_fla']:.3f}x fla), kernels {tot:.0f} us "
                  f"({r['kernel_sum_vs_fla']:.3f}x), state {sum(t for kn, t in per.items() if 'chunk_state' in kn):.0f} us, "
                  f"rel o/state vs fla {r['rel_diff_o_vs_fla']:.1e}/{r['rel_diff_state_vs_fla']:.1e}", flush=True)
        cp_mod.CHUNK_LAUNCH[key] = base
        del q, k, v, a, b
        torch.cuda.empty_cache()


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
            kw = {} if bv is None else dict(value_tile=bv)
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
        mod = importlib.import_module("sgl_hybrid_kernel.delta_rule.recurrent")
    finally:
        sys.path.remove(path)
        for n in [n for n in sys.modules if n == "sgl_hybrid_kernel" or n.startswith("sgl_hybrid_kernel.")]:
            del sys.modules[n]
        sys.modules.update(mine)
    return mod.gated_delta_recurrent_triton, mod.replay_commit


# (BV, warps[, preload]) tried per case; None = the wrapper's default (pick_value_tile /
# recurrent_num_warps / recurrent_preload); preload False = per-token inputs ("_tok" in the name)
# (the first sweep, 2026-11-30, tried 4..64 columns x 1..8 warps: one warp won everywhere)
SWEEP_TILES = {("decode", 1): [None, (1, 1), (2, 1), (4, 1), (8, 1), (16, 1)], ("decode", 0): [None, (4, 1), (8, 1)],
               ("verify", 1): [None, (1, 1), (2, 1), (2, 1, False), (4, 1, False), (8, 1, False)],
               ("verify", 0): [None, (1, 1), (2, 1), (2, 1, False), (4, 1), (8, 1, False), (16, 1, False), (16, 2, False), (32, 2, False),
                               (64, 4, False)]}
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
             {} if t is None else dict(value_tile=t[0], num_warps=t[1], **({"preload": t[2]} if len(t) > 2 else {})))
            for t in tiles]
        if WIDE_VARIANTS:  # decode too (T = 1): the same kernel, one token
            todo += [(f"wide_bv{bv}_w{nw}" + (f"_kl{kl}" if kl else ""), gated_delta_recurrent_triton,
                      dict(wide=True, value_tile=bv, num_warps=nw,
                           **({"key_lanes": int(str(kl).split("s")[0])} if kl else {}),
                           **({"num_stages": int(str(kl).split("s")[1])} if "s" in str(kl) else {})))
                     for bv, nw, kl in WIDE_VARIANTS]
        if T > 1:
            todo += [(f"chunk_bv{bv}_w{nw}_{prec}", gated_delta_recurrent_triton,
                      dict(form="chunk", value_tile=bv, num_warps=nw, dot_precision=prec)) for bv, nw, prec in CHUNK_VARIANTS]
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
    global PARTIAL_OUT, CHUNK_STATE_SHAPES, RECURRENT_BASELINE, SWEEP_DEFAULT_ONLY, SWEEP_CASES, HOST_BASELINE, HOST_SHAPES
    global GDN_KEEP, SWEEP_DECODE_BATCHES, SWEEP_VERIFY_BATCHES, SWEEP_DEFERRED_BATCHES, SWEEP_VERIFY_TOKENS
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_delta_rule.json")
    p.add_argument("--only", default=None, help="comma list: correctness,bench_decode_verify,bench_fused_decode,bench_gdn,"
                   "bench_prefill,bench_group_scan,bench_decode_b1_value_tiles,bench_chunk_state,bench_gdn_prefill,bench_recurrent_sweep,"
                   "deferred_exact")
    p.add_argument("--tag", default="", help="label stored in the JSON (e.g. 'baseline' for an older checkout's package)")
    p.add_argument("--chunk-state-variants", default=None, help="comma list of CHUNK_STATE_VARIANTS names (default: all)")
    p.add_argument("--chunk-state-shapes", default=None, help="comma list of BxT (default: CHUNK_STATE_SHAPES)")
    p.add_argument("--chunk-state-baseline", default=None, help="path holding an older checkout's sgl_hybrid_kernel, "
                   "timed in the same process as variant 'baseline'")
    p.add_argument("--recurrent-baseline", default=None, help="path holding an older checkout's sgl_hybrid_kernel: its "
                   "decode / verify wrapper is timed in bench_recurrent_sweep as variant 'baseline'")
    p.add_argument("--sweep-tiles", default="all", choices=("all", "default"), help="bench_recurrent_sweep: every "
                   "(value tile, warps) of SWEEP_TILES, or the defaults only")
    p.add_argument("--sweep-cases", default=None, help="bench_recurrent_sweep: comma list of substrings of the case "
                   "names to run (e.g. 'verify,deferred'; default: all)")
    p.add_argument("--prefill-baseline", default=None, help="bench_prefill_host: path holding an older checkout's "
                   "sgl_hybrid_kernel, timed in the same process as 'before'")
    p.add_argument("--host-shapes", default=None, help="bench_prefill_host: comma list of BxT (default: HOST_SHAPES)")
    p.add_argument("--prefill-variants", default=None, help="comma list of PREFILL_VARIANTS names to time (default: all)")
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
    p.add_argument("--gdn-variants", default=None, help="bench_gdn_prefill: comma list of GDN_PREFILL_VARIANTS names")
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
    PARTIAL_OUT = args.out
    if args.prefill_variants:
        keep = args.prefill_variants.split(",")
        PREFILL_VARIANTS[:] = [x for x in PREFILL_VARIANTS if x[0] in keep]
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "time": time.strftime("%Y-%m-%d %H:%M:%S"), "tag": args.tag}
    import sys

    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    if only is None or "correctness" in only:
        check_correctness(results)
    if only is not None and "deferred_exact" in only:  # the serving-shape bit-exact checks alone (B=8, and GDN B=1)
        results["deferred_exact"] = {f"{g}_{lay}_t{t}_b{b}": _deferred_exact(g, h, hv, t, lay, B=b) for g, h, hv, t, lay, b in (
            ("gdn", 16, 48, 5, "vk", 8), ("gdn", 16, 48, 5, "kv", 8), ("kda", 12, 12, 4, "vk", 8), ("gdn", 16, 48, 5, "vk", 1))}
        for lv in (x for x in args.lanes_exact.split(",") if x):  # the lanes kernel at explicit tiles
            bv, kl = (int(y) for y in lv.split("x"))
            for g, h, hv, t, b in (("gdn", 16, 48, 5, 8), ("gdn", 16, 48, 5, 32), ("kda", 12, 12, 4, 8)):
                results["deferred_exact"][f"{g}_vk_t{t}_b{b}_lanes_bv{bv}_kl{kl}"] = _deferred_exact(
                    g, h, hv, t, "vk", B=b, value_tile=bv, key_lanes=kl)
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
    try:
        if only is None or "bench_prefill" in only:
            bench_prefill(results)
    except Exception as exc:
        print("bench_prefill FAILED", type(exc).__name__, str(exc)[:500])
    try:
        if only is not None and "bench_prefill_host" in only:  # issue 4 host overhead (not in the default run)
            HOST_BASELINE = args.prefill_baseline
            if args.host_shapes:
                HOST_SHAPES = tuple(tuple(int(x) for x in bt.split("x")) for bt in args.host_shapes.split(","))
            bench_prefill_host(results)
    except Exception as exc:
        print("bench_prefill_host FAILED", type(exc).__name__, str(exc)[:500])
    try:
        if only is not None and "bench_gdn_prefill" in only:  # issue 4 op 5 (not in the default run)
            GDN_KEEP = args.gdn_variants.split(",") if args.gdn_variants else None
            bench_gdn_prefill(results, args.chunk_state_baseline)
    except Exception as exc:
        print("bench_gdn_prefill FAILED", type(exc).__name__, str(exc)[:500])
    try:
        if only is None or "bench_chunk_state" in only:
            keep = args.chunk_state_variants.split(",") if args.chunk_state_variants else None
            PARTIAL_OUT = args.out
            if args.chunk_state_shapes:
                CHUNK_STATE_SHAPES = tuple(tuple(int(x) for x in bt.split("x")) for bt in args.chunk_state_shapes.split(","))
            bench_chunk_state(results, [x for x in CHUNK_STATE_VARIANTS if keep is None or x[0] in keep],
                              args.chunk_state_baseline)
    except Exception as exc:
        print("bench_chunk_state FAILED", type(exc).__name__, str(exc)[:500])
    try:
        if only is None or "bench_group_scan" in only:
            bench_group_scan(results)
    except Exception as exc:
        print("bench_group_scan FAILED", type(exc).__name__, str(exc)[:500])
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
