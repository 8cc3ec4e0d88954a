"""``sgl_kernel.utils`` of the stand-in."""

from __future__ import annotations


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch (PDL): the stand-in's plain-torch ops never use it.

    Upstream passes the answer on to its own Triton kernels (``launch_pdl``); False
    keeps them on ordinary launches.
    """
    return False
