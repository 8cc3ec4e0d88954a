"""The plugin's flags through the real plugin loader and upstream's argument parsing (one subprocess):
``--radix-cache-backend`` names checked when the arguments are parsed (upstream finds out only when the
scheduler builds its cache, after the model has loaded), its help text naming our two backends, the
cache size flags' errors, ``sgl_hybrid`` accepted by ``--linear-attn-verify-backend`` (whose choices
upstream copies at import, so the public registration alone missed it), and the plugin's
``ServerArgs.from_cli_args`` hooks no longer stacking AROUND hooks (upstream warns on every launch when
more than one wraps the same target)."""

import json
import os
import subprocess
import sys
import textwrap

CODE = textwrap.dedent(
    """
    import json, logging, io
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    import argparse

    log = io.StringIO()
    logging.getLogger("sglang.srt.plugins.hook_registry").addHandler(logging.StreamHandler(log))
    load_plugins()
    out = {}
    base = ["--model-path", "m", "--device", "cpu"]
    for name, extra in (("bogus", ["--radix-cache-backend", "no-such-cache"]),
                        ("host_negative", ["--hybrid-host-cache-gb", "-1"]),
                        ("device_zero", ["--hybrid-device-cache-gb", "0"])):
        try:
            prepare_server_args(base + extra)
            out[name] = "accepted"
        except ValueError as exc:
            out[name] = str(exc)
    for name in ("hybrid", "upstream"):
        out[name] = prepare_server_args(base + ["--radix-cache-backend", name]).radix_cache_backend
    for flag in ("--linear-attn-backend", "--linear-attn-decode-backend", "--linear-attn-prefill-backend",
                 "--linear-attn-verify-backend"):
        try:
            args = prepare_server_args(base + [flag, "sgl_hybrid"])
            out[flag] = getattr(args, flag[2:].replace("-", "_"))
        except SystemExit:
            out[flag] = "refused by the parser"
    for name, extra in (("warm_ours", ["--linear-attn-backend", "sgl_hybrid"]),
                        ("warm_mla", ["--attention-backend", "sgl_hybrid_mla", "--warmups", "voice_chat"]),
                        ("warm_skip", ["--linear-attn-backend", "sgl_hybrid", "--skip-server-warmup"]),
                        ("warm_plain", [])):
        out[name] = prepare_server_args(base + extra).warmups
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out["help"] = next(a.help for a in parser._actions if "--radix-cache-backend" in a.option_strings)
    from sglang_hybrid.flags import GROUP_TITLE
    group = next(g for g in parser._action_groups if g.title == GROUP_TITLE)
    out["group"] = sorted(o for a in group._group_actions for o in a.option_strings)
    out["log"] = log.getvalue()
    print("RESULT " + json.dumps(out))
    """
)


def test_plugin_flags_through_upstream_parser():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    res = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    assert "'no-such-cache' is not registered" in out["bogus"] and "hybrid" in out["bogus"], out["bogus"]
    assert "--hybrid-host-cache-gb must be >= 0, got -1.0" in out["host_negative"], out["host_negative"]
    assert "--hybrid-device-cache-gb must be > 0, got 0.0" in out["device_zero"], out["device_zero"]
    assert (out["hybrid"], out["upstream"]) == ("hybrid", "upstream")
    assert "'hybrid'" in out["help"] and "'upstream'" in out["help"], out["help"]
    # every flag the plugin adds sits under its own --help heading, and is declared once (server_info reads it)
    from sglang_hybrid.flags import PLUGIN_FLAGS

    assert out["group"] == sorted(PLUGIN_FLAGS), out["group"]
    for flag in ("--linear-attn-backend", "--linear-attn-decode-backend", "--linear-attn-prefill-backend",
                 "--linear-attn-verify-backend"):
        assert out[flag] == "sgl_hybrid", (flag, out[flag])
    # our GPU kernel backends get the hybrid warm-up (entrypoints/warmup.py) unless warm-up is skipped
    assert out["warm_ours"] == "sglang_hybrid", out["warm_ours"]
    assert out["warm_mla"] == "voice_chat,sglang_hybrid", out["warm_mla"]
    assert out["warm_skip"] is None and out["warm_plain"] is None, (out["warm_skip"], out["warm_plain"])
    assert "Multiple AROUND hooks on 'sglang.srt.server_args.ServerArgs.from_cli_args'" not in out["log"] + res.stderr


STRATEGY_CODE = textwrap.dedent(
    """
    import json, sys
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    out = {}
    models = json.loads(sys.argv[1])
    runs = {"base": ["--linear-attn-backend", "sgl_hybrid"],
            "explicit": ["--linear-attn-backend", "sgl_hybrid", "--mamba-radix-cache-strategy", "extra_buffer"],
            "per-mode": ["--linear-attn-decode-backend", "sgl_hybrid", "--linear-attn-prefill-backend", "sgl_hybrid"]}
    for model, path in models.items():
        for run, flags in runs.items():
            try:
                args = prepare_server_args(["--model-path", path, "--device", "cpu", *flags])
                args.resolve_once()
                view = resolving_view(args)
                out[f"{model} {run}"] = [view.mamba_radix_cache_strategy, view.page_size, view.linear_attn_backend]
            except (AssertionError, ValueError) as exc:
                out[f"{model} {run}"] = f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps(out))
    """
)


def test_linear_attn_backend_sgl_hybrid_keeps_the_extra_buffer_strategy():
    """``--linear-attn-backend sgl_hybrid`` as a user types it, resolved by upstream for both tiny models: the
    mamba radix-cache strategy is ``extra_buffer`` as with the per-mode flags. Upstream allows it only for the
    ``triton`` base backend, so it resolved to ``no_buffer`` (Kimi K3: no prefix hit on an exact repeat) and
    Qwen3.8, paged by 64 for compressed QSA, failed "no_buffer only supports page_size=1"; an explicit
    ``--mamba-radix-cache-strategy extra_buffer`` was refused ("extra_buffer is not supported")."""
    from tiny_model import tiny_kimi_k3, tiny_qwen38

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    models = json.dumps({"kimi-k3": tiny_kimi_k3(), "qwen3.8": tiny_qwen38()})
    res = subprocess.run([sys.executable, "-c", STRATEGY_CODE, models], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    for run in ("base", "explicit"):
        assert out[f"kimi-k3 {run}"] == ["extra_buffer", 1, "sgl_hybrid"], out
        assert out[f"qwen3.8 {run}"] == ["extra_buffer", 64, "sgl_hybrid"], out
    assert out["kimi-k3 per-mode"] == ["extra_buffer", 1, "triton"] and out["qwen3.8 per-mode"][0] == "extra_buffer", out


def test_undeclared_plugin_flag_is_refused():
    """A flag added outside ``sglang_hybrid.flags.PLUGIN_FLAGS`` fails loudly (it would be missing from
    ``/server_info`` and the docs); a declared one lands under the plugin's heading once."""
    import argparse

    import pytest

    from sglang_hybrid.flags import GROUP_TITLE, add_plugin_argument

    parser = argparse.ArgumentParser()
    with pytest.raises(KeyError, match="--no-such-flag"):
        add_plugin_argument(parser, "--no-such-flag")
    assert add_plugin_argument(parser, "--skip-boot-gates", action="store_true") is not None
    assert add_plugin_argument(parser, "--skip-boot-gates", action="store_true") is None
    group = next(g for g in parser._action_groups if g.title == GROUP_TITLE)
    assert [a.option_strings for a in group._group_actions] == [["--skip-boot-gates"]]
