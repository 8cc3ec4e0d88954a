"""A threaded in-process aiohttp server for the benchmark-client tests (CPU only).

Subclasses implement ``add_routes(app)``; ``start()`` binds a free port on
127.0.0.1 and serves on a background event loop, ``stop()`` ends it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Optional

from aiohttp import web


class ThreadedAiohttpServer:
    def __init__(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None
        self._thread: Optional[threading.Thread] = None
        self.port: Optional[int] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def start(self):
        ready = threading.Event()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            app = web.Application(client_max_size=64 * 1024 * 1024)
            self.add_routes(app)
            self._runner = web.AppRunner(app)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(web.SockSite(self._runner, sock).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
