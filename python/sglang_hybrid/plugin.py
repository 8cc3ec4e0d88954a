"""Entry point of the ``sglang.srt.plugins`` group: registration only, no computation.

Upstream calls :func:`register` in the launcher before argument parsing and
again in every scheduler / detokenizer process. It

1. checks every upstream anchor we hook (``anchors.py``) and stops the process
   with the list of broken ones — upstream would only log an exception;
2. declares ``KimiK3LinearForCausalLM`` as a hybrid model that uses the mamba
   radix cache (``register_linear_attn_model``);
3. replaces upstream's KDA backend class with ours (CPU path; GPU unchanged);
4. offers ``--linear-attn-backend sgl_hybrid`` (our KDA kernels under upstream's
   KDA backend, for upstream's own model classes on GPU);
5. rejects out-of-vocabulary ``input_ids`` with HTTP 400 (upstream crashes);
6. on CPU: registers the plain-torch reference models under upstream's
   architecture names and installs the CPU hooks of ``platforms/cpu.py``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_hybrid")

_REGISTERED = False


def register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True

    from sglang_hybrid.anchors import AnchorError, verify_anchors
    from sglang_hybrid.platforms import current_platform

    try:
        verify_anchors()
    except AnchorError as exc:
        logger.critical("%s", exc)
        # SystemExit is not an Exception: upstream's plugin loader cannot swallow it.
        raise SystemExit(f"sglang-hybrid: {exc}") from exc

    platform = current_platform()
    logger.info("sglang-hybrid plugin: platform=%s (%s)", platform.device, platform.reason)

    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.configs.linear_attn_model_registry import LinearAttnModelSpec, register_linear_attn_model
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_hybrid.layers.attention.kda_backend import HybridKDAAttnBackend
    from sglang_hybrid.models.kimi_k3 import ARCHITECTURE as KIMI_K3

    register_linear_attn_model(
        LinearAttnModelSpec(
            config_class=KimiLinearConfig,
            backend_class_name="sglang_hybrid.layers.attention.kda_backend.HybridKDAAttnBackend",
            arch_names=[KIMI_K3],
            uses_mamba_radix_cache=True,
            support_mamba_cache=True,
            support_mamba_cache_extra_buffer=True,
        )
    )
    HookRegistry.register(
        "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend", HybridKDAAttnBackend, HookType.REPLACE
    )
    from sglang_hybrid.entrypoints import validation
    from sglang_hybrid.layers.attention import kda_kernel

    validation.install()
    kda_kernel.install()

    if platform.is_cpu:
        from sglang.srt.models.registry import ModelRegistry

        from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM
        from sglang_hybrid.platforms import cpu

        ModelRegistry.models[KIMI_K3] = KimiK3ReferenceForCausalLM
        cpu.default_conv_state_fp32()
        cpu.allow_extra_buffer()
        cpu.pin_memory_noop_without_gpu()
        logger.info("sglang-hybrid: %s served by the plain-torch reference model (CPU)", KIMI_K3)
