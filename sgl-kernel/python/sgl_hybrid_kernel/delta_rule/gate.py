"""Gate kinds of the gated delta rule, shared by every kernel, plan and wrapper of ``delta_rule``.

The decay of each token is ``exp(g)`` with ``g`` (natural log, <= 0) from the raw gate input ``f``:

* ``GATE_KDA`` (Kimi Delta Attention, per channel): ``g = -exp(A_log[h]) * softplus(f + dt_bias[h, k])``;
* ``GATE_KDA_SAFE`` (Kimi K3's bounded gate, per channel): ``g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias[h, k]))``;
* ``GATE_GDN`` (Gated DeltaNet, per value head): ``g = -exp(A_log[h]) * softplus(f + dt_bias[h])``.

The torch forms are ``naive.kda_gate`` / ``naive.gdn_gate``; the Triton kernels take the kind as the
``GATE`` constexpr.
"""

from __future__ import annotations

from typing import Optional

GATE_KDA = 0
GATE_KDA_SAFE = 1
GATE_GDN = 2


def gate_kind(gate: str, lower_bound: Optional[float] = None) -> int:
    """The kernels' gate kind for ``gate`` (``"kda"`` or ``"gdn"``) and KDA's ``lower_bound`` (``None``: the
    standard gate; a negative float: the bounded gate).

    Raises:
        ValueError: ``gate`` is neither ``"kda"`` nor ``"gdn"``.
    """
    if gate == "kda":
        return GATE_KDA if lower_bound is None else GATE_KDA_SAFE
    if gate == "gdn":
        return GATE_GDN
    raise ValueError(f"gate must be 'kda' or 'gdn', got {gate!r}")
