"""Import-time stand-in for the ``flash_mla`` module (the ``sgl-flash-mla`` wheel) on CUDA machines
that do not have it.

Upstream 0.5.23 imports ``sglang.srt.layers.attention.flashmla_backend`` on every CUDA start with
speculative decoding (``eagle_worker_v2._capture_cuda_graphs`` lists the backends whose draft
extend can be graph-captured), and that module imports ``flash_mla`` at the top. Without the wheel
(e.g. a torch other than upstream's pin, for which no wheel is built) MTP serving then dies at
start-up with ``No module named 'flash_mla'`` although FlashMLA is never selected (issue 40, H100
run of 2026-12-07). This stand-in is installed only when no real ``flash_mla`` is importable; every
FlashMLA op raises :class:`NotImplementedError` when called, so a server that does select
``--attention-backend flashmla`` fails with a message instead of computing anything.
"""

from __future__ import annotations

import importlib.util
import sys
import types

MESSAGE = ("flash_mla is the sglang-hybrid import stand-in (the sgl-flash-mla wheel is not installed): "
           "FlashMLA kernels are unavailable; choose another --attention-backend")


def _unavailable(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"flash_mla.{name}: {MESSAGE}")

    op.__name__ = name
    return op


class FlashMLASchedMeta:
    """Type of FlashMLA's scheduler metadata; constructing one raises :class:`NotImplementedError`."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"flash_mla.FlashMLASchedMeta: {MESSAGE}")


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable(name)


def install() -> bool:
    """Put the stand-in into ``sys.modules`` as ``flash_mla`` and ``flash_mla.flash_mla_interface``
    when no real ``flash_mla`` can be imported; returns whether it did."""
    if "flash_mla" in sys.modules or importlib.util.find_spec("flash_mla") is not None:
        return False
    root = _StandinModule("flash_mla", MESSAGE)
    root.__path__ = []  # a package, so that ``flash_mla.flash_mla_interface`` resolves
    root.STANDIN = True
    sub = _StandinModule("flash_mla.flash_mla_interface", MESSAGE)
    sub.FlashMLASchedMeta = FlashMLASchedMeta
    root.flash_mla_interface = sub
    root.FlashMLASchedMeta = FlashMLASchedMeta
    sys.modules["flash_mla"] = root
    sys.modules["flash_mla.flash_mla_interface"] = sub
    return True
