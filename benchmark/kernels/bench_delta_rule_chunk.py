"""Chunked-prefill benchmark of our KDA / GDN Triton kernels against fla-core 0.6.0 (H200 / H100).

Run on a CUDA machine (the device tool), with fla-core importable:

    PYTHONPATH=sgl-kernel/python python3 benchmark/kernels/bench_delta_rule_chunk.py --out results.json

``bench_prefill`` (the plan variants of ``PREFILL_VARIANTS``, eager), ``bench_group_scan``, ``bench_chunk_state``
(launch-table variants: the device's row with fields replaced, passed as a plan), ``bench_gdn_prefill`` and
``bench_prefill_host`` (host overhead, against an older checkout's package). Every variant is a plan
(``ChunkOverrides``); the cases are data: ``delta_rule_chunk_cases.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton

import bench_delta_rule_common as common
from bench_delta_rule_common import (DEV, LB, _chunk_mode, _context_lost, _kernel_us, _save_partial, check_correctness,
                                     chunk_ours, load_cases, rel)
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.naive import gated_delta_recurrent, kda_gate
from sgl_hybrid_kernel.norm import l2_norm

CASES = load_cases("chunk")
PREFILL_SHAPES = CASES["PREFILL_SHAPES"]
PREFILL_VARIANTS = CASES["PREFILL_VARIANTS"]  # (name, plan fields: ChunkOverrides); the fastest is reported as "ours"
GROUP_SCAN_SHAPES = CASES["GROUP_SCAN_SHAPES"]
GROUP_SCAN_CHUNKS = CASES["GROUP_SCAN_CHUNKS"]  # chunks of 64 tokens per group; None = auto_group_chunks
HOST_SHAPES = CASES["HOST_SHAPES"]
HOST_GROUP_CHUNKS = CASES["HOST_GROUP_CHUNKS"]
HOST_HEADS = CASES["HOST_HEADS"]
CHUNK_STATE_SHAPES = CASES["CHUNK_STATE_SHAPES"]
CHUNK_STATE_VARIANTS = CASES["CHUNK_STATE_VARIANTS"]  # (name, ChunkLaunch fields replaced on the device's row)
GDN_PREFILL_SHAPES = CASES["GDN_PREFILL_SHAPES"]
GDN_PREFILL_VARIANTS = CASES["GDN_PREFILL_VARIANTS"]


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
                ms = triton.testing.do_bench(lambda: chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda",
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
                    chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB, **kw)
                torch.cuda.synchronize()
            row["kernel_us_per_call"] = {e.key: e.device_time_total / 3 for e in prof.key_averages() if e.device_time_total > 0}
            print(row["kernel_us_per_call"])
        pool.zero_()
        o_ours = chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB, **kw)
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


def bench_group_scan(results):
    """Group-scan mode of the chunk-64 prefill (issue 4) vs the plain chunk-64 pass vs fla chunk_kda,
    Kimi K3 TP8 (12 KDA heads x 128, safe gate), B=1, BF16 activations, TF32 products, BF16
    intermediates; eager (do_bench median) and the profiler's sum of kernel times."""
    from fla.ops.kda import chunk_kda

    from sgl_hybrid_kernel.delta_rule.chunk import group_scan as gs_mod
    from sgl_hybrid_kernel.delta_rule.chunk.group_scan import auto_group_chunks

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
            call = lambda: chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, **base, **kw)  # noqa: E731
            try:
                ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
                ms2 = triton.testing.do_bench(call, warmup=10, rep=200, return_mode="median")
                per, tot = _kernel_us(call)
            except Exception as exc:
                print("variant", name, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                continue
            pool.copy_(pool0)
            o = chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, **base, **kw)
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
                o = chunk_ours(q, k, v, fl, b, A, dtb, cu, pool, idx, checkpoints=cks, checkpoint_pool=cp, **base, **kw)
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
                chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, checkpoints=cks, checkpoint_pool=cp, **base, **kw)
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
                   baseline_file=base_mods["sgl_hybrid_kernel.delta_rule.chunk.wrapper"].__file__ if base_mods else None, variants={})
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
                        if impl == "new":  # this checkout: the variant as a plan
                            call = lambda: chunk_ours(q, k, v, f, b, A, dtb, cu, pool, idx, fn=fn, **base, **kw)  # noqa: E731
                        else:  # the baseline package's own keywords
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

    return sys.modules["sgl_hybrid_kernel.delta_rule.chunk.wrapper"].gated_delta_chunk_triton


def _fp64_chunk_err(fn, launch=None):
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
    o = fn(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB,
           **_chunk_mode(fn, launch, method="parallel", tf32=True, group_scan=False))
    errs = []
    for i in range(3):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        ro, rs = gated_delta_recurrent(l2_norm(q[sl]), l2_norm(k[sl]), v[sl], kda_gate(f[sl], A, dtb, LB), torch.sigmoid(b[sl]),
                                       initial_state=pool0[i], acc_dtype=torch.float64)[:2]
        errs += [rel(o[sl], ro), rel(pool[i], rs)]
    return max(errs)


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
        fn = importlib.import_module("sgl_hybrid_kernel.delta_rule.chunk.wrapper").gated_delta_chunk_triton
        mod = importlib.import_module("sgl_hybrid_kernel.delta_rule.chunk.parallel")
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

    from sgl_hybrid_kernel.delta_rule.chunk import triton_chunk_parallel as tcp_mod
    from sgl_hybrid_kernel.delta_rule.chunk.rules import target_chunk_launch
    from sgl_hybrid_kernel.platform import Target

    base_fn = _load_baseline(baseline)[0] if baseline else None
    base = target_chunk_launch(Target.of(torch.device(DEV)))
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
                fn, launch = base_fn, None
            elif not set(over) <= fields:
                continue
            else:  # the variant is a plan: the table row with its fields replaced
                fn, launch = gated_delta_chunk_triton, dataclasses.replace(base, **over)
            ckw = _chunk_mode(fn, launch, method="parallel", tf32=True, scratch_dtype=torch.bfloat16, group_scan=False)
            call = lambda: fn(q, k, v, f, b, A, dtb, cu, pool, idx, gate="kda", lower_bound=LB,  # noqa: E731
                              seq_lens_cpu=lens, **ckw)
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
                    return
                continue
            if name not in fp64_errs:  # the same launch's numerics at every shape: check once
                try:  # FP32 inputs / scratch: a variant may not fit there (e.g. shared memory)
                    fp64_errs[name] = _fp64_chunk_err(fn, launch)
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
        del q, k, v, f, b
        torch.cuda.empty_cache()


GDN_KEEP = None  # main(): --gdn-variants


def bench_gdn_prefill(results, baseline=None):
    """Chunk-64 GDN prefill (issue 4, op 5), Qwen3.8-Flash-Next per GPU (16 q / k heads, 48 value heads, 128 x
    128, BF16 activations, raw gate and beta activated in the kernels, TF32 products, BF16 scratch, host
    lengths) vs fla ``chunk_gated_delta_rule`` (GVA, gate and beta sigmoid in its kernels, host lengths) in
    the same process: eager ``do_bench`` median, the profiler's per-kernel times, relative difference of
    outputs and final states to fla. ``baseline``: an older checkout's package, timed as ``baseline``."""
    import dataclasses

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from sgl_hybrid_kernel.delta_rule.chunk.rules import target_chunk_launch
    from sgl_hybrid_kernel.platform import Target

    base_fn = _load_baseline(baseline)[0] if baseline else None
    base = target_chunk_launch(Target.of(torch.device(DEV)))
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
            ckw = _chunk_mode(fn, None if over is None else dataclasses.replace(base, **over), method="parallel",
                              tf32=True, scratch_dtype=torch.bfloat16, group_scan=False)
            call = lambda: fn(q, k, v, a, b, A, dtb, cu, pool, idx, gate="gdn", seq_lens_cpu=lens, **ckw)  # noqa: E731
            try:
                ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
                per, tot = _kernel_us(call)
                pool.copy_(pool0)
                o = call().float()
            except Exception as exc:
                print("gdn variant", name, "FAILED", type(exc).__name__, str(exc)[:300], flush=True)
                if _context_lost(exc):
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
        del q, k, v, a, b
        torch.cuda.empty_cache()


def main():
    global CHUNK_STATE_SHAPES, HOST_BASELINE, HOST_SHAPES, GDN_KEEP
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench_delta_rule_chunk.json")
    p.add_argument("--only", default=None, help="comma list: correctness,bench_prefill,bench_group_scan,bench_chunk_state,"
                   "bench_gdn_prefill,bench_prefill_host")
    p.add_argument("--tag", default="", help="label stored in the JSON (e.g. 'baseline' for an older checkout's package)")
    p.add_argument("--chunk-state-variants", default=None, help="comma list of CHUNK_STATE_VARIANTS names (default: all)")
    p.add_argument("--chunk-state-shapes", default=None, help="comma list of BxT (default: CHUNK_STATE_SHAPES)")
    p.add_argument("--chunk-state-baseline", default=None, help="path holding an older checkout's sgl_hybrid_kernel, "
                   "timed in the same process as variant 'baseline'")
    p.add_argument("--prefill-baseline", default=None, help="bench_prefill_host: path holding an older checkout's "
                   "sgl_hybrid_kernel, timed in the same process as 'before'")
    p.add_argument("--host-shapes", default=None, help="bench_prefill_host: comma list of BxT (default: HOST_SHAPES)")
    p.add_argument("--prefill-variants", default=None, help="comma list of PREFILL_VARIANTS names to time (default: all)")
    p.add_argument("--gdn-variants", default=None, help="bench_gdn_prefill: comma list of GDN_PREFILL_VARIANTS names")
    args = p.parse_args()
    common.PARTIAL_OUT = args.out
    if args.prefill_variants:
        keep = args.prefill_variants.split(",")
        PREFILL_VARIANTS[:] = [x for x in PREFILL_VARIANTS if x[0] in keep]
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "time": time.strftime("%Y-%m-%d %H:%M:%S"), "tag": args.tag}
    only = args.only.split(",") if args.only else None
    if only is not None and "correctness" in only:
        check_correctness(results)
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
