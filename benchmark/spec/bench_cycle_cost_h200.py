"""Cycle cost T(k, batch) of Kimi K3 at TP8 on one H200: our verify kernel + a matmul model (issue 7).

Run on a CUDA machine (the device tool, one H200), from the repository root:

    PYTHONPATH=sgl-kernel/python python3 benchmark/spec/bench_cycle_cost_h200.py --out cost.json
    # CPU smoke run of the same code path (tiny shapes, wall clock, torch reference kernel):
    PYTHONPATH=sgl-kernel/python python3 benchmark/spec/bench_cycle_cost_h200.py --smoke --out /tmp/c.json

What is measured (each part timed by CUDA-graph replay, median of the replays, with
rotated weight copies so no part runs out of L2 that would not in a full model):

* KDA verify kernel: our ``gated_delta_recurrent_triton`` through the delta-rule dispatcher
  (``choose_recurrent``), 12 heads x 128 x 128 FP32 state per request (Kimi K3 at TP8),
  ``T = k + 1`` tokens per request over a pool of 1024 slots, per-token states written to an
  intermediate pool (what chain verify does); ``T = 1`` is plain decode (commit in place).
* Matmul model of one target layer of each kind, BF16 ``torch.matmul`` / ``torch.bmm`` at
  ``M = batch * (k + 1)`` rows, per-GPU sizes at TP8:
  KDA layer projections ``[M, 7168] x [7168, 5 * 1536]`` (q, k, v, full-rank gate, output
  gate) and ``[M, 1536] x [1536, 7168]``; MLA layer projections ``[M, 7168] x [7168, 1536 + 576]``,
  ``[M, 1536] x [1536, 12 * 192]``, ``[M, 1536] x [1536, 7168]``; MoE layer: router
  ``[M, 7168] x [7168, 896]``, latent down ``[M, 896] x [896, 3584]`` (input split), routed
  experts as a batched GEMM over the experts the ``M`` rows touch in expectation
  (``E (1 - (1 - 16 / E) ** M)`` of ``E = 896``, rows spread evenly, expert width 2048 / 8 = 256,
  gate+up then down in the 3584 latent), latent up ``[M, 3584] x [3584, 896]`` (owned rows),
  shared expert ``[M, 7168] x [7168, 512]`` and ``[M, 256] x [256, 7168]``; LM head
  ``[M, 7168] x [7168, 163840 / 8]``.
* Target step = 69 x (KDA projections + KDA verify kernel) + 24 x MLA projections + 92 x MoE
  + LM head; draft = ``k`` x (one MLA layer + one MoE layer + LM head at ``M = batch``), an
  MTP-style draft layer (assumed; the K3 checkpoint's draft is not public here).

Not in the model (stated, not hidden): the MLA attention core, norms, routing top-k, the
TP all-reduces, sampling, scheduler and launch overheads, and weight precision (the
deployment's MXFP4 experts read 1/4 of these BF16 bytes). Sizes not in the article
(expert width 2048, vocabulary 163,840, q rank 1536, MLA head 192) are assumptions.
The result is a *model of the cycle built from measured parts*, not a served cycle.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import time

import torch

BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEPTHS = tuple(range(8))
FULL = dict(D=7168, kda_heads=12, head=128, mla_q_rank=1536, mla_kv=576, mla_heads=12, mla_qk=192, mla_v=128,
            experts=896, topk=16, latent=3584, expert_width=256, shared_width=256, vocab=163840 // 8,
            kda_layers=69, mla_layers=24, moe_layers=92, slots=1024, rot=4)
SMOKE = dict(D=64, kda_heads=2, head=16, mla_q_rank=32, mla_kv=16, mla_heads=2, mla_qk=24, mla_v=16,
             experts=16, topk=2, latent=32, expert_width=16, shared_width=16, vocab=128,
             kda_layers=3, mla_layers=1, moe_layers=4, slots=64, rot=2)


class Timer:
    """Median time of ``fn`` in seconds: CUDA-graph replay on a GPU, wall clock on CPU."""

    def __init__(self, device: str, reps: int):
        self.device, self.reps = device, reps

    def __call__(self, fn, calls: int = 1) -> float:
        if self.device == "cpu":
            fn()
            ts = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return sorted(ts)[len(ts) // 2] / calls
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3)
        del g
        return sorted(ts)[len(ts) // 2] / calls


def touched_experts(rows: int, experts: int, topk: int) -> int:
    """Expected experts hit by ``rows`` tokens routing to ``topk`` of ``experts`` each (rounded up)."""
    return min(experts, max(topk, math.ceil(experts * (1.0 - (1.0 - topk / experts) ** rows))))


class MatmulModel:
    def __init__(self, c: dict, device: str, timer: Timer):
        self.c, self.dev, self.timer = c, device, timer
        bf = dict(device=device, dtype=torch.bfloat16)
        D, R = c["D"], c["rot"]
        h = c["kda_heads"] * c["head"]

        def w(*shape):
            return [torch.randn(*shape, **bf) * 0.02 for _ in range(R)]

        self.kda_in, self.kda_out = w(D, 5 * h), w(h, D)
        self.mla_a, self.mla_qb = w(D, c["mla_q_rank"] + c["mla_kv"]), w(c["mla_q_rank"], c["mla_heads"] * c["mla_qk"])
        self.mla_o = w(c["mla_heads"] * c["mla_v"], D)
        self.router, self.lat_down = w(D, c["experts"]), w(D // 8 if D >= 64 else D, c["latent"])
        self.lat_up = w(c["latent"], D // 8 if D >= 64 else D)
        self.sh_in, self.sh_out = w(D, 2 * c["shared_width"]), w(c["shared_width"], D)
        E, L, I = c["experts"], c["latent"], c["expert_width"]
        self.w13 = torch.randn(E, L, 2 * I, **bf) * 0.02  # one MoE layer's experts (all layers share the timing)
        self.w2 = torch.randn(E, I, L, **bf) * 0.02
        self.lm = torch.randn(D, c["vocab"], **bf) * 0.02  # > L2 on its own
        self.bf = bf
        self.cache = {}

    def _x(self, m, n):
        return torch.randn(m, n, **self.bf)

    def kda_proj(self, m):
        c, h = self.c, self.c["kda_heads"] * self.c["head"]
        x, y = self._x(m, c["D"]), self._x(m, h)
        return self.timer(lambda: [(x @ a, y @ b) for a, b in zip(self.kda_in, self.kda_out)], c["rot"])

    def mla_proj(self, m):
        c = self.c
        x, y, z = self._x(m, c["D"]), self._x(m, c["mla_q_rank"]), self._x(m, c["mla_heads"] * c["mla_v"])
        return self.timer(lambda: [(x @ a, y @ b, z @ o) for a, b, o in zip(self.mla_a, self.mla_qb, self.mla_o)],
                          c["rot"])

    def moe(self, m):
        c = self.c
        E, L, I = c["experts"], c["latent"], c["expert_width"]
        n = touched_experts(m, E, c["topk"])
        r = math.ceil(m * c["topk"] / n)
        x, xd = self._x(m, c["D"]), self._x(m, self.lat_down[0].shape[0])
        xl, xe = self._x(m, L), torch.randn(n, r, L, **self.bf)
        he = torch.randn(n, r, I, **self.bf)
        xs = self._x(m, c["shared_width"])
        start = [(i * 131) % max(1, E - n + 1) for i in range(c["rot"])]  # different expert sets per call

        def fn():
            for i in range(c["rot"]):
                x @ self.router[i]
                xd @ self.lat_down[i]
                torch.bmm(xe, self.w13[start[i]: start[i] + n])
                torch.bmm(he, self.w2[start[i]: start[i] + n])
                xl @ self.lat_up[i]
                x @ self.sh_in[i]
                xs @ self.sh_out[i]

        return self.timer(fn, c["rot"]), n

    def lm_head(self, m):
        x = self._x(m, self.c["D"])
        return self.timer(lambda: x @ self.lm)

    def parts(self, m):
        if m not in self.cache:
            moe, n = self.moe(m)
            self.cache[m] = dict(kda_proj_s=self.kda_proj(m), mla_proj_s=self.mla_proj(m), moe_s=moe,
                                 moe_touched_experts=n, lm_head_s=self.lm_head(m))
        return self.cache[m]


def kda_kernel_time(c, device, timer, B, T, pool, inter, rot_perms):
    """Seconds of one KDA decode (T=1) / verify (T>1) call through our dispatcher's choice."""
    from sgl_hybrid_kernel.delta_rule.dispatch import choose_recurrent
    from sgl_hybrid_kernel.delta_rule.ops import decode_torch

    H, K = c["kda_heads"], c["head"]
    N = B * T
    bf = dict(device=device, dtype=torch.bfloat16)
    q, k, v, f = (torch.randn(N, H, K, **bf) for _ in range(4))
    b = torch.randn(N, H, **bf)
    A, dtb = torch.rand(H, device=device), torch.randn(H * K, device=device)
    impl = choose_recurrent(q, v, pool)
    if impl == "triton":
        from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton

        o = torch.empty_like(v)
        inter_idx = torch.arange(N, device=device, dtype=torch.int32)

        def call(r):
            if T == 1:
                gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, rot_perms[r][:B], 1, "kda", -5.0,
                                             state_layout="vk", commit=True, out=o)
            else:
                gated_delta_recurrent_triton(q, k, v, f, b, A, dtb, pool, rot_perms[r][:B], T, "kda", -5.0,
                                             state_layout="vk", commit=False, inter_state=inter,
                                             inter_indices=inter_idx, out=o)
    else:
        def call(r):
            decode_torch(q, k, v, f, b, A, dtb, pool, rot_perms[r][:B], T, "kda", -5.0, state_layout="vk")
    R = len(rot_perms)
    return timer(lambda: [call(r) for r in range(R)], R), impl


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="cycle_cost_h200.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (checks the code path only)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    c = SMOKE if args.smoke else FULL
    batches = (1, 2) if args.smoke else BATCHES
    depths = (0, 1, 2) if args.smoke else DEPTHS
    t_start = time.perf_counter()
    timer = Timer(device, 3 if args.smoke else args.reps)
    torch.manual_seed(0)
    H, K = c["kda_heads"], c["head"]
    pool = torch.randn(c["slots"], H, K, K, device=device) * 0.1
    inter = torch.zeros(max(batches) * (max(depths) + 1), H, K, K, device=device)
    rot_perms = [torch.randperm(c["slots"], device=device)[: max(batches)].to(torch.int32) for _ in range(8)]
    mm = MatmulModel(c, device, timer)
    impls, rows = set(), []
    out = {
        "what": "Kimi K3 TP8 cycle cost T(k, batch) on one GPU: our KDA verify kernel + BF16 matmul model "
                "(see benchmark/spec/bench_cycle_cost_h200.py docstring for what is and is not included)",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
        "torch": torch.__version__,
        "sizes": c,
        "timing": "CUDA-graph replay, median of %d replays, rotated weight copies" % timer.reps,
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "rows": rows,
    }
    if device == "cuda":
        import triton

        out["triton"] = triton.__version__

    def write(complete):
        out.update(kda_kernel_impl=sorted(impls), wall_s=time.perf_counter() - t_start, complete=complete)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)

    def on_term(*_):
        raise SystemExit("terminated")

    signal.signal(signal.SIGTERM, on_term)
    for B in batches:  # results are written after each batch size (a time limit keeps what was done)
        draft = mm.parts(B)
        for k in depths:
            kernel, impl = kda_kernel_time(c, device, timer, B, k + 1, pool, inter, rot_perms)
            impls.add(impl)
            M = B * (k + 1)
            p = mm.parts(M)
            target = (c["kda_layers"] * (p["kda_proj_s"] + kernel) + c["mla_layers"] * p["mla_proj_s"]
                      + c["moe_layers"] * p["moe_s"] + p["lm_head_s"])
            draft_s = k * (draft["mla_proj_s"] + draft["moe_s"] + draft["lm_head_s"])
            rows.append(dict(batch=B, k=k, rows=M, cycle_s=target + draft_s, target_s=target, draft_s=draft_s,
                             kda_verify_kernel_s=kernel, **{f"layer_{n}": v for n, v in p.items()}))
            if not args.smoke:
                print(f"b={B:3d} k={k} M={M:4d} cycle {rows[-1]['cycle_s'] * 1e3:8.3f} ms (target "
                      f"{target * 1e3:.3f}, draft {draft_s * 1e3:.3f}, kda kernel {kernel * 1e6:.1f} us, "
                      f"experts {p['moe_touched_experts']}) [{time.perf_counter() - t_start:.0f} s]", flush=True)
        write(False)
    write(True)
    print(f"wrote {args.out} ({out['wall_s']:.1f} s)")
    return out


if __name__ == "__main__":
    main()
