"""Benchmark-only controlled acceptance in the server's verify step (issue 7, "Controlled acceptance").

``--speculative-synthetic-acceptance a_1,a_2,...`` makes greedy chain verify (EAGLE / MTP,
``topk=1``) accept, per request and cycle, ``L`` drafts with ``P(L >= i) = a_i`` whatever the
draft proposed (:class:`~.acceptance.SyntheticAcceptance`), so an end-to-end benchmark
measures the depth controller with a known acceptance curve, separately from the draft
model. It **changes the committed tokens** (drafts are committed whether or not the target
agrees): it is not accuracy-preserving and is refused with a ``ValueError`` unless
``SGLANG_HYBRID_BENCHMARK_MODE=1`` (checked when the flag is parsed and again in the
scheduler process).

How: upstream's greedy verify compares, along the chain ``candidates[:, 0..k]`` (the last
committed token, then the ``k`` drafts), the target's argmax ``target_predict[:, j]`` with
``candidates[:, j + 1]`` and accepts up to the first mismatch; the bonus token is
``target_predict[:, L]``. The AROUND hook on ``eagle_utils.verify_tree_greedy_func`` rewrites
``target_predict`` so that positions ``< L`` match the drafts and position ``L`` (when
``L < k``) does not, then calls upstream's function, so the accepted length, the bonus token,
the KV / state bookkeeping and the accept-length statistics are upstream's own. Sampling
(non-greedy) verify is left alone.
"""

from __future__ import annotations

from sglang_hybrid.flags import add_plugin_argument

import logging
import os
from typing import Optional, Sequence

import numpy as np
import torch

from .acceptance import SyntheticAcceptance

logger = logging.getLogger("sglang_hybrid.speculative")

FLAG = "--speculative-synthetic-acceptance"
#: Carries the rates from the CLI to the scheduler process (comma-separated floats).
ENV = "SGLANG_HYBRID_SPEC_SYNTHETIC_ACCEPTANCE"


def parse_rates(text: str) -> SyntheticAcceptance:
    """``"0.8,0.66,0.54,0.36"`` -> a validated :class:`SyntheticAcceptance` (benchmark mode required).

    Raises:
        ValueError: not a comma-separated list of floats, invalid rates, or benchmark mode off.
    """
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"{FLAG} must be comma-separated floats a_1,a_2,..., got {text!r}") from exc
    return SyntheticAcceptance(rates)


def force_accept_lengths(target_predict: torch.Tensor, candidates: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``target_predict`` rewritten so greedy chain verify accepts exactly ``lengths[r]`` drafts.

    Args:
        target_predict: ``[B, k + 1]`` int, the target's argmax after each chain position.
        candidates: ``[B, k + 1]`` int, the chain (last committed token, then ``k`` drafts).
        lengths: ``[B]`` int in ``[0, k]``.

    Returns:
        a new ``[B, k + 1]`` tensor: ``[:, j] = candidates[:, j + 1]`` for ``j < L``; at ``j = L < k`` the
        target's own token, moved by one id when it equals the draft (so the chain stops there).

    Raises:
        ValueError: mismatched shapes or a length outside ``[0, k]``.
    """
    if target_predict.shape != candidates.shape or target_predict.dim() != 2:
        raise ValueError(f"target_predict {tuple(target_predict.shape)} and candidates {tuple(candidates.shape)} "
                         "must both be [B, k + 1]")
    B, width = candidates.shape
    k = width - 1
    lengths = lengths.to(device=candidates.device, dtype=torch.long).reshape(-1)
    if lengths.numel() != B or (B and (int(lengths.min()) < 0 or int(lengths.max()) > k)):
        raise ValueError(f"lengths must be {B} ints in [0, {k}], got {lengths.tolist()}")
    out = target_predict.clone()
    j = torch.arange(width, device=candidates.device)[None, :]
    drafts_next = torch.cat([candidates[:, 1:], candidates[:, -1:]], dim=1)  # candidates[:, j + 1]
    accept = j < lengths[:, None]
    out = torch.where(accept, drafts_next.to(out.dtype), out)
    stop = (j == lengths[:, None]) & (j < k) & (out == drafts_next.to(out.dtype))
    moved = torch.where(out > 0, out - 1, out + 1)
    return torch.where(stop, moved, out)


class _State:
    synthetic: Optional[SyntheticAcceptance] = None
    text: Optional[str] = None
    rng = np.random.default_rng(0)


def _synthetic() -> Optional[SyntheticAcceptance]:
    text = os.environ.get(ENV)
    if not text:
        return None
    if text != _State.text:
        _State.synthetic, _State.text = parse_rates(text), text
        logger.warning("benchmark-only controlled acceptance ON: drafts are accepted with P(L >= i) = %s "
                       "(not accuracy-preserving)", _State.synthetic.rates.tolist())
    return _State.synthetic


def around_verify_tree_greedy(original, *args, **kwargs):
    """AROUND upstream's greedy verify: force the accepted lengths when controlled acceptance is on."""
    syn = _synthetic()
    if syn is None:
        return original(*args, **kwargs)
    topk = kwargs.get("topk", -1)
    if topk != 1:
        raise ValueError(f"{FLAG} needs chain drafts (--speculative-eagle-topk 1), got topk={topk!r}")
    candidates, target_predict = kwargs["candidates"], kwargs["target_predict"]
    k = candidates.shape[1] - 1
    if k > syn.max_depth:
        raise ValueError(f"{FLAG} gives {syn.max_depth} rates but verify drafts {k} tokens")
    lengths = torch.from_numpy(syn.sample_accept_lengths(k, candidates.shape[0], _State.rng))
    kwargs["target_predict"] = force_accept_lengths(target_predict, candidates, lengths)
    return original(*args, **kwargs)


def add_flag(parser) -> None:
    if FLAG not in parser._option_string_actions:
        add_plugin_argument(
            parser, FLAG,
            type=str,
            default=None,
            help="BENCHMARK ONLY (needs SGLANG_HYBRID_BENCHMARK_MODE=1; not accuracy-preserving): greedy chain "
            "verify accepts drafts with the given unconditional rates a_1,a_2,... (a_i = P(first i accepted)).",
        )


def keep_flag(args) -> None:
    """Validate the flag's value (refused outside benchmark mode) and hand it to the scheduler process."""
    value = getattr(args, FLAG[2:].replace("-", "_"), None)
    if value:
        parse_rates(value)  # raises the benchmark-mode / validation ValueError here, at start-up
        os.environ[ENV] = value


def rates_env(rates: Sequence[float]) -> str:
    """The flag / environment value for ``rates``."""
    return ",".join(repr(float(a)) for a in rates)
