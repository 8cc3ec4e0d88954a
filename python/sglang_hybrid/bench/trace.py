"""Mooncake-format traces: loading, length scaling and synthetic prompt tokens.

A Mooncake trace line is ``{"timestamp": ms, "input_length": tokens,
"output_length": tokens, "hash_ids": [...]}`` with one hash id per 512-token
block of the input. Equal ids mean equal block content, and the ids of one
request form its prefix chain, so equal id at block ``i`` implies the whole
prefix up to block ``i`` is equal (Mooncake, FAST'25, trace release notes).

We replay a trace with synthetic token ids: every hash id maps to a fixed
block of ``b`` token ids drawn from an RNG keyed by ``(seed, hash_id)``, and a
prompt is the concatenation of its blocks truncated to its input length. Equal
ids therefore give equal token blocks, which keeps the trace's prefix-sharing
pattern; the same seed gives the same prompts on every run.
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

PACKAGED_TRACE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces",
                                   "mooncake_conversation_trace.jsonl")


def _default_trace_path() -> str:
    """``$SGLANG_HYBRID_TRACE`` if set, else the Mooncake conversation trace shipped as package data
    (``sglang_hybrid/bench/traces/``, so it is found from an installed wheel or an image too)."""
    return os.environ.get("SGLANG_HYBRID_TRACE") or PACKAGED_TRACE_PATH


DEFAULT_TRACE_PATH = _default_trace_path()
TRACE_BLOCK_SIZE = 512  # tokens per hash id in the Mooncake release
# Used when neither --model-path nor --vocab-size says anything about the
# vocabulary: ids below 1000 hold the special/control tokens of most
# tokenizers, and every tokenizer we care about has more than 30000 entries.
DEFAULT_TOKEN_RANGE = (1000, 30000)


@dataclass(frozen=True)
class TraceRecord:
    """One line of the trace, unscaled. Lengths in tokens, timestamp in ms."""

    index: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: Tuple[int, ...]


@dataclass(frozen=True)
class ScaledRequest:
    """A trace request after length scaling; all lengths in tokens.

    ``hash_ids`` are the ids actually used (``ceil(input_len / block_size)``
    of them); ``timestamp_s`` is the trace timestamp in seconds (unscaled by
    any speedup).
    """

    index: int
    timestamp_s: float
    input_len: int
    output_len: int
    block_size: int
    hash_ids: Tuple[int, ...]


def load_trace(path: str, num_requests: Optional[int] = None) -> List[TraceRecord]:
    """Read the first ``num_requests`` lines (all when None) of a JSONL trace."""
    records: List[TraceRecord] = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            if num_requests is not None and len(records) >= num_requests:
                break
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            records.append(
                TraceRecord(
                    index=len(records),
                    timestamp_ms=float(obj.get("timestamp", 0)),
                    input_length=int(obj["input_length"]),
                    output_length=int(obj["output_length"]),
                    hash_ids=tuple(int(h) for h in obj["hash_ids"]),
                )
            )
    return records


def scaled_block_size(length_scale: float) -> int:
    """Tokens per hash-id block after scaling: ``max(1, round(512 * s))``."""
    return max(1, round(TRACE_BLOCK_SIZE * length_scale))


def scale_request(
    rec: TraceRecord,
    length_scale: float = 1.0,
    output_scale: float = 1.0,
    max_output_len: Optional[int] = None,
) -> ScaledRequest:
    """Scale one trace record.

    Input: ``L = max(1, round(input_length * s))`` tokens in blocks of
    ``b = scaled_block_size(s)``, using the first ``ceil(L / b)`` hash ids; if
    the record has fewer ids, ``L`` is clamped to ``len(hash_ids) * b``.
    Output: ``max(1, round(output_length * output_scale))``, capped at
    ``max_output_len`` when given.
    """
    b = scaled_block_size(length_scale)
    n_ids = len(rec.hash_ids)
    if n_ids == 0:
        raise ValueError(f"trace request {rec.index} has no hash_ids")
    L = max(1, round(rec.input_length * length_scale))
    L = min(L, n_ids * b)
    n_blocks = math.ceil(L / b)
    out = max(1, round(rec.output_length * output_scale))
    if max_output_len is not None:
        out = max(1, min(out, max_output_len))
    return ScaledRequest(
        index=rec.index,
        timestamp_s=rec.timestamp_ms / 1000.0,
        input_len=L,
        output_len=out,
        block_size=b,
        hash_ids=rec.hash_ids[:n_blocks],
    )


def theoretical_reuse(requests: Sequence[ScaledRequest]) -> Tuple[int, int]:
    """Prefix reuse an unbounded prefix cache could reach, in trace order.

    For each request, ``matched`` = (number of leading blocks whose hash id
    was used by an earlier request of the selection) * block size, capped at
    ``input_len - 1`` because a server recomputes at least one token.
    Returns ``(sum matched, sum input_len)`` in tokens.
    """
    seen = set()
    matched_total = 0
    input_total = 0
    for req in requests:
        k = 0
        for h in req.hash_ids:
            if h not in seen:
                break
            k += 1
        matched_total += min(k * req.block_size, req.input_len - 1)
        input_total += req.input_len
        seen.update(req.hash_ids)
    return matched_total, input_total


# --------------------------------------------------------------------------
# Token-id range
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRange:
    """Token ids drawn uniformly from ``[lo, hi)`` minus ``excluded``."""

    lo: int
    hi: int
    excluded: Tuple[int, ...] = ()

    def allowed_ids(self) -> np.ndarray:
        ids = np.arange(self.lo, self.hi, dtype=np.int64)
        if self.excluded:
            ids = np.setdiff1d(ids, np.asarray(self.excluded, dtype=np.int64))
        if ids.size == 0:
            raise ValueError(f"empty token range {self}")
        return ids


def _special_ids_from_tokenizer(model_path: str) -> Optional[Tuple[List[int], Optional[int]]]:
    """Special token ids and base-vocab size from tokenizer files, or None.

    Reads ``tokenizer.json`` (``added_tokens`` with ``special: true``;
    ``model.vocab`` size) and ``tokenizer_config.json``
    (``added_tokens_decoder`` entries with ``special: true``).
    """
    specials: List[int] = []
    base_vocab: Optional[int] = None
    found = False
    tj = os.path.join(model_path, "tokenizer.json")
    if os.path.isfile(tj):
        found = True
        with open(tj, "r", encoding="utf-8") as f:
            obj = json.load(f)
        for tok in obj.get("added_tokens") or []:
            if tok.get("special", False) and "id" in tok:
                specials.append(int(tok["id"]))
        vocab = (obj.get("model") or {}).get("vocab")
        if isinstance(vocab, (dict, list)) and len(vocab) > 0:
            base_vocab = len(vocab)
    tc = os.path.join(model_path, "tokenizer_config.json")
    if os.path.isfile(tc):
        found = True
        with open(tc, "r", encoding="utf-8") as f:
            obj = json.load(f)
        for tid, tok in (obj.get("added_tokens_decoder") or {}).items():
            if isinstance(tok, dict) and tok.get("special", False):
                specials.append(int(tid))
    if not found:
        return None
    return sorted(set(specials)), base_vocab


def resolve_token_range(
    model_path: Optional[str] = None, vocab_size: Optional[int] = None
) -> TokenRange:
    """Pick the token-id range for synthetic prompts.

    - ``hi``: ``vocab_size`` if given, else ``config.json`` ``vocab_size``
      under ``model_path`` (lowered to the tokenizer's base vocabulary when
      that is smaller, so padded embedding rows are never used), else 30000.
    - ``lo``: when tokenizer files list special tokens, one past the largest
      special id in the lower half of ``[0, hi)``; specials in the upper half
      are excluded individually. Without tokenizer files ``lo`` is
      ``min(1000, hi // 2)``.
    """
    hi: Optional[int] = None
    specials: List[int] = []
    have_tokenizer = False
    if model_path:
        cfg_path = os.path.join(model_path, "config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path, "r", encoding="utf-8") as f:
                cfg = json.load(f)
            v = cfg.get("vocab_size")
            if v is None and isinstance(cfg.get("text_config"), dict):
                v = cfg["text_config"].get("vocab_size")
            if v is not None:
                hi = int(v)
        tok = _special_ids_from_tokenizer(model_path)
        if tok is not None:
            have_tokenizer = True
            specials, base_vocab = tok
            if base_vocab is not None and hi is not None and vocab_size is None:
                # Upper specials live above the base vocab in most tokenizers;
                # keep them in range so they are excluded one by one.
                hi = min(hi, max(base_vocab, max(specials, default=-1) + 1))
    if vocab_size is not None:
        hi = int(vocab_size)
    if hi is None:
        if not have_tokenizer:
            return TokenRange(*DEFAULT_TOKEN_RANGE)
        hi = DEFAULT_TOKEN_RANGE[1]
    if have_tokenizer:
        low = [s for s in specials if s < hi // 2]
        lo = max(low) + 1 if low else 0
        excluded = tuple(s for s in specials if lo <= s < hi)
    else:
        lo = min(DEFAULT_TOKEN_RANGE[0], hi // 2)
        excluded = ()
    if lo >= hi:
        raise ValueError(f"no usable token ids: lo={lo} hi={hi}")
    return TokenRange(lo=lo, hi=hi, excluded=excluded)


# --------------------------------------------------------------------------
# Prompt synthesis
# --------------------------------------------------------------------------


class PromptSynthesizer:
    """Deterministic token ids for hash-id blocks.

    ``block_tokens(h)`` is ``block_size`` ids drawn uniformly from the
    allowed ids of ``token_range`` by ``numpy.random.default_rng([seed, h])``.
    Blocks are cached (LRU, ``cache_blocks`` entries) because conversation
    turns reuse the same ids many times.
    """

    def __init__(
        self,
        block_size: int,
        token_range: TokenRange = TokenRange(*DEFAULT_TOKEN_RANGE),
        seed: int = 0,
        cache_blocks: int = 8192,
    ):
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if seed < 0:
            raise ValueError("seed must be >= 0")
        self.block_size = block_size
        self.token_range = token_range
        self.seed = seed
        self._allowed = token_range.allowed_ids()
        self._cache: "OrderedDict[int, np.ndarray]" = OrderedDict()
        self._cache_blocks = cache_blocks

    def _draw(self, entropy: Sequence[int], n: int) -> np.ndarray:
        rng = np.random.default_rng(list(entropy))
        idx = rng.integers(0, self._allowed.size, size=n)
        return self._allowed[idx]

    def block_tokens(self, hash_id: int) -> np.ndarray:
        """Token ids (int64, shape [block_size]) for one hash id."""
        if hash_id < 0:
            raise ValueError("hash ids must be >= 0")
        blk = self._cache.get(hash_id)
        if blk is not None:
            self._cache.move_to_end(hash_id)
            return blk
        blk = self._draw((self.seed, hash_id), self.block_size)
        self._cache[hash_id] = blk
        if len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return blk

    def input_ids(self, req: ScaledRequest) -> List[int]:
        """The request's prompt: its blocks concatenated, truncated to ``input_len``."""
        if req.block_size != self.block_size:
            raise ValueError("request and synthesizer use different block sizes")
        parts = [self.block_tokens(h) for h in req.hash_ids]
        ids = np.concatenate(parts)[: req.input_len]
        return ids.tolist()

    def warmup_ids(self, k: int, length: int = 16) -> List[int]:
        """A short prompt for warm-up request ``k``.

        Keyed by a 3-element entropy ``(seed, 2**32, k)``, a different stream
        from every ``(seed, hash_id)`` block, so warm-up prompts share no
        prefix with the trace (beyond chance).
        """
        return self._draw((self.seed, 2**32, k), length).tolist()


def scale_trace(
    records: Iterable[TraceRecord],
    length_scale: float = 1.0,
    output_scale: float = 1.0,
    max_output_len: Optional[int] = None,
) -> List[ScaledRequest]:
    """``scale_request`` over a list of records."""
    return [scale_request(r, length_scale, output_scale, max_output_len) for r in records]
