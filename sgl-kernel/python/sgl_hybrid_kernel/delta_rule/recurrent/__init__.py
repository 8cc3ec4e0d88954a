"""Decode / verify of the gated delta rule: ``wrapper.py`` (host wrapper, launches a ``plan.RecurrentPlan``),
``rules.py`` (tile and mode rules; rows in ``tiles.json``) and the Triton kernels (``triton_recurrent.py``: the
one-warp and register-tile kernels; ``triton_lanes.py``: the lanes pair; ``triton_window.py``: the chunk-form
window)."""
