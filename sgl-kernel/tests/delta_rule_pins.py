"""Recorder of what the gated-delta-rule wrappers launch, for a grid of shapes and targets (issue 43).

``test_delta_rule_plan_pins.py`` compares today's launches against ``data/delta_rule_plan_pins.json.gz``,
which this module wrote (``python sgl-kernel/tests/delta_rule_pins.py --write``) from the code as it
was before the plan refactor (commit named in the JSON). A launch is what a kernel's ``kernel[grid](...)``
received: the kernel's name, the grid, every non-tensor argument (constexprs, flags, strides, scalars),
``num_warps`` / ``num_stages`` / ``launch_pdl``. Nothing runs: ``KernelInterface.__getitem__`` is replaced
by a recorder, so shapes may be as large as served ones (tensors are allocated, never touched).

Targets are faked on a CPU machine: a GPU target makes the wrappers' device questions answer as that
(vendor, arch, compute units) would, with the interpreter switched off; ``"cpu"`` is the interpreter.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
from typing import Dict, Iterator, List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PINS = os.path.join(HERE, "data", "delta_rule_plan_pins.json.gz")

# (label, vendor, arch, compute units): the tuned H200, an untuned H100 PCIe count, an Ampere part,
# the two CDNA tables and the interpreter
TARGETS: List[Tuple[str, str, str, int]] = [
    ("sm90x132", "cuda", "sm90", 132),
    ("sm90x114", "cuda", "sm90", 114),
    ("sm80x108", "cuda", "sm80", 108),
    ("gfx942x304", "rocm", "gfx942", 304),
    ("gfx950x256", "rocm", "gfx950", 256),
    ("cpu", "cpu", "", 0),
]

# (gate, lower_bound, H, HV, K, V): K3's KDA share (12 heads of 128, bounded and standard gate), Qwen3.8's GDN
# (16 key heads, 48 value heads) and a small odd-size GDN outside the fast paths' shape rules
HEADS = [("kda", -5.0, 12, 12, 128, 128), ("kda", None, 12, 12, 128, 128), ("gdn", None, 16, 48, 128, 128),
         ("gdn", None, 2, 4, 32, 48)]
BATCHES = [1, 2, 3, 4, 5, 8, 12, 16, 17, 22, 32, 44, 64, 128]
TOKENS = [1, 2, 3, 4, 5, 6, 8]


class _Recorder:
    def __init__(self):
        self.launches: List[str] = []

    def __call__(self, kernel, grid):
        name = getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(kernel, "__name__", repr(kernel))

        def launch(*args, **kwargs):
            scal = [_scalar(a) for a in args]
            kw = ",".join(f"{k}={_scalar(v)}" for k, v in sorted(kwargs.items()))
            self.launches.append(f"{name}{list(grid)}({','.join(scal)}|{kw})")

        return launch


def _scalar(x) -> str:
    if isinstance(x, torch.Tensor):
        return "T"
    if isinstance(x, float):
        return repr(round(x, 9))
    if x is None or isinstance(x, (bool, int, str)):
        return repr(x)
    if isinstance(x, torch.dtype):
        return str(x)
    return type(x).__name__


@contextlib.contextmanager
def recording() -> Iterator[_Recorder]:
    """Replace every Triton kernel launch by a record."""
    from triton.runtime.jit import KernelInterface

    rec = _Recorder()
    old = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda self, grid: rec(self, grid)
    try:
        yield rec
    finally:
        KernelInterface.__getitem__ = old


@contextlib.contextmanager
def fake_target(vendor: str, arch: str, cus: int):
    """Make the wrappers' device questions answer as ``(vendor, arch, cus)`` would, for CPU tensors."""
    from sgl_hybrid_kernel import platform as plat_mod

    saved_env = os.environ.get("TRITON_INTERPRET")
    if vendor == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            yield
        finally:
            _restore_env(saved_env)
        return
    os.environ.pop("TRITON_INTERPRET", None)
    fake = plat_mod.DevicePlatform(vendor, arch, cus, f"fake {arch}")
    old_of = vars(plat_mod.Target)["of"]
    plat_mod.Target.of = staticmethod(lambda device: plat_mod.Target.from_platform(fake))
    try:
        yield
    finally:
        plat_mod.Target.of = old_of
        _restore_env(saved_env)


def _restore_env(saved):
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


def recurrent_cases() -> Iterator[Tuple[str, dict]]:
    for gate, lb, H, HV, K, V in HEADS:
        for T in TOKENS:
            modes = ["plain"] + (["snapshots", "deferred", "fused"] if T > 1 else ["snapshots"])
            for mode in modes:
                for layout in ("vk", "kv"):
                    if layout == "kv" and (mode in ("deferred", "fused") or HV == 4):
                        continue
                    for B in BATCHES:
                        key = f"rec:{gate}:{lb}:{H}x{HV}x{K}x{V}:T{T}:{mode}:{layout}:B{B}"
                        yield key, dict(gate=gate, lb=lb, H=H, HV=HV, K=K, V=V, T=T, mode=mode, layout=layout, B=B)
    # experiment overrides the benchmarks and tests still pass
    for extra in ({"value_tile": 8}, {"value_tile": 16, "key_lanes": 8}, {"xred": 0}, {"tokprep": False},
                  {"form": "chunk"}, {"wide": False}, {"preload": True}, {"num_warps": 2}):
        for gate, lb, H, HV, K, V in HEADS[::2]:
            for T, B in ((1, 4), (4, 8), (5, 32)):
                if "form" in extra and T == 1:
                    continue
                key = f"rec:{gate}:{lb}:{H}x{HV}x{K}x{V}:T{T}:plain:vk:B{B}:{json.dumps(extra, sort_keys=True)}"
                yield key, dict(gate=gate, lb=lb, H=H, HV=HV, K=K, V=V, T=T, mode="plain", layout="vk", B=B, extra=extra)


def run_recurrent(c: dict) -> None:
    from sgl_hybrid_kernel.delta_rule.plan import RecurrentOverrides
    from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton

    gate, lb, H, HV, K, V, T, B, layout, mode = (c[n] for n in ("gate", "lb", "H", "HV", "K", "V", "T", "B", "layout", "mode"))
    N = B * T
    dt = torch.bfloat16
    q = torch.empty(N, H, K, dtype=dt)
    v = torch.empty(N, HV, V, dtype=dt)
    f = torch.empty((N, HV, K) if gate == "kda" else (N, HV), dtype=dt)
    b = torch.empty(N, HV, dtype=dt)
    A_log = torch.empty(HV)
    dt_bias = torch.empty(HV * K if gate == "kda" else HV)
    shape = (B + 1, HV, K, V) if layout == "kv" else (B + 1, HV, V, K)
    state = torch.empty(shape)
    idx = torch.arange(B, dtype=torch.int32)
    kw = {"plan": RecurrentOverrides(**c["extra"])} if "extra" in c else {}
    if mode == "snapshots":
        kw.update(inter_state=torch.empty((N + 1,) + shape[1:]), inter_indices=torch.arange(N, dtype=torch.int32))
    gk = K if gate == "kda" else 1
    if mode in ("deferred", "fused"):
        kw.update(replay_buffer=torch.empty(B + 1, T - 1, HV, K + gk + 1 + V))
    if mode == "fused":
        kw.update(replay_prev=torch.empty(B + 1, T - 1, HV, K + gk + 1 + V), accept_prev=torch.ones(B, dtype=torch.int32))
    gated_delta_recurrent_triton(q, q, v, f, b, A_log, dt_bias, state, idx, T, gate, lb, state_layout=layout,
                                 commit=T == 1, **kw)


def chunk_cases() -> Iterator[Tuple[str, dict]]:
    seqs = [(1, 4096), (2, 4096), (4, 2048), (8, 1024), (1, 65536), (3, 130), (16, 64), (32, 300)]
    for gate, lb, H, HV, K, V in HEADS:
        for dtype in ("bf16", "fp32"):
            for S, L in seqs:
                for ckpt in (False, True):
                    for gs in (None, "auto", True):
                        if gs and ckpt:
                            continue
                        key = f"chunk:{gate}:{lb}:{H}x{HV}x{K}x{V}:{dtype}:S{S}xL{L}:ckpt{int(ckpt)}:gs{gs}"
                        yield key, dict(gate=gate, lb=lb, H=H, HV=HV, K=K, V=V, dtype=dtype, S=S, L=L, ckpt=ckpt, gs=gs)
    for extra in ({"method": "sequential"}, {"method": "parallel"}, {"value_tile": 64}, {"num_warps": 4},
                  {"group_scan": True, "group_chunks": 4}):
        for gate, lb, H, HV, K, V in HEADS[::2]:
            key = f"chunk:{gate}:{lb}:{H}x{HV}x{K}x{V}:bf16:S2xL4096:ckpt0:{json.dumps(extra, sort_keys=True)}"
            yield key, dict(gate=gate, lb=lb, H=H, HV=HV, K=K, V=V, dtype="bf16", S=2, L=4096, ckpt=False, gs=None, extra=extra)


def run_chunk(c: dict) -> None:
    from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
    from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides

    gate, lb, H, HV, K, V, S, L = (c[n] for n in ("gate", "lb", "H", "HV", "K", "V", "S", "L"))
    dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float32
    N = S * L
    q = torch.empty(N, H, K, dtype=dt)
    v = torch.empty(N, HV, V, dtype=dt)
    f = torch.empty((N, HV, K) if gate == "kda" else (N, HV), dtype=dt)
    b = torch.empty(N, HV, dtype=dt)
    state = torch.empty(S + 1, HV, V, K)
    cu = torch.arange(0, N + 1, L, dtype=torch.int32)
    over = dict(c.get("extra", {}))
    if c["gs"] is not None:
        over["group_scan"] = c["gs"]
    kw = {"plan": ChunkOverrides(**over)} if over else {}
    if c["ckpt"]:
        kw.update(checkpoints=[(0, 64, 0), (S - 1, L, 1)], checkpoint_pool=torch.empty(2, HV, V, K))
    gated_delta_chunk_triton(q, q, v, f, b, torch.empty(HV), torch.empty(HV * K if gate == "kda" else HV), cu, state,
                             torch.arange(S, dtype=torch.int32), torch.ones(S, dtype=torch.int32), gate, lb,
                             state_layout="vk", seq_lens_cpu=[L] * S, **kw)


def record_all() -> Dict[str, str]:
    """``{case key: launches}`` over every target, recurrent and chunk cases."""
    out: Dict[str, str] = {}
    for label, vendor, arch, cus in TARGETS:
        with fake_target(vendor, arch, cus):
            for cases, run in ((recurrent_cases, run_recurrent), (chunk_cases, run_chunk)):
                for key, c in cases():
                    with recording() as rec:
                        try:
                            run(c)
                            got = " ; ".join(rec.launches)
                        except ValueError as e:
                            got = f"ValueError: {e}"
                    out[f"{label}|{key}"] = got
    return out


def pack(records: Dict[str, str]) -> dict:
    sigs = sorted(set(records.values()))
    index = {s: i for i, s in enumerate(sigs)}
    return {"signatures": sigs, "cases": {k: index[v] for k, v in records.items()}}


def unpack(pins: dict) -> Dict[str, str]:
    return {k: pins["signatures"][i] for k, i in pins["cases"].items()}


if __name__ == "__main__":
    recs = record_all()
    if "--write" in sys.argv:
        os.makedirs(os.path.dirname(PINS), exist_ok=True)
        data = {"about": "launches of the delta-rule wrappers before the plan refactor (issue 43); written by "
                         "sgl-kernel/tests/delta_rule_pins.py --write", "commit": sys.argv[-1], **pack(recs)}
        with gzip.open(PINS, "wt") as fh:
            json.dump(data, fh, indent=0, sort_keys=True)
    print(len(recs), "cases,", len(set(recs.values())), "distinct launch sets")


def load_pins() -> Dict[str, str]:
    """``{case key: launches}`` as pinned."""
    with gzip.open(PINS, "rt") as fh:
        return unpack(json.load(fh))
