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
import os
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


@functools.lru_cache(maxsize=1)
def _triton_version() -> Tuple[int, int]:
    """``(major, minor)`` of the installed Triton (read once: plans are made on every kernel call)."""
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2])


@dataclass(frozen=True)
class Target:
    """What a kernel plan is chosen for: a :class:`DevicePlatform`, whether Triton runs in its interpreter
    (``TRITON_INTERPRET=1`` when the plan is made) and the installed Triton's ``(major, minor)``.

    Plans (``delta_rule.plan``) are functions of a ``Target`` and the computation's shapes only, so any
    architecture's choices can be computed, logged, tabulated and tested on a CPU machine.

    Attributes:
        vendor: ``"cpu"``, ``"cuda"`` or ``"rocm"`` (the device's, not the interpreter's).
        arch, num_compute_units: as :class:`DevicePlatform` (``None`` on CPU).
        interpreter: kernels run in Triton's interpreter (no inline PTX there).
        triton_version: ``(major, minor)`` of the Triton that compiles the kernels.
    """

    vendor: str
    arch: Optional[str] = None
    num_compute_units: Optional[int] = None
    interpreter: bool = False
    triton_version: Tuple[int, int] = (0, 0)

    @property
    def key(self) -> Tuple[Optional[str], Optional[int]]:
        """``(arch, num_compute_units)``: the key of tuned kernel tables."""
        return (self.arch, self.num_compute_units)

    @staticmethod
    def from_platform(plat: DevicePlatform, interpreter: Optional[bool] = None,
                      triton_version: Optional[Tuple[int, int]] = None) -> "Target":
        """The target of ``plat``; ``interpreter`` / ``triton_version`` default to this process's
        (``TRITON_INTERPRET`` now, the installed Triton)."""
        if interpreter is None:
            interpreter = os.environ.get("TRITON_INTERPRET") == "1"
        return Target(plat.device, plat.arch, plat.num_compute_units, bool(interpreter),
                      tuple(triton_version) if triton_version is not None else _triton_version())

    @staticmethod
    def of(device: Optional[torch.device]) -> "Target":
        """The target of a tensor's device in this process (:func:`device_platform`)."""
        return Target.from_platform(device_platform(device))
