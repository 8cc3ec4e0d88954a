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
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out["help"] = next(a.help for a in parser._actions if "--radix-cache-backend" in a.option_strings)
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
    for flag in ("--linear-attn-backend", "--linear-attn-decode-backend", "--linear-attn-prefill-backend",
                 "--linear-attn-verify-backend"):
        assert out[flag] == "sgl_hybrid", (flag, out[flag])
    assert "Multiple AROUND hooks on 'sglang.srt.server_args.ServerArgs.from_cli_args'" not in out["log"] + res.stderr
