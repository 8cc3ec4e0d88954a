"""Precision paths of the Qwen3.8 reference model, each behind a flag (issue 6, seeds digest items 15-16).

===============================  ==========================================  ==============================
flag (environment variable)      what changes                                 kernel / oracle
===============================  ==========================================  ==============================
``--qwen38-fp8-residual-proj``   the gated-stream low-rank projections        ``sgl_hybrid_kernel.fp8_linear``
(``SGLANG_HYBRID_QWEN38_FP8_``   ``input_mix_weight_down`` (hc*D -> r) and
``RESIDUAL_PROJ=1``)             ``input_mix_weight_up`` (r -> hc*D) of every
                                 site run FP8 W8A16 with per-output-channel
                                 scales (10,240 <-> 320 at full size)
``--vocab-screening-topk K``     the LM head screens the vocabulary with a    ``sgl_hybrid_kernel.vocab_screen``
(``SGLANG_HYBRID_VOCAB_``        low-precision copy and recomputes the best
``SCREENING_TOPK``; 0 = off)     ``K`` rows exactly (greedy = exact argmax
                                 over the candidates)
``--vocab-screening-format F``   the screen's format: ``fp8`` (default),
(``SGLANG_HYBRID_VOCAB_``        ``int8`` or ``mxfp4``
``SCREENING_FORMAT``)
===============================  ==========================================  ==============================

``ServerArgs`` is a closed record, so the flags are not fields: AFTER
``ServerArgs.add_cli_args`` adds them to upstream's parser, AROUND
``ServerArgs.from_cli_args`` exports them to the environment the scheduler
processes inherit (the ``Engine`` API sets the variables directly). The model
reads them once at construction (:func:`apply_precision_paths`) and the
start-up log's op table gets one line per path (``residual_proj``, ``lm_head``).
Weights are quantised lazily on first use and again whenever a weight tensor
changes (its version counter or storage), so weight loading and updates need
no extra step. Only the plain-torch reference (CPU) honours the flags; the MTP
draft head keeps full precision.
"""

from __future__ import annotations

from sglang_hybrid.flags import add_plugin_argument

import logging
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.fp8_linear import fp8_dtype_for, fp8_linear, quantize_fp8_per_channel
from sgl_hybrid_kernel.platform import device_platform
from sgl_hybrid_kernel.vocab_screen import FORMATS, QuantizedRows, quantize_rows, screen_logits

logger = logging.getLogger(__name__)

FP8_FLAG, FP8_ENV = "--qwen38-fp8-residual-proj", "SGLANG_HYBRID_QWEN38_FP8_RESIDUAL_PROJ"
TOPK_FLAG, TOPK_ENV = "--vocab-screening-topk", "SGLANG_HYBRID_VOCAB_SCREENING_TOPK"
FORMAT_FLAG, FORMAT_ENV = "--vocab-screening-format", "SGLANG_HYBRID_VOCAB_SCREENING_FORMAT"


@dataclass(frozen=True)
class PrecisionPaths:
    """The chosen paths: ``fp8_residual_proj``; ``screening_topk`` (0 = full LM head) in ``screening_format``."""

    fp8_residual_proj: bool = False
    screening_topk: int = 0
    screening_format: str = "fp8"

    @classmethod
    def from_env(cls, env: Optional[Dict[str, str]] = None) -> "PrecisionPaths":
        """Read the three variables (module docstring) from ``env`` (default ``os.environ``).

        Raises:
            ValueError: a value that is not ``0/1`` (FP8), a non-negative integer (top-k)
                or a known format; the message names the variable.
        """
        env = os.environ if env is None else env
        fp8 = env.get(FP8_ENV, "0").strip().lower() or "0"
        if fp8 not in ("0", "1", "false", "true"):
            raise ValueError(f"{FP8_ENV} must be 0 or 1, got {fp8!r}")
        raw = env.get(TOPK_ENV, "0").strip() or "0"
        try:
            topk = int(raw)
        except ValueError as exc:
            raise ValueError(f"{TOPK_ENV} must be an integer, got {raw!r}") from exc
        if topk < 0:
            raise ValueError(f"{TOPK_ENV} must be >= 0, got {topk}")
        fmt = env.get(FORMAT_ENV, "fp8").strip() or "fp8"
        if fmt not in FORMATS:
            raise ValueError(f"{FORMAT_ENV} must be one of {FORMATS}, got {fmt!r}")
        return cls(fp8 in ("1", "true"), topk, fmt)


def _weight_key(weight: torch.Tensor) -> Tuple[int, int, torch.device]:
    return (weight._version, weight.data_ptr(), weight.device)


class Fp8LowRankProjections:
    """``x @ W^T`` through FP8 W8A16 codes of ``W`` (cached per weight, refreshed when it changes).

    Called by ``GatedStreams.mix`` as ``proj(x [N, C_in], W [C_out, C_in]) -> [N, C_out]`` in ``x.dtype``.
    """

    def __init__(self):
        self._cache: Dict[int, Tuple[tuple, torch.Tensor, torch.Tensor]] = {}

    def codes(self, weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(codes [C_out, C_in] e4m3, scale [C_out] FP32)`` of ``weight`` for its device's FP8 flavour."""
        key = _weight_key(weight)
        hit = self._cache.get(id(weight))
        if hit is None or hit[0] != key:
            codes, scale = quantize_fp8_per_channel(weight, fp8_dtype_for(device_platform(weight.device)))
            hit = (key, codes, scale)
            self._cache[id(weight)] = hit
        return hit[1], hit[2]

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        codes, scale = self.codes(weight)
        return fp8_linear(x, codes, scale)


class VocabScreeningMethod:
    """A ``quant_method`` for upstream's ``LogitsProcessor`` that screens the vocabulary.

    Upstream's ``_compute_lm_head`` calls ``quant_method.apply(lm_head, hidden [N, D], bias)``
    for any method outside its unquantised set; this one returns
    ``screen_logits(...).logits`` ``[N, V]`` FP32 (exact at the ``topk`` candidates).

    Raises:
        NotImplementedError: from :meth:`apply` with an embedding bias.
    """

    def __init__(self, topk: int, fmt: str):
        self.topk, self.fmt = int(topk), fmt
        self._key: Optional[tuple] = None
        self._rows: Optional[QuantizedRows] = None

    def quantized(self, weight: torch.Tensor) -> QuantizedRows:
        key = _weight_key(weight)
        if self._rows is None or self._key != key:
            self._rows, self._key = quantize_rows(weight, self.fmt), key
        return self._rows

    def process_weights_after_loading(self, layer) -> None:
        self.quantized(layer.weight)

    def apply(self, layer, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if bias is not None:
            raise NotImplementedError("vocab screening does not take an embedding bias")
        return screen_logits(x, layer.weight, self.quantized(layer.weight), self.topk).logits


def apply_precision_paths(model, log: Optional[logging.Logger] = None, paths: Optional[PrecisionPaths] = None) -> PrecisionPaths:
    """Attach the flagged paths to a ``Qwen38ReferenceForConditionalGeneration`` and log the choice once.

    Sets ``fp8_lowrank`` on every ``GatedStreams`` of ``model.model`` (read by
    ``GatedStreams.mix``) and, with screening, ``model.lm_head.quant_method``.

    Returns:
        the :class:`PrecisionPaths` applied (``paths``, else read from the environment).
    """
    from sglang_hybrid.models.qwen38.hyper import GatedStreams

    log = log or logger
    paths = paths or PrecisionPaths.from_env()
    if paths.fp8_residual_proj:
        proj = Fp8LowRankProjections()
        for module in model.model.modules():
            if isinstance(module, GatedStreams):
                module.fp8_lowrank = proj
        record_choice("residual_proj", "fp8-w8a16",
                      f"{FP8_FLAG}: gated-stream low-rank projections in FP8 e4m3, per-output-channel scales", log=log)
    else:
        record_choice("residual_proj", "torch", "model dtype (enable FP8 W8A16 with " + FP8_FLAG + ")", log=log)
    if paths.screening_topk > 0:
        model.lm_head.quant_method = VocabScreeningMethod(paths.screening_topk, paths.screening_format)
        record_choice("lm_head", f"screen-{paths.screening_format}-top{paths.screening_topk}",
                      f"{TOPK_FLAG} {paths.screening_topk}: {paths.screening_format} logits for the vocabulary, "
                      f"the best {paths.screening_topk} recomputed with the original rows", log=log)
    else:
        record_choice("lm_head", "torch", f"full-precision LM head ({TOPK_FLAG} 0)", log=log)
    return paths


# ------------------------------------------------------------------ CLI flags (registered by plugin.py)


def add_precision_flags(result, parser, *args, **kwargs):
    """AFTER ``ServerArgs.add_cli_args``: the three flags (idempotent)."""
    have = {s for a in parser._actions for s in a.option_strings}
    if FP8_FLAG not in have:
        add_plugin_argument(parser, FP8_FLAG, action="store_true", default=False,
                            help="sglang-hybrid (Qwen3.8 CPU reference model): run the hyper-connection low-rank "
                                 f"projections as FP8 W8A16 with per-output-channel scales. Same as {FP8_ENV}=1.")
    if TOPK_FLAG not in have:
        add_plugin_argument(parser, TOPK_FLAG, type=int, default=None, metavar="K",
                            help="sglang-hybrid (Qwen3.8 CPU reference model): screen the vocabulary with "
                                 "low-precision LM-head rows and recompute the best K exactly (0: off). "
                                 f"Same as {TOPK_ENV}=K.")
    if FORMAT_FLAG not in have:
        add_plugin_argument(parser, FORMAT_FLAG, choices=FORMATS, default=None,
                            help=f"sglang-hybrid: the screen's weight format (default fp8). Same as {FORMAT_ENV}.")
    return result


def export_precision_flags(cls, args, *rest, **kwargs):
    """BEFORE ``ServerArgs.from_cli_args``: flags -> environment variables (upstream's call follows).

    Raises:
        ValueError: ``--vocab-screening-topk`` below 0.
    """
    if getattr(args, "qwen38_fp8_residual_proj", False):
        os.environ[FP8_ENV] = "1"
    topk = getattr(args, "vocab_screening_topk", None)
    if topk is not None:
        if topk < 0:
            raise ValueError(f"{TOPK_FLAG} must be >= 0, got {topk}")
        os.environ[TOPK_ENV] = str(topk)
    fmt = getattr(args, "vocab_screening_format", None)
    if fmt is not None:
        os.environ[FORMAT_ENV] = fmt
    if os.environ.get(FP8_ENV, "0") not in ("", "0") or int(os.environ.get(TOPK_ENV, "0") or 0) > 0:
        from sglang_hybrid.platforms import current_platform

        if not current_platform().is_cpu:
            logger.warning("%s / %s act on the Qwen3.8 plain-torch reference model, which serves on CPU only; "
                           "upstream's model class on this GPU ignores them", FP8_FLAG, TOPK_FLAG)


def install() -> None:
    """Register the two ``ServerArgs`` hooks (called by ``plugin.register``)."""
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)
