"""Anchor checks: every upstream name the plugin hooks or patches, verified at load.

Each ``Anchor`` names a dotted target in the pinned upstream SGLang and, where
we rely on specific source text inside it, a snippet that must be present.
``verify_anchors`` raises :class:`AnchorError` listing every broken anchor, so
a different SGLang version fails at start-up instead of misbehaving later.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import pkgutil
from dataclasses import dataclass
from typing import Iterable, List, Optional

PINNED_SGLANG = "0.5.23"


class AnchorError(RuntimeError):
    """An upstream anchor the plugin depends on is missing or changed."""


@dataclass(frozen=True)
class Anchor:
    """``target``: dotted path; ``snippet``: text its source must contain (optional); ``why``: what we do there."""

    target: str
    why: str
    snippet: Optional[str] = None


ANCHORS: List[Anchor] = [
    Anchor(
        "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend",
        "class REPLACE with HybridKDAAttnBackend (CPU path; GPU defers to upstream)",
    ),
    Anchor(
        "sglang.srt.layers.attention.attention_registry.attn_backend_wrapper",
        "upstream builds KDAAttnBackend for Kimi-Linear-family configs inside this function",
        snippet="linear_attn_backend = KDAAttnBackend(runner)",
    ),
    Anchor(
        "sglang.srt.layers.attention.linear.kda_backend.KDAKernelDispatcher.__init__",
        "AROUND hook installing SglHybridKDAKernel for --linear-attn-*-backend sgl_hybrid",
        snippet="def __init__(",
    ),
    Anchor(
        "sglang.srt.arg_groups.choices.add_linear_attn_kernel_backend_choices",
        "registers sgl_hybrid as a --linear-attn-*-backend choice",
    ),
    Anchor(
        "sglang.srt.configs.linear_attn_model_registry.register_linear_attn_model",
        "declares KimiK3LinearForCausalLM as a hybrid model using the mamba radix cache",
    ),
    Anchor("sglang.srt.models.registry.ModelRegistry", "CPU reference models are registered here"),
    Anchor(
        "sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer",
        "CPU: REPLACE so the extra_buffer strategy is allowed (our KDA backend writes the snapshots)",
    ),
    Anchor(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        "BEFORE hook rejecting out-of-vocabulary input_ids with HTTP 400",
        snippet="def _validate_one_request(",
    ),
    Anchor(
        "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode",
        "CPU: this pins the track mask unconditionally; we make pin_memory a no-op without a GPU",
        snippet="track_mask_cpu.pin_memory()",
    ),
]


def _check(anchor: Anchor) -> Optional[str]:
    try:
        obj = pkgutil.resolve_name(anchor.target)
    except (ImportError, AttributeError, ValueError) as exc:
        return f"{anchor.target}: not found ({exc.__class__.__name__}: {exc}) — needed for: {anchor.why}"
    if anchor.snippet is not None:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError) as exc:
            return f"{anchor.target}: source unavailable ({exc}) — needed for: {anchor.why}"
        if anchor.snippet not in source:
            return f"{anchor.target}: expected text {anchor.snippet!r} not found — needed for: {anchor.why}"
    return None


def verify_anchors(anchors: Iterable[Anchor] = ANCHORS) -> None:
    """Raise :class:`AnchorError` if any anchor is broken (message lists all of them)."""
    problems = [p for p in (_check(a) for a in anchors) if p]
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    if problems:
        raise AnchorError(
            f"sglang-hybrid is pinned to sglang=={PINNED_SGLANG} but found sglang {version}; "
            f"{len(problems)} upstream anchor(s) changed:\n  - " + "\n  - ".join(problems)
        )
