"""Platform detection (CPU / CUDA / ROCm, arch, CU count, aiter) and the start-up op table text.

No GPU here: torch's device queries are replaced by fakes carrying what torch
reports on an MI355X (``gcnArchName`` ``gfx950:sramecc+:xnack-``, 256 CUs) and an
H200 (compute capability 9.0, 132 SMs).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

import sgl_hybrid_kernel.platform as kplatform
import sglang_hybrid.platforms as platforms
from sgl_hybrid_kernel.dispatch import KernelChoice
from sglang_hybrid.boot.gates import op_table

MI355X = SimpleNamespace(gcnArchName="gfx950:sramecc+:xnack-", multi_processor_count=256, name="AMD Instinct MI355X",
                         major=9, minor=5)
H200 = SimpleNamespace(multi_processor_count=132, name="NVIDIA H200", major=9, minor=0)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Install a fake device; returns a function taking (props, hip_version)."""

    def install(props, hip):
        monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
        monkeypatch.setattr(torch.version, "hip", hip)
        kplatform._gpu_platform.cache_clear()
        kplatform.aiter_status.cache_clear()

    yield install
    kplatform._gpu_platform.cache_clear()
    kplatform.aiter_status.cache_clear()


def test_rocm_mi355x_detected_with_arch_and_cus(fake_gpu):
    fake_gpu(MI355X, "7.2.0")
    p = platforms._detect()
    assert (p.device, p.arch, p.num_compute_units, p.name) == ("rocm", "gfx950", 256, "AMD Instinct MI355X")
    assert p.is_rocm and not p.is_cuda and not p.is_cpu
    assert p.reason == "torch.version.hip=7.2.0"
    assert p.describe().startswith("rocm gfx950 (MI355X / MI350X / MI350P (CDNA4)), 256 CUs, AMD Instinct MI355X")


def test_cuda_h200_detected_as_sm90(fake_gpu):
    fake_gpu(H200, None)
    p = platforms._detect()
    assert (p.device, p.arch, p.num_compute_units) == ("cuda", "sm90", 132)
    assert "132 SMs" in p.describe()
    assert p.aiter() == (False, "cuda: aiter is ROCm-only")


def test_cpu_engine_flag_wins_over_a_visible_gpu(fake_gpu, monkeypatch):
    fake_gpu(MI355X, "7.2.0")
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert platforms._detect() == platforms.Platform("cpu", reason="SGLANG_USE_CPU_ENGINE=1")
    assert platforms._detect().torch_device == torch.device("cpu")


def test_rocm_properties_without_arch_name_raise():
    with pytest.raises(ValueError, match="props"):
        kplatform.arch_from_properties(SimpleNamespace(gcnArchName="", multi_processor_count=1), is_hip=True)


def test_aiter_reported_with_the_import_error_or_its_version(fake_gpu, monkeypatch):
    fake_gpu(MI355X, "7.2.0")
    monkeypatch.setitem(sys.modules, "aiter", None)  # "import aiter" raises ImportError
    ok, why = platforms._detect().aiter()
    assert not ok and why.startswith("import aiter failed: ModuleNotFoundError")
    kplatform.aiter_status.cache_clear()
    monkeypatch.setitem(sys.modules, "aiter", SimpleNamespace(__version__="0.1.9"))
    assert platforms._detect().aiter() == (True, "aiter 0.1.9")


def test_op_table_names_platform_aiter_and_each_choice(fake_gpu, monkeypatch):
    fake_gpu(MI355X, "7.2.0")
    monkeypatch.setitem(sys.modules, "aiter", SimpleNamespace(__version__="0.1.9"))
    text = op_table(platforms._detect(), [
        KernelChoice("delta_rule_decode", "triton:default(gfx950x256)", "rocm: no tuned value-tile table"),
        KernelChoice("delta_rule_prefill", "torch", "outside the Triton contract: head dim 96"),
    ])
    lines = text.splitlines()
    assert lines[0].startswith("sglang-hybrid kernel paths on rocm gfx950")
    assert lines[1] == "  aiter: usable (aiter 0.1.9)"
    assert lines[2].split() == ["op", "implementation", "why"]
    assert lines[4].split()[:2] == ["delta_rule_decode", "triton:default(gfx950x256)"]
    assert lines[5].split()[:2] == ["delta_rule_prefill", "torch"]


def test_current_platform_is_decided_once():
    assert platforms.current_platform() is platforms.current_platform()
    assert platforms.current_platform().is_cpu  # CI: SGLANG_USE_CPU_ENGINE=1 (test/conftest.py)
