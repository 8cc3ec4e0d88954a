"""The ``sgl_kernel`` stand-in (``sgl-kernel/cpu_shim``) as a CUDA-side replacement for ``sglang-kernel``.

Three things are checked on this CPU machine:

1. imports: every ``from sgl_kernel[.x] import NAME`` (and ``import sgl_kernel.x``,
   ``sgl_kernel.NAME(...)``, kernel-registry target ``"sgl_kernel:NAME"``) found by
   scanning upstream SGLang's source resolves on the stand-in, except the two
   names upstream probes with ``try/except ImportError`` to choose a fallback; and,
   in a subprocess where ``torch.cuda`` pretends to be an H100, every upstream module
   that imports ``sgl_kernel`` at module load imports without an ``sgl_kernel``
   error, the stand-in says so once in the log and clears upstream's
   ``sglang-kernel>=0.4.9`` check;
2. numerics of each implemented op against an independent formula (float64
   references, hand-computed examples, in-place semantics on every mutated tensor);
3. every placeholder raises ``NotImplementedError`` naming itself when called.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import types
import unittest
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import sgl_kernel
from sgl_kernel._unprovided import is_placeholder

SGLANG_ROOT = Path(importlib.util.find_spec("sglang").origin).parent

# Upstream chooses a fallback when these fail to import; providing them would switch
# it onto kernels the stand-in does not have.
DELIBERATELY_ABSENT = {
    ("sgl_kernel.allreduce", None): "custom all-reduce probe (custom_all_reduce_ops.py): NCCL instead",
    ("sgl_kernel", "metal"): "MLX Metal probe (hardware_backend/mlx/aot.py)",
}


TARGET = re.compile(r"^sgl_kernel:([A-Za-z_]\w*)$")  # "module:attr" of upstream's kernel registry


def _is_sgl_kernel(module: str | None) -> bool:
    return module == "sgl_kernel" or (module or "").startswith("sgl_kernel.")


@functools.lru_cache(maxsize=1)
def _scan_upstream():
    """(module, name, file:line, module_level) for each sgl_kernel reference in upstream's source."""
    found = []
    for path in sorted(SGLANG_ROOT.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            if "sgl_kernel" not in text:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in upstream's strings
                tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError):
            continue
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

        def module_level(node):
            while node in parents:
                node = parents[node]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    return False
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    return False
            return True

        where = str(path.relative_to(SGLANG_ROOT))
        for node in ast.walk(tree):
            refs = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_sgl_kernel(node.module):
                refs = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                refs = [(alias.name, None) for alias in node.names if _is_sgl_kernel(alias.name)]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sgl_kernel":
                refs = [("sgl_kernel", node.attr)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value):
                refs = [("sgl_kernel", TARGET.match(node.value).group(1))]  # kernel-registry target
            for module, name in refs:
                found.append((module, name, f"{where}:{node.lineno}", module_level(node)))
    # Registry targets built with an f-string (kernels/ops/quantization/__init__.py).
    for name in ("sgl_per_token_group_quant_8bit", "sgl_per_token_group_quant_fp8", "sgl_per_token_group_quant_int8"):
        found.append(("sgl_kernel", name, "kernels/ops/quantization/__init__.py", False))
    return tuple(found)


def _resolves(module: str, name: str | None) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    if name is None or hasattr(mod, name):
        return True
    try:  # ``from sgl_kernel import top_k`` names a submodule
        importlib.import_module(f"{module}.{name}")
        return True
    except ImportError:
        return False


class TestUpstreamImportsResolve(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.refs = _scan_upstream()

    def test_scan_sees_upstream(self):
        names = {(m, n) for m, n, _, _ in self.refs}
        self.assertGreater(len(names), 120, "the scan of upstream's source found too few sgl_kernel names")
        for must in [("sgl_kernel", "rmsnorm"), ("sgl_kernel.utils", "is_arch_support_pdl"),
                     ("sgl_kernel.scalar_type", "scalar_types"), ("sgl_kernel", "moe_align_block_size"),
                     ("sgl_kernel.kvcacheio", "transfer_kv_per_layer_mla"), ("sgl_kernel", "fp8_scaled_mm")]:
            self.assertIn(must, names)

    def test_every_name_resolves(self):
        missing = sorted(
            {f"{m}:{n} ({where})" for m, n, where, _ in self.refs
             if (m, n) not in DELIBERATELY_ABSENT and not _resolves(m, n)}
        )
        self.assertEqual(missing, [], "upstream imports these sgl_kernel names; the stand-in lacks them")

    def test_probed_names_stay_absent(self):
        for (module, name), why in DELIBERATELY_ABSENT.items():
            self.assertFalse(_resolves(module, name), f"{module}:{name} must stay absent: {why}")
        # get_device_accessible_ptr / transfer_embedding_ranges_direct are importable, but upstream uses
        # them only if torch.ops.sgl_kernel has the op too, which the stand-in never registers.
        for op in ("get_device_accessible_ptr", "transfer_embedding_ranges_direct", "rmsnorm", "fp8_scaled_mm"):
            self.assertFalse(hasattr(torch.ops.sgl_kernel, op), op)


_FAKE_CUDA_CHILD = textwrap.dedent(
    """
    import importlib, json, logging, os, sys, types
    import torch

    # Pretend to be an H100 host as far as upstream's import-time checks go.
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 << 30,
                                  multi_processor_count=132, gcnArchName="", L2_cache_size=50 << 20,
                                  warp_size=32)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_name = lambda *a, **k: props.name
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cuda.is_bf16_supported = lambda *a, **k: True
    assert torch.version.cuda is not None, "this check needs a CUDA build of torch"

    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("sgl_kernel").addHandler(Keep())

    from sglang.srt.utils import is_cuda
    assert is_cuda()

    failures = {}
    for name in json.loads(sys.argv[1]):
        try:
            importlib.import_module(name)
        except BaseException as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"

    from sglang.srt.utils.common import assert_pkg_version
    try:
        assert_pkg_version("sglang-kernel", "0.4.9", "")
        version_check = "passed"
    except Exception as exc:
        version_check = str(exc)
    import sgl_kernel.utils
    print("RESULT" + json.dumps({
        "failures": failures,
        "standin_warnings": [r for r in records if "stand-in" in r],
        "skip_env": os.environ.get("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"),
        "version_check": version_check,
        "pdl": sgl_kernel.utils.is_arch_support_pdl(),
        "sgl_kernel_file": sgl_kernel.__file__,
    }))
    """
)

# Modules that must import on CUDA with the stand-in whatever else is missing: the ones
# our models load.
MUST_IMPORT = [
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.attention.merge_state",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe",
    "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size",
    "sglang.srt.layers.quantization.w8a8_int8",
    "sglang.srt.layers.quantization.gguf",
    "sglang.srt.mem_cache.memory_pool_host",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
]
# XPU-only module whose failure is a torch.ops lookup of a SYCL op, not an sgl_kernel import.
XPU_ONLY = {"sglang.kernels.ops.diffusion.norm.scale_residual_norm_scale_shift_sycl"}


class TestUpstreamModulesImportOnFakeCuda(unittest.TestCase):
    def test_modules_importing_sgl_kernel_at_load(self):
        modules = list(MUST_IMPORT)
        for _, _, where, module_level in _scan_upstream():
            path = where.rsplit(":", 1)[0]
            if not module_level or path.startswith("test/"):
                continue
            dotted = "sglang." + path[: -len(".py")].replace("/", ".")
            dotted = dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted
            if dotted not in modules and dotted not in XPU_ONLY:
                modules.append(dotted)
        self.assertGreater(len(modules), 40)
        env = {k: v for k, v in os.environ.items()
               if k not in ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK")}
        res = subprocess.run([sys.executable, "-c", _FAKE_CUDA_CHILD, json.dumps(modules)], env=env,
                             capture_output=True, text=True, timeout=900)
        self.assertEqual(res.returncode, 0, res.stderr[-3000:])
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")][-1]
        out = json.loads(line[len("RESULT"):])
        self.assertTrue(out["sgl_kernel_file"].startswith(str(Path(sgl_kernel.__file__).parent)))

        failures = out["failures"]
        for name in MUST_IMPORT:
            self.assertNotIn(name, failures, failures.get(name))
        about_sgl_kernel = {k: v for k, v in failures.items() if "sgl_kernel" in v}
        self.assertEqual(about_sgl_kernel, {}, "upstream modules fail to import sgl_kernel names on CUDA")
        # Anything else that failed did so for a missing optional dependency of upstream's.
        for name, err in failures.items():
            self.assertTrue(err.startswith("ModuleNotFoundError"), f"{name}: {err}")

        self.assertEqual(len(out["standin_warnings"]), 1, out["standin_warnings"])
        self.assertIn("device cuda", out["standin_warnings"][0])
        self.assertEqual(out["skip_env"], "1")
        self.assertEqual(out["version_check"], "passed")
        self.assertIs(out["pdl"], False)


class TestStartupWarning(unittest.TestCase):
    def test_warns_once_naming_itself_and_the_device(self):
        code = "import sgl_kernel, sgl_kernel.elementwise, sgl_kernel.moe, sgl_kernel.kvcacheio, os; " \
               "print(os.environ.get('SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK'))"
        env = {k: v for k, v in os.environ.items() if k != "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr[-3000:])
        lines = [ln for ln in res.stderr.splitlines() if "stand-in" in ln]
        self.assertEqual(len(lines), 1, res.stderr)
        self.assertIn("device cpu", lines[0])
        self.assertEqual(res.stdout.strip(), "None")  # CPU: upstream's CUDA version check does not apply
        self.assertTrue(sgl_kernel.STANDIN)


def _rms_ref(x, w, eps, gemma=False):
    x64 = x.double()
    w64 = w.double() + (1.0 if gemma else 0.0)
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64


class TestNorms(unittest.TestCase):
    def setUp(self):
        self.gen = torch.Generator().manual_seed(0)

    def _data(self, dtype, shape=(5, 64)):
        x = torch.randn(*shape, generator=self.gen).to(dtype)
        w = (torch.rand(shape[-1], generator=self.gen) + 0.5).to(dtype)
        return x, w

    def test_rmsnorm(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
            x, w = self._data(dtype)
            x0 = x.clone()
            y = sgl_kernel.rmsnorm(x, w, 1e-6)
            self.assertEqual(y.dtype, dtype)
            torch.testing.assert_close(y.double(), _rms_ref(x, w, 1e-6), rtol=tol, atol=tol)
            self.assertTrue(torch.equal(x, x0), "rmsnorm must not modify its input")

    def test_rmsnorm_out_and_pdl_kwarg(self):
        x, w = self._data(torch.float32)
        out = torch.empty_like(x)
        y = sgl_kernel.rmsnorm(x, w, 1e-5, out=out, enable_pdl=True)
        self.assertIs(y, out)
        torch.testing.assert_close(out.double(), _rms_ref(x, w, 1e-5), rtol=1e-5, atol=1e-5)

    def test_rmsnorm_eps_matters(self):
        x = torch.full((1, 4), 1e-3)
        w = torch.ones(4)
        y = sgl_kernel.rmsnorm(x, w, 1e-6)
        self.assertAlmostEqual(y[0, 0].item(), 1e-3 / math.sqrt(1e-6 + 1e-6), places=5)

    def test_fused_add_rmsnorm_updates_both_in_place(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            x, w = self._data(dtype)
            r = torch.randn(x.shape, generator=self.gen).to(dtype)
            x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
            s64 = x.double() + r.double()
            ret = sgl_kernel.fused_add_rmsnorm(x, r, w, 1e-6, enable_pdl=False)
            self.assertIsNone(ret)
            self.assertEqual((x.data_ptr(), r.data_ptr()), (x_ptr, r_ptr))
            torch.testing.assert_close(r.double(), s64.to(dtype).double(), rtol=0, atol=0)  # residual = x + r
            torch.testing.assert_close(x.double(), _rms_ref(s64, w, 1e-6), rtol=tol, atol=tol)

    def test_gemma_variants_scale_by_one_plus_weight(self):
        x, w = self._data(torch.float32)
        torch.testing.assert_close(sgl_kernel.gemma_rmsnorm(x, w, 1e-6).double(), _rms_ref(x, w, 1e-6, gemma=True),
                                   rtol=1e-5, atol=1e-5)
        zero = torch.zeros_like(w)  # weight 0 -> plain normalisation
        torch.testing.assert_close(sgl_kernel.gemma_rmsnorm(x, zero, 1e-6),
                                   sgl_kernel.rmsnorm(x, torch.ones_like(w), 1e-6))
        r = torch.randn(x.shape, generator=self.gen)
        s64 = x.double() + r.double()
        sgl_kernel.gemma_fused_add_rmsnorm(x, r, w, 1e-6)
        torch.testing.assert_close(r.double(), s64, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(x.double(), _rms_ref(s64, w, 1e-6, gemma=True), rtol=1e-5, atol=1e-5)


class TestActivations(unittest.TestCase):
    def test_gated(self):
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(3, 7, 32, generator=gen)
        a, b = x[..., :16].double(), x[..., 16:].double()
        refs = {
            "silu_and_mul": a / (1 + torch.exp(-a)) * b,
            "gelu_and_mul": 0.5 * a * (1 + torch.erf(a / math.sqrt(2))) * b,
            "gelu_tanh_and_mul": 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))) * b,
        }
        for name, ref in refs.items():
            fn = getattr(sgl_kernel, name)
            torch.testing.assert_close(fn(x).double(), ref, rtol=1e-5, atol=1e-5, msg=name)
            out = torch.empty(3, 7, 16)
            self.assertIs(fn(x, out), out)
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5, msg=name)
        with self.assertRaises(ValueError):
            sgl_kernel.silu_and_mul(x, torch.empty(3, 7, 8))
        y = sgl_kernel.silu_and_mul(x.bfloat16())
        self.assertEqual(y.dtype, torch.bfloat16)

    def test_gelu_quick(self):
        x = torch.linspace(-4, 4, 17)
        torch.testing.assert_close(sgl_kernel.gelu_quick(x).double(),
                                   x.double() / (1 + torch.exp(-1.702 * x.double())), rtol=1e-6, atol=1e-6)


class TestRenorm(unittest.TestCase):
    P = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])

    def test_top_k_hand_example(self):
        y = sgl_kernel.top_k_renorm_prob(self.P, torch.tensor([2, 4], dtype=torch.int32))
        torch.testing.assert_close(y, torch.tensor([[0, 4 / 7, 0, 3 / 7], [0.25] * 4]))
        self.assertEqual(y.dtype, torch.float32)
        y = sgl_kernel.top_k_renorm_prob(self.P.half(), 1)
        torch.testing.assert_close(y[0], torch.tensor([0.0, 1.0, 0.0, 0.0]))
        torch.testing.assert_close(y[1], torch.tensor([0.25] * 4))  # ties at the pivot are kept
        off = sgl_kernel.top_k_renorm_prob(self.P, torch.tensor([1 << 30, 0]))  # SGLang's "no top-k"
        torch.testing.assert_close(off, self.P)

    def test_top_p_hand_example(self):
        probs = self.P[:1]
        cases = {0.6: [0, 4 / 7, 0, 3 / 7], 0.75: [0, 4 / 9, 2 / 9, 3 / 9], 0.3: [0, 1, 0, 0], 1.0: [0.1, 0.4, 0.2, 0.3]}
        for p, expect in cases.items():
            torch.testing.assert_close(sgl_kernel.top_p_renorm_prob(probs, p)[0], torch.tensor(expect, dtype=torch.float32),
                                       msg=str(p))
        per_row = sgl_kernel.top_p_renorm_prob(self.P, torch.tensor([0.6, 0.3]))
        torch.testing.assert_close(per_row, torch.tensor([[0, 4 / 7, 0, 3 / 7], [0.25] * 4]))

    def test_renorm_against_a_sorting_reference(self):
        gen = torch.Generator().manual_seed(2)
        probs = torch.softmax(torch.randn(6, 50, generator=gen), -1)
        ks = torch.tensor([1, 3, 7, 50, 20, 2])
        ps = torch.tensor([0.1, 0.5, 0.9, 0.99, 0.3, 0.7])
        yk = sgl_kernel.top_k_renorm_prob(probs, ks)
        yp = sgl_kernel.top_p_renorm_prob(probs, ps)
        for i in range(6):
            order = probs[i].tolist()
            ranked = sorted(range(50), key=lambda j: -order[j])
            keep_k = set(ranked[: int(ks[i])])
            acc, keep_p = 0.0, set()
            for j in ranked:
                keep_p.add(j)
                acc += order[j]
                if acc >= float(ps[i]):
                    break
            for keep, y in ((keep_k, yk), (keep_p, yp)):
                ref = torch.tensor([order[j] if j in keep else 0.0 for j in range(50)], dtype=torch.float64)
                torch.testing.assert_close(y[i].double(), ref / ref.sum(), rtol=1e-5, atol=1e-6)


class TestMoe(unittest.TestCase):
    def test_moe_sum_reduce_and_moe_sum(self):
        gen = torch.Generator().manual_seed(3)
        x = torch.randn(4, 3, 8, generator=gen).bfloat16()
        out = torch.empty(4, 8, dtype=torch.bfloat16)
        ptr = out.data_ptr()
        self.assertIsNone(sgl_kernel.moe_sum_reduce(x, out, 2.5))
        self.assertEqual(out.data_ptr(), ptr)
        ref = (x.double()[:, 0] + x.double()[:, 1] + x.double()[:, 2]) * 2.5
        torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
        out2 = torch.empty(4, 8, dtype=torch.bfloat16)
        sgl_kernel.moe_sum(x, out2)
        torch.testing.assert_close(out2.double(), ref / 2.5, rtol=1e-2, atol=1e-2)

    def test_moe_align_block_size_hand_example(self):
        # 4 experts (+1 bucket for filtered id -1), block 4; upstream's caller passes num_experts + 1.
        topk_ids = torch.tensor([[1, 2], [0, 1], [1, -1]], dtype=torch.int32)  # flat: 1 2 0 1 1 -1
        numel, buckets, block = 6, 5, 4
        sorted_ids = torch.full((32,), -7, dtype=torch.int32)
        expert_ids = torch.full((8,), -7, dtype=torch.int32)
        post_pad = torch.zeros(1, dtype=torch.int32)
        cumsum = torch.zeros(buckets + 1, dtype=torch.int32)
        sgl_kernel.moe_align_block_size(topk_ids, buckets, block, sorted_ids, expert_ids, post_pad, cumsum, True)
        # buckets: [-1]: slot 5; [0]: slot 2; [1]: slots 0 3 4; [2]: slot 1; [3]: none -> 4 blocks of 4
        P = numel
        self.assertEqual(post_pad.tolist(), [16])
        self.assertEqual(sorted_ids[:16].tolist(), [5, P, P, P, 2, P, P, P, 0, 3, 4, P, 1, P, P, P])
        self.assertTrue((sorted_ids[16:] == P).all())
        self.assertEqual(expert_ids[:4].tolist(), [-1, 0, 1, 2])
        self.assertEqual(cumsum.tolist(), [0, 4, 8, 12, 16, 16])
        with self.assertRaisesRegex(ValueError, "expert ids"):
            sgl_kernel.moe_align_block_size(topk_ids + 4, buckets, block, sorted_ids, expert_ids, post_pad, cumsum, True)

    def test_moe_align_block_size_routes_cuda_tensors_to_upstreams_jit_kernel(self):
        import sglang.kernels.ops.moe.moe_align as jit

        calls = []
        fake_ids = types.SimpleNamespace(is_cuda=True, device="cuda:0")
        original = jit.moe_align_block_size
        jit.moe_align_block_size = lambda *args, **kwargs: calls.append((args, kwargs))
        try:
            sgl_kernel.moe_align_block_size(fake_ids, 9, 16, "sorted", "experts", "post", "cumsum", True)
        finally:
            jit.moe_align_block_size = original
        if torch.version.hip is None:
            self.assertEqual(calls, [((fake_ids, 9, 16, "sorted", "experts", "post", "cumsum", True), {})])

    def test_ignore_invalid_expert_is_not_implemented(self):
        with self.assertRaisesRegex(NotImplementedError, "moe_align_block_size"):
            sgl_kernel.moe_align_block_size(torch.zeros(2, 1, dtype=torch.int32), 3, 4, None, None, None, None, True,
                                            True)


class TestOtherOps(unittest.TestCase):
    def test_merge_state_v2_equals_attention_over_the_union(self):
        gen = torch.Generator().manual_seed(4)
        T, H, D, na, nb = 3, 2, 8, 5, 4
        q = torch.randn(T, H, D, generator=gen, dtype=torch.float64)
        ka, va = torch.randn(na, H, D, generator=gen, dtype=torch.float64), torch.randn(na, H, D, generator=gen, dtype=torch.float64)
        kb, vb = torch.randn(nb, H, D, generator=gen, dtype=torch.float64), torch.randn(nb, H, D, generator=gen, dtype=torch.float64)

        def attend(k, v):
            s = torch.einsum("thd,nhd->thn", q, k)
            return torch.einsum("thn,nhd->thd", torch.softmax(s, -1), v), torch.logsumexp(s, -1)

        oa, la = attend(ka, va)
        ob, lb = attend(kb, vb)
        o, l_ = attend(torch.cat([ka, kb]), torch.cat([va, vb]))
        vm, sm = sgl_kernel.merge_state_v2(oa.float(), la.float(), ob.float(), lb.float())
        self.assertEqual(sm.dtype, torch.float32)
        torch.testing.assert_close(vm.double(), o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sm.double(), l_, rtol=1e-5, atol=1e-5)
        out, out_lse = torch.empty(T, H, D, dtype=torch.bfloat16), torch.empty(T, H)
        got = sgl_kernel.merge_state_v2(oa.bfloat16(), la.float(), ob.bfloat16(), lb.float(), out, out_lse)
        self.assertIs(got[0], out)
        self.assertIs(got[1], out_lse)
        torch.testing.assert_close(out.double(), o, rtol=2e-2, atol=2e-2)
        # an empty part (LSE -inf, or +inf as upstream's Triton kernel treats it) leaves the other one
        for empty in (float("-inf"), float("inf")):
            vm, sm = sgl_kernel.merge_state_v2(oa.float(), la.float(), ob.float(), torch.full_like(lb.float(), empty))
            torch.testing.assert_close(vm.double(), oa, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(sm.double(), la, rtol=1e-5, atol=1e-5)

    def test_rotary_embedding_against_complex_rotation(self):
        gen = torch.Generator().manual_seed(5)
        T, Hq, Hk, Dh, rot = 4, 3, 1, 16, 8
        pos = torch.tensor([0, 5, 2, 9])
        inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        ang = torch.arange(12, dtype=torch.float64)[:, None] * inv[None]
        cache = torch.cat([ang.cos(), ang.sin()], -1).float()
        for neox in (True, False):
            q = torch.randn(T, Hq * Dh, generator=gen)
            k = torch.randn(T, Hk * Dh, generator=gen)
            q0, k0 = q.clone(), k.clone()
            self.assertIsNone(sgl_kernel.rotary_embedding(pos, q, k, Dh, cache, neox))
            for x0, x, H in ((q0, q, Hq), (k0, k, Hk)):
                x0 = x0.view(T, H, Dh).double()
                if neox:
                    z = torch.complex(x0[..., : rot // 2], x0[..., rot // 2 : rot])
                else:
                    z = torch.complex(x0[..., 0:rot:2], x0[..., 1:rot:2])
                zr = z * torch.polar(torch.ones_like(ang[pos]), ang[pos])[:, None, :]
                ref = x0.clone()
                if neox:
                    ref[..., : rot // 2], ref[..., rot // 2 : rot] = zr.real, zr.imag
                else:
                    ref[..., 0:rot:2], ref[..., 1:rot:2] = zr.real, zr.imag
                torch.testing.assert_close(x.view(T, H, Dh).double(), ref, rtol=1e-5, atol=1e-5)

    def test_int8_scaled_mm(self):
        gen = torch.Generator().manual_seed(6)
        a = torch.randint(-128, 128, (5, 64), generator=gen, dtype=torch.int8)
        b = torch.randint(-128, 128, (64, 7), generator=gen, dtype=torch.int8)
        sa, sb = torch.rand(5, 1, generator=gen), torch.rand(7, generator=gen)
        bias = torch.randn(7, generator=gen)
        exact = (a.long() @ b.long()).double()
        ref = exact * sa.double() * sb.double()[None] + bias.double()
        y = sgl_kernel.int8_scaled_mm(a, b, sa, sb, torch.float32, bias)
        self.assertEqual(y.dtype, torch.float32)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
        self.assertEqual(sgl_kernel.int8_scaled_mm(a, b, sa, sb, torch.bfloat16).dtype, torch.bfloat16)

    def test_weak_ref_tensor_aliases_without_owning(self):
        base = torch.arange(24.0).view(4, 6)
        view = base[1:, 2:5]
        w = sgl_kernel.weak_ref_tensor(view)
        self.assertEqual((w.shape, w.stride(), w.dtype, w.data_ptr()), (view.shape, view.stride(), view.dtype, view.data_ptr()))
        base[2, 3] = -1.0
        self.assertEqual(w[1, 1].item(), -1.0)
        self.assertEqual(sgl_kernel.weak_ref_tensor(torch.empty(0)).numel(), 0)

    def test_is_arch_support_pdl(self):
        from sgl_kernel.utils import is_arch_support_pdl

        self.assertIs(is_arch_support_pdl(), False)

    def test_scalar_types(self):
        from sgl_kernel.scalar_type import ScalarType, scalar_types as st

        # ids in the C++ layout: exponent | mantissa << 8 | signed << 16 | bias << 17 | finite << 49 | nan << 50
        self.assertEqual(st.uint4b8.id, 4 << 8 | 8 << 17 | 1 << 50)
        self.assertEqual(st.float8_e4m3fn.id, 4 | 3 << 8 | 1 << 16 | 1 << 49 | 2 << 50)
        self.assertEqual(st.float4_e2m1f.id, 2 | 1 << 8 | 1 << 16 | 1 << 49)
        for t in (st.uint4b8, st.uint8b128, st.float8_e4m3fn, st.float4_e2m1f, st.bfloat16, st.int4, ScalarType.int_(8, -3)):
            self.assertEqual(ScalarType.from_id(t.id), t)
        self.assertEqual((st.uint4b8.size_bits, st.uint4b8.min(), st.uint4b8.max()), (4, -8, 7))
        self.assertEqual((st.uint8b128.min(), st.uint8b128.max()), (-128, 127))
        self.assertEqual((st.int4.min(), st.int4.max(), st.uint4.max()), (-8, 7, 15))
        self.assertEqual(st.float8_e4m3fn.max(), torch.finfo(torch.float8_e4m3fn).max)
        self.assertEqual(st.float8_e5m2.max(), torch.finfo(torch.float8_e5m2).max)
        self.assertEqual(st.bfloat16.max(), torch.finfo(torch.bfloat16).max)
        self.assertEqual((st.float4_e2m1f.max(), st.float4_e2m1f.size_bits), (6.0, 4))
        self.assertTrue(st.uint4b8.is_integer() and st.uint4b8.has_bias() and not st.uint4b8.is_signed())
        self.assertEqual((str(st.uint4b8), str(st.float8_e4m3fn), str(st.float4_e2m1f)), ("uint4b8", "float8_e4m3fn", "float4_e2m1f"))
        self.assertEqual(len({st.uint4b8: 1, st.uint4: 2}), 2)  # hashable, distinct


def _all_placeholders():
    out = []
    for module_name in ("sgl_kernel", "sgl_kernel.elementwise", "sgl_kernel.kvcacheio", "sgl_kernel.flash_attn",
                        "sgl_kernel.quantization", "sgl_kernel.speculative", "sgl_kernel.top_k", "sgl_kernel.spatial"):
        module = importlib.import_module(module_name)
        out += [(module_name, name, obj) for name, obj in vars(module).items() if is_placeholder(obj)]
    return out


class TestPlaceholders(unittest.TestCase):
    def test_every_placeholder_raises_naming_itself(self):
        placeholders = _all_placeholders()
        self.assertGreater(len(placeholders), 80)
        for module_name, name, fn in placeholders:
            with self.assertRaises(NotImplementedError, msg=f"{module_name}.{name}") as ctx:
                fn(torch.zeros(1), 1, key="value")
            self.assertIn(name, str(ctx.exception))
            self.assertIn("stand-in", str(ctx.exception))

    def test_examples(self):
        for call, name in (
            (lambda: sgl_kernel.fp8_scaled_mm(None, None, None, None, torch.bfloat16), "fp8_scaled_mm"),
            (lambda: sgl_kernel.topk_softmax(None, None, None), "topk_softmax"),
            (lambda: importlib.import_module("sgl_kernel.kvcacheio").transfer_kv_per_layer(), "transfer_kv_per_layer"),
            (lambda: importlib.import_module("sgl_kernel.flash_attn").flash_attn_with_kvcache(), "flash_attn_with_kvcache"),
            (lambda: importlib.import_module("sgl_kernel.quantization").ggml_dequantize(), "ggml_dequantize"),
        ):
            with self.assertRaisesRegex(NotImplementedError, name):
                call()

    def test_implemented_ops_are_not_placeholders(self):
        for name in ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul",
                     "gelu_and_mul", "gelu_tanh_and_mul", "gelu_quick", "top_k_renorm_prob", "top_p_renorm_prob",
                     "moe_sum_reduce", "moe_sum", "moe_align_block_size", "merge_state_v2", "rotary_embedding",
                     "int8_scaled_mm", "weak_ref_tensor"):
            self.assertFalse(is_placeholder(getattr(sgl_kernel, name)), name)


if __name__ == "__main__":
    unittest.main()
