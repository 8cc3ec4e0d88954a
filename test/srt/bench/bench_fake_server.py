"""A fake server with scripted stream timings for the benchmark-suite tests (CPU only).

Serves ``POST /v1/completions`` (OpenAI streaming) and ``POST /generate``
(SGLang streaming), ``GET /v1/models``, ``GET /get_server_info`` and
``POST /flush_cache`` (counted in ``flushes``). Every
request streams chunks following ``script``: a list of ``(delay_s, tokens)``,
the first delay being the TTFT; the script is cycled on its last entry until
the requested number of tokens is reached. How the OpenAI chunks expose
their tokens is chosen by ``token_source``:

- ``"token_ids"``: ``choices[0].token_ids`` (and ``usage`` per chunk);
- ``"usage"``: only cumulative ``usage.completion_tokens``;
- ``"logprobs"``: only ``choices[0].logprobs.tokens``;
- ``"events"``: only text.

Chunk indices in ``empty_text_chunks`` carry empty text (an incomplete UTF-8
sequence), as real servers send.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import List, Optional, Sequence, Set, Tuple

from aiohttp import web
from threaded_aiohttp import ThreadedAiohttpServer

SERVER_INFO = {"model_path": "scripted-model", "version": "fake-0.0", "kernel_paths": None}


class ScriptedServer(ThreadedAiohttpServer):
    def __init__(
        self,
        script: Sequence[Tuple[float, int]] = ((0.01, 1), (0.01, 1)),
        token_source: str = "token_ids",
        empty_text_chunks: Set[int] = frozenset(),
        spec_verify_ct: Optional[int] = None,
        fail_requests: Set[int] = frozenset(),
        delay_scale_by_inflight: bool = False,
    ):
        self.script = list(script)
        self.token_source = token_source
        self.empty_text_chunks = set(empty_text_chunks)
        self.spec_verify_ct = spec_verify_ct
        self.fail_requests = set(fail_requests)
        self.delay_scale_by_inflight = delay_scale_by_inflight
        self.arrivals: List[Tuple[float, str, dict]] = []  # (perf_counter, path, body)
        self.inflight = 0
        self.max_inflight = 0
        self.flushes = 0
        super().__init__()

    def chunks(self, n_tokens: int) -> List[Tuple[float, int]]:
        """The (delay, tokens) schedule of one request asking for ``n_tokens``."""
        out, total, i = [], 0, 0
        while total < n_tokens:
            d, k = self.script[min(i, len(self.script) - 1)]
            k = min(k, n_tokens - total)
            out.append((d, k))
            total += k
            i += 1
        return out

    async def _models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "scripted-model", "object": "model"}]})

    async def _flush(self, request):
        self.flushes += 1
        return web.Response(text="Cache flushed.")

    async def _info(self, request):
        return web.json_response(SERVER_INFO)

    async def _stream(self, request, n_tokens: int, make_chunk, final=None):
        number = len(self.arrivals) - 1
        if number in self.fail_requests:
            return web.Response(status=500, text=f"scripted failure of request {number}")
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            total = 0
            sched = self.chunks(n_tokens)
            for j, (delay, k) in enumerate(sched):
                scale = self.inflight if self.delay_scale_by_inflight else 1
                await asyncio.sleep(delay * scale)
                ids = [100 + total + t for t in range(k)]
                total += k
                chunk = make_chunk(j, ids, total, j == len(sched) - 1)
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if final is not None:
                await resp.write(b"data: " + json.dumps(final(total)).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.inflight -= 1

    async def _completions(self, request):
        body = await request.json()
        self.arrivals.append((time.perf_counter(), "/v1/completions", body))
        n = int(body["max_tokens"])
        src = self.token_source

        def make(j, ids, total, last):
            text = "" if j in self.empty_text_chunks else "x" * len(ids)
            choice = {"index": 0, "text": text, "finish_reason": "length" if last else None}
            chunk = {"id": "r", "object": "text_completion", "choices": [choice], "usage": None}
            if src == "token_ids":
                choice["token_ids"] = ids
                chunk["usage"] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": total}
            elif src == "usage":
                chunk["usage"] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": total}
            elif src == "logprobs":
                choice["logprobs"] = {"tokens": ["t"] * len(ids), "token_logprobs": [-1.0] * len(ids)}
            return chunk

        def final(total):
            out = {"id": "r", "choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                       "completion_tokens": total}}
            if self.spec_verify_ct:
                out["sglext"] = {"spec_tokens_details": {"spec_verify_ct": self.spec_verify_ct}}
            return out

        return await self._stream(request, n, make, final)

    async def _generate(self, request):
        body = await request.json()
        self.arrivals.append((time.perf_counter(), "/generate", body))
        n = int(body["sampling_params"]["max_new_tokens"])
        out: List[int] = []

        def make(j, ids, total, last):
            out.extend(ids)
            meta = {"prompt_tokens": len(body["input_ids"]), "completion_tokens": total, "cached_tokens": 0,
                    "finish_reason": {"type": "length", "length": n} if last else None}
            if self.spec_verify_ct:  # as sglang's tokenizer manager reports them
                meta["spec_verify_ct"] = self.spec_verify_ct
                meta["spec_accept_length"] = total / self.spec_verify_ct
            return {"text": "x" * total, "output_ids": list(out), "meta_info": meta}

        return await self._stream(request, n, make)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/get_server_info", self._info)
        app.router.add_post("/flush_cache", self._flush)

