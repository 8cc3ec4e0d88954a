"""Where the boot gates hook into upstream's start-up (declared and anchor-checked in ``patches.py``).

* AFTER ``ServerArgs.add_cli_args``: add ``--skip-boot-gates`` to upstream's parser.
  ``ServerArgs`` is a closed record, so the flag is not a field: BEFORE
  ``ServerArgs.from_cli_args`` turns it into ``SGLANG_HYBRID_SKIP_BOOT_GATES=1`` in the
  launcher's environment, which every scheduler process inherits.
* BEFORE ``ModelRunner.load_model``: in each scheduler process, after the device is
  set and before the weights load (so a bad kernel fails fast, before minutes of
  loading), log the op table and run the gates once. A :class:`BootGateError`
  raised there reaches upstream's scheduler launcher, which logs it and stops the
  server (the launcher exits non-zero).
"""

from __future__ import annotations

from sglang_hybrid.flags import add_plugin_argument

import logging
import os

from sglang_hybrid.boot.gates import SKIP_ENV, SKIP_FLAG, run_boot

logger = logging.getLogger("sglang_hybrid.boot")

_BOOTED = False


def _add_skip_flag(result, parser, *args, **kwargs):
    if not any(SKIP_FLAG in a.option_strings for a in parser._actions):
        add_plugin_argument(
            parser, SKIP_FLAG, action="store_true", default=False,
            help="sglang-hybrid: start even if a kernel path fails its start-up numerical check (boot gate) "
                 f"against the torch reference. Same as {SKIP_ENV}=1.",
        )
    return result


def _export_skip_flag(cls, args, *rest, **kwargs):
    """BEFORE ``ServerArgs.from_cli_args``: ``--skip-boot-gates`` -> the environment the scheduler inherits."""
    if getattr(args, "skip_boot_gates", False):
        os.environ[SKIP_ENV] = "1"


def _export_conv_dtype(cls, args, *rest, **kwargs):
    """BEFORE ``ServerArgs.from_cli_args``: :func:`conv_state_follows_fp32`."""
    conv_state_follows_fp32(args)


CONV_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"


def conv_state_follows_fp32(args) -> bool:
    """``--dtype float32`` -> ``SGLANG_MAMBA_CONV_DTYPE=float32`` unless the user set it.

    Upstream keeps the KDA / GDN conv window in BF16 whatever ``--dtype`` is, and its KDA extend then
    writes FP32 rows into that BF16 cache: the first prefill fails with "Index put requires the source
    and destination dtypes match" (upstream's Kimi K3 class on an H100, 2026-12-07). Returns whether
    the variable was set here.
    """
    if str(getattr(args, "dtype", "")) in ("float32", "float") and CONV_DTYPE_ENV not in os.environ:
        os.environ[CONV_DTYPE_ENV] = "float32"
        logger.info("sglang-hybrid: --dtype float32 -> %s=float32 (upstream keeps the conv window in BF16, "
                    "and its KDA extend then fails writing FP32 rows into it)", CONV_DTYPE_ENV)
        return True
    return False


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def boot_once() -> None:
    """Op table + boot gates, once per process (a draft model's runner does not repeat them)."""
    global _BOOTED
    if _BOOTED:
        return
    _BOOTED = True
    run_boot(full_log=_rank() == 0)


def _before_load_model(*args, **kwargs):
    boot_once()
    return None


def install() -> None:
    """Register the hooks declared for this module in ``patches.py`` (called by ``plugin.register``)."""
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)
