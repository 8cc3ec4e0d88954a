"""Boot gates: the op table, the numerical gates, a broken kernel stopping start-up, --skip-boot-gates.

Function level: ``run_boot`` on the CPU platform with kernels monkeypatched to be
wrong. End to end: a real ``python -m sglang.launch_server`` whose KDA recurrence is
broken (through a ``sitecustomize`` on ``PYTHONPATH``, so every spawned process
gets it) must exit non-zero and say which kernel path failed, before serving.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest

from sgl_hybrid_kernel.delta_rule import ops as delta_ops
from sgl_hybrid_kernel.delta_rule import naive as kda_ref
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from sglang_hybrid.boot import SKIP_ENV, BootGateError, run_boot
from sglang_hybrid.platforms import Platform
from tiny_model import tiny_kimi_k3

CPU = Platform("cpu", reason="test")


def _off_by(delta):
    original = kda_ref.kda_recurrent

    def broken(*args, **kwargs):
        o, S = original(*args, **kwargs)
        return o + delta, S

    return broken


def test_cpu_paths_are_torch_and_pass_their_gates(caplog):
    with caplog.at_level(logging.INFO, logger="test_boot"):
        results = run_boot(CPU, skip=False, log=logging.getLogger("test_boot"))
    by_op = {r.op: r for r in results}
    assert set(by_op) >= {"delta_rule_decode", "delta_rule_prefill"}
    for op in ("delta_rule_decode", "delta_rule_prefill"):
        assert by_op[op].impl == "torch" and by_op[op].ok
        assert 0.0 < by_op[op].max_abs_err < 1e-5  # FP32 path vs FP64 oracle of another algorithm
    text = caplog.text
    assert re.search(r"delta_rule_decode +torch +CPU tensors: plain-torch reference", text)
    assert "aiter: not used (cpu: aiter is ROCm-only)" in text
    assert "boot gates" in text and "kda-safe decode B=3" in text


def test_wrong_kernel_refuses_to_start_naming_the_op(monkeypatch):
    monkeypatch.setattr(kda_ref, "kda_recurrent", _off_by(1e-3))  # just above the 1e-4 tolerance
    with pytest.raises(BootGateError) as ctx:
        run_boot(CPU, skip=False, log=logging.getLogger("test_boot"))
    msg = str(ctx.value)
    assert "1 kernel path(s) disagree" in msg
    assert "delta_rule_decode [torch]: max |err| 1.000e-03 > tolerance 1e-04" in msg
    assert "delta_rule_prefill" not in msg  # its path does not use the broken function
    assert "--skip-boot-gates" in msg and SKIP_ENV in msg


def test_crashing_kernel_is_a_failed_gate(monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("illegal memory access")

    monkeypatch.setattr(delta_ops, "prefill_torch", crash)
    with pytest.raises(BootGateError, match=r"delta_rule_prefill \[torch\]: raised RuntimeError: illegal memory access"):
        run_boot(CPU, skip=False, log=logging.getLogger("test_boot"))


def test_plan_that_raises_is_a_failed_gate_not_a_traceback(monkeypatch):
    from sgl_hybrid_kernel import dispatch as kd

    def broken_plan(device):
        raise RuntimeError("no tile for this device")

    entry = next(e for e in kd.registered_ops() if e.op == "dcp_merge")
    monkeypatch.setitem(kd._OPS, "dcp_merge", kd.RegisteredOp("dcp_merge", broken_plan, entry.gate, entry.description))
    with pytest.raises(BootGateError, match=r"dcp_merge \[plan-error\]: raised RuntimeError in its plan: no tile"):
        run_boot(CPU, skip=False, log=logging.getLogger("test_boot"))


def test_nan_output_fails_the_gate(monkeypatch):
    monkeypatch.setattr(kda_ref, "kda_recurrent", _off_by(float("nan")))
    with pytest.raises(BootGateError, match=r"delta_rule_decode \[torch\]: max \|err\| nan"):
        run_boot(CPU, skip=False, log=logging.getLogger("test_boot"))


def test_skip_keeps_the_table_and_runs_no_gate(monkeypatch, caplog):
    monkeypatch.setattr(kda_ref, "kda_recurrent", _off_by(1.0))
    monkeypatch.setenv(SKIP_ENV, "1")
    with caplog.at_level(logging.INFO, logger="test_boot"):
        assert run_boot(CPU, log=logging.getLogger("test_boot")) == []
    assert re.search(r"delta_rule_prefill +torch", caplog.text) and "boot gates SKIPPED" in caplog.text


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", SKIP_ENV)}
    env.update(SGLANG_USE_CPU_ENGINE="1", **extra)
    return env


def test_skip_flag_reaches_scheduler_env_through_upstream_parser():
    """The real plugin loader + upstream's argument parsing: the flag is accepted and exported."""
    code = textwrap.dedent(
        f"""
        import os
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import prepare_server_args
        load_plugins()
        prepare_server_args(["--model-path", "m", "--device", "cpu"])
        print("without:", os.environ.get("{SKIP_ENV}"))
        prepare_server_args(["--model-path", "m", "--device", "cpu", "--skip-boot-gates"])
        print("with:", os.environ.get("{SKIP_ENV}"))
        """
    )
    res = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "without: None" in res.stdout and "with: 1" in res.stdout, res.stdout


BROKEN_SITECUSTOMIZE = """
# Test only: every Python process started with this directory on PYTHONPATH gets a
# KDA recurrence that is off by 0.1, as a miscompiled kernel would be.
import sgl_hybrid_kernel.delta_rule.naive as _ref

_original = _ref.kda_recurrent


def _broken(*args, **kwargs):
    o, S = _original(*args, **kwargs)
    return o + 0.1, S


_ref.kda_recurrent = _broken
"""


def test_server_with_a_broken_kernel_exits_with_the_gate_message(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BROKEN_SITECUSTOMIZE)
    pythonpath = os.pathsep.join([str(tmp_path)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    server = LaunchedServer(tiny_kimi_k3(), cpu_server_args(), env={"PYTHONPATH": pythonpath},
                            timeout=240, log_path=str(tmp_path / "server.log"))
    try:
        with pytest.raises(RuntimeError, match="server exited with code") as ctx:
            server.start()
    finally:
        server.stop()
    assert server.process.returncode != 0
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "sglang-hybrid kernel paths on cpu" in log  # the op table came first
    assert "delta_rule_decode [torch]: max |err| 1.000e-01 > tolerance 1e-04" in log, str(ctx.value)
    assert "so the server will not start" in log and "--skip-boot-gates" in log
    assert "Load weight begin" not in log  # refused before loading the weights
