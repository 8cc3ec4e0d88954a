"""Anchor checks: every upstream name the plugin hooks or relies on, verified at load.

Each ``Anchor`` names a dotted target in the pinned upstream SGLang and, where
we rely on specific source text inside it, a snippet that must be present.
The anchors of the hooks come from their declarations in ``patches.py`` (one
declaration per hook); :data:`ANCHORS` lists the others: registries we add to,
attributes we overwrite, upstream source text our own code relies on.
``verify_anchors`` checks both and raises :class:`AnchorError` listing every
broken anchor, so a different SGLang version fails at start-up instead of
misbehaving later.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Iterable, List, Optional

from sglang_hybrid.patches import Anchor, patch_anchors

PINNED_SGLANG = "0.5.23"


class AnchorError(RuntimeError):
    """An upstream anchor the plugin depends on is missing or changed."""


class UpstreamImportError(AnchorError):
    """An upstream module the plugin hooks could not be imported because something *it*
    imports is missing or broken (an installation problem, e.g. no ``sgl_kernel``), not
    because the anchor changed. ``missing`` names the modules (or import failures) seen."""

    def __init__(self, message: str, missing: List[str]):
        super().__init__(message)
        self.missing = missing


ANCHORS: List[Anchor] = [
    Anchor(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.short_conv_layer_cache",
        "the Qwen3.8 reference model keeps its PLE short-conv windows in upstream's PLE side pool",
    ),
    Anchor(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.get_ngram_context",
        "the Qwen3.8 reference model keeps its n-gram token context in upstream's PLE side pool",
    ),
    Anchor(
        "sglang.srt.arg_groups.choices.add_linear_attn_kernel_backend_choices",
        "registers sgl_hybrid as a --linear-attn-*-backend choice",
    ),
    # Wiring of our GDN / KDA kernels (issue 4): layers/attention/gdn_kernel.py, kda_kernel.py.
    Anchor(
        "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend._prefill_gates",
        "SglHybridGDNKernel.extend receives the gated (g, beta) of fused_gdn_gating and inverts them for our kernel",
        snippet="fused_gdn_gating(layer.A_log, a, b, layer.dt_bias)",
    ),
    Anchor(
        "sglang.srt.layers.attention.linear.utils.resolve_linear_attn_backends",
        "an unset verify backend resolves to triton; our hooks make verify follow decode when decode is sgl_hybrid",
        snippet='verify = decode.value if decode.is_flashinfer() else "triton"',
    ),
    # --attention-backend sgl_hybrid_mla (issue 5): layers/attention/mla_backend.py.
    Anchor(
        "sglang.srt.layers.attention.attention_registry.register_attention_backend",
        "registers the sgl_hybrid_mla attention backend factory",
    ),
    Anchor(
        "sglang.srt.arg_groups.choices.add_attention_backend_choices",
        "adds sgl_hybrid_mla to the --attention-backend choices",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
        "sgl_hybrid_mla replaces the instance attribute decode_attention_fwd with SglHybridMLADecode",
        snippet="self.decode_attention_fwd = torch.compiler.disable(decode_attention_fwd)",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode",
        "SglHybridMLADecode is called with upstream's signature; the DCP path reduces attn_lse over splits",
        snippet="local_lse = torch.logsumexp(",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
        "sgl_hybrid_mla replaces the instance attribute extend_attention_fwd with SglHybridMLAExtend",
        snippet="self.extend_attention_fwd = torch.compiler.disable(extend_attention_fwd)",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._forward_extend_kernel",
        "forward_extend reaches the (replaced) extend_attention_fwd through this method",
        snippet="return self.extend_attention_fwd(*args, **kwargs)",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend",
        "the new rows are written at out_cache_loc before the extend kernel runs (SglHybridMLAExtend reads them there)",
        snippet="# Save KV cache first (must do this before unified kernel)",
    ),
    Anchor(
        "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd",
        "SglHybridMLAExtend keeps upstream's extend_attention_fwd signature",
        snippet="extend_seq_lens_cpu=None,\n    identity_kv_indices: bool = False,",
    ),
    Anchor(
        "sglang.srt.layers.attention.linear.kda_backend.KDAKernelDispatcher.target_verify",
        "SglHybridKDAKernel.target_verify is called with upstream's verify signature",
        snippet="return self.verify_kernel.target_verify(",
    ),
    Anchor(
        "sglang.srt.configs.linear_attn_model_registry.register_linear_attn_model",
        "declares KimiK3LinearForCausalLM as a hybrid model using the mamba radix cache",
    ),
    Anchor("sglang.srt.models.registry.ModelRegistry", "CPU reference models are registered here"),
    # Speculative decoding on CPU (issue 6): models/qwen38/mtp_draft.py.
    Anchor(
        "sglang.srt.configs.model_config.ModelConfig",
        "the draft of Qwen4ExpForConditionalGeneration is named Qwen4ExpForCausalLMMTP (our CPU draft registers under it)",
        snippet='self.hf_config.architectures[0] = "Qwen4ExpForCausalLMMTP"',
    ),
    # Hybrid radix cache (sglang_hybrid.mem_cache, issue 3): subclasses of upstream's components
    Anchor(
        "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent._evict_device_start",
        "ValueAwareMambaComponent reorders the MAMBA LRU before upstream's eviction walk",
    ),
    Anchor(
        "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent.evict_component",
        "host tier: a checkpoint leaving the device is copied to host memory first",
        snippet="cd.value = None",
    ),
    Anchor(
        "sglang.srt.mem_cache.unified_cache.components.full.FullComponent.evict_component",
        "host tier: a KV segment leaving the device is copied to host memory first",
    ),
    Anchor(
        "sglang.srt.mem_cache.memory_pool.MambaPool.get_cpu_copy",
        "host tier payload of a checkpoint (and load_cpu_copy to restore it)",
    ),
    # Speculative depth controller (sglang_hybrid.speculative.controller_hooks, issue 7): the policy protocol
    Anchor(
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_verify_complete_cpu",
        "accept lengths reach the policy through AdaptiveController.on_verify_complete",
        snippet="self.adaptive_controller.on_verify_complete(",
    ),
    Anchor(
        "sglang.srt.speculative.adaptive_runtime_state.AdaptiveController.activate_step_by_batch",
        "the policy protocol our CycleCostDepthPolicy implements (get_steps_for_batch per decode step)",
        snippet="self.params.get_steps_for_batch(batch_size)",
    ),
    Anchor(
        "sglang.srt.speculative.adaptive_spec_params.resolve_candidate_steps_from_config",
        "the depths whose runtime states upstream builds (our controller chooses among them)",
    ),
    Anchor(  # --warmups sglang_hybrid (entrypoints/warmup.py): registered in upstream's custom warm-ups
        "sglang.srt.entrypoints.warmup.warmup",
        "registers the 'sglang_hybrid' warm-up (chunked prefill, resumed extend, batched decode)",
        snippet="_warmup_registry[name] = fn",
    ),
]


def _import_failure(target: str, exc: ImportError) -> Optional[str]:
    """The name of what failed to import when it is a dependency of ``target``'s module, not the module itself."""
    name = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and name and (target == name or target.startswith(name + ".")):
        return None  # the upstream module on the anchor's own path is gone: a changed anchor
    if isinstance(exc, ModuleNotFoundError) and name:
        return name
    return f"{exc}"  # e.g. "cannot import name X from Y" raised while importing the anchor's module


def _resolve(target: str):
    """Like ``pkgutil.resolve_name`` for dotted names, but an ImportError raised *inside* a
    module's import (a dependency missing) propagates instead of turning into an AttributeError."""
    parts = target.split(".")
    obj = importlib.import_module(parts[0])
    mod, i = parts[0], 1
    while i < len(parts):
        sub = f"{mod}.{parts[i]}"
        try:
            obj = importlib.import_module(sub)
        except ModuleNotFoundError as exc:
            if exc.name == sub:
                break  # no such submodule: the rest are attributes
            raise
        mod, i = sub, i + 1
    for p in parts[i:]:
        obj = getattr(obj, p)
    return obj


def _check(anchor: Anchor, import_failures: dict) -> Optional[str]:
    try:
        obj = _resolve(anchor.target)
    except ImportError as exc:
        what = _import_failure(anchor.target, exc)
        if what is not None:
            import_failures.setdefault(what, []).append(anchor.target)
            return None
        return f"{anchor.target}: not found ({exc.__class__.__name__}: {exc}) — needed for: {anchor.why}"
    except (AttributeError, ValueError) as exc:
        return f"{anchor.target}: not found ({exc.__class__.__name__}: {exc}) — needed for: {anchor.why}"
    if anchor.snippet is not None:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError) as exc:
            return f"{anchor.target}: source unavailable ({exc}) — needed for: {anchor.why}"
        if anchor.snippet not in source:
            return f"{anchor.target}: expected text {anchor.snippet!r} not found — needed for: {anchor.why}"
    return None


def all_anchors() -> List[Anchor]:
    """The anchors of every declared patch (``patches.PATCHES``), then :data:`ANCHORS`."""
    return patch_anchors() + list(ANCHORS)


def verify_anchors(anchors: Optional[Iterable[Anchor]] = None) -> None:
    """Raise :class:`AnchorError` if any anchor is broken (message lists all of them).

    ``anchors``: those to check; None (the default) checks :func:`all_anchors`.

    Raises:
        UpstreamImportError: an upstream module could not be imported because a module it
            imports is missing (named in the message and in ``missing``); reported instead of
            the anchors, which cannot be checked until the installation is fixed.
        AnchorError: anchors missing or changed in the installed sglang.
    """
    if anchors is None:
        anchors = all_anchors()
    failures: dict = {}
    problems = [p for p in (_check(a, failures) for a in anchors) if p]
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    if failures:
        lines = []
        for what, targets in failures.items():
            more = f" and {len(targets) - 1} more anchor(s)" if len(targets) > 1 else ""
            label = f"No module named {what!r}" if " " not in what else what
            lines.append(f"{label} (while resolving {targets[0]}{more})")
        hint = ""
        if "sgl_kernel" in failures:
            hint = (
                "\nsgl_kernel comes from upstream's sglang-kernel wheel; where it cannot load (CPU, or a torch other "
                "than sglang's pin) install our stand-in: pip install \"./python[cpu]\" or ./sgl-kernel/cpu_shim (docs/install.md)."
            )
        raise UpstreamImportError(
            f"sglang-hybrid could not import upstream sglang {version} modules it hooks — an installation problem, "
            f"not a changed anchor:\n  - " + "\n  - ".join(lines) + hint,
            sorted(failures),
        )
    if problems:
        raise AnchorError(
            f"sglang-hybrid is pinned to sglang=={PINNED_SGLANG} but found sglang {version}; "
            f"{len(problems)} upstream anchor(s) changed:\n  - " + "\n  - ".join(problems)
        )
