"""A fake SGLang ``/generate`` server for testing the replay client (CPU only).

Streams ``max_new_tokens`` tokens in chunks of ``chunk_size`` as SSE
``data: {json}`` lines followed by ``data: [DONE]``. ``cached_tokens`` is the
length of the longest prefix of ``input_ids`` shared with any earlier
request, so prefix reuse is deterministic given the arrival order, which is
recorded in ``arrivals``.
"""

from __future__ import annotations

import asyncio
import json
from typing import List, Optional

from aiohttp import web
from threaded_aiohttp import ThreadedAiohttpServer

SERVER_INFO = {"model_path": "fake-model", "version": "fake-0.0", "page_size": 1}


def common_prefix_len(a: List[int], b: List[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class FakeServer(ThreadedAiohttpServer):
    def __init__(
        self,
        chunk_size: int = 3,
        cumulative_ids: bool = True,
        send_completion_tokens: bool = True,
        max_input_len: Optional[int] = None,
        chunk_delay_s: float = 0.0005,
    ):
        self.chunk_size = chunk_size
        self.cumulative_ids = cumulative_ids
        self.send_completion_tokens = send_completion_tokens
        self.max_input_len = max_input_len
        self.chunk_delay_s = chunk_delay_s
        self.arrivals: List[List[int]] = []  # input_ids of accepted requests, arrival order
        self.cached: List[int] = []  # cached_tokens answered, same order
        super().__init__()

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response(SERVER_INFO)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = list(body["input_ids"])
        n = int(body["sampling_params"]["max_new_tokens"])
        if self.max_input_len is not None and len(ids) > self.max_input_len:
            return web.Response(
                status=400, text=f"input length {len(ids)} exceeds max {self.max_input_len}"
            )
        # Runs on the server's single event-loop thread: no lock needed.
        cached = max((common_prefix_len(ids, prev) for prev in self.arrivals), default=0)
        self.arrivals.append(ids)
        self.cached.append(cached)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        out: List[int] = []
        while len(out) < n:
            new = [7 + (len(out) + j) % 50 for j in range(min(self.chunk_size, n - len(out)))]
            out.extend(new)
            meta = {"prompt_tokens": len(ids), "cached_tokens": cached, "finish_reason": None}
            if self.send_completion_tokens:
                meta["completion_tokens"] = len(out)
            if len(out) == n:
                meta["finish_reason"] = {"type": "length", "length": n}
            chunk = {
                "text": "x" * len(out),
                "output_ids": list(out) if self.cumulative_ids else new,
                "meta_info": meta,
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/get_server_info", self._server_info)
