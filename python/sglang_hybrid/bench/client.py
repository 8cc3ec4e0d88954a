"""Streaming client for SGLang's native ``POST /generate`` endpoint.

The server answers a ``"stream": true`` request with server-sent events:
``data: {json}`` lines, then ``data: [DONE]``. Each JSON carries ``text``,
``output_ids`` and ``meta_info`` (``prompt_tokens``, cumulative
``completion_tokens``, ``cached_tokens``, ``finish_reason``). Depending on a
server flag, ``output_ids`` is cumulative or incremental, so tokens are
counted from ``meta_info.completion_tokens`` and only fall back to
``output_ids`` when that is missing.

All times are in seconds from ``time.perf_counter``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import aiohttp


@dataclass
class RequestResult:
    """Outcome of one request. Times in seconds, lengths in tokens.

    ``ttft``: send to first token-carrying chunk (prefill + queueing).
    ``itl``: gaps between successive token-carrying chunks after the first
    (decode); ``chunk_tokens[j]`` is the number of new tokens in chunk ``j``
    (the first entry belongs to the first chunk, so ``len(itl) ==
    len(chunk_tokens) - 1``). ``e2e_latency``: send to end of stream.
    ``start_time``: send time relative to the start of the run.
    """

    index: int
    timestamp: float
    input_len: int
    output_len: int
    output_tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens: Optional[int] = None
    ttft: Optional[float] = None
    itl: List[float] = field(default_factory=list)
    chunk_tokens: List[int] = field(default_factory=list)
    e2e_latency: Optional[float] = None
    start_time: Optional[float] = None
    finish_reason: Any = None
    success: bool = False
    error: Optional[str] = None

    def to_row(self) -> Dict[str, Any]:
        """A JSON-ready dict; times rounded to 0.1 µs to keep files small."""
        row = asdict(self)
        row["itl"] = [round(g, 7) for g in self.itl]
        for key in ("ttft", "e2e_latency", "start_time"):
            if row[key] is not None:
                row[key] = round(row[key], 7)
        return row


class _TokenCounter:
    """Cumulative completion-token count across SSE chunks."""

    def __init__(self) -> None:
        self.total = 0
        self._prev_ids: List[int] = []

    def update(self, chunk: Dict[str, Any]) -> int:
        """Return the number of new tokens in ``chunk``."""
        meta = chunk.get("meta_info") or {}
        cum = meta.get("completion_tokens")
        if cum is not None:
            new = int(cum) - self.total
            self.total = max(self.total, int(cum))
            return max(new, 0)
        ids = chunk.get("output_ids") or []
        prev = self._prev_ids
        # Cumulative streams repeat the earlier ids as a prefix.
        if prev and len(ids) >= len(prev) and ids[: len(prev)] == prev:
            new = len(ids) - len(prev)
            self._prev_ids = list(ids)
        else:
            new = len(ids)
            self._prev_ids = prev + list(ids)
        self.total += new
        return new


async def _iter_sse_data(resp: aiohttp.ClientResponse):
    """Yield the payload of each ``data:`` line as soon as it arrives.

    Reads raw chunks rather than ``readline`` so that very long lines (the
    cumulative ``text`` of a long output) cannot hit aiohttp's line limit.
    """
    buf = b""
    async for piece in resp.content.iter_any():
        buf += piece
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl].strip(), buf[nl + 1 :]
            if line.startswith(b"data:"):
                yield line[5:].strip()
    line = buf.strip()
    if line.startswith(b"data:"):
        yield line[5:].strip()


async def send_generate(
    session: aiohttp.ClientSession,
    base_url: str,
    input_ids: List[int],
    max_new_tokens: int,
    result: RequestResult,
    t0: float,
    timeout_s: Optional[float] = None,
) -> RequestResult:
    """Stream one ``/generate`` request and fill ``result`` in place.

    Never raises for server or network errors: they end up in
    ``result.error`` with ``result.success = False`` (HTTP status and body
    for non-200 answers, the exception text otherwise). ``t0`` is the run's
    start time, used for ``result.start_time``.
    """
    payload = {
        "input_ids": input_ids,
        "sampling_params": {
            "max_new_tokens": int(max_new_tokens),
            "temperature": 0.0,
            "ignore_eos": True,
        },
        "stream": True,
    }
    timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
    counter = _TokenCounter()
    start = time.perf_counter()
    result.start_time = start - t0
    last_chunk_t: Optional[float] = None
    try:
        async with session.post(f"{base_url}/generate", json=payload, timeout=timeout) as resp:
            if resp.status != 200:
                body = await resp.text()
                result.error = f"HTTP {resp.status}: {body[:2000]}"
                result.e2e_latency = time.perf_counter() - start
                return result
            async for data in _iter_sse_data(resp):
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk and "meta_info" not in chunk:
                    raise RuntimeError(f"server error in stream: {chunk['error']}")
                meta = chunk.get("meta_info") or {}
                if meta.get("cached_tokens") is not None:
                    result.cached_tokens = int(meta["cached_tokens"])
                if meta.get("prompt_tokens") is not None:
                    result.prompt_tokens = int(meta["prompt_tokens"])
                if meta.get("finish_reason") is not None:
                    result.finish_reason = meta["finish_reason"]
                new = counter.update(chunk)
                if new <= 0:
                    continue
                if last_chunk_t is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last_chunk_t)
                result.chunk_tokens.append(new)
                last_chunk_t = now
        result.e2e_latency = time.perf_counter() - start
        result.output_tokens = counter.total
        fr = result.finish_reason
        if isinstance(fr, dict) and fr.get("type") == "abort":
            result.error = f"aborted by server: {fr.get('message', fr)}"
        elif result.ttft is None:
            result.error = "stream ended without any output token"
        result.success = result.error is None
    except asyncio.CancelledError:
        raise
    except Exception as e:  # network errors, timeouts, bad JSON
        result.e2e_latency = time.perf_counter() - start
        result.output_tokens = counter.total
        result.success = False
        result.error = f"{type(e).__name__}: {e}"
    return result


async def get_server_info(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0
) -> Optional[Dict[str, Any]]:
    """``GET {base_url}/get_server_info`` as JSON, or None on any error."""
    try:
        async with session.get(
            f"{base_url}/get_server_info", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except Exception:
        return None
