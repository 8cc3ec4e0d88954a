"""``LaunchedServer``'s retry when its automatically picked port is taken before the server binds it
(``make test`` runs two pytest-xdist workers that both start servers). The launch itself is replaced
by a stand-in here; the real launches are the server tests."""

import socket

import pytest

from sglang_hybrid.bench import server as server_mod
from sglang_hybrid.bench.server import LaunchedServer, _port_taken

UVICORN_BIND_ERROR = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 40001): address already in use"


def test_port_taken_recognises_the_bind_errors_and_nothing_else():
    assert _port_taken("server exited with code 1\n" + UVICORN_BIND_ERROR)
    assert _port_taken("ValueError: Port is already in use. dist_init_port=1 port_base=2")
    assert _port_taken("OSError: [Errno 98] Address already in use")
    assert not _port_taken("server exited with code 1\nValueError: --max-total-tokens must be positive")
    assert not _port_taken("server not healthy after 300 s\n")


def _fake_launches(monkeypatch, errors):
    """``_start_once`` raises the given errors in turn (None: healthy); returns the ports it saw."""
    seen = []

    def start_once(self):
        seen.append(self.port)
        err = errors[len(seen) - 1]
        if err is not None:
            raise RuntimeError(err)
        return self

    monkeypatch.setattr(LaunchedServer, "_start_once", start_once)
    return seen


def test_a_taken_auto_picked_port_is_replaced_and_the_launch_retried(monkeypatch):
    ports = iter([40001, 40002])
    monkeypatch.setattr(server_mod, "free_port", lambda: next(ports))
    seen = _fake_launches(monkeypatch, ["server exited with code 1\n" + UVICORN_BIND_ERROR, None])
    s = LaunchedServer("/nonexistent/model", ["--device", "cpu"], log_path="/dev/null")
    assert s.start() is s
    assert seen == [40001, 40002]
    assert (s.port, s.base_url) == (40002, "http://127.0.0.1:40002")


def test_other_failures_and_given_ports_are_not_retried(monkeypatch):
    monkeypatch.setattr(server_mod, "free_port", lambda: 40003)
    seen = _fake_launches(monkeypatch, ["server exited with code 1\nValueError: bad flag", None])
    with pytest.raises(RuntimeError, match="bad flag"):
        LaunchedServer("/nonexistent/model", log_path="/dev/null").start()
    assert seen == [40003]

    seen = _fake_launches(monkeypatch, [UVICORN_BIND_ERROR, None])
    with pytest.raises(RuntimeError, match="address already in use"):
        LaunchedServer("/nonexistent/model", port=40004, log_path="/dev/null").start()
    assert seen == [40004]  # the caller chose this port: no silent move to another


def test_gives_up_after_three_taken_ports(monkeypatch):
    ports = iter([40005, 40006, 40007, 40008])
    monkeypatch.setattr(server_mod, "free_port", lambda: next(ports))
    seen = _fake_launches(monkeypatch, [UVICORN_BIND_ERROR] * 4)
    with pytest.raises(RuntimeError, match="address already in use"):
        LaunchedServer("/nonexistent/model", log_path="/dev/null").start()
    assert seen == [40005, 40006, 40007]


def test_free_port_returns_a_bindable_port():
    port = server_mod.free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # raises OSError if the port were taken
        assert s.getsockname()[1] == port
