"""NaN guard before sampling: fail the one request whose logits are not finite (issue 11, item 3).

Upstream SGLang 0.5.23 either asserts on NaN logits (``SGLANG_ENABLE_NAN_LOGITS_CHECK``,
which kills the scheduler and with it every request) or replaces them with
``-1e30`` (``SGLANG_SANITIZE_NAN_LOGITS``) and samples garbage from the row.
This guard does neither:

======================================  =============================================
hook (declared in ``patches.py``)       what it does
======================================  =============================================
``ModelRunner.sample`` BEFORE           rows of ``next_token_logits [B, V]`` with any
                                        NaN/±inf: remember the request id (from
                                        ``forward_batch.rids``) and zero the row, so the
                                        sampler runs on finite numbers
``Scheduler.process_batch_result``      each remembered request gets
BEFORE                                  ``FINISH_ABORT(status 500, InternalServerError)``;
                                        upstream answers it with HTTP 500 and the message
                                        (streams: a final chunk with ``finish_reason``
                                        ``abort``); the rest of the batch is untouched
======================================  =============================================

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


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """Indices of the rows of ``logits [B, V]`` holding any NaN or ±inf (int64 [k], possibly empty).

    ``-inf`` entries are kept legal only when they come from masking (grammar,
    ``logit_bias``) — those are applied later in the sampler, so at this point
    any non-finite value is a numerical failure of the forward pass.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    return (~torch.isfinite(logits).all(dim=-1)).nonzero().flatten()


def _before_sample(runner, logits_output, forward_batch, *args, **kwargs):
    logits = getattr(logits_output, "next_token_logits", None)
    if not isinstance(logits, torch.Tensor) or logits.numel() == 0:
        return None
    tracer = getattr(runner, "_sglang_hybrid_nan_tracer", None)
    rows = nonfinite_rows(logits)
    if rows.numel() == 0:
        return None
    rids = forward_batch.rids or []
    if tracer is not None:
        where = f"first non-finite output in this forward pass: {tracer.first}"
    else:
        where = f"layer unknown (set {TRACE_ENV}=1 to trace)"
    with _lock:
        for r in rows.tolist():
            rid = rids[r] if r < len(rids) else None
            msg = f"NaN/inf in the logits of this request ({where}); the request was stopped"
            logger.error("sglang-hybrid NaN guard: rid=%s row=%d: %s", rid, r, msg)
            if rid is not None:
                _poisoned[rid] = msg
    logits[rows] = 0.0  # sample from a finite row; the request is aborted before its token is used
    return None


def _before_process_batch_result(scheduler, batch, result, *args, **kwargs):
    if not _poisoned:
        return None
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    with _lock:
        for req in batch.reqs:
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
