"""Start and stop a real ``python -m sglang.launch_server`` for demos, benchmarks and tests.

``LaunchedServer`` picks a free port, starts the server as a subprocess in its
own process group with its log in a file, waits for ``/health``, and always
stops the whole process tree (context manager, ``stop()`` is idempotent).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import requests


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_taken(message: str) -> bool:
    """Whether a failed launch's log tail says that a port was taken (uvicorn's bind error, or
    sglang's own port check)."""
    m = message.lower()
    return "address already in use" in m or "errno 98" in m or "port is already in use" in m or " is in use" in m


def cpu_server_args(
    max_total_tokens: int = 65536, max_mamba_cache_size: int = 256, dtype: str = "float32"
) -> List[str]:
    """Flags for serving a tiny hybrid model on a CPU.

    ``--max-total-tokens`` and ``--max-mamba-cache-size`` bound the pools (without
    them upstream sizes the KV pool to the whole RAM); ``--dtype float32``
    because upstream's ``auto`` turns an FP32 checkpoint into FP16;
    ``--sleep-on-idle`` because an idle scheduler otherwise polls at 100% of a
    core, which on a 2-core machine halves everything else.
    """
    return [
        "--device", "cpu",
        "--sleep-on-idle",
        "--dtype", dtype,
        "--max-total-tokens", str(max_total_tokens),
        "--max-mamba-cache-size", str(max_mamba_cache_size),
    ]


class LaunchedServer:
    """A running SGLang server subprocess.

    Args:
        model_path: checkpoint directory.
        server_args: extra ``launch_server`` flags (e.g. :func:`cpu_server_args`).
        env: extra environment variables (``SGLANG_USE_CPU_ENGINE=1`` is added
            when ``--device cpu`` is among the flags).
        timeout: seconds to wait for ``/health``.
        log_path: where stdout/stderr go (default: a temporary file).

    Raises:
        RuntimeError: from :meth:`start` if the process exits or is not healthy
            within ``timeout``; the message ends with the log's tail.
    """

    def __init__(
        self,
        model_path: str,
        server_args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        timeout: float = 300.0,
        log_path: Optional[str] = None,
        port: Optional[int] = None,
    ):
        self.model_path = model_path
        self.server_args = list(server_args)
        self.env = dict(env or {})
        self.timeout = timeout
        self._port_given = port is not None
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or tempfile.mkstemp(prefix=f"sglang-{self.port}-", suffix=".log")[1]
        self.process: Optional[subprocess.Popen] = None

    @property
    def command(self) -> List[str]:
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path,
            "--host", "127.0.0.1", "--port", str(self.port),
            *self.server_args,
        ]

    def start(self) -> "LaunchedServer":
        """Launch and wait for ``/health``. A port picked by :func:`free_port` can be taken by another
        process before the server binds it (e.g. a second test worker); the launch is then retried on
        a new port, up to three times."""
        for attempt in range(3):
            try:
                return self._start_once()
            except RuntimeError as e:
                if self._port_given or attempt == 2 or not _port_taken(str(e)):
                    raise
                self.port = free_port()
                self.base_url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start_once(self) -> "LaunchedServer":
        env = os.environ.copy()
        env.pop("TRITON_INTERPRET", None)  # the kernel tests' interpreter switch must not reach a server
        if "--device" in self.server_args and self.server_args[self.server_args.index("--device") + 1] == "cpu":
            env["SGLANG_USE_CPU_ENGINE"] = "1"
        env.update(self.env)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()  # schedulers of a multi-rank launch may outlive the launcher
                raise RuntimeError(f"server exited with code {self.process.returncode}\n{self.log_tail()}")
            try:
                if requests.get(self.base_url + "/health", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"server not healthy after {self.timeout:.0f} s\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after 30 s); scheduler and
        detokenizer processes that outlive the launcher are killed with the group."""
        p = self.process
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                return
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        if p.poll() is None:
            p.wait(timeout=30)

    def __enter__(self) -> "LaunchedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
