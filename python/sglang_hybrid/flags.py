"""The plugin's command-line flags: one declaration each, one ``--help`` heading.

Every flag sglang-hybrid adds to ``python -m sglang.launch_server`` is declared in
:data:`PLUGIN_FLAGS` with the environment variable it is exported to (the
scheduler processes read the environment, since they receive upstream's
``ServerArgs`` record, which has no field for a plugin flag). The modules that own
a flag add it with :func:`add_plugin_argument` from their
``ServerArgs.add_cli_args`` hook; the argument lands in the parser's
"sglang-hybrid plugin" group. ``/server_info`` reports the values in effect
(:func:`flag_values`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Dict, Optional

GROUP_TITLE = "sglang-hybrid plugin"


@dataclass(frozen=True)
class PluginFlag:
    """One plugin flag: its option string, the environment variable carrying its value to the
    scheduler processes, and the module that owns its meaning."""

    flag: str
    env: str
    owner: str


PLUGIN_FLAGS: Dict[str, PluginFlag] = {
    f.flag: f
    for f in (
        PluginFlag("--hybrid-host-cache-gb", "SGLANG_HYBRID_HOST_CACHE_GB", "sglang_hybrid.mem_cache.serving"),
        PluginFlag("--hybrid-device-cache-gb", "SGLANG_HYBRID_DEVICE_CACHE_GB", "sglang_hybrid.mem_cache.serving"),
        PluginFlag("--hybrid-store", "SGLANG_HYBRID_STORE", "sglang_hybrid.mem_cache.serving"),
        PluginFlag("--hybrid-store-config", "SGLANG_HYBRID_STORE_CONFIG", "sglang_hybrid.mem_cache.serving"),
        PluginFlag("--skip-boot-gates", "SGLANG_HYBRID_SKIP_BOOT_GATES", "sglang_hybrid.boot.hooks"),
        PluginFlag("--speculative-depth-controller", "SGLANG_HYBRID_SPEC_DEPTH_CONTROLLER",
                   "sglang_hybrid.speculative.controller_hooks"),
        PluginFlag("--speculative-synthetic-acceptance", "SGLANG_HYBRID_SPEC_SYNTHETIC_ACCEPTANCE",
                   "sglang_hybrid.speculative.controlled_acceptance"),
        PluginFlag("--qwen38-fp8-residual-proj", "SGLANG_HYBRID_QWEN38_FP8_RESIDUAL_PROJ",
                   "sglang_hybrid.models.qwen38.precision"),
        PluginFlag("--vocab-screening-topk", "SGLANG_HYBRID_VOCAB_SCREENING_TOPK",
                   "sglang_hybrid.models.qwen38.precision"),
        PluginFlag("--vocab-screening-format", "SGLANG_HYBRID_VOCAB_SCREENING_FORMAT",
                   "sglang_hybrid.models.qwen38.precision"),
    )
}


def _group(parser: argparse.ArgumentParser):
    for group in parser._action_groups:
        if group.title == GROUP_TITLE:
            return group
    return parser.add_argument_group(
        GROUP_TITLE, "Flags added by the sglang-hybrid plugin (docs/install.md); each is also read from the "
        "environment variable named in its help.")


def add_plugin_argument(parser: argparse.ArgumentParser, flag: str, **kwargs) -> Optional[argparse.Action]:
    """Add a declared plugin flag to ``parser`` under the plugin's heading (once per parser).

    Returns:
        The new argparse action, or None when the parser already has the flag.

    Raises:
        KeyError: ``flag`` is not declared in :data:`PLUGIN_FLAGS` (a flag added anywhere else
            would be missing from ``/server_info`` and from the docs).
    """
    if flag not in PLUGIN_FLAGS:
        raise KeyError(f"sglang-hybrid flag {flag} is not declared in sglang_hybrid.flags.PLUGIN_FLAGS")
    if flag in parser._option_string_actions:
        return None
    return _group(parser).add_argument(flag, **kwargs)


def flag_values() -> Dict[str, Optional[str]]:
    """``{flag: value}`` in effect in this process: the exported environment value, or None when the
    flag was not given (the owner module's default applies)."""
    return {f.flag: os.environ.get(f.env) for f in PLUGIN_FLAGS.values()}
