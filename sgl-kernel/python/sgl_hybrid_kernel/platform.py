"""What a tensor's device is, as far as kernel choices go (no SGLang import).

The server decides its platform once in ``sglang_hybrid.platforms``; the kernel
package cannot import that, so this module answers the few questions a
dispatcher asks about a ``torch.device`` itself: CPU, CUDA or ROCm, the GPU
architecture (``sm90``, ``gfx942`` = MI300X, ``gfx950`` = MI355X / MI350P), its
compute-unit count (SMs on NVIDIA, CUs on AMD) and whether AMD's aiter imports.
Answers are cached per device index.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Optional, Tuple

import torch


@dataclass(frozen=True)
class DevicePlatform:
    """Facts about one device.

    Attributes:
        device: ``"cpu"``, ``"cuda"`` or ``"rocm"``.
        arch: ``"sm<major><minor>"`` on NVIDIA, the ``gcnArchName`` stem (``"gfx950"``)
            on AMD; ``None`` on CPU.
        num_compute_units: ``multi_processor_count`` (SMs / CUs); ``None`` on CPU.
        name: the device name torch reports; ``None`` on CPU.
    """

    device: str
    arch: Optional[str] = None
    num_compute_units: Optional[int] = None
    name: Optional[str] = None

    @property
    def key(self) -> Tuple[Optional[str], Optional[int]]:
        """``(arch, num_compute_units)``: the key of tuned kernel configs."""
        return (self.arch, self.num_compute_units)


def arch_from_properties(props, is_hip: bool) -> str:
    """``"gfx950"`` from ``gcnArchName`` ``"gfx950:sramecc+:xnack-"`` (ROCm), ``"sm90"`` from 9.0 (CUDA).

    Raises:
        ValueError: ROCm properties without a ``gcnArchName``.
    """
    if is_hip:
        arch = str(getattr(props, "gcnArchName", "") or "").split(":")[0]
        if not arch:
            raise ValueError("props: ROCm device properties carry no gcnArchName")
        return arch
    return f"sm{props.major}{props.minor}"


@functools.lru_cache(maxsize=None)
def _gpu_platform(index: int) -> DevicePlatform:
    props = torch.cuda.get_device_properties(index)
    is_hip = torch.version.hip is not None
    return DevicePlatform(
        "rocm" if is_hip else "cuda", arch_from_properties(props, is_hip), int(props.multi_processor_count), props.name
    )


def device_platform(device: Optional[torch.device] = None) -> DevicePlatform:
    """The platform of ``device`` (default: the current CUDA/HIP device if any, else CPU).

    A ``cuda`` device is reported as ``"rocm"`` on a ROCm build of torch
    (``torch.version.hip`` set), as torch uses one device type for both.
    """
    if device is None:
        if not torch.cuda.is_available():
            return DevicePlatform("cpu")
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        return DevicePlatform("cpu")
    return _gpu_platform(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=1)
def aiter_status() -> Tuple[bool, str]:
    """``(True, version)`` if AMD's ``aiter`` imports on a ROCm build of torch, else ``(False, why)``.

    Imported once (it is large); any exception counts as "not usable" and its
    text is the reason, so the start-up table can say why aiter was not chosen.
    """
    if torch.version.hip is None:
        return False, "not a ROCm build of torch"
    try:
        mod = importlib.import_module("aiter")
    except Exception as exc:  # ImportError, or a failing JIT / library load inside aiter
        return False, f"import aiter failed: {type(exc).__name__}: {str(exc)[:160]}"
    return True, f"aiter {getattr(mod, '__version__', 'unknown version')}"
