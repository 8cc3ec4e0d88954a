"""Cross-compile gate: build every Triton kernel and tuned config for ROCm and CUDA on a CPU machine.

No GPU is needed: ``triton.compile`` targets ``GPUTarget("hip", "gfx942"/"gfx950", 64)``
and ``GPUTarget("cuda", 90, 32)`` in-process (kernel-toolchain.md). For each
(kernel config, target) we read the shared memory / LDS bytes, registers (AMD:
``.vgpr_count``; NVIDIA: ``ptxas -v``), spills and AMD's register occupancy. The
gate fails on any spill or when shared memory exceeds the config's budget
(default 80 KiB, so two workgroups fit a CDNA4 CU's 160 KiB of LDS).

    python -m sgl_hybrid_kernel.compile_gate            # print the table
    python -m sgl_hybrid_kernel.compile_gate --markdown  # the table for docs/kernels.md
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

TARGETS = {"gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64), "sm90": ("cuda", 90, 32)}
FLOAT_SCALARS = {"scale", "lower_bound", "eps"}
INDEX_POINTERS = {"state_idx_ptr", "inter_idx_ptr", "ckpt_idx_ptr", "cu_ptr", "has_init_ptr", "accept_ptr", "count_ptr",
                  "accept_prev_ptr"}
ACTIVATION_POINTERS = {"q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "o_ptr", "x_ptr", "gate_ptr", "out_ptr"}


@dataclass
class KernelConfig:
    """One compiled variant: ``kernel`` (a ``@triton.jit`` function) with ``constexprs``.

    Activation pointers are BF16 (serving dtype), states and workspaces FP32.
    """

    name: str
    kernel: Callable
    constexprs: Dict[str, object]
    num_warps: int = 4
    lds_budget: int = 80 * 1024
    activation_dtype: str = "bf16"
    targets: tuple = tuple(TARGETS)
    signature: Dict[str, str] = field(default_factory=dict)  # per-argument type overrides (e.g. "*fp8e4nv")
    num_stages: int = 1  # software-pipelining stages the wrapper launches with
    # arguments the launch specialises as multiples of 16 (Triton's JIT does so for such pointers / ints):
    # without the hint the pointer loads stay scalar and unpipelined, so registers differ from the launched code
    divisible: tuple = ()


@dataclass
class Report:
    config: str
    target: str
    shared_bytes: int
    registers: Optional[int]
    spills: int
    occupancy: Optional[int]
    error: Optional[str] = None
    budget: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.spills == 0 and self.shared_bytes <= self.budget


def _constexprs(cfg: KernelConfig) -> Dict[str, object]:
    """``cfg.constexprs`` plus the defaults of the kernel's other constexpr parameters, as the JIT launches them
    (``ASTSource`` alone would make a constexpr parameter left out of ``constexprs`` a runtime argument)."""
    out = {}
    for p, prm in inspect.signature(cfg.kernel.fn).parameters.items():
        ann = prm.annotation
        if p not in cfg.constexprs and prm.default is not inspect.Parameter.empty and (
                ann == "tl.constexpr" or getattr(ann, "__name__", "") == "constexpr"):
            out[p] = prm.default
    out.update(cfg.constexprs)
    return out


def _signature(cfg: KernelConfig) -> Dict[str, str]:
    sig = {}
    cexprs = _constexprs(cfg)
    for p in inspect.signature(cfg.kernel.fn).parameters:
        if p in cexprs:
            sig[p] = "constexpr"
        elif p.endswith("_ptr"):
            sig[p] = "*i32" if p in INDEX_POINTERS else ("*" + cfg.activation_dtype if p in ACTIVATION_POINTERS else "*fp32")
        elif p in FLOAT_SCALARS:
            sig[p] = "fp32"
        else:
            sig[p] = "i64"
    sig.update(cfg.signature)
    return sig


def _nvidia_registers(ptx: str) -> tuple:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(d, "k.cubin")],
            capture_output=True, text=True, check=True,
        )
    text = res.stderr + res.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else 0)


def _compile(cfg: KernelConfig, target: str):
    """``triton.compile`` of ``cfg`` for ``target`` (a key of ``TARGETS``), as the JIT would launch it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(cfg.kernel.fn).parameters)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in cfg.divisible} or None
    return triton.compile(ASTSource(fn=cfg.kernel, signature=_signature(cfg), constexprs=_constexprs(cfg), attrs=attrs),
                          target=GPUTarget(*TARGETS[target]), options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def compile_config(cfg: KernelConfig, target: str) -> Report:
    """Compile ``cfg`` for ``target`` (a key of ``TARGETS``) and read its resources."""
    try:
        compiled = _compile(cfg, target)
    except Exception as exc:  # report, do not hide: the gate fails on it
        return Report(cfg.name, target, 0, None, 0, None, error=f"{type(exc).__name__}: {str(exc)[:200]}", budget=cfg.lds_budget)
    shared = int(compiled.metadata.shared)
    if TARGETS[target][0] == "hip":
        asm = compiled.asm["amdgcn"]

        def field_(name):
            m = re.search(rf"\.{name}:\s+(\d+)", asm)
            return int(m.group(1)) if m else 0

        occ = re.search(r"; Occupancy: (\d+)", asm)
        spills = field_("vgpr_spill_count") + field_("sgpr_spill_count") + (1 if field_("private_segment_fixed_size") else 0)
        return Report(cfg.name, target, shared, field_("vgpr_count"), spills, int(occ.group(1)) if occ else None, budget=cfg.lds_budget)
    regs, spills = _nvidia_registers(compiled.asm["ptx"])
    return Report(cfg.name, target, shared, regs, spills, None, budget=cfg.lds_budget,
                  error=shuffle_layout_error(compiled.asm["ttgir"]))


def _lane_dim0_layout(defs: Dict[str, str], layout: str) -> bool:
    """Whether a TTGIR layout (an alias of ``defs`` or an inline ``#ttg.slice``) puts exactly the warp's 32 lanes
    on dim 0, lane ``l`` holding index ``l`` there, one warp, and nothing else of dim 0 in registers."""
    m = re.fullmatch(r"#ttg\.slice<\{dim = (\d+), parent = (#\w+)\}>", layout)
    drop = None
    if m:
        drop, layout = int(m.group(1)), m.group(2)
        if drop == 0:
            return False
    text = defs.get(layout, "")
    b = re.search(r"#ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], warpsPerCTA = \[([\d, ]+)\]", text)
    if b:
        spt, tpw, wpc = ([int(x) for x in g.split(",")] for g in b.groups())
        return spt[0] == 1 and tpw[0] == 32 and all(w == 1 for w in wpc)
    li = re.search(r"#ttg\.linear<\{register = \[(.*?)\], lane = \[(.*?)\], warp = \[(.*?)\]", text)
    if li:
        vec = lambda g: [[int(x) for j, x in enumerate(v.split(",")) if j != drop]  # noqa: E731
                         for v in re.findall(r"\[([-\d, ]+)\]", g)]
        reg, lane, warp = (vec(g) for g in li.groups())
        return ([v[0] for v in lane] == [1, 2, 4, 8, 16] and all(not any(v[1:]) for v in lane)
                and all(v[0] == 0 for v in reg) and all(not any(v) for v in warp))
    return False


def shuffle_layout_error(ttgir: str) -> Optional[str]:
    """``None``, or why a kernel's inline-PTX warp shuffles (``triton_recurrent._lane_xor`` / ``_lane_pick``, issue 4)
    cannot be trusted: their ``[32, n]`` operands must have dim 0 on the 32 lanes, lane ``l`` at index ``l`` (the
    lane arithmetic of ``_xred_pair`` assumes it; Triton chooses the layouts)."""
    defs = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, flags=re.M))
    for line in ttgir.splitlines():
        if "elementwise_inline_asm" in line and "shfl.sync" in line:
            m = re.search(r"-> tensor<32x\d+xi32, (#ttg\.slice<\{[^}]*\}>|#\w+)>", line)
            if not m or not _lane_dim0_layout(defs, m.group(1)):
                return "warp shuffle on a tile without dim 0 on the lanes: " + (m.group(1) if m else line.strip()[:160])
    return None


def compiled_asm(config_name: str, target: str = "sm90", activation: Optional[str] = None) -> Dict[str, str]:
    """The compiled kernel's ``asm`` dict (``ttgir``, ``ptx`` / ``amdgcn``, ...) of the config named
    ``config_name`` (for tests of what Triton made of a kernel). ``activation`` (e.g. ``"fp32"``): its
    BF16 pointers retyped to that dtype, as the FP32 boot gates launch the kernel."""
    import dataclasses

    named = [c for c in kernel_configs() if c.name == config_name]  # one per target group for some rows
    cfg = next((c for c in named if target in c.targets), named[0])
    if activation is not None:
        retype = lambda t: "*" + activation if t == "*bf16" else t  # noqa: E731
        sig = {p: retype(t) for p, t in _signature(cfg).items()}
        cfg = dataclasses.replace(cfg, signature=sig, activation_dtype=activation)
    compiled = _compile(cfg, target)
    return {k: v for k, v in compiled.asm.items() if isinstance(v, str)}


def blocked_layouts(config_name: str, target: str = "sm90") -> List[tuple]:
    """``(sizePerThread, threadsPerWarp)`` of every blocked layout in the compiled TTGIR of the
    config named ``config_name`` (for checks of how Triton laid a tile out, e.g. the lanes kernel's)."""
    found = re.findall(r"#ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\]",
                       compiled_asm(config_name, target)["ttgir"])
    return [(tuple(int(x) for x in spt.split(",")), tuple(int(x) for x in tpw.split(","))) for spt, tpw in found]


def kernel_configs() -> List[KernelConfig]:
    """Every kernel at the shapes we serve: Kimi K3 TP8 (12 KDA heads x 128) and
    Qwen3.8 GDN (16 k-heads, 48 v-heads x 128), with the tiles the wrappers pick."""
    from sgl_hybrid_kernel.delta_rule.chunk.triton_chunk import gated_delta_chunk_kernel
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE
    from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import (
        gated_delta_recurrent_kernel,
        gated_delta_verify_wide_kernel,
    )
    from sgl_hybrid_kernel.kda.fused_decode import num_warps_for
    from sgl_hybrid_kernel.kda.triton_fused_decode import kda_fused_decode_kernel

    kda = dict(H=12, HV=12, K=128, V=128, BK=128)
    gdn = dict(H=16, HV=48, K=128, V=128, BK=128)
    out = []
    # decode / verify (issue 4): one warp, the tiles recurrent.rules.pick_value_tile picks; one binary serves
    # every mode (commit / snapshots / deferred / fused replay are runtime flags). As Triton's JIT does at
    # launch, the unit stride of the pool (and snapshot pool) is a constant 1 and the others multiples of 16.
    ptrs = ("q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "o_ptr", "state_ptr", "inter_ptr", "replay_ptr", "replay_prev_ptr")
    vk = dict(constexprs=dict(s_k=1, is_k=1), divisible=ptrs + ("s_slot", "s_h", "s_v", "is_slot", "is_h", "is_v"))
    kv = dict(constexprs=dict(s_v=1, is_v=1), divisible=ptrs + ("s_slot", "s_h", "s_k", "is_slot", "is_h", "is_k"))

    def rec(name, T, bv, gate, shape, lay, preload=True):
        return KernelConfig(name, gated_delta_recurrent_kernel,
                            dict(T=T, BV=bv, GATE=gate, L2NORM=True, PRELOAD=preload, **shape, **lay["constexprs"]),
                            num_warps=max(1, bv // 16), divisible=lay["divisible"])

    def wide(name, T, bv, gate, shape, lay, plain=True, fast=False, xred=0, tokprep=False):  # V-major decode and every verify window (recurrent.rules.use_wide_verify)
        tile = dict(s_v=shape["K"]) if lay is vk else dict(s_k=shape["V"])  # both tile strides are constexprs

        def cfg(targets, seq):
            return KernelConfig(name, gated_delta_verify_wide_kernel,
                                dict(T=T, BV=bv, GATE=gate, L2NORM=True, PLAIN=plain, FAST=fast, XRED=xred, SEQ=seq,
                                     **(dict(TOKPREP=True) if tokprep else {}), **shape,
                                     **lay["constexprs"], **tile),
                                num_warps=1, divisible=tuple(a for a in lay["divisible"] if a not in tile), targets=targets)

        # FAST, XRED: CUDA only (recurrent.rules.use_fast_gate, recurrent.rules.use_xred); SEQ on the V-major pool on the
        # sm_90 rows only, as recurrent.rules.use_seq_key_sums launches it
        if fast or xred:
            return [cfg(("sm90",), lay is vk)]
        if lay is vk:
            return [cfg(("sm90",), True), cfg(tuple(t for t in TARGETS if t != "sm90"), False)]
        return [cfg(tuple(TARGETS), False)]

    out += [rec("kda_decode_bv16", 1, 16, GATE_KDA_SAFE, kda, vk), rec("kda_decode_bv4", 1, 4, GATE_KDA_SAFE, kda, vk),
            rec("kda_verify_t4_bv4", 4, 4, GATE_KDA_SAFE, kda, vk), rec("gdn_decode_bv16", 1, 16, GATE_GDN, gdn, vk),
            rec("gdn_decode_bv64_kv", 1, 64, GATE_GDN, gdn, kv), rec("gdn_decode_bv32_kv", 1, 32, GATE_GDN, gdn, kv),
            rec("gdn_verify_t5_bv8", 5, 8, GATE_GDN, gdn, vk), rec("gdn_verify_t5_bv8_kv", 5, 8, GATE_GDN, gdn, kv),
            rec("gdn_verify_t5_bv4_tok", 5, 4, GATE_GDN, gdn, vk, preload=False),
            wide("kda_decode1w_bv4", 1, 4, GATE_KDA_SAFE, kda, vk),
            wide("kda_decode1w_bv16", 1, 16, GATE_KDA_SAFE, kda, vk),
            wide("gdn_decode1w_bv16", 1, 16, GATE_GDN, gdn, vk),
            wide("gdn_decode1w_bv4", 1, 4, GATE_GDN, gdn, vk),  # GDN decode's tile at every batch since 2026-11-30
            wide("kda_verify1w_t4_bv2", 4, 2, GATE_KDA_SAFE, kda, vk),  # KDA's plain verify at B <= 2 since 2026-12-01
            wide("kda_verify1w_t4_bv4", 4, 4, GATE_KDA_SAFE, kda, vk),
            wide("kda_verify1w_t4_bv8", 4, 8, GATE_KDA_SAFE, kda, vk),  # plain verify tiles by batch since 2026-11-30
            wide("kda_verify1w_t4_bv16", 4, 16, GATE_KDA_SAFE, kda, vk),
            # KDA's plain verify at 4 / 8 columns on CUDA since 2026-12-01 (recurrent.rules.use_fast_gate)
            wide("kda_verify1w_t4_bv4_fast", 4, 4, GATE_KDA_SAFE, kda, vk, fast=True),
            wide("kda_verify1w_t4_bv8_fast", 4, 8, GATE_KDA_SAFE, kda, vk, fast=True),
            wide("gdn_verify1w_t5_bv4", 5, 4, GATE_GDN, gdn, vk),
            wide("gdn_verify1w_t5_bv8", 5, 8, GATE_GDN, gdn, vk),
            wide("gdn_verify1w_t5_bv16", 5, 16, GATE_GDN, gdn, vk),
            wide("gdn_verify1w_t5_bv16_kv", 5, 16, GATE_GDN, gdn, kv),
            # the all-modes binary (snapshots / deferred / fused replay / replay_commit), recurrent.rules.pick_deferred_tile
            wide("kda_verify1w_t4_bv4_allmodes", 4, 4, GATE_KDA_SAFE, kda, vk, False),
            wide("kda_verify1w_t4_bv8_allmodes", 4, 8, GATE_KDA_SAFE, kda, vk, False),
            # what CUDA launches for KDA's all-modes windows since 2026-12-01 (recurrent.rules.use_fast_gate)
            wide("kda_verify1w_t4_bv4_allmodes_fast", 4, 4, GATE_KDA_SAFE, kda, vk, False, fast=True),
            wide("kda_verify1w_t4_bv8_allmodes_fast", 4, 8, GATE_KDA_SAFE, kda, vk, False, fast=True),
            wide("gdn_verify1w_t5_bv8_allmodes", 5, 8, GATE_GDN, gdn, vk, False),
            wide("gdn_verify1w_t5_bv4_allmodes", 5, 4, GATE_GDN, gdn, vk, False),
            wide("gdn_verify1w_t5_bv16_kv_allmodes", 5, 16, GATE_GDN, gdn, kv, False),
            wide("gdn_verify1w_t5_bv8_kv_allmodes", 5, 8, GATE_GDN, gdn, kv, False),
            # what CUDA launches below 16 columns on the V-major pool since 2026-12-02: the key sums as one
            # reduce-scatter (recurrent.rules.use_xred; KDA plain verify at 4 columns from B=1, GDN plain at B=1)
            wide("kda_decode1w_bv4_xred", 1, 4, GATE_KDA_SAFE, kda, vk, xred=1),
            wide("gdn_decode1w_bv4_xred", 1, 4, GATE_GDN, gdn, vk, xred=1),
            wide("kda_verify1w_t4_bv4_fast_xred", 4, 4, GATE_KDA_SAFE, kda, vk, fast=True, xred=1),
            wide("kda_verify1w_t4_bv8_fast_xred", 4, 8, GATE_KDA_SAFE, kda, vk, fast=True, xred=1),
            # the other tiles an explicit value_tile can ask with XRED (recurrent.rules.xred_shape_ok: 2 to 16 columns)
            wide("kda_verify1w_t4_bv2_xred", 4, 2, GATE_KDA_SAFE, kda, vk, xred=1),
            wide("kda_verify1w_t4_bv16_xred", 4, 16, GATE_KDA_SAFE, kda, vk, xred=1),
            wide("gdn_verify1w_t5_bv4_xred", 5, 4, GATE_GDN, gdn, vk, xred=1),
            # plain GDN windows with XRED take every token's per-head scalars first (recurrent.rules.use_tokprep)
            wide("gdn_verify1w_t5_bv4_xred_tokprep", 5, 4, GATE_GDN, gdn, vk, xred=1, tokprep=True),
            wide("gdn_verify1w_t5_bv8_xred_tokprep", 5, 8, GATE_GDN, gdn, vk, xred=1, tokprep=True),
            wide("gdn_verify1w_t5_bv2_xred_tokprep", 5, 2, GATE_GDN, gdn, vk, xred=1, tokprep=True),
            wide("gdn_verify1w_t5_bv16_xred_tokprep", 5, 16, GATE_GDN, gdn, vk, xred=1, tokprep=True),
            # and KDA's (per-key decays as one [BK, TG] tile in the prep): 4 / 8 columns with the fix-up-free gate,
            # the other XRED tiles without
            wide("kda_verify1w_t4_bv4_fast_xred_tokprep", 4, 4, GATE_KDA_SAFE, kda, vk, fast=True, xred=1, tokprep=True),
            wide("kda_verify1w_t4_bv8_fast_xred_tokprep", 4, 8, GATE_KDA_SAFE, kda, vk, fast=True, xred=1, tokprep=True),
            wide("kda_verify1w_t4_bv2_xred_tokprep", 4, 2, GATE_KDA_SAFE, kda, vk, xred=1, tokprep=True),
            wide("kda_verify1w_t4_bv16_xred_tokprep", 4, 16, GATE_KDA_SAFE, kda, vk, xred=1, tokprep=True),
            wide("kda_verify1w_t4_bv4_allmodes_fast_xred", 4, 4, GATE_KDA_SAFE, kda, vk, False, fast=True, xred=1),
            wide("kda_verify1w_t4_bv8_allmodes_fast_xred", 4, 8, GATE_KDA_SAFE, kda, vk, False, fast=True, xred=1),
            wide("gdn_verify1w_t5_bv4_allmodes_xred", 5, 4, GATE_GDN, gdn, vk, False, xred=1),
            wide("gdn_verify1w_t5_bv8_allmodes_xred", 5, 8, GATE_GDN, gdn, vk, False, xred=1)]
    # lanes kernel (triton_lanes.py; recurrent.rules.pick_lanes_tile: 16 columns, 8 key lanes) and its per-token
    # prologue; V_FIRST as the installed Triton needs it (triton_lanes.lanes_v_first)
    from sgl_hybrid_kernel.delta_rule.recurrent.triton_lanes import (gated_delta_verify_lanes_kernel, lanes_v_first, prep_heads_per_program,
                                                           token_prep_kernel)

    lptrs = ("qn_ptr", "kn_ptr", "d_ptr", "bq_ptr", "v_ptr", "o_ptr", "state_ptr", "inter_ptr", "replay_prev_ptr")

    # the prologue and the lanes kernel as recurrent._launch_lanes launches them: on sm_90 as a programmatic
    # dependent launch pair (PDL, recurrent.rules.lanes_pdl), on CDNA without
    by_pdl = ((("gfx942", "gfx950"), False), (("sm90",), True))

    from sgl_hybrid_kernel.delta_rule.recurrent.rules import (LANES_PDL_PLAIN_PER_HEAD_MAX_TILE,
                                                              LANES_PDL_PLAIN_PER_HEAD_OFF_FROM_TRITON)
    from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import TRITON_VERSION

    def lanes(name, T, bv, kl, gate, shape, plain=True, snapshots=False):
        # plain GDN windows over 8 columns launch without PDL from Triton 3.7 (recurrent.rules.lanes_pdl); FOLD on CUDA
        # only (recurrent.rules.lanes_fold)
        no_pdl = (plain and gate == GATE_GDN and TRITON_VERSION >= LANES_PDL_PLAIN_PER_HEAD_OFF_FROM_TRITON
                  and bv > LANES_PDL_PLAIN_PER_HEAD_MAX_TILE)
        return [KernelConfig(name, gated_delta_verify_lanes_kernel,
                             dict(T=T, BV=bv, KL=kl, PER_CHANNEL=gate != GATE_GDN, V_FIRST=lanes_v_first(), FOLD="sm90" in targets, PLAIN=plain,
                                  SNAPSHOTS=snapshots, PDL=pdl and not no_pdl, s_v=shape["K"],
                                  **{d: shape[d] for d in ("H", "HV", "K", "V")}),
                             num_warps=1, divisible=lptrs + ("s_slot", "s_h", "is_slot"), targets=targets)
                for targets, pdl in by_pdl]

    def prep(name, T, gate, shape, hb):  # heads per program as prep_heads_per_program picks them
        return [KernelConfig(name, token_prep_kernel,
                             dict(T=T, GATE=gate, L2NORM=True, BVR=shape["V"], HB=hb, PDL=pdl, **shape),
                             num_warps=2 if hb == 8 else 1, targets=targets,
                             divisible=("q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "qn_ptr", "kn_ptr", "d_ptr", "bq_ptr",
                                        "replay_ptr"))
                for targets, pdl in by_pdl]

    out += [c for g, T, gate, shape in (("gdn_t5", 5, GATE_GDN, gdn), ("kda_t4", 4, GATE_KDA_SAFE, kda))
            for hb in (1, 2, 4, 8) if hb <= prep_heads_per_program(shape["HV"])
            for c in prep(f"token_prep_{g}_hb{hb}", T, gate, shape, hb)]
    out += [c for cs in (lanes("gdn_lanes_t5_bv16_kl8", 5, 16, 8, GATE_GDN, gdn),
                         lanes("gdn_lanes_t5_bv8_kl8", 5, 8, 8, GATE_GDN, gdn),  # the narrow tile (pick_lanes_tile)
                         lanes("kda_lanes_t4_bv16_kl8", 4, 16, 8, GATE_KDA_SAFE, kda),
                         lanes("gdn_lanes_t5_bv16_kl8_deferred", 5, 16, 8, GATE_GDN, gdn, False),
                         lanes("gdn_lanes_t5_bv16_kl8_allmodes", 5, 16, 8, GATE_GDN, gdn, False, True)) for c in cs]
    # chunk-form verify window (triton_window.py, opt-in form="chunk"): 32 columns, FP32 tl.dot;
    # 4 warps on CDNA (MFMA), 8 on sm_90 (FMA loop), as recurrent.rules.window_num_warps launches it
    from sgl_hybrid_kernel.delta_rule.recurrent.triton_window import gated_delta_window_kernel

    wptrs = ("q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "o_ptr", "state_ptr", "replay_ptr", "replay_prev_ptr")
    for wname, T, gate, shape, mode in (("kda_window_t4_bv32", 4, GATE_KDA_SAFE, kda, "plain"),
                                        ("gdn_window_t5_bv32_deferred_fused", 5, GATE_GDN, gdn, "fused")):
        for targets, warps in ((("gfx942", "gfx950"), 4), (("sm90",), 8)):
            out.append(KernelConfig(f"{wname}_w{warps}", gated_delta_window_kernel,
                                    dict(T=T, BV=32, GATE=gate, L2NORM=True, COMMIT=mode == "plain", DEFERRED=mode == "fused",
                                         REPLAY_PREV=mode == "fused", DOT_PREC="ieee", s_k=1, **shape),
                                    num_warps=warps, targets=targets, divisible=wptrs + ("s_slot", "s_h", "s_v", "r_slot")))
    for bv in (32, 16, 8):  # 16: what kda.fused_decode.value_tile_for(128) launches on the served path
        out.append(KernelConfig(f"kda_fused_decode_bv{bv}", kda_fused_decode_kernel,
                                dict(H=12, K=128, V=128, W=4, BK=128, BV=bv, NV=128 // bv, NVP=128 // bv, SAFE_GATE=True),
                                num_warps=num_warps_for(bv)))
    # The sequential chunked prefill runs on CUDA only (it spills on CDNA; ROCm runs the
    # chunk-64 form, chunk.gated_delta_chunk_triton): its configs are gated on sm_90.
    chunk = dict(BK=128, BV=32, BT=16, L2NORM=True, CKPT=True, TF32=True, KB=16)
    for name, extra in (
        ("kda_chunk_safe_bv32", dict(H=12, HV=12, GATE=GATE_KDA_SAFE, FACTORIZED=True)),
        ("kda_chunk_std_bv32", dict(H=12, HV=12, GATE=GATE_KDA, FACTORIZED=False)),
        ("gdn_chunk_bv32", dict(H=16, HV=48, GATE=GATE_GDN, FACTORIZED=False)),
    ):
        out.append(KernelConfig(name, gated_delta_chunk_kernel, dict(K=128, V=128, **extra, **chunk), num_warps=8, targets=("sm90",)))
    out = [c for x in out for c in (x if isinstance(x, list) else [x])]  # wide() rows come as lists (per target)
    out += chunk_parallel_configs() + chunk_group_scan_configs()
    return out + attention_moe_configs() + fp8_linear_configs()


def plan_targets():
    """``(gate target, Target)`` of every row of the delta-rule tables (``recurrent/tiles.json``, ``chunk/launch.json``)
    whose arch the gate compiles, for the installed Triton (outside the interpreter)."""
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH
    from sgl_hybrid_kernel.delta_rule.recurrent.rules import VALUE_TILE_TUNED
    from sgl_hybrid_kernel.delta_rule.recurrent.triton_recurrent import TRITON_VERSION
    from sgl_hybrid_kernel.platform import Target

    keys = sorted(set(VALUE_TILE_TUNED) | set(CHUNK_LAUNCH))
    return [(arch, Target("rocm" if arch.startswith("gfx") else "cuda", arch, cus, False, TRITON_VERSION))
            for arch, cus in keys if arch in TARGETS]


def recurrent_plans_without_config(batches=range(1, 161)) -> List[str]:
    """The decode / verify plans (``plan.plan_recurrent``) of every table row's target, at the served shapes (Kimi
    K3 TP8's KDA at T = 1 / 4, Qwen3.8's GDN at T = 1 / 5; V-major FP32 pool; plain decode, plain, snapshot and deferred
    verify windows;
    ``batches``) that no config of :func:`kernel_configs` compiles for that target: the gate enumerates the tables'
    plans, so a table row or rule change that launches an ungated binary fails ``test_compile_gate_coverage.py``."""
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA_SAFE
    from sgl_hybrid_kernel.delta_rule.plan import plan_recurrent

    configs = kernel_configs()

    def has(target, kernel_name, want):
        return any(c.kernel.fn.__name__ == kernel_name and target in c.targets
                   and all(c.constexprs.get(k, False) == v for k, v in want.items()) for c in configs)

    missing = set()
    for arch, target in plan_targets():
        for gate, H, HV, Ts in ((GATE_KDA_SAFE, 12, 12, (1, 4)), (GATE_GDN, 16, 48, (1, 5))):
            for T in Ts:
                for mode in ("plain", "snapshots", "deferred"):
                    if T == 1 and mode != "plain":  # decode writes no snapshots and defers nothing on the served path
                        continue
                    for B in batches:
                        p = plan_recurrent(B, T, H, HV, 128, 128, gate, "vk", target, plain=mode == "plain",
                                           snapshots=mode == "snapshots")
                        shape = dict(T=T, H=H, HV=HV, K=128, V=128)
                        if p.kernel == "one_warp":
                            ok = has(arch, "gated_delta_verify_wide_kernel",
                                     dict(shape, BV=p.value_tile, GATE=gate, PLAIN=mode == "plain", FAST=p.fast,
                                          XRED=p.xred, SEQ=p.seq, TOKPREP=p.tokprep))
                        elif p.kernel == "lanes":
                            ok = (has(arch, "gated_delta_verify_lanes_kernel",
                                      dict(shape, BV=p.value_tile, KL=p.key_lanes, PER_CHANNEL=gate != GATE_GDN,
                                           PLAIN=mode == "plain", SNAPSHOTS=mode == "snapshots", PDL=p.pdl, FOLD=p.fold))
                                  and has(arch, "token_prep_kernel", dict(shape, GATE=gate, HB=p.prep_heads, PDL=p.pdl)))
                        else:
                            ok = False
                        if not ok:
                            missing.add(f"{arch} {'KDA' if gate != GATE_GDN else 'GDN'} T={T} {mode}: {p.describe()}")
    return sorted(missing)


def _int32_scalars(kernel, constexprs) -> Dict[str, str]:
    """``i32`` for every plain integer argument: what Triton's JIT specialises a Python int
    below 2**31 to (strides, counts at serving shapes); the gate's default ``i64`` costs
    scalar registers the launched kernel does not use."""
    return {p: "i32" for p in inspect.signature(kernel.fn).parameters
            if p not in constexprs and not p.endswith("_ptr") and p not in FLOAT_SCALARS}


CHUNK_TARGETS = {"sm90": "sm90", "gfx942": "gfx942", "gfx950": "gfx950"}  # launch-table arch -> gate target


def chunk_parallel_configs() -> List[KernelConfig]:
    """Multi-kernel chunked prefill (chunk 64, ``triton_chunk_parallel.py``): the four launches
    exactly as ``chunk.parallel.launch_params`` builds them from each (arch, CU) entry of
    ``CHUNK_LAUNCH``, compiled for that entry's arch; BF16 activations and intermediates, TF32
    products on sm_90 (the CUDA ``method="auto"`` choice) and FP32 products on CDNA (ROCm always
    runs this form, without TF32); state passing with and without checkpoints. Kimi K3 TP8 (KDA safe and
    standard gate, 12 heads x 128) and Qwen3.8 GDN (16 k-heads, 48 v-heads x 128)."""
    from sgl_hybrid_kernel.delta_rule.chunk.parallel import launch_params
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH, use_fused_output
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE

    bf16 = {p: "*bf16" for p in ("w_ptr", "u_ptr", "kg_ptr", "vn_ptr", "h_ptr")}
    idx = {p: "*i32" for p in ("cidx_ptr", "coff_ptr")}
    models = (("kda", GATE_KDA_SAFE, 12, 12, -5.0), ("kda_std", GATE_KDA, 12, 12, 0.0), ("gdn", GATE_GDN, 16, 48, 0.0))
    out, seen = [], set()
    for (arch, cus), launch in CHUNK_LAUNCH.items():
        target = CHUNK_TARGETS[arch]
        # sm_90's state pass pipelines whole-K w / kg tiles through its chunk loop (110 KB at 16 value
        # columns, 140 KB at 64; the H200's Triton reports the same): Hopper's per-block limit
        state_budget = {"state": HOPPER_SMEM} if target == "sm90" else None
        for tf32 in ((False,) if target != "sm90" else (True,)):  # chunk.py: no TF32 on CDNA
            for model, kind, H, HV, lb in models:
                for ckpt in (False, True):
                    # BF16 scratch, as these rows type it (and as serving runs): the 16-bit state-pass stages
                    params = launch_params(launch, kind, H, HV, 128, 128, lb, True, tf32, ckpt, lowp_scratch=True)
                    mrows = {"m_ptr": "*bf16"} if launch.intra_inv_lowp and launch.intra_solve_lowp else {}
                    _add_launch_rows(out, seen, target, params, {**bf16, **idx, **mrows}, lambda part: (
                        f"{model}_chunk64_{part}{'_ckpt' if ckpt and part == 'state' else ''}"
                        f"_{'tf32' if tf32 else 'fp32'}_{arch}x{cus}"), budgets=state_budget)
                    # the wider state tiles chunk.parallel.pick_state_tile takes for large batches (no checkpoints)
                    for bv, _ in (launch.state_bv_costs if not ckpt else ()):
                        wide = launch_params(launch, kind, H, HV, 128, 128, lb, True, tf32, ckpt, state_tile=bv,
                                             lowp_scratch=True)
                        _add_launch_rows(out, seen, target, {"state": wide["state"]}, {**bf16, **idx},
                                         lambda part, bv=bv: f"{model}_chunk64_state_bv{bv}_{'tf32' if tf32 else 'fp32'}_{arch}x{cus}",
                                         budgets=state_budget)
                    # the state pass that forms the output (chunk.parallel.use_fused_output) at each of those
                    # tiles, and the A programs that write q's row factor, Aqk (BF16) and KDA's q e^G for it
                    tiles = ([b for b, _ in launch.state_bv_costs] or [None]) if kind == GATE_GDN else launch.fuse_output_kda_bv
                    for bv in tiles:
                        if use_fused_output(launch, kind, True, ckpt, lb, tf32, bv):
                            fused = launch_params(launch, kind, H, HV, 128, 128, lb, True, tf32, ckpt, state_tile=bv,
                                                  lowp_scratch=True, fuse_output=True)
                            _add_launch_rows(out, seen, target, {p: fused[p] for p in ("intra_a", "state")},
                                             {**bf16, **idx, "aqk_ptr": "*bf16", "qeg_ptr": "*bf16"}, lambda part, bv=bv: (
                                                 f"{model}_chunk64_{part}_fused{f'_bv{bv}' if bv and part == 'state' else ''}"
                                                 f"_{'tf32' if tf32 else 'fp32'}_{arch}x{cus}"), budgets=state_budget)
    return out


HOPPER_SMEM = 227 * 1024  # sm_90's per-block shared-memory limit


def _add_launch_rows(out: List[KernelConfig], seen: set, target: str, params: Dict, ptr_types: Dict[str, str],
                     name_of: Callable[[str], str], budgets: Optional[Dict[str, int]] = None) -> None:
    """Append one config per launched part ``{part: (kernel, constexprs, num_warps, _[, num_stages])}``
    not yet in ``seen`` (same target, part, constexprs, warps, stages), typed with the kernel's int32
    scalars and those of ``ptr_types`` it takes. Every pointer is marked 16-byte aligned, as Triton's
    JIT specialises it at launch for torch allocations (the scratch these wrappers allocate always is;
    inputs are when they start on a 16-byte boundary, and one that does not gets another, unchecked,
    specialisation: correct, maybe slower). Integer scalars stay unspecialised. ``budgets``: shared-memory
    budget per part (default: the config's 80 KiB)."""
    for part, spec in params.items():
        kern, cx, nw = spec[:3]
        stages = spec[4] if len(spec) > 4 else 1
        key = (target, part, tuple(sorted(cx.items())), nw, stages)
        if key in seen:
            continue
        seen.add(key)
        ps = inspect.signature(kern.fn).parameters
        sig = {k: v for k, v in ptr_types.items() if k in ps}
        extra = {"lds_budget": budgets[part]} if budgets and part in budgets else {}
        out.append(KernelConfig(name_of(part), kern, cx, num_warps=nw, targets=(target,), num_stages=stages,
                                signature={**_int32_scalars(kern, cx), **sig},
                                divisible=tuple(p for p in ps if p.endswith("_ptr") and p not in cx), **extra))


def chunk_group_scan_configs() -> List[KernelConfig]:
    """Group-scan mode of the chunk-64 prefill (``chunk/group_scan.py``): the summary and scan
    kernels as ``chunk.group_scan.group_scan_launch_params`` builds them for each ``CHUNK_LAUNCH``
    entry (the replay is the state kernel, gated above); same models and products as
    :func:`chunk_parallel_configs`."""
    from sgl_hybrid_kernel.delta_rule.chunk.group_scan import group_scan_launch_params
    from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH
    from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN, GATE_KDA, GATE_KDA_SAFE

    bf16 = {p: "*bf16" for p in ("w_ptr", "u_ptr")}
    idx = {p: "*i32" for p in ("gidx_ptr", "goff_ptr")}
    models = (("kda", GATE_KDA_SAFE, 12, 12), ("kda_std", GATE_KDA, 12, 12), ("gdn", GATE_GDN, 16, 48))
    out, seen = [], set()
    for (arch, cus), launch in CHUNK_LAUNCH.items():
        target = CHUNK_TARGETS[arch]
        tf32 = target == "sm90"
        for model, kind, H, HV in models:
            params = group_scan_launch_params(kind, H, HV, 128, 128, True, tf32, launch)
            _add_launch_rows(out, seen, target, params, {**bf16, **idx},
                             lambda part: f"{model}_chunk64_group_{part}_{'tf32' if tf32 else 'fp32'}_{arch}x{cus}")
    return out


def attention_moe_configs() -> List[KernelConfig]:
    """MLA decode / verify, DCP merge, AttnRes + RMSNorm, MoE routing, QSA (issue 5), at the tiles the
    dispatchers pick: Kimi K3 TP8 (12 MLA heads, latent 512 + rope 64, 896 experts top 16 + shared,
    hidden 7168) and Qwen3.8 (QSA 12 query heads per KV head x 5 verify positions, head dim 128;
    512 experts top 10 + shared). CUDA-only tiles are gated on sm_90, ROCm tiles on gfx942 / gfx950."""
    from sgl_hybrid_kernel.attn_res.triton_attn_res import attn_res_rmsnorm_kernel
    from sgl_hybrid_kernel.dcp.triton_merge import merge_partials_kernel
    from sgl_hybrid_kernel.mla.attention import default_tile
    from sgl_hybrid_kernel.mla.triton_attention import mla_split_kv_kernel
    from sgl_hybrid_kernel.moe.triton_routing import moe_gating_topk_kernel, moe_sorted_layout_kernel
    from sgl_hybrid_kernel.qsa.triton_qsa import qsa_attention_kernel, qsa_merge_kernel
    from sgl_hybrid_kernel.norm.triton_rms_norm import rms_norm_kernel

    i32, f32, bf16 = "*i32", "*fp32", "*bf16"
    idx = {"page_table_ptr": i32, "kv_lens_ptr": i32, "qo_indptr_ptr": i32}

    def mla_sig(kv):
        return {"q_ptr": bf16, "kv_ptr": kv, "part_ptr": f32, "part_lse_ptr": f32, "sm_scale": "fp32", "kv_scale": "fp32", **idx}

    def mla_tile(platform, rows, R, fp8=False):  # mla.attention.default_tile as the kernel's constexprs
        t = default_tile(platform, rows, R, fp8)
        return dict(BLOCK_N=t["block_n"], RC=t["score_chunk"], RV=t["value_cols"])

    mla = dict(R=512, P=64, PAGE_SIZE=1, CAUSAL=True)  # CAUSAL=False (DCP prefix shards) only drops the mask
    cuda_tile = mla_tile("cuda", 16, 512)  # BLOCK_N 64, RC = RV = 512
    hopper_smem = HOPPER_SMEM  # the 16-row Hopper tile runs one program per SM
    cdna_tile = mla_tile("rocm", 16, 512)  # BLOCK_N 16, RC 64, RV 128; also CUDA above 16 rows
    # the tiny Kimi K3 (tools/make_tiny_model.py: 4 heads, latent 64 + rope 16) at the Hopper decode tile
    tiny_mla = dict(R=64, P=16, PAGE_SIZE=1, CAUSAL=True, HB=4, BLOCK_M=16, **mla_tile("cuda", 16, 64))
    route_sig = {"logits_ptr": f32, "bias_ptr": f32, "weights_ptr": f32, "ids_ptr": i32,
                 "routed_scaling_factor": "fp32", "shared_weight": "fp32"}
    layout_sig = {"bits_ptr": "*i64", **{k: i32 for k in ("ids_ptr", "sorted_ids_ptr", "block_expert_ptr", "num_rows_ptr", "scratch_ptr")}}

    def qsa_sig(kern):
        cx = ("G", "D", "DV", "PAGE_SIZE", "RATIO", "TPP", "BLOCK_M", "BLOCK_N", "SPARSE")
        return {**_int32_scalars(kern, dict.fromkeys(cx)), "q_ptr": bf16, "k_ptr": bf16, "v_ptr": bf16, "row_req_ptr": i32, "idx_ptr": i32,
                "o_ptr": bf16, "lse_ptr": f32, "sm_scale": "fp32", **idx}

    qsa_div = ("q_ptr", "k_ptr", "v_ptr", "page_table_ptr", "kv_lens_ptr", "qo_indptr_ptr", "row_req_ptr", "idx_ptr",
               "o_ptr", "lse_ptr", "stride_qn", "stride_qh", "stride_ks", "stride_kh", "stride_vs", "stride_vh",
               "stride_on", "stride_oh")
    qsa = dict(G=12, D=128, DV=128, PAGE_SIZE=1, RATIO=4)
    K = KernelConfig
    return [
        K("dcp_merge_dv512", merge_partials_kernel, dict(DV=512, BLOCK_DV=512, BLOCK_S=64),
          signature={"part_ptr": f32, "part_lse_ptr": f32, "out_ptr": bf16, "lse_out_ptr": f32}),
        K("mla_decode_h12_cuda", mla_split_kv_kernel, dict(**mla, HB=12, BLOCK_M=16, **cuda_tile), num_warps=8,
          targets=("sm90",), lds_budget=hopper_smem, signature=mla_sig(bf16)),
        K("mla_decode_h12_fp8_cuda", mla_split_kv_kernel, dict(**mla, HB=12, BLOCK_M=16, **mla_tile("cuda", 16, 512, True)),
          targets=("sm90",), signature=mla_sig("*fp8e4nv")),
        K("mla_decode_tiny_r64_cuda", mla_split_kv_kernel, tiny_mla, num_warps=8, targets=("sm90",), signature=mla_sig(bf16)),
        K("mla_decode_h12_cdna", mla_split_kv_kernel, dict(**mla, HB=12, BLOCK_M=16, **cdna_tile), signature=mla_sig(bf16)),
        K("mla_decode_h12_fp8_gfx942", mla_split_kv_kernel, dict(**mla, HB=12, BLOCK_M=16, **cdna_tile),
          targets=("gfx942",), signature=mla_sig("*fp8e4b8")),
        K("mla_decode_h12_fp8_gfx950", mla_split_kv_kernel, dict(**mla, HB=12, BLOCK_M=16, **cdna_tile),
          targets=("gfx950",), signature=mla_sig("*fp8e4nv")),
        K("mla_decode_h32_cdna", mla_split_kv_kernel, dict(**mla, HB=32, BLOCK_M=32, **cdna_tile), signature=mla_sig(bf16)),
        K("mla_decode_h128", mla_split_kv_kernel, dict(**mla, HB=64, BLOCK_M=64, **cdna_tile), num_warps=8,
          signature=mla_sig(bf16)),
        K("mla_verify_t5_h12", mla_split_kv_kernel, dict(**mla, HB=12, BLOCK_M=64, **cdna_tile), num_warps=8,
          signature=mla_sig(bf16)),
        K("mla_extend_dcp_prefix_h12", mla_split_kv_kernel, dict(**{**mla, "CAUSAL": False}, HB=12, BLOCK_M=64, **cdna_tile),
          num_warps=8, signature=mla_sig(bf16)),
        K("rms_norm_d7168", rms_norm_kernel, dict(BLOCK_D=8192, HAS_RESIDUAL=False), num_warps=16,
          signature={"x_ptr": bf16, "res_ptr": bf16, "w_ptr": bf16, "out_ptr": bf16, "res_out_ptr": bf16, "eps": "fp32"}),
        K("fused_add_rms_norm_d7168", rms_norm_kernel, dict(BLOCK_D=8192, HAS_RESIDUAL=True), num_warps=16,
          signature={"x_ptr": bf16, "res_ptr": bf16, "w_ptr": bf16, "out_ptr": bf16, "res_out_ptr": bf16, "eps": "fp32"}),
        K("attn_res_rmsnorm_d7168", attn_res_rmsnorm_kernel, dict(D=7168, BLOCK_D=8192, HAS_PREFIX=True, WRITE_BANK=True),
          num_warps=16, signature={"prefix_ptr": bf16, "addend_ptr": bf16, "bank_ptr": bf16, "cw_ptr": f32,
                                   "norm_w_ptr": bf16, "out_ptr": bf16, "head_ptr": bf16}),
        K("moe_route_k3_e896_top16_shared", moe_gating_topk_kernel,
          dict(TOPK=16, KPAD=32, G=1, EG=896, GPAD=1, EGPAD=1024, TOPK_GROUP=1, SCORING=0, HAS_BIAS=True, RENORM=True,
               SHARED=1), signature=route_sig),
        K("moe_route_qwen_e512_top10_shared", moe_gating_topk_kernel,
          dict(TOPK=10, KPAD=16, G=1, EG=512, GPAD=1, EGPAD=512, TOPK_GROUP=1, SCORING=1, HAS_BIAS=False, RENORM=True,
               SHARED=1), signature={**route_sig, "logits_ptr": bf16}),
        K("moe_route_grouped_e256_g8", moe_gating_topk_kernel,
          dict(TOPK=8, KPAD=8, G=8, EG=32, GPAD=8, EGPAD=32, TOPK_GROUP=4, SCORING=0, HAS_BIAS=True, RENORM=True,
               SHARED=0), signature=route_sig),
        K("moe_sorted_layout_k3_e897", moe_sorted_layout_kernel,
          dict(KOUT=17, NE_PAD=1024, EB=1024, FILL=1024, BLOCK_SIZE=16), num_warps=8, signature=layout_sig),
        K("moe_sorted_layout_qwen_e513", moe_sorted_layout_kernel,
          dict(KOUT=11, NE_PAD=1024, EB=1024, FILL=1024, BLOCK_SIZE=16), num_warps=8, signature=layout_sig),
        # QSA at qsa.attention.default_tile, with the launch's int32 scalars and divisibility specialisation;
        # the CUDA dense tile (64 positions, 3 stages, 112 KB) runs 2 programs per SM: Hopper's per-block budget
        K("qsa_dense_t5_cuda", qsa_attention_kernel, dict(**qsa, TPP=5, BLOCK_M=64, BLOCK_N=64, SPARSE=False),
          num_warps=4, num_stages=3, targets=("sm90",), lds_budget=hopper_smem, signature=qsa_sig(qsa_attention_kernel),
          divisible=qsa_div),
        K("qsa_dense_t5_cdna", qsa_attention_kernel, dict(**qsa, TPP=5, BLOCK_M=64, BLOCK_N=16, SPARSE=False),
          num_warps=8, num_stages=2, targets=("gfx942", "gfx950"), signature=qsa_sig(qsa_attention_kernel), divisible=qsa_div),
        K("qsa_sparse_cuda", qsa_attention_kernel, dict(**qsa, TPP=1, BLOCK_M=16, BLOCK_N=32, SPARSE=True),
          num_warps=4, num_stages=2, targets=("sm90",), signature=qsa_sig(qsa_attention_kernel), divisible=qsa_div),
        K("qsa_sparse_cdna", qsa_attention_kernel, dict(**qsa, TPP=1, BLOCK_M=16, BLOCK_N=16, SPARSE=True),
          num_warps=4, num_stages=2, targets=("gfx942", "gfx950"), signature=qsa_sig(qsa_attention_kernel), divisible=qsa_div),
        K("qsa_merge_s4_h4", qsa_merge_kernel, dict(DV=128, BLOCK_S=4, BLOCK_H=4),
          signature={"o_ptr": bf16, "Hq": "i32", "S": "i32", **{f"stride_{x}": "i32" for x in ("pn", "ph", "ln", "lh", "on", "oh", "lon")}}),
    ]


def fp8_linear_configs() -> List[KernelConfig]:
    """FP8 W8A16 GEMM of the Qwen3.8 residual projections (issue 6): 10,240 -> 320 and 320 -> 10,240 at the
    tiles ``fp8_linear.linear.default_tile`` picks (16 decode/verify rows, 64 prefill rows). Codes are
    ``fp8e4b8`` on gfx942 and ``fp8e4nv`` on gfx950 / sm_90; sizes and strides are i32, as Triton
    specialises them at launch."""
    from sgl_hybrid_kernel.fp8_linear.triton_fp8_linear import fp8_w8a16_linear_kernel

    ints = {n: "i32" for n in ("M", "N", "K", "stride_xm", "stride_wn", "stride_om")}
    out = []
    for name, tile, warps in (("down_k10240_n320_m16", (16, 32, 128), 4), ("up_k320_n10240_m16", (16, 64, 64), 4),
                              ("down_k10240_n320_m64", (64, 32, 128), 8), ("up_k320_n10240_m64", (64, 64, 64), 8)):
        consts = dict(BLOCK_M=tile[0], BLOCK_N=tile[1], BLOCK_K=tile[2], EVEN_K=True)
        for targets, fp8 in ((("gfx942",), "*fp8e4b8"), (("gfx950", "sm90"), "*fp8e4nv")):
            out.append(KernelConfig(f"fp8_w8a16_{name}_{fp8[1:]}", fp8_w8a16_linear_kernel, consts, num_warps=warps,
                                    targets=targets, signature={"w_ptr": fp8, "scale_ptr": "*fp32", **ints}))
    return out


_GATE_ITEMS: List[tuple] = []  # (config, target) pairs of the running gate, inherited by forked workers


def _compile_item(i: int) -> Report:
    cfg, target = _GATE_ITEMS[i]
    return compile_config(cfg, target)


def gate_jobs() -> int:
    """Worker processes of :func:`run_gate`: ``SGL_HYBRID_GATE_JOBS``, else the CPUs this process may use (at most 8).
    A cold Triton cache took 13 min on one core of the 2-core CI-sized machine (2026-12-02, 298 pairs)."""
    env = os.environ.get("SGL_HYBRID_GATE_JOBS")
    if env:
        return max(1, int(env))
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)))


def run_gate(targets=tuple(TARGETS), jobs: Optional[int] = None) -> List[Report]:
    """Compile every (config, target) pair; in ``jobs`` forked processes (:func:`gate_jobs`) where the platform
    forks, in order either way."""
    import multiprocessing

    items = [(cfg, t) for cfg in kernel_configs() for t in targets if t in cfg.targets]
    jobs = gate_jobs() if jobs is None else jobs
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [compile_config(cfg, t) for cfg, t in items]
    _GATE_ITEMS[:] = items
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(_compile_item, range(len(items)), chunksize=1)
    finally:
        _GATE_ITEMS.clear()


def markdown_table(reports: List[Report]) -> str:
    lines = [
        "| kernel config | target | LDS / shared (bytes) | budget | registers (VGPR / reg) | spills | occupancy (waves/SIMD, registers only) | gate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r.config} | {r.target} | {r.shared_bytes} | {r.budget} | {r.registers if r.registers is not None else '-'} "
            f"| {r.spills} | {r.occupancy if r.occupancy is not None else '-'} | {'ok' if r.ok else 'FAIL: ' + (r.error or 'spill/LDS')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    reports = run_gate()
    print(markdown_table(reports))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
