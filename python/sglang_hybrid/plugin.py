"""Entry point of the ``sglang.srt.plugins`` group: registration only, no computation.

Upstream calls :func:`register` in the launcher before argument parsing and
again in every scheduler / detokenizer process. It

1. checks every upstream anchor (those of the hooks declared in ``patches.py``
   and the others of ``anchors.py``) and stops the process with the list of
   broken ones — upstream would only log an exception; every hook below is
   registered from its declaration in ``patches.py``;
2. declares ``KimiK3LinearForCausalLM`` as a hybrid model that uses the mamba
   radix cache (``register_linear_attn_model``);
3. replaces upstream's KDA backend class with ours (CPU path; GPU unchanged);
4. offers ``--linear-attn-backend sgl_hybrid`` (our KDA kernels under upstream's
   KDA backend, for upstream's own model classes on GPU);
5. rejects out-of-vocabulary ``input_ids`` with HTTP 400 (upstream crashes);
6. on CPU: registers the plain-torch reference models under upstream's
   architecture names (the Qwen3.8 MTP draft too) and installs the CPU hooks of
   ``platforms/cpu.py``, ``platforms/cpu_spec.py`` (speculative decoding) and
   ``parallel/cpu_tp.py`` (``--tp > 1`` on gloo groups);
8. registers the hybrid radix cache (``--radix-cache-backend hybrid``, default
   for our models) and ``--hybrid-host-cache-gb`` (``mem_cache/serving.py``);
7. adds ``--skip-boot-gates`` and hooks the start-up op table + boot gates
   (``boot/hooks.py``: they run in each scheduler before the weights load);
9. installs the NaN guard before sampling (``reliability/nan_guard.py``): a request
   whose logits are not finite fails alone with HTTP 500; with
   ``SGLANG_HYBRID_IDLE_AUDIT=1`` also the idle pool audit (``reliability/idle_audit.py``);
10. adds the Qwen3.8 precision-path flags ``--qwen38-fp8-residual-proj`` and
   ``--vocab-screening-topk`` / ``--vocab-screening-format`` (``models/qwen38/precision.py``).
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_hybrid")

_REGISTERED = False


UPSTREAM_OPS_ENV = "SGLANG_HYBRID_UPSTREAM_OPS"
_HOOKED_OPS = ("moe_routing", "attn_res", "kda_fused_decode")


def _upstream_ops() -> frozenset:
    """Ops whose upstream implementation stays in place (A/B runs, fault isolation on a GPU):
    ``SGLANG_HYBRID_UPSTREAM_OPS=moe_routing,attn_res`` leaves those two hooks out.

    Raises:
        ValueError: a name other than those of :data:`_HOOKED_OPS`.
    """
    import os

    names = frozenset(n.strip() for n in os.environ.get(UPSTREAM_OPS_ENV, "").split(",") if n.strip())
    unknown = names - set(_HOOKED_OPS)
    if unknown:
        raise ValueError(f"{UPSTREAM_OPS_ENV}: unknown op(s) {sorted(unknown)}; known: {', '.join(_HOOKED_OPS)}")
    if names:
        logger.warning("%s=%s: upstream's %s kept (our hooks not installed)", UPSTREAM_OPS_ENV,
                       ",".join(sorted(names)), ", ".join(sorted(names)))
    return names


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
    logger.info("sglang-hybrid plugin: platform=%s", platform.describe())

    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.configs.linear_attn_model_registry import LinearAttnModelSpec, register_linear_attn_model

    from sglang_hybrid.layers.attention import kda_backend
    from sglang_hybrid.models.kimi_k3 import ARCHITECTURE as KIMI_K3
    from sglang_hybrid.patches import register_patches

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
    register_patches(kda_backend.__name__)  # class REPLACE KDAAttnBackend (patches.py)
    # Qwen3.8-Flash-Next (upstream qwen4_exp): upstream already treats its config as
    # hybrid GDN; the spec records the same facts for our registry readers, and the
    # GDN backend gets our CPU path (GPU unchanged).
    from sglang.srt.configs.qwen4_exp import Qwen4ExpTextConfig

    from sglang_hybrid.layers.attention import gdn_backend
    from sglang_hybrid.models.qwen38 import ARCHITECTURE as QWEN38

    register_linear_attn_model(
        LinearAttnModelSpec(
            config_class=Qwen4ExpTextConfig,
            backend_class_name="sglang_hybrid.layers.attention.gdn_backend.HybridGDNAttnBackend",
            arch_names=[QWEN38],
            uses_mamba_radix_cache=True,
            support_mamba_cache=True,
            support_mamba_cache_extra_buffer=True,
            unwrap_text_config=True,
        )
    )
    register_patches(gdn_backend.__name__)  # class REPLACE GDNAttnBackend (patches.py)
    from sglang_hybrid.boot import hooks as boot_hooks
    from sglang_hybrid.entrypoints import validation
    from sglang_hybrid.layers.attention import kda_kernel

    validation.install()
    kda_kernel.install()
    from sglang_hybrid.layers.attention import gdn_kernel

    gdn_kernel.install()  # --linear-attn-backend sgl_hybrid for GDN (Qwen3.8), docs/kernels.md#wiring
    from sglang_hybrid.layers.attention import gdn_deferred

    gdn_deferred.install()  # commit after verify: GDN deferred commit; torch scatter on CPU
    from sglang_hybrid.layers.attention import mla_backend

    mla_backend.install()  # --attention-backend sgl_hybrid_mla (Kimi K3 MLA decode), docs/kernels.md#wiring
    from sglang_hybrid.layers.attention import dcp_merge_hook

    dcp_merge_hook.install()  # sgl_hybrid_mla under DCP: all-to-all + our merge instead of all-reduce + slice
    from sglang_hybrid.layers.attention import qsa_backend

    qsa_backend.install()  # --attention-backend sgl_hybrid_qsa (Qwen3.8 QSA decode / chain verify), docs/kernels.md#wiring
    from sglang_hybrid.layers import attn_res_hook
    from sglang_hybrid.layers.moe import routing_hook

    upstream_ops = _upstream_ops()
    if "moe_routing" not in upstream_ops:
        routing_hook.install()  # upstream TopK routing -> our kernel on GPU/ROCm (CPU unchanged)
    if "attn_res" not in upstream_ops:
        attn_res_hook.install()  # upstream AttnRes aggregation -> our fused kernel on GPU/ROCm (CPU unchanged)
    if "kda_fused_decode" not in upstream_ops:
        from sglang_hybrid.layers.attention import kda_fused_decode

        kda_fused_decode.install()  # Kimi K3 decode: our one-launch fused KDA step (docs/kernels.md#wiring)
    from sglang_hybrid.mem_cache import serving as hybrid_cache

    hybrid_cache.install()  # --radix-cache-backend hybrid, default for our models (docs/hybrid-cache.md)
    boot_hooks.install()
    from sglang_hybrid.speculative import controller_hooks

    controller_hooks.install()  # --speculative-depth-controller (docs/speculative.md)
    from sglang_hybrid.models.qwen38 import precision as qwen38_precision

    qwen38_precision.install()  # --qwen38-fp8-residual-proj, --vocab-screening-topk (docs/qwen38-reference.md)
    from sglang_hybrid.reliability import nan_guard

    nan_guard.install()  # NaN/inf logits fail only their request (docs/reliability.md)
    from sglang_hybrid.reliability import idle_audit

    idle_audit.install()  # SGLANG_HYBRID_IDLE_AUDIT=1: pool + lock audit at idle (docs/reliability.md)
    from sglang_hybrid.entrypoints import server_info
    from sglang_hybrid.tools import layer_taps

    server_info.install()  # /get_server_info: plugin version, kernel paths, kernel call counts
    from sglang_hybrid.entrypoints import warmup as hybrid_warmup

    hybrid_warmup.install()  # --warmups sglang_hybrid, added for our GPU kernel backends (issue 40, item 6)
    layer_taps.install()  # SGLANG_HYBRID_LAYER_TAPS=DIR: per-layer taps of extend passes (docs/gpu.md)

    if platform.is_cpu:
        from sglang.srt.models.registry import ModelRegistry

        from sglang_hybrid.models.kimi_k3 import KimiK3ReferenceForCausalLM
        from sglang_hybrid.platforms import cpu

        ModelRegistry.models[KIMI_K3] = KimiK3ReferenceForCausalLM
        from sglang_hybrid.models.qwen38 import Qwen38ReferenceForConditionalGeneration

        ModelRegistry.models[QWEN38] = Qwen38ReferenceForConditionalGeneration
        logger.info("sglang-hybrid: %s served by the plain-torch reference model (CPU)", QWEN38)
        from sglang_hybrid.models.qwen38.mtp_draft import DRAFT_ARCHITECTURE, Qwen38ReferenceMTPForCausalLM
        from sglang_hybrid.platforms import cpu_spec

        ModelRegistry.models[DRAFT_ARCHITECTURE] = Qwen38ReferenceMTPForCausalLM  # MTP draft (issue 6)
        cpu_spec.install()  # commit after verify in torch, QSA verify width (docs/qwen38-reference.md#speculative-decoding-mtp-issue-6)
        cpu.default_conv_state_fp32()
        cpu.allow_extra_buffer()
        cpu.pin_memory_noop_without_gpu()
        from sglang_hybrid.parallel import cpu_tp

        cpu_tp.install()  # --tp > 1 on CPU: gloo groups without PyNccl (docs/parallelism.md)
        logger.info("sglang-hybrid: %s served by the plain-torch reference model (CPU)", KIMI_K3)
