"""Streaming clients: SGLang's native ``POST /generate`` and the OpenAI
``POST /v1/completions`` endpoint (SGLang, vLLM, any OpenAI-compatible server).

Both answer a ``"stream": true`` request with server-sent events:
``data: {json}`` lines, then ``data: [DONE]``.

``/generate`` (``api="sglang"``): each JSON carries ``text``, ``output_ids``
and ``meta_info`` (``prompt_tokens``, cumulative ``completion_tokens``,
``cached_tokens``, ``finish_reason``, and ``spec_verify_ct`` with
speculative decoding). Depending on a server flag, ``output_ids`` is
cumulative or incremental, so tokens are counted from
``meta_info.completion_tokens`` and only fall back to ``output_ids`` when that
is missing.

``/v1/completions`` (``api="openai"``): a chunk's text can be empty (an
incomplete UTF-8 sequence) or hold several tokens (bursts), so counting
stream events miscounts tokens. We ask for per-token data and count, per
chunk, from the first source present (see :class:`OpenAITokenCounter`):
``choices[0].token_ids`` (``return_token_ids``: SGLang, vLLM >= 0.10.2),
cumulative ``usage.completion_tokens`` (``stream_options.continuous_usage_stats``:
SGLang, vLLM), ``choices[0].logprobs.tokens`` (``logprobs``, only with
``logprobs=True``), and only as a last resort one token per non-empty chunk
(recorded as source ``"events"``).

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
    ``spec_verify_ct``: speculative-decoding verify steps the server reports
    for this request (None when it reports none). ``token_count_source``:
    where the token counts came from (``completion_tokens``, ``output_ids``,
    ``token_ids``, ``usage``, ``logprobs`` or ``events``).
    ``usage_completion_tokens``: the server's final ``usage.completion_tokens``
    (OpenAI API only; None when not sent). ``cached_tokens_details``: the server's
    split of ``cached_tokens`` by cache tier (``device``, ``host``, ``storage``;
    native API). ``base_url``: the server that served it (several with
    ``--base-url A,B``).
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
    spec_verify_ct: Optional[int] = None
    token_count_source: Optional[str] = None
    usage_completion_tokens: Optional[int] = None
    cached_tokens_details: Dict[str, int] = field(default_factory=dict)
    base_url: Optional[str] = None

    def to_row(self) -> Dict[str, Any]:
        """A JSON-ready dict; times rounded to 0.1 µs to keep files small."""
        row = asdict(self)
        row["itl"] = [round(g, 7) for g in self.itl]
        for key in ("ttft", "e2e_latency", "start_time"):
            if row[key] is not None:
                row[key] = round(row[key], 7)
        return row


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


class OpenAITokenCounter:
    """Tokens per ``/v1/completions`` stream chunk, from per-token data.

    Per chunk, the first source present wins: ``choices[0].token_ids``
    (incremental ids: one token each), cumulative ``usage.completion_tokens``
    (difference to the previous cumulative value), ``choices[0].logprobs.tokens``
    (one entry per token), else 1 if the chunk has non-empty text (source
    ``"events"``: counts stream events, wrong for bursts and empty chunks).
    ``source`` is the source of the last token-carrying chunk, or
    ``"mixed"`` once two chunks used different sources. A final chunk
    without choices (usage only) carries no tokens; its
    ``usage.completion_tokens`` is kept in ``usage_total``.
    """

    def __init__(self) -> None:
        self.total = 0
        self.source: Optional[str] = None
        self.usage_total: Optional[int] = None
        self._usage_seen = 0

    def _note(self, src: str) -> None:
        if self.source is None:
            self.source = src
        elif self.source != src:
            self.source = "mixed"

    def update(self, chunk: Dict[str, Any]) -> int:
        """Return the number of new tokens in ``chunk``."""
        usage = chunk.get("usage") or {}
        cum = usage.get("completion_tokens")
        choices = chunk.get("choices") or []
        if not choices:
            if cum is not None:
                self.usage_total = int(cum)
            return 0
        choice = choices[0]
        new: Optional[int] = None
        src = None
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            new, src = len(ids), "token_ids"
        elif cum is not None:
            new, src = max(int(cum) - self._usage_seen, 0), "usage"
        else:
            lp = choice.get("logprobs") or {}
            toks = lp.get("tokens") if isinstance(lp, dict) else None
            if isinstance(toks, list):
                new, src = len(toks), "logprobs"
            elif choice.get("text"):
                new, src = 1, "events"
            else:
                new = 0
        if cum is not None:
            self._usage_seen = max(self._usage_seen, int(cum))
            self.usage_total = int(cum)
        if new and src:
            self._note(src)
        self.total += new
        return new


async def _stream_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: Dict[str, Any],
    result: RequestResult,
    t0: float,
    timeout_s: Optional[float],
    on_chunk,
) -> RequestResult:
    """POST ``payload`` to ``url`` and time the SSE stream into ``result``.

    ``on_chunk(chunk) -> int`` parses one JSON chunk (raising on an error
    chunk) and returns its number of new tokens; chunks with none are not
    timed. Never raises for server or network errors (see ``send_generate``).
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
    start = time.perf_counter()
    result.start_time = start - t0
    last_chunk_t: Optional[float] = None
    try:
        async with session.post(url, json=payload, timeout=timeout) as resp:
            if resp.status != 200:
                body = await resp.text()
                result.error = f"HTTP {resp.status}: {body[:2000]}"
                result.e2e_latency = time.perf_counter() - start
                return result
            async for data in _iter_sse_data(resp):
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                new = on_chunk(json.loads(data))
                if new <= 0:
                    continue
                if last_chunk_t is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last_chunk_t)
                result.chunk_tokens.append(new)
                result.output_tokens += new
                last_chunk_t = now
        result.e2e_latency = time.perf_counter() - start
        fr = result.finish_reason
        if isinstance(fr, dict) and fr.get("type") == "abort":
            result.error = f"aborted by server: {fr.get('message', fr)}"
        elif fr == "abort":
            result.error = "aborted by server"
        elif result.ttft is None:
            result.error = "stream ended without any output token"
        result.success = result.error is None
    except asyncio.CancelledError:
        raise
    except Exception as e:  # network errors, timeouts, bad JSON, error chunks
        result.e2e_latency = time.perf_counter() - start
        result.success = False
        result.error = f"{type(e).__name__}: {e}"
    return result


def _upstream_args(temperature: float):
    """The module-global ``args`` upstream's request functions read (``sglang.benchmark.serving``):
    greedy or ``temperature`` sampling, ``ignore_eos``, streaming, no logprobs, cache report on."""
    import argparse

    return argparse.Namespace(temperature=float(temperature), top_p=1.0, disable_ignore_eos=False,
                              disable_stream=False, return_logprob=False, return_routed_experts=False,
                              logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, cache_report=True,
                              header=None)


def chunks_from_upstream_itl(itl: List[float], output_len: int) -> tuple:
    """Upstream's ``RequestFuncOutput.itl`` holds, per streamed chunk after the first, ``gap / n`` repeated
    ``n`` times (``n`` the chunk's new tokens). Returns ``(chunk_gaps, chunk_tokens)`` with the first
    chunk's tokens first (``output_len`` minus the later chunks'), so ``len(gaps) == len(tokens) - 1``.
    Two adjacent chunks whose ``gap / n`` are the same float would read as one (never seen: the gaps come
    from ``time.perf_counter``)."""
    gaps: List[float] = []
    tokens: List[int] = []
    i = 0
    while i < len(itl):
        j = i
        while j + 1 < len(itl) and itl[j + 1] == itl[i]:
            j += 1
        n = j - i + 1
        gaps.append(itl[i] * n)
        tokens.append(n)
        i = j + 1
    first = output_len - sum(tokens)
    return gaps, [first, *tokens]


async def send_generate(
    session: aiohttp.ClientSession,
    base_url: str,
    input_ids: List[int],
    max_new_tokens: int,
    result: RequestResult,
    t0: float,
    timeout_s: Optional[float] = None,
    temperature: float = 0.0,
) -> RequestResult:
    """Stream one ``/generate`` request with upstream's client and fill ``result`` in place.

    The request is made by ``sglang.benchmark.serving.async_request_sglang_generate`` (what
    ``python -m sglang.bench_serving --backend sglang`` sends: ``input_ids``, ``temperature``,
    ``ignore_eos``, streaming; it opens its own HTTP session, so ``session`` is not used). Its output
    is turned into ours: chunk gaps and tokens per chunk (:func:`chunks_from_upstream_itl`), cached
    tokens by tier, the server's prompt length, and verify steps from its accept length. Since upstream
    does not record the finish reason, a stream that ends with no token or with fewer than
    ``max_new_tokens`` (``ignore_eos``: the server aborted it) is an error. Never raises for server or
    network errors: they end up in ``result.error`` with ``result.success = False``. ``t0`` is the run's
    start time (``time.perf_counter``, s), used for ``result.start_time``; ``timeout_s`` bounds the request.
    """
    from sglang.benchmark import serving as upstream

    upstream.set_global_args(_upstream_args(temperature))
    inp = upstream.RequestFuncInput(prompt=list(input_ids), api_url=f"{base_url}/generate", prompt_len=len(input_ids),
                                    output_len=int(max_new_tokens), model="", lora_name=None, image_data=None,
                                    extra_request_body={})
    start = time.perf_counter()
    try:
        call = upstream.async_request_sglang_generate(inp)
        out = await (asyncio.wait_for(call, timeout_s) if timeout_s else call)
    except asyncio.TimeoutError:
        result.start_time = start - t0
        result.e2e_latency = time.perf_counter() - start
        result.error = f"timeout after {timeout_s} s"
        return result
    result.start_time = (out.start_time or start) - t0
    result.e2e_latency = out.latency or (time.perf_counter() - start)
    result.token_count_source = "completion_tokens"
    if not out.success:
        result.error = (out.error or "request failed").strip()[:2000]
        return result
    if not out.ttft:
        result.error = "stream ended without any output token"
        return result
    result.ttft = out.ttft
    result.output_tokens = int(out.output_len)
    result.itl, result.chunk_tokens = chunks_from_upstream_itl(list(out.itl), result.output_tokens)
    result.cached_tokens = int(out.cached_tokens or 0)
    details = out.cached_tokens_details
    if isinstance(details, dict):  # tiers of the cached prefix (device / host / storage)
        result.cached_tokens_details = {str(k): int(v) for k, v in details.items() if isinstance(v, (int, float))}
    # the server's meta_info.prompt_tokens (upstream keeps the length sent when the server reports none)
    result.prompt_tokens = int(out.prompt_len) if out.prompt_len else None
    if out.spec_accept_length:
        result.spec_verify_ct = max(1, round(result.output_tokens / out.spec_accept_length))
    if result.output_tokens < int(max_new_tokens):
        result.error = f"stream ended after {result.output_tokens} of {max_new_tokens} tokens (aborted by the server)"
        return result
    result.success = True
    return result


async def send_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    input_ids: List[int],
    max_tokens: int,
    result: RequestResult,
    t0: float,
    timeout_s: Optional[float] = None,
    temperature: float = 0.0,
    model: Optional[str] = None,
    logprobs: bool = False,
) -> RequestResult:
    """Stream one OpenAI ``/v1/completions`` request and fill ``result`` in place.

    The prompt is sent as token ids (``prompt: [ids]``), with ``ignore_eos``
    (SGLang, vLLM), ``return_token_ids`` and
    ``stream_options.continuous_usage_stats`` so that tokens are counted from
    per-token data (see :class:`OpenAITokenCounter`); ``logprobs=True`` adds
    ``logprobs: 0`` (one more per-token source, at some server cost).
    ``return_spec_tokens_details`` asks SGLang for the verify-step count.
    Servers ignore fields they do not know. Same error contract as
    :func:`send_generate`.
    """
    payload: Dict[str, Any] = {
        "model": model or "default",
        "prompt": input_ids,
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
        "return_spec_tokens_details": True,
    }
    if logprobs:
        payload["logprobs"] = 0
    counter = OpenAITokenCounter()

    def on_chunk(chunk: Dict[str, Any]) -> int:
        if "error" in chunk and not chunk.get("choices"):
            raise RuntimeError(f"server error in stream: {chunk['error']}")
        usage = chunk.get("usage") or {}
        if usage.get("prompt_tokens") is not None:
            result.prompt_tokens = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            result.cached_tokens = int(details["cached_tokens"])
        spec = (chunk.get("sglext") or {}).get("spec_tokens_details")
        if isinstance(spec, list):
            spec = spec[0] if spec else None
        if isinstance(spec, dict) and spec.get("spec_verify_ct"):
            result.spec_verify_ct = int(spec["spec_verify_ct"])
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason") is not None:
                result.finish_reason = choice["finish_reason"]
        return counter.update(chunk)

    await _stream_request(
        session, f"{base_url}/v1/completions", payload, result, t0, timeout_s, on_chunk
    )
    result.token_count_source = counter.source
    result.usage_completion_tokens = counter.usage_total
    return result


API_CHOICES = ("sglang", "openai")


async def send_request(
    api: str,
    session: aiohttp.ClientSession,
    base_url: str,
    input_ids: List[int],
    max_tokens: int,
    result: RequestResult,
    t0: float,
    timeout_s: Optional[float] = None,
    temperature: float = 0.0,
    model: Optional[str] = None,
    logprobs: bool = False,
) -> RequestResult:
    """``send_generate`` (``api="sglang"``) or ``send_completion`` (``api="openai"``)."""
    if api == "sglang":
        return await send_generate(
            session, base_url, input_ids, max_tokens, result, t0, timeout_s, temperature
        )
    if api == "openai":
        return await send_completion(
            session, base_url, input_ids, max_tokens, result, t0, timeout_s, temperature,
            model, logprobs,
        )
    raise ValueError(f"unknown api {api!r}; expected one of {API_CHOICES}")


async def _get_json(session: aiohttp.ClientSession, url: str, timeout_s: float) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except Exception:
        return None


# Where servers publish their configuration: SGLang, then vLLM (dev mode).
SERVER_INFO_ENDPOINTS = ("/get_server_info", "/server_info")


async def get_server_info(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0
) -> Optional[Dict[str, Any]]:
    """The server's configuration as JSON, or None.

    ``GET {base_url}/get_server_info`` (SGLang: every server flag plus
    runtime state), else ``GET /server_info`` (vLLM with
    ``VLLM_SERVER_DEV_MODE=1``); the first JSON object answered wins.
    """
    for path in SERVER_INFO_ENDPOINTS:
        info = await _get_json(session, base_url + path, timeout_s)
        if isinstance(info, dict):
            return info
    return None


async def list_models(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0
) -> Optional[List[Dict[str, Any]]]:
    """``GET {base_url}/v1/models`` ``data`` list (model ids, ``max_model_len``), or None."""
    obj = await _get_json(session, base_url + "/v1/models", timeout_s)
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        return obj["data"]
    return None
