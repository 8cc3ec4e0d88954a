"""The platform decision, made once and passed down (architecture.md, "Rules of the house").

``current_platform()`` answers: which device kind serves (CPU, CUDA, ROCm), and
for GPUs the architecture name and compute-unit count. Kernel dispatchers and
the plugin consult it; nothing else probes ``torch.cuda`` or ``torch.version.hip``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Platform:
    """What the server runs on.

    Attributes:
        device: ``"cpu"``, ``"cuda"`` or ``"rocm"``.
        arch: GPU architecture (``"sm90"``, ``"gfx942"``, ``"gfx950"``); ``None`` on CPU.
        num_compute_units: SMs / CUs of device 0; ``None`` on CPU.
        reason: one line saying how the decision was made (logged at start-up).
    """

    device: str
    arch: Optional[str] = None
    num_compute_units: Optional[int] = None
    reason: str = ""

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def is_rocm(self) -> bool:
        return self.device == "rocm"


def _detect() -> Platform:
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0").lower() in ("1", "true", "yes"):
        return Platform("cpu", reason="SGLANG_USE_CPU_ENGINE=1")
    if not torch.cuda.is_available():
        return Platform("cpu", reason="no CUDA/ROCm device visible to torch")
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip is not None:
        arch = getattr(props, "gcnArchName", "").split(":")[0] or None
        return Platform("rocm", arch, props.multi_processor_count, f"torch.version.hip={torch.version.hip}")
    return Platform(
        "cuda", f"sm{props.major}{props.minor}", props.multi_processor_count, f"torch.version.cuda={torch.version.cuda}"
    )


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    """The platform of this process (cached: decided once)."""
    return _detect()
