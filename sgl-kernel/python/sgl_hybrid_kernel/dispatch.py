"""Kernel-path choices: every dispatcher records what it picked and why, once.

``record_choice`` logs the first decision per op (the start-up table the
architecture asks for) and ``chosen_paths`` returns them all, e.g. for a run
manifest. Kernels here never import SGLang; the caller passes its logger.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional

_LOCK = threading.Lock()
_CHOICES: Dict[str, "KernelChoice"] = {}
_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelChoice:
    """One op's implementation: ``impl`` is ``"torch"``, ``"triton:<config>"`` or ``"aiter"``."""

    op: str
    impl: str
    reason: str


def record_choice(op: str, impl: str, reason: str, log: Optional[logging.Logger] = None) -> KernelChoice:
    """Record (and log once) the implementation chosen for ``op``."""
    choice = KernelChoice(op, impl, reason)
    with _LOCK:
        previous = _CHOICES.get(op)
        _CHOICES[op] = choice
    if previous != choice:
        (log or _logger).info("kernel path: %-16s -> %-10s (%s)", op, impl, reason)
    return choice


def chosen_paths() -> List[KernelChoice]:
    """All recorded choices, sorted by op name."""
    with _LOCK:
        return sorted(_CHOICES.values(), key=lambda c: c.op)
