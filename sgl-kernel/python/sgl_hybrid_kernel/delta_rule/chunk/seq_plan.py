"""Host facts and device index tables of a set of packed sequences, shared by the chunk-64 prefill
(``chunk/parallel.py``) and its group-scan state pass (``chunk/group_scan.py``), cached so that every
KDA / GDN layer of one forward launches without building or copying them again (issue 4: host
overhead)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import torch
import triton

BT = 64  # tokens per chunk
BC = 16  # rows per diagonal block of the in-chunk inverse; checkpoint grid


def int32_to_device(data: Sequence[int], device: torch.device) -> torch.Tensor:
    """An int32 tensor of ``data`` on ``device`` without a host sync: on a GPU the values go through
    pinned host memory with a non-blocking copy (a plain ``torch.tensor(..., device=)`` / ``.to()``
    from pageable memory waits for the stream: every earlier launch finishes first)."""
    t = torch.tensor(list(data), dtype=torch.int32)
    if torch.device(device).type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class SeqPlan:
    """Host facts and device index tables of one set of packed sequences (issue 4: host overhead).

    Built once per ``(cu_seqlens values, device, current stream)`` and cached (:func:`seq_plan`), so repeated
    calls with the same sequences — every KDA / GDN layer of one forward — launch without
    building tables or copying them to the device. Attributes: ``bos`` ``[S + 1]`` token offsets
    (host); ``lens`` tokens per sequence; ``n_ch`` chunks of ``BT`` per sequence; ``NC`` their sum;
    ``cidx`` ``[max(NC, 1), 2]`` int32 (sequence, chunk in sequence) per global chunk and ``coff``
    ``[S]`` first global chunk per sequence, both on the device; ``n_sub``: 16-token sub-chunks of
    the longest sequence; ``ones`` ``[S]`` int32 ones (the default ``has_initial_state``);
    ``extra``: tables other modules cache on the plan (group scan, keyed by its group size).
    """

    bos: Tuple[int, ...]
    lens: Tuple[int, ...]
    n_ch: Tuple[int, ...]
    NC: int
    cidx: torch.Tensor
    coff: torch.Tensor
    ones: torch.Tensor
    n_sub: int
    extra: Dict[object, object] = field(default_factory=dict)


PLAN_CACHE_SIZE = 16
_PLANS: "OrderedDict[Tuple[Tuple[int, ...], str, int], SeqPlan]" = OrderedDict()


def seq_plan(bos: Sequence[int], device: torch.device) -> SeqPlan:
    """The cached :class:`SeqPlan` of token offsets ``bos`` (``[S + 1]``, host ints) on ``device``
    (least recently used of :data:`PLAN_CACHE_SIZE` dropped). One non-blocking host-to-device copy
    when built, none when cached.

    Raises:
        ValueError: ``bos`` empty or decreasing.
    """
    bos = tuple(int(x) for x in bos)
    # Keyed by stream too: the tables' copy is ordered only on the stream it was issued on.
    dev = torch.device(device)
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    key = (bos, str(device), stream)
    plan = _PLANS.get(key)
    if plan is not None:
        _PLANS.move_to_end(key)
        return plan
    if not bos or any(b < a for a, b in zip(bos, bos[1:])):
        raise ValueError(f"cu_seqlens must be non-empty and non-decreasing, got {list(bos)[:8]}...")
    lens = tuple(b - a for a, b in zip(bos, bos[1:]))
    S = len(lens)
    n_ch = tuple(triton.cdiv(n, BT) for n in lens)
    NC = sum(n_ch)
    cidx: List[int] = [x for s in range(S) for c in range(n_ch[s]) for x in (s, c)] or [0, 0]
    coff, acc = [], 0
    for n in n_ch:
        coff.append(acc)
        acc += n
    flat = int32_to_device(cidx + coff + [1] * S, device)
    n_sub = max(1, max(n_ch, default=0) * (BT // BC))
    plan = SeqPlan(bos, lens, n_ch, NC, flat[: len(cidx)].view(-1, 2), flat[len(cidx): len(cidx) + S],
                   flat[len(cidx) + S:], n_sub)
    _PLANS[key] = plan
    while len(_PLANS) > PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return plan
