"""Coverage of the cross-compile gate (issue 9: "the gate covers every kernel for gfx942 and gfx950").

Imports every module of ``sgl_hybrid_kernel``, finds each ``@triton.jit`` function, tells
launched kernels from ``@triton.jit`` helpers (a helper is called by name from another
jitted function of the package; a kernel is not), and asserts every kernel has a config in
``compile_gate.kernel_configs()`` for gfx942, gfx950 and sm_90 — so a new kernel cannot be
missed. The exceptions are listed here with the reason dispatch never launches them there.
The compile itself (and its spill / LDS check) is ``test_compile_gate.py``.
"""

import ast
import importlib
import inspect
import pkgutil
import textwrap

import sgl_hybrid_kernel
from triton.runtime.jit import KernelInterface  # JITFunction and the interpreter's InterpretedFunction
from sgl_hybrid_kernel.compile_gate import TARGETS, kernel_configs
from sgl_hybrid_kernel.delta_rule.chunk.rules import CHUNK_LAUNCH, chunk_launch

# kernel name -> why no config for these targets is needed (dispatch cannot launch it there)
NOT_LAUNCHED = {
    "gated_delta_chunk_kernel": ({"gfx942", "gfx950"}, "sequential chunked prefill: ROCm always runs the chunk-64 form "
                                                       "(chunk.gated_delta_chunk_triton raises on method='sequential')"),
    # chunk-64 in-chunk step: the sm_90 table splits it (intra_split / intra_inv), the CDNA tables keep the fused kernel
    "chunk_intra_kernel": ({"sm90"}, "the sm90x132 launch entry (also the base of untuned CUDA parts) runs the split step"),
    "chunk_intra_a_kernel": ({"gfx942", "gfx950"}, "the CDNA launch entries run the fused chunk_intra_kernel"),
    "chunk_intra_arow_kernel": ({"gfx942", "gfx950"}, "the CDNA launch entries run the fused chunk_intra_kernel"),
    "chunk_intra_inv_kernel": ({"gfx942", "gfx950"}, "the CDNA launch entries run the fused chunk_intra_kernel"),
    "chunk_intra_solve_kernel": ({"gfx942", "gfx950"}, "the CDNA launch entries run the fused chunk_intra_kernel"),
}


def _jitted():
    """``{name: jitted object}`` of every ``@triton.jit`` function defined in the package."""
    found = {}
    for info in pkgutil.walk_packages(sgl_hybrid_kernel.__path__, "sgl_hybrid_kernel."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if isinstance(obj, KernelInterface) and inspect.isfunction(fn) and fn.__module__ == mod.__name__:
                assert name not in found or found[name].fn is fn, f"two jitted functions named {name}"
                found[name] = obj
    return found


def _called_names(fn) -> set:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr
            for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}


def _kernels():
    jitted = _jitted()
    called = set().union(*(_called_names(obj.fn) for obj in jitted.values()))
    return {name: obj for name, obj in jitted.items() if name not in called}


def test_every_jitted_kernel_is_in_the_gate_for_each_target():
    kernels = _kernels()
    # the classifier finds the known kernels and leaves known helpers out
    assert {"gated_delta_recurrent_kernel", "chunk_state_kernel", "chunk_intra_kernel", "mla_split_kv_kernel"} <= set(kernels)
    assert not {"_softplus", "_tril_inverse_16", "_state_advance"} & set(kernels)
    covered = {t: set() for t in TARGETS}
    for cfg in kernel_configs():
        for t in cfg.targets:
            covered[t].add(cfg.kernel.fn)
    missing = []
    for name, obj in sorted(kernels.items()):
        exempt = NOT_LAUNCHED.get(name, (set(), ""))[0]
        missing += [f"{name} on {t}" for t in TARGETS if t not in exempt and obj.fn not in covered[t]]
    assert not missing, "kernels without a compile-gate config: " + ", ".join(missing)
    assert set(NOT_LAUNCHED) <= set(kernels), "stale NOT_LAUNCHED entry"


def test_chunk_launch_table_is_keyed_by_arch_and_cu_count():
    # every tuned entry's arch is compiled by the gate (chunk_parallel_configs walks CHUNK_LAUNCH)
    gated = {cfg.name.rsplit("_", 1)[-1] for cfg in kernel_configs() if "_chunk64_" in cfg.name}
    assert gated == {f"{a}x{c}" for a, c in CHUNK_LAUNCH}
    # a 128-CU gfx950 part gets the gfx950 (compile-gated) parameters, marked untuned, never the 256-CU entry itself
    half = chunk_launch("gfx950", 128)
    full = CHUNK_LAUNCH[("gfx950", 256)]
    assert half is not full and not half.tuned and half.state_bv == full.state_bv and "gfx950" in half.name
    assert chunk_launch("gfx942", 304) is CHUNK_LAUNCH[("gfx942", 304)]
    assert not chunk_launch("gfx1100", 48).tuned and "not compile-gated" in chunk_launch("gfx1100", 48).source


def test_the_gate_compiles_every_plan_of_the_tables():
    """The compile gate enumerates the delta-rule tables' plans (issue 43): for every row of ``recurrent/tiles.json``
    and ``chunk/launch.json`` the gate compiles for, each decode / verify plan at the served shapes (batches 1-160)
    has a config with its kernel, tile and modes for that arch; and an arch no table row names is not enumerated."""
    from sgl_hybrid_kernel.compile_gate import plan_targets, recurrent_plans_without_config

    assert {arch for arch, _ in plan_targets()} == {"sm90", "gfx942", "gfx950"}
    assert recurrent_plans_without_config() == []
