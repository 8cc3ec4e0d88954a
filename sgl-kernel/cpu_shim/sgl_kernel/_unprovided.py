"""Placeholders for ``sgl_kernel`` names the stand-in does not implement.

Upstream SGLang imports many ``sgl_kernel`` names at module load (on CUDA:
attention, quantization, KV transfer, MoE kernels ...) but calls most of them
only on paths our models do not take. Each placeholder is importable and raises
``NotImplementedError`` naming the op when *called*, so a lookup never breaks
start-up and a call never fails silently.
"""

from __future__ import annotations

from typing import Callable, Iterable


def not_provided(qualname: str, why: str = "") -> Callable:
    """A function named after the last part of ``qualname`` that raises when called."""

    def _raise(*args, **kwargs):
        msg = f"{qualname} is not implemented by the sglang-hybrid sgl_kernel stand-in"
        if why:
            msg += f" ({why})"
        raise NotImplementedError(
            msg + "; this code path needs the real sglang-kernel build for this torch/device."
        )

    _raise.__name__ = qualname.rsplit(".", 1)[-1]
    _raise.__qualname__ = _raise.__name__
    _raise.__doc__ = f"Placeholder for ``{qualname}``: raises ``NotImplementedError`` when called."
    _raise._sgl_kernel_standin_unprovided = True  # lets tests tell placeholders from implemented ops
    return _raise


def define(namespace: dict, module: str, names: Iterable[str], why: str = "") -> None:
    """Put a placeholder for each of ``names`` into ``namespace`` (a module's globals)."""
    for name in names:
        namespace[name] = not_provided(f"{module}.{name}", why)


def is_placeholder(obj) -> bool:
    return bool(getattr(obj, "_sgl_kernel_standin_unprovided", False))
