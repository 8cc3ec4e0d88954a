"""NaN guard before sampling: fail the one request whose logits are not finite (issue 11, item 3).

Upstream SGLang 0.5.23 either asserts on NaN logits (``SGLANG_ENABLE_NAN_LOGITS_CHECK``,
which kills the scheduler and with it every request) or replaces them with
``-1e30`` (``SGLANG_SANITIZE_NAN_LOGITS``) and samples garbage from the row.
This guard does neither:

======================================  =============================================
hook (declared in ``patches.py``)       what it does
======================================  =============================================
``ModelRunner.sample`` BEFORE           rows of ``next_token_logits [B, V]`` with any
                                        NaN/±inf are zeroed on the device, so the sampler
                                        runs on finite numbers; the row mask is copied to
                                        pinned host memory behind a CUDA event, with the
                                        batch's request ids (no synchronisation here)
``Scheduler.process_batch_result``      the oldest pending mask of this batch's requests
BEFORE                                  is read (its forward pass is done: the results are
                                        being processed) and each request of a bad row gets
                                        ``FINISH_ABORT(status 500, InternalServerError)``;
                                        upstream answers it with HTTP 500 and the message
                                        (streams: a final chunk with ``finish_reason``
                                        ``abort``); the rest of the batch is untouched
======================================  =============================================

The sampling hook used to find the bad rows with ``nonzero()``, which waits for the forward pass on
every step and so held the overlap scheduler's CPU work behind the GPU (issue 41: no synchronisation
on the served path that no consumer needs).

Which layer produced the NaN: with :data:`TRACE_ENV` on (the default on CPU,
where one ``isfinite`` reduction per layer module is cheap; off on GPU, where
it would synchronise the stream), forward hooks on every direct child of a
decoder layer (``model.layers.<i>.self_attn``, ``.mlp``) record the first
module whose output is not finite in the current forward pass, and the error
message names it. Without tracing the message says so.

The aborted request's KV pages and state slot are released by upstream's
normal abort path; what they held may be NaN, so the guard is a containment
measure, not a repair (see docs/reliability.md).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from http import HTTPStatus
from typing import Dict, Optional

import torch

logger = logging.getLogger("sglang_hybrid.reliability")

TRACE_ENV = "SGLANG_HYBRID_NAN_TRACE_LAYERS"
_LAYER_CHILD = re.compile(r"(^|\.)layers\.\d+\.[A-Za-z_]+$")

_lock = threading.Lock()
_poisoned: Dict[str, str] = {}  # rid -> error message, filled at sampling, consumed at result processing


class _LayerTracer:
    """Forward hooks remembering the first layer module with a non-finite output in a forward pass."""

    def __init__(self, model: torch.nn.Module):
        self.first: Optional[str] = None
        self.modules = [(n, m) for n, m in model.named_modules() if _LAYER_CHILD.search(n)]
        for name, module in self.modules:
            module.register_forward_hook(self._make_hook(name))
        if self.modules:
            # the root module's pre-hook starts a new pass
            model.register_forward_pre_hook(lambda *_: self.reset())

    def reset(self) -> None:
        self.first = None

    def _make_hook(self, name: str):
        def hook(_module, _inputs, output):
            if self.first is not None:
                return
            t = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                self.first = name

        return hook


def _trace_enabled(device: torch.device) -> bool:
    v = os.environ.get(TRACE_ENV)
    if v is not None:
        return v not in ("0", "false", "")
    return device.type == "cpu"


class _Pending:
    """One sampled batch's row mask on its way to the host: ``event`` (None: already on the host),
    ``mask`` (bool [B], host), the batch's request ids and where the first non-finite output was."""

    __slots__ = ("event", "mask", "rids", "where")

    def __init__(self, event, mask: torch.Tensor, rids, where: str):
        self.event, self.mask, self.rids, self.where = event, mask, list(rids), where

    def ready(self) -> bool:
        return self.event is None or self.event.query()


_pending: "list[_Pending]" = []  # oldest first
MAX_PENDING = 64  # masks left unclaimed by any batch; past this the oldest is read (synchronising on it)


def _where(runner) -> str:
    tracer = getattr(runner, "_sglang_hybrid_nan_tracer", None)
    if tracer is not None:
        return f"first non-finite output in this forward pass: {tracer.first}"
    return f"layer unknown (set {TRACE_ENV}=1 to trace)"


def _before_sample(runner, logits_output, forward_batch, *args, **kwargs):
    """Zero the non-finite rows of ``next_token_logits`` on the device and queue the row mask for
    :func:`_before_process_batch_result` (a non-blocking copy behind a CUDA event on GPUs)."""
    logits = getattr(logits_output, "next_token_logits", None)
    if not isinstance(logits, torch.Tensor) or logits.numel() == 0:
        return None
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    bad = ~torch.isfinite(logits).all(dim=-1)
    logits.masked_fill_(bad.unsqueeze(-1), 0.0)  # sample from finite rows; a bad row's request is aborted
    if logits.is_cuda:
        mask = torch.empty(bad.shape, dtype=torch.bool, pin_memory=True)
        mask.copy_(bad, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:
        mask, event = bad, None
    with _lock:
        _pending.append(_Pending(event, mask, forward_batch.rids or [], _where(runner)))
    return None


def _resolve(p: _Pending) -> None:
    """Read ``p``'s mask (waiting on its event if needed) and remember each bad row's request."""
    if not p.ready():
        p.event.synchronize()
    for r, is_bad in enumerate(p.mask.tolist()):
        if not is_bad:
            continue
        rid = p.rids[r] if r < len(p.rids) else None
        msg = f"NaN/inf in the logits of this request ({p.where}); the request was stopped"
        logger.error("sglang-hybrid NaN guard: rid=%s row=%d: %s", rid, r, msg)
        if rid is not None:
            _poisoned[rid] = msg


def _before_process_batch_result(scheduler, batch, result, *args, **kwargs):
    """Read the masks whose copies are done, then the oldest pending mask holding one of this batch's
    requests (its forward pass has finished), and abort the requests of bad rows."""
    reqs = getattr(batch, "reqs", None) or []
    with _lock:
        if not _pending and not _poisoned:
            return None
        rids = {req.rid for req in reqs}
        todo = [p for p in _pending if p.ready()]
        mine = next((p for p in _pending if p not in todo and rids.intersection(p.rids)), None)
        if mine is not None:
            todo.append(mine)
        while len(_pending) - len(todo) > MAX_PENDING:  # masks no batch claimed (e.g. a batch sampled twice)
            todo.append(next(p for p in _pending if p not in todo))
        for p in todo:
            _pending.remove(p)
            _resolve(p)
        if not _poisoned:
            return None
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        for req in reqs:
            msg = _poisoned.pop(req.rid, None)
            if msg is not None:
                req.to_finish = FINISH_ABORT(msg, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
    return None


def _attach_tracer(_result, runner, *args, **kwargs):
    if not hasattr(runner, "_sglang_hybrid_nan_tracer"):
        model = getattr(runner, "model", None)
        device = torch.device(getattr(runner, "device", "cpu"))
        runner._sglang_hybrid_nan_tracer = (
            _LayerTracer(model) if isinstance(model, torch.nn.Module) and _trace_enabled(device) else None
        )
    return None


def install() -> None:
    """Register the hooks declared for this module in ``patches.py`` (called by ``plugin.register``)."""
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)
