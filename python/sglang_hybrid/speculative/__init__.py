"""Speculative decoding: the draft-depth controller driven by cycle cost (issue 7, docs/speculative.md).

``acceptance`` (estimator + benchmark-only synthetic acceptance), ``cycle_cost`` (cost
table, prior, timer) and ``controller`` are plain numpy and import no SGLang;
``controller_hooks`` adapts them to upstream's adaptive-speculation policy protocol;
``controlled_acceptance`` (torch) is the benchmark-only verify hook of
``--speculative-synthetic-acceptance``.
"""

from .acceptance import AcceptanceEstimator, SyntheticAcceptance
from .controller import DepthController, select_depth
from .cycle_cost import CycleCostTable, CycleTimer, ParametricCycleCost, batch_bucket

__all__ = [
    "AcceptanceEstimator",
    "CycleCostTable",
    "CycleTimer",
    "DepthController",
    "ParametricCycleCost",
    "SyntheticAcceptance",
    "batch_bucket",
    "select_depth",
]
