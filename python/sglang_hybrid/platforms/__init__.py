"""The platform decision, made once and passed down (architecture.md, "Rules of the house").

``current_platform()`` answers: which device kind serves (CPU, CUDA, ROCm), and
for GPUs the architecture (``sm90``; ``gfx942`` = MI300X, ``gfx950`` = MI355X /
MI350P), compute-unit count and device name; on ROCm also whether AMD's aiter
imports (:meth:`Platform.aiter`). Kernel dispatchers in ``sgl_hybrid_kernel``
cannot import this package: they read the same facts from the tensor's device
(``sgl_hybrid_kernel.platform``); the start-up op table (``sglang_hybrid.boot``)
prints both views side by side.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from sgl_hybrid_kernel.platform import aiter_status, device_platform

# gfx arch -> the AMD Instinct parts we target (docs/rocm.md).
AMD_PARTS = {"gfx942": "MI300X / MI325X (CDNA3)", "gfx950": "MI355X / MI350X / MI350P (CDNA4)"}


@dataclass(frozen=True)
class Platform:
    """What the server runs on.

    Attributes:
        device: ``"cpu"``, ``"cuda"`` or ``"rocm"``.
        arch: GPU architecture (``"sm90"``, ``"gfx942"``, ``"gfx950"``); ``None`` on CPU.
        num_compute_units: SMs / CUs of the device; ``None`` on CPU.
        reason: one line saying how the decision was made (logged at start-up).
        name: the device name torch reports; ``None`` on CPU.
    """

    device: str
    arch: Optional[str] = None
    num_compute_units: Optional[int] = None
    reason: str = ""
    name: Optional[str] = None

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def is_rocm(self) -> bool:
        return self.device == "rocm"

    @property
    def torch_device(self) -> torch.device:
        """Where this process's kernels run: ``cpu``, or the current CUDA/HIP device."""
        if self.is_cpu:
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    def aiter(self) -> Tuple[bool, str]:
        """``(usable, why)``: whether ``import aiter`` succeeds (ROCm only; imported once, lazily)."""
        if not self.is_rocm:
            return False, f"{self.device}: aiter is ROCm-only"
        return aiter_status()

    def describe(self) -> str:
        """One line for the start-up log, e.g. ``rocm gfx950 (MI355X / ...), 256 CUs, AMD Instinct MI355X``."""
        if self.is_cpu:
            return f"cpu ({self.reason})"
        part = f" ({AMD_PARTS[self.arch]})" if self.arch in AMD_PARTS else ""
        unit = "CUs" if self.is_rocm else "SMs"
        return f"{self.device} {self.arch}{part}, {self.num_compute_units} {unit}, {self.name} ({self.reason})"


def _detect() -> Platform:
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0").lower() in ("1", "true", "yes"):
        return Platform("cpu", reason="SGLANG_USE_CPU_ENGINE=1")
    if not torch.cuda.is_available():
        return Platform("cpu", reason="no CUDA/ROCm device visible to torch")
    dev = device_platform(torch.device("cuda", 0))
    why = f"torch.version.hip={torch.version.hip}" if dev.device == "rocm" else f"torch.version.cuda={torch.version.cuda}"
    return Platform(dev.device, dev.arch, dev.num_compute_units, why, dev.name)


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    """The platform of this process (cached: decided once)."""
    return _detect()
