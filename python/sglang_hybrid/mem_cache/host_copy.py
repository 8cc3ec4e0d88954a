"""Device <-> host copies for the hybrid cache's host tier (issue #3, "Host offload tier").

Write-back (device -> host) is asynchronous on a GPU: rows are gathered and
copied into pinned host memory on a side stream, ordered after the work
already queued on the compute stream; the compute stream then waits (on the
device, not the CPU) for the copy before anything can overwrite the freed
slots. The host entry keeps the copy's event, and :meth:`HostCopier.load`
synchronises on it explicitly before the data is read back. Load-back
(host -> device) is issued on the compute stream, so kernels queued after it
see the data.

Without a GPU (CPU serving, CI) the same calls run synchronously: no stream,
no event, plain copies.

Tensors: ``buffers`` are device tensors whose dimension ``dim`` indexes slots
(KV rows: ``[tokens, ...]`` with ``dim=0``; recurrent state ``[layers, slots, ...]``
with ``dim=1``); ``indices`` is an int64 tensor of slot ids.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


class HostCopy:
    """One host copy: per-buffer CPU tensors (pinned when a GPU is present) and the event
    that marks the end of the device->host copy (``None`` when it ran synchronously)."""

    __slots__ = ("tensors", "event", "dim")

    def __init__(self, tensors: List[Optional[torch.Tensor]], event, dim: int):
        self.tensors = tensors
        self.event = event
        self.dim = dim

    def wait(self) -> None:
        """Block the CPU until the copy has landed in host memory."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors if t is not None)


class HostCopier:
    """Issues the tier's copies; one per cache. ``device`` decides async (cuda) or sync."""

    def __init__(self, device: Optional[torch.device] = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.is_async = self.device.type == "cuda" and torch.cuda.is_available()
        self._stream = torch.cuda.Stream(device=self.device) if self.is_async else None

    def save(self, buffers: Sequence[Optional[torch.Tensor]], indices: torch.Tensor, dim: int = 0) -> HostCopy:
        """Copy ``buffers[:, indices]`` (along ``dim``) to host memory; returns at once on a GPU.

        Raises:
            ValueError: if ``indices`` is not a 1-D integer tensor.
        """
        if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"indices must be a 1-D integer tensor, got {tuple(indices.shape)} {indices.dtype}")
        if not self.is_async:
            idx = indices.to("cpu") if indices.device.type != "cpu" else indices
            out = [None if b is None or b.shape[dim] == 0 else b.index_select(dim, idx.to(b.device)).to("cpu") for b in buffers]
            return HostCopy(out, None, dim)
        compute = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(compute)  # rows written by queued kernels first
        out: List[Optional[torch.Tensor]] = []
        with torch.cuda.stream(self._stream):
            idx = indices.to(self.device, non_blocking=True)
            for b in buffers:
                if b is None or b.shape[dim] == 0:
                    out.append(None)
                    continue
                rows = b.index_select(dim, idx)
                host = torch.empty(rows.shape, dtype=rows.dtype, device="cpu", pin_memory=True)
                host.copy_(rows, non_blocking=True)
                rows.record_stream(self._stream)
                out.append(host)
            idx.record_stream(self._stream)
            event = torch.cuda.Event()
            event.record(self._stream)
        compute.wait_event(event)  # freed slots are not overwritten before the copy read them
        return HostCopy(out, event, dim)

    def load(self, copy: HostCopy, buffers: Sequence[Optional[torch.Tensor]], indices: torch.Tensor) -> None:
        """Write a host copy back into ``buffers`` at ``indices`` (same order/shape as saved).

        Waits for the copy's device->host event first (the explicit synchronisation
        before first use); the host->device copy is queued on the compute stream.
        """
        copy.wait()
        dim = copy.dim
        for b, h in zip(buffers, copy.tensors):
            if b is None or h is None:
                continue
            if h.shape[dim] != indices.numel():
                raise ValueError(f"host copy has {h.shape[dim]} rows along dim {dim}, indices {indices.numel()}")
            b.index_copy_(dim, indices.to(b.device), h.to(b.device, non_blocking=self.is_async))
