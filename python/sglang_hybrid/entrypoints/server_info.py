"""The plugin's part of ``/get_server_info``: version, kernel paths and kernel call counts.

AFTER upstream's ``SchedulerInternalStateController.get_internal_state`` (declared and
anchored in ``patches.py``), each scheduler's entry of ``/get_server_info``'s ``internal_states``
gains a ``"sglang_hybrid"`` object:

* ``version``: the installed ``sglang-hybrid`` version;
* ``flags``: ``{flag: value}`` for every plugin flag (``sglang_hybrid.flags``), the value
  in effect in the scheduler (None: not given, the default applies);
* ``kernel_paths``: ``{op: impl}``, the implementation each dispatcher chose last
  (``sgl_hybrid_kernel.dispatch.chosen_paths``, the start-up table);
* ``kernel_calls``: ``{"op=impl": calls}`` in that scheduler process
  (``sgl_hybrid_kernel.dispatch.call_counts``: eager calls and CUDA-graph captures),
  which the GPU tests read to prove that our kernels, not upstream's, served.
"""

from __future__ import annotations

import importlib.metadata

from sgl_hybrid_kernel.dispatch import call_counts, chosen_paths
from sglang_hybrid.flags import flag_values


def plugin_state() -> dict:
    """The ``"sglang_hybrid"`` object described in the module docstring."""
    try:
        version = importlib.metadata.version("sglang-hybrid")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "version": version,
        "flags": flag_values(),
        "kernel_paths": {c.op: c.impl for c in chosen_paths()},
        "kernel_calls": call_counts(),
    }


def _after_get_internal_state(result, *args, **kwargs):
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state["sglang_hybrid"] = plugin_state()
    return None


def install() -> None:
    """Register the AFTER hook on ``get_internal_state`` declared in ``patches.py``."""
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)
