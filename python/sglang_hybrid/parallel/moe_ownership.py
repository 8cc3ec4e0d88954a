"""MoE routed-output ownership (issue 8; article item 4, SGLang PR #59591).

In latent MoE (``routed_expert_hidden_size``) the routed experts work in a
latent space; after their TP partial sums are all-reduced (and normalised)
every rank holds the same latent, and the latent -> hidden output projection
``routed_expert_up_proj`` (``[D, L]``, replicated) ran identically on all ranks.
With ownership, rank ``r`` computes only output coordinates
``owned_output_rows(D, r, tp)`` and adds them into its shared-expert partial sum,
which the existing shared-expert all-reduce completes: every coordinate then
receives exactly one rank's routed value. No new collective; a rank needs only
its rows of the projection (the weight saving reported by
``owned_weight_bytes_saved``).
"""

from __future__ import annotations

from sglang_hybrid.parallel.spec import shard_range


def owned_output_rows(hidden_size: int, rank: int, tp_size: int) -> slice:
    """Output coordinates of the routed projection that ``rank`` computes (an even split of ``hidden_size``).

    Raises:
        ValueError: ``tp_size`` does not divide ``hidden_size`` or a bad rank.
    """
    return shard_range(hidden_size, rank, tp_size)


def owned_weight_bytes_saved(hidden_size: int, latent_size: int, num_moe_layers: int, tp_size: int, bytes_per_elem: int = 2) -> int:
    """Bytes of ``routed_expert_up_proj`` weight one rank no longer loads.

    Replicated: ``D * L`` elements per MoE layer on every rank; owned:
    ``D * L / tp``. Saved per rank: ``D * L * (1 - 1/tp) * layers * bytes``.

    Raises:
        ValueError: non-positive sizes or ``tp_size`` not dividing ``hidden_size``.
    """
    if min(hidden_size, latent_size, num_moe_layers, tp_size, bytes_per_elem) < 1:
        raise ValueError("sizes must be positive")
    if hidden_size % tp_size:
        raise ValueError(f"tp_size={tp_size} does not divide hidden_size={hidden_size}")
    per_layer = hidden_size * latent_size * bytes_per_elem
    return (per_layer - per_layer // tp_size) * num_moe_layers
