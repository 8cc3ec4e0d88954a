"""Start-up checks of the kernel paths: the op -> implementation table and the boot gates.

See :mod:`sglang_hybrid.boot.gates` (what runs) and :mod:`sglang_hybrid.boot.hooks`
(where it runs in upstream's start-up); docs/rocm.md has the table.
"""

from sglang_hybrid.boot.gates import SKIP_ENV, SKIP_FLAG, BootGateError, run_boot, skip_requested

__all__ = ["SKIP_ENV", "SKIP_FLAG", "BootGateError", "run_boot", "skip_requested"]
