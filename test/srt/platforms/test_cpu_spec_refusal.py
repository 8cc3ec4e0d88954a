"""Kimi K3 with ``--speculative-algorithm`` on ``--device cpu`` is refused at start-up with one clear
error (issue 42, defect 3; ``platforms/cpu_spec.py``). Before, each algorithm failed later, in the
scheduler, with an unrelated error: NGRAM an ImportError of ``reconstruct_indices_from_tree_mask``
from the ``sgl_kernel`` stand-in, NEXTN an AttributeError ``get_embed_and_head``, STANDALONE
"torch_native not supported". Argument parsing passed for all three.

Checks: the arguments parsed and resolved as the launcher does (``prepare_server_args`` then
``resolve_once``, plugin loaded, one subprocess) for the tiny Kimi K3 raise the ValueError naming
the flag, the architecture and the reason; the tiny Qwen3.8 with NEXTN (its MTP path on CPU) still
resolves; a real ``launch_server`` exits with the message in its log before any weight loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from sglang_hybrid.platforms.cpu_spec import cpu_speculation_refusal
from tiny_model import tiny_kimi_k3, tiny_qwen38

RESOLVE_CODE = textwrap.dedent(
    """
    import json, sys
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    out = {}
    for name, argv in json.loads(sys.argv[1]).items():
        try:
            args = prepare_server_args(argv)
            args.resolve_once()
            out[name] = "resolved: " + str(resolving_view(args).speculative_algorithm)
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps(out))
    """
)

KIMI_ALGORITHMS = ("NGRAM", "NEXTN", "STANDALONE", "eagle3")


def _resolve(runs: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    res = subprocess.run([sys.executable, "-c", RESOLVE_CODE, json.dumps(runs)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])


def test_kimi_k3_speculation_on_cpu_refused_when_arguments_resolve():
    kimi, qwen = tiny_kimi_k3(), tiny_qwen38()
    base = ["--device", "cpu"]
    runs = {algo: ["--model-path", kimi, *base, "--speculative-algorithm", algo] for algo in KIMI_ALGORITHMS}
    runs["qwen3.8 NEXTN"] = ["--model-path", qwen, *base, "--speculative-algorithm", "NEXTN",
                             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                             "--speculative-num-draft-tokens", "4"]
    runs["kimi no speculation"] = ["--model-path", kimi, *base]
    out = _resolve(runs)
    for algo in KIMI_ALGORITHMS:
        msg = out[algo]
        assert msg.startswith(f"ValueError: --speculative-algorithm {algo.upper()} is not supported for "
                              "KimiK3LinearForCausalLM on --device cpu: "), (algo, msg)
        assert "no target-verify path on CPU" in msg and "without --speculative-algorithm" in msg, (algo, msg)
    assert "no MTP layers" in out["NEXTN"] and "no MTP layers" in out["eagle3"], out
    assert "NGRAM's drafts cannot be verified" in out["NGRAM"], out
    assert "STANDALONE's drafts cannot be verified" in out["STANDALONE"], out
    assert out["qwen3.8 NEXTN"] == "resolved: EAGLE", out  # NEXTN aliases EAGLE upstream
    assert out["kimi no speculation"] == "resolved: None", out


def test_refusal_only_for_kimi_k3_on_cpu():
    assert cpu_speculation_refusal("NGRAM", "cuda", "KimiK3LinearForCausalLM") is None
    assert cpu_speculation_refusal("NEXTN", "cpu", "Qwen4ExpForConditionalGeneration") is None
    assert cpu_speculation_refusal(None, "cpu", "KimiK3LinearForCausalLM") is None
    msg = cpu_speculation_refusal("EAGLE", "cpu", "KimiK3LinearForCausalLM", draft_model_path="/some/draft")
    assert "no MTP layers" not in msg and "EAGLE's drafts cannot be verified" in msg, msg


def test_launch_server_exits_with_the_message():
    server = LaunchedServer(tiny_kimi_k3(), cpu_server_args() + ["--speculative-algorithm", "NGRAM"], timeout=300)
    with pytest.raises(RuntimeError) as info:
        server.start()
    log = open(server.log_path, encoding="utf-8", errors="replace").read()
    assert "server exited with code" in str(info.value), str(info.value)[-2000:]
    assert ("ValueError: --speculative-algorithm NGRAM is not supported for KimiK3LinearForCausalLM on "
            "--device cpu") in log, log[-3000:]
    assert "Load weight begin" not in log, log[-3000:]  # refused in the launcher, before a model loads
