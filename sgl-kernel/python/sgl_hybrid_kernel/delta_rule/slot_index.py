"""Index arguments of the delta-rule kernels: state-pool slots, snapshot rows, accepted counts,
sequence offsets and initial-state flags.

Every Triton delta-rule kernel loads an index tensor as ``ptr + i`` (unit stride). A strided view,
e.g. column 0 of a ``[B, 4]`` int32 table, would be read as ``table[0, 0], table[0, 1], ...``: wrong
slots, other requests' states overwritten, and with out-of-range neighbours writes past the pool
(issue 42). The host wrappers therefore pass every index tensor through :func:`unit_stride` or
:func:`slot_indices`. ``Tensor.contiguous()`` returns the tensor itself when it is already
contiguous, so the usual case costs no copy and no launch; a strided one costs one small copy.

The range check (a slot past its pool: ``ValueError`` naming the argument) runs only on CPU tensors
(the Triton interpreter, tests, CPU callers). On a GPU it would need the largest index on the host,
a device-to-host sync per layer that also fails inside the CUDA-graph capture of decode and verify;
a device-side assert would kill the CUDA context instead of answering. GPU callers keep the pool's
invariant (the scheduler hands out slots of the pool it sized).
"""

from __future__ import annotations

from typing import Tuple

import torch


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when contiguous, else a contiguous copy (what a kernel loading ``ptr + i`` needs)."""
    return t.contiguous()


def slot_indices(name: str, idx: torch.Tensor, *pools: Tuple[str, int]) -> torch.Tensor:
    """Unit-stride ``idx`` (``[B]`` or ``[N]`` int slots; negative = padding / skip), range-checked on CPU.

    Args:
        name: the caller's argument name, used in the error.
        idx: slot per row; any int dtype, any stride.
        pools: ``(pool name, slots)`` pairs every non-negative entry must index.

    Returns:
        ``idx`` itself when contiguous, else a contiguous copy (same dtype and device).

    Raises:
        ValueError: on a CPU tensor, an entry ``>= slots`` of one of ``pools``. Not checked on a GPU
            (it would need a device-to-host sync; see the module docstring).
    """
    idx = idx.contiguous()
    if idx.device.type == "cpu" and idx.numel() and pools:
        hi = int(idx.max())
        for pool, slots in pools:
            if hi >= slots:
                raise ValueError(f"{name}: slot {hi} is outside {pool} ({slots} slots)")
    return idx
