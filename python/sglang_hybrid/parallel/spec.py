"""Who this process is in TP / DCP, and the two collectives the reference models use.

``ParallelSpec`` is passed to a reference model at construction. The default
(``ParallelSpec()``) is one process: every collective is skipped, so the model
computes exactly what it computes without a spec. Collectives go through
``torch.distributed.all_reduce`` / ``all_gather`` looked up at call time (tests
wrap them to count calls).

Layout rules (issue 8; as upstream SGLang shards its models):

* column-parallel projection (``[out, in]`` weight, output features split):
  rank ``r`` keeps output rows ``shard_range(out, r, tp)``;
* row-parallel projection (input features split): rank ``r`` keeps input
  columns ``shard_range(in, r, tp)``; its output is a partial sum that one
  all-reduce over the TP group completes;
* DCP (decode context parallel) groups are ``dcp_size`` consecutive TP ranks;
  ``dcp_size`` must divide ``tp_size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist


def shard_range(n: int, rank: int, size: int) -> slice:
    """Rows ``[rank * n / size, (rank + 1) * n / size)`` of a dimension of ``n`` split evenly.

    Raises:
        ValueError: ``size`` does not divide ``n`` or ``rank`` outside ``[0, size)``.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size={size}), got {rank}")
    if n % size:
        raise ValueError(f"size={size} does not divide the dimension n={n}")
    step = n // size
    return slice(rank * step, (rank + 1) * step)


def check_heads_divide(tp_size: int, heads: Dict[str, int], model: str = "the checkpoint") -> None:
    """Refuse at start-up a head count that ``--tp`` does not split into whole heads per rank.

    Without this check the first symptom is a tensor-shape mismatch while loading weights (on
    ``--device cpu`` upstream pads the attention heads up to a multiple of the TP width before the
    model is built, so the model's shapes no longer match the checkpoint; issue 42).

    Args:
        tp_size: the TP width (``--tp``).
        heads: config field -> the checkpoint's head count (e.g. ``{"num_attention_heads": 3}``).
        model: the model's name, for the message.

    Raises:
        ValueError: naming every field ``tp_size`` does not divide, its value and the TP width.
    """
    bad = [f"{field}={n}" for field, n in heads.items() if n is not None and n % tp_size]
    if bad:
        raise ValueError(f"--tp {tp_size} does not divide {model}'s {', '.join(bad)}: every TP rank must hold "
                         f"whole heads; use a --tp that divides them")


@dataclass
class ParallelSpec:
    """TP / DCP placement of one process and its process groups.

    Attributes:
        tp_rank, tp_size: tensor-parallel rank and width.
        dcp_size: decode-context-parallel width (``1`` = off); divides ``tp_size``.
        tp_group, dcp_group: ``torch.distributed`` groups (``None`` = default group);
            unused when the width is 1.
        moe_owned_output: compute only this rank's output coordinates of the
            replicated routed-expert output projection (latent MoE) and fold them
            into the shared-expert partial sum (docs/parallelism.md).
    """

    tp_rank: int = 0
    tp_size: int = 1
    dcp_size: int = 1
    tp_group: Optional[Any] = None
    dcp_group: Optional[Any] = None
    moe_owned_output: bool = False

    def __post_init__(self):
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be in [0, tp_size={self.tp_size}), got {self.tp_rank}")
        if self.dcp_size < 1 or self.tp_size % self.dcp_size:
            raise ValueError(f"dcp_size={self.dcp_size} must divide tp_size={self.tp_size}")

    @classmethod
    def from_sglang(cls, allow_dcp: bool = False) -> "ParallelSpec":
        """This process's placement in a running SGLang server (``--tp``, ``--dcp-size``), on upstream's groups.

        Collectives run on the TP group's and the DCP group's ``device_group``
        (gloo when ``--device cpu``). Called at model construction, after
        upstream built its model-parallel groups (the DCP groups are
        ``dcp_size`` consecutive TP ranks, ``dcp_rank = tp_rank % dcp_size``).

        Args:
            allow_dcp: the model serves ``--dcp-size > 1`` (the Kimi K3 MLA layer,
                through upstream's widened KV locations; docs/parallelism.md).

        Raises:
            NotImplementedError: ``--dcp-size > 1`` for a model that does not
                pass ``allow_dcp``.
        """
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.runtime_context import get_parallel

        tp = get_parallel().tp_size
        dcp_group = ps.get_dcp_group_no_assert()
        dcp = dcp_group.world_size if dcp_group is not None else 1
        if dcp > 1 and not allow_dcp:
            raise NotImplementedError("this CPU reference model is served with --dcp-size 1 (docs/parallelism.md)")
        group = ps.get_tp_group().device_group if tp > 1 else None
        return cls(
            tp_rank=get_parallel().tp_rank, tp_size=tp, tp_group=group,
            dcp_size=dcp, dcp_group=dcp_group.device_group if dcp > 1 else None,
        )

    @property
    def dcp_rank(self) -> int:
        """Rank inside the DCP group (consecutive TP ranks)."""
        return self.tp_rank % self.dcp_size

    def tp_shard(self, n: int) -> slice:
        """This rank's slice of a TP-split dimension of size ``n``."""
        return shard_range(n, self.tp_rank, self.tp_size)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the TP group (in place; returns ``x``). No-op at TP = 1."""
        if self.tp_size == 1:
            return x
        x = x.contiguous()
        dist.all_reduce(x, group=self.tp_group)
        return x

    def dcp_all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[dcp_size, *x.shape]``: ``x`` of every DCP rank, in DCP-rank order."""
        if self.dcp_size == 1:
            return x.unsqueeze(0)
        parts = [torch.empty_like(x) for _ in range(self.dcp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.dcp_group)
        return torch.stack(parts)
