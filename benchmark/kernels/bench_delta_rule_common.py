"""Shared pieces of the delta-rule kernel benchmarks (``bench_delta_rule_recurrent.py``: decode / verify;
``bench_delta_rule_chunk.py``: chunked prefill): device and gate constants, timing helpers, the plan helpers of
benchmark variants, cases loaded from the JSON beside the scripts, and the GPU correctness checks both run.

Run on a CUDA machine (the device tool), with fla-core importable (see each script's docstring).
"""

from __future__ import annotations

import json
import os

import torch

from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, gdn_gate, kda_gate
from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides, RecurrentOverrides
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton, replay_commit
from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode
from sgl_hybrid_kernel.norm import gated_rms_norm, l2_norm

HERE = os.path.dirname(os.path.abspath(__file__))


def _decode_case(value):
    """JSON -> Python: lists become tuples, ``"torch.<dtype>"`` strings dtypes."""
    if isinstance(value, list):
        return tuple(_decode_case(x) for x in value)
    if isinstance(value, dict):
        return {k: _decode_case(x) for k, x in value.items()}
    if isinstance(value, str) and value.startswith("torch."):
        return getattr(torch, value[len("torch."):])
    return value


def load_cases(name: str) -> dict:
    """The cases of ``delta_rule_<name>_cases.json`` beside this file: each entry's ``value`` (tuples for lists;
    dicts keyed by integers where the keys are digits), or for ``*_VARIANTS`` a list of ``(name, fields)``.

    Raises:
        ValueError: an entry with neither ``value`` nor ``cases``.
    """
    with open(os.path.join(HERE, f"delta_rule_{name}_cases.json")) as fh:
        raw = json.load(fh)
    out = {}
    for key, entry in raw.items():
        if key == "about":
            continue
        if "cases" in entry:
            out[key] = [(c["name"], _decode_case(c["fields"])) for c in entry["cases"]]
        elif "value" in entry:
            v = entry["value"]
            if isinstance(v, dict):
                out[key] = {(int(k) if k.isdigit() else tuple(int(p) if p.isdigit() else p for p in k.split(","))):
                            _decode_case(x) for k, x in v.items()}
            else:
                out[key] = _decode_case(v)
        else:
            raise ValueError(f"name: entry {key!r} of delta_rule_{name}_cases.json has neither value nor cases")
    return out


DEV = "cuda"


LB = -5.0


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _kernel_us(fn, calls=3):
    """Per-call device time of each kernel launched by ``fn`` (profiler), and their sum in µs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}
    return per, sum(per.values())


PARTIAL_OUT = None  # main(): --out, rewritten after every chunk-state variant


def _save_partial(results):
    """Write ``results`` to ``PARTIAL_OUT`` (if set) now, so a run cut short by the device call's limit keeps
    what it measured."""
    if PARTIAL_OUT:
        with open(PARTIAL_OUT, "w") as fh:
            json.dump(results, fh, indent=1)


def _context_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error that leaves the process's context unusable (an illegal memory
    access or another sticky error: every later launch fails with it)."""
    text = f"{type(exc).__name__}: {exc}"
    return "illegal memory access" in text or "unspecified launch failure" in text or "misaligned address" in text


def chunk_ours(*args, fn=None, **kw):
    """``gated_delta_chunk_triton`` (or ``fn``, the same function of this checkout loaded otherwise) with a variant's
    plan fields (``ChunkOverrides`` fields in ``kw``: ``method``, ``tf32``, ``scratch_dtype``, ``group_scan``,
    ``group_chunks``, ``value_tile``, ...) given as its plan."""
    over = {k: kw.pop(k) for k in list(kw) if k in ChunkOverrides.__dataclass_fields__}
    return (fn or gated_delta_chunk_triton)(*args, **kw, plan=ChunkOverrides(**over) if over else None)


def _chunk_mode(fn, launch=None, **mode):
    """Keyword arguments selecting a chunked-prefill plan: ours take ``plan=ChunkOverrides(...)`` (a variant is the
    table row ``launch`` with its fields replaced); a baseline package (an older checkout) its own keywords."""
    if fn is gated_delta_chunk_triton:
        return {"plan": ChunkOverrides(launch=launch, **mode)}
    return mode


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
    # (a plain window may take another kernel: the lanes kernel's PLAIN binary, recurrent.rules.pick_lanes_tile)
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
                                       inter_state=inter2, inter_indices=torch.arange(N, device=DEV),
                                       plan=RecurrentOverrides(value_tile=4))
    rb = torch.zeros(16, T - 1, HV, K + 1 + 1 + V, device=DEV)
    o_d = gated_delta_recurrent_triton(q, k, v2, a2, b2, A2, dt2, p_def, idx2, T, "gdn", replay_buffer=rb,
                                       plan=RecurrentOverrides(value_tile=4))
    acc = torch.tensor([1, 4, 2, 3], device=DEV, dtype=torch.int32)
    replay_commit(p_def, idx2, acc, rb, K, "gdn", num_k_heads=H, activation_dtype=torch.float32,
                  plan=RecurrentOverrides(value_tile=4))
    out["deferred_outputs_bit_exact"] = bool(torch.equal(o_s, o_d))
    # fused replay: a second window that first rebuilds the first window's accepted state
    w2 = [torch.randn_like(t) for t in (q, k, v2, a2, b2)]
    p_ref = pool2.clone()
    for i, (s, a) in enumerate(zip(idx2.tolist(), acc.tolist())):
        p_ref[s] = inter2[i * T + int(a) - 1]
    o2_ref = gated_delta_recurrent_triton(*w2, A2, dt2, p_ref, idx2, T, "gdn", commit=True,
                                          plan=RecurrentOverrides(value_tile=4))
    p_fused = pool2.clone()
    rb1, rb2 = torch.zeros_like(rb), torch.zeros_like(rb)
    gated_delta_recurrent_triton(q, k, v2, a2, b2, A2, dt2, p_fused, idx2, T, "gdn", replay_buffer=rb1,
                                 plan=RecurrentOverrides(value_tile=4))
    o2_f = gated_delta_recurrent_triton(*w2, A2, dt2, p_fused, idx2, T, "gdn", replay_buffer=rb2, replay_prev=rb1,
                                        accept_prev=acc, plan=RecurrentOverrides(value_tile=4))
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
                oc = gated_delta_chunk_triton(qc, kc, vc, fc, bc, A, dtb, cu, pc, idc, gate="kda", lower_bound=LB,
                                              plan=ChunkOverrides(tf32=tf32, method=method, scratch_dtype=sd))
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
        og = gated_delta_chunk_triton(qg, kg_, vg, ag, bg, Ag, dtg, cu, pg, idc, gate="gdn",
                                      plan=ChunkOverrides(scratch_dtype=sd))
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
