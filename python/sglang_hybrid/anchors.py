"""Anchor checks: every upstream name the plugin hooks or patches, verified at load.

Each ``Anchor`` names a dotted target in the pinned upstream SGLang and, where
we rely on specific source text inside it, a snippet that must be present.
``verify_anchors`` raises :class:`AnchorError` listing every broken anchor, so
a different SGLang version fails at start-up instead of misbehaving later.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass
from typing import Iterable, List, Optional

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


@dataclass(frozen=True)
class Anchor:
    """``target``: dotted path; ``snippet``: text its source must contain (optional); ``why``: what we do there."""

    target: str
    why: str
    snippet: Optional[str] = None


ANCHORS: List[Anchor] = [
    Anchor(
        "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend",
        "class REPLACE with HybridKDAAttnBackend (CPU path; GPU defers to upstream)",
    ),
    Anchor(
        "sglang.srt.layers.attention.attention_registry.attn_backend_wrapper",
        "upstream builds KDAAttnBackend for Kimi-Linear-family configs inside this function",
        snippet="linear_attn_backend = KDAAttnBackend(runner)",
    ),
    Anchor(
        "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend",
        "class REPLACE with HybridGDNAttnBackend (Qwen3.8 CPU path; GPU defers to upstream)",
    ),
    Anchor(
        "sglang.srt.layers.attention.attention_registry.attn_backend_wrapper",
        "upstream builds GDNAttnBackend for hybrid GDN configs (Qwen4ExpTextConfig) inside this function",
        snippet="linear_attn_backend = GDNAttnBackend(runner)",
    ),
    Anchor(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.short_conv_layer_cache",
        "the Qwen3.8 reference model keeps its PLE short-conv windows in upstream's PLE side pool",
    ),
    Anchor(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.get_ngram_context",
        "the Qwen3.8 reference model keeps its n-gram token context in upstream's PLE side pool",
    ),
    Anchor(
        "sglang.srt.layers.attention.linear.kda_backend.KDAKernelDispatcher.__init__",
        "AROUND hook installing SglHybridKDAKernel for --linear-attn-*-backend sgl_hybrid",
        snippet="def __init__(",
    ),
    Anchor(
        "sglang.srt.arg_groups.choices.add_linear_attn_kernel_backend_choices",
        "registers sgl_hybrid as a --linear-attn-*-backend choice",
    ),
    Anchor(
        "sglang.srt.arg_groups.overrides.supports_mamba_cache_extra_buffer",
        "AROUND hook (kda_kernel.py): --linear-attn-backend sgl_hybrid counts as triton for the extra_buffer strategy",
        snippet='return view.linear_attn_backend == "triton"',
    ),
    Anchor(
        "sglang.srt.arg_groups.overrides._mamba_radix_cache_resolution",
        "the auto mamba radix-cache strategy resolves through supports_mamba_cache_extra_buffer (hooked above)",
        snippet="supports_mamba_cache_extra_buffer(\n            view, hf_config\n        )",
    ),
    # Wiring of our GDN / KDA kernels (issue 4): layers/attention/gdn_kernel.py, kda_kernel.py.
    Anchor(
        "sglang.srt.layers.attention.linear.gdn_backend.GDNKernelDispatcher.__init__",
        "AROUND hook installing SglHybridGDNKernel for --linear-attn-*-backend sgl_hybrid (tree verify stays upstream's)",
        snippet="self.tree_verify_kernel = triton_kernel",
    ),
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
    # sgl_hybrid_mla DCP merge (issue 5): layers/attention/dcp_merge_hook.py.
    Anchor(
        "sglang.srt.layers.attention.triton_backend.cp_lse_ag_out_rs_mha",
        "AROUND hook: the module-level name TritonAttnBackend calls for the DCP merge (ours under sgl_hybrid_mla)",
        snippet="return_lse: bool = False,",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode",
        "dcp_merge_hook: DCP decode merges all-head partials [R, H, D] through the hooked name",
        snippet="o = cp_lse_ag_out_rs_mha(o_for_decode, local_lse, group)",
    ),
    Anchor(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend._forward_extend_dcp",
        "dcp_merge_hook: DCP extend merges the prefix partials through the hooked name (LSE returned)",
        snippet="prefix_out, prefix_lse = cp_lse_ag_out_rs_mha(\n            prefix_out, prefix_lse, group, return_lse=True\n        )",
    ),
    Anchor(
        "sglang.srt.distributed.parallel_state.GroupCoordinator.all_to_all_single",
        "dcp_merge_hook exchanges head groups with the DCP group's all_to_all_single(output, input)",
        snippet="def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor):",
    ),
    Anchor(
        "sglang.srt.distributed.parallel_state.GroupCoordinator._all_to_all_single",
        "dcp_merge_hook on CPU tensors: the body of the GPU-only custom op, all_to_all_single on the gloo device_group",
        snippet="torch.distributed.all_to_all_single(output, input, group=self.device_group)",
    ),
    # --attention-backend sgl_hybrid_qsa (issue 5): layers/attention/qsa_backend.py.
    Anchor(
        "sglang.srt.layers.attention.attention_registry.attn_backend_wrapper",
        "upstream builds QwenSparseAttnBackend for Qwen3.8's QSA layers inside this function (our hooks act there)",
        snippet="full_attn_backend = QwenSparseAttnBackend(runner)",
    ),
    Anchor(
        "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend._forward_paged_attention",
        "AROUND hook: decode / chain-verify rows run sgl_hybrid_kernel.qsa with upstream's per-row metadata",
        snippet="def _forward_paged_attention(\n        self,\n        q: torch.Tensor,\n        layer,\n        forward_batch,\n        topk_indices: torch.Tensor,",
    ),
    Anchor(
        "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend._try_fused_kv_attention",
        "AROUND hook: returns None for our rows so upstream writes K/V and calls _forward_paged_attention",
        snippet="def _try_fused_kv_attention(self, q, k, v, layer, forward_batch, indices):",
    ),
    Anchor(
        "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend._metadata_from_forward_batch",
        "per-row metadata for speculative rows: one token_slot_table row and length (position + 1) per query row",
        snippet="sequence_lengths = (logical_positions + 1).to(torch.int32)",
    ),
    # MoE routing and AttnRes + RMSNorm hooks (issue 5): layers/moe/routing_hook.py, layers/attn_res_hook.py.
    Anchor(
        "sglang.srt.layers.moe.topk.select_experts",
        "routing_hook: select_experts reaches the module-level names our AROUND hooks wrap",
        snippet="topk_weights, topk_ids = biased_grouped_topk(",
    ),
    Anchor(
        "sglang.srt.layers.moe.topk.select_experts",
        "routing_hook: the softmax (Qwen) route goes through fused_topk",
        snippet="topk_weights, topk_ids = fused_topk(",
    ),
    Anchor(
        "sglang.srt.layers.moe.topk.biased_grouped_topk_gpu",
        "routing_hook: AROUND hook keeps upstream's (hidden_states, gating_output, correction_bias, topk, ...) signature",
        snippet="apply_routed_scaling_factor_on_output: Optional[bool] = False,",
    ),
    Anchor(
        "sglang.srt.models.kimi_k3.KimiK3MoE.__init__",
        "Kimi K3 routes through upstream's TopK (grouped sigmoid with correction bias)",
        snippet="self.topk = TopK(",
    ),
    Anchor(
        "sglang.srt.layers.attn_residual.AttnResidual.forward",
        "attn_res_hook: AttnResidual.forward calls the module-level aggregation functions we wrap",
        snippet="normed, prefix = _aggregate_fused_add(",
    ),
    Anchor(
        "sglang.srt.layers.attn_residual._aggregate",
        "attn_res_hook: AROUND hook (score -> softmax -> mix -> RMSNorm on our fused kernel, GPU only)",
        snippet="write_bank_row: bool = False,",
    ),
    Anchor(
        "sglang.srt.layers.layer_boundary.residual.attn_bank.AttnBankState._aggregate",
        "Kimi K3's residual stream reads go through AttnResidual.forward",
        snippet="return bank.forward(",
    ),
    Anchor(
        "sglang.srt.layers.attn_residual._aggregate_fused_add",
        "attn_res_hook: AROUND hook (the aggregation after a pending residual add; returns (normed, prefix))",
        snippet="prefix_b: torch.Tensor,",
    ),
    Anchor(
        "sglang.srt.layers.moe.topk.biased_grouped_topk",
        "routing_hook: AROUND hook on the platform's biased grouped top-k (an alias bound at import)",
    ),
    Anchor(
        "sglang.srt.layers.moe.topk.fused_topk",
        "routing_hook: AROUND hook on the softmax top-k (Qwen3.8)",
        snippet="gating_output: torch.Tensor,",
    ),
    Anchor(
        "sglang.srt.speculative.eagle_utils.verify_tree_greedy_func",
        "controlled_acceptance: AROUND hook (benchmark-only forced acceptance) on the name eagle_utils imports",
    ),
    Anchor(
        "sglang.srt.models.kimi_k3.KimiK3DeltaAttention._prepare_fused_decode",
        "kda_fused_decode: AFTER hook sets the model's fused-decode ready flag for our kernel's contract",
        snippet="self._kda_fused_decode_ready = True",
    ),
    Anchor(
        "sglang.srt.models.kimi_k3.KimiK3DeltaAttention.forward",
        "kda_fused_decode: the model offers the output-norm gate on the attention layer and skips o_norm "
        "when the backend consumed it",
        snippet="fused_onorm = self.attn._k3_onorm_consumed",
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
    Anchor(
        "sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer",
        "CPU: REPLACE so the extra_buffer strategy is allowed (our KDA backend writes the snapshots)",
    ),
    Anchor(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        "BEFORE hook rejecting out-of-vocabulary input_ids with HTTP 400",
        snippet="def _validate_one_request(",
    ),
    Anchor(
        "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode",
        "CPU: this pins the track mask unconditionally; we make pin_memory a no-op without a GPU",
        snippet="track_mask_cpu.pin_memory()",
    ),
    # Speculative decoding on CPU (issue 6): platforms/cpu_spec.py, models/qwen38/mtp_draft.py.
    Anchor(
        "sglang.srt.arg_groups.pipeline.run_resolution_pipeline",
        "CPU: resolution hook around handle_speculative_decoding refusing Kimi K3 speculation (issue 42 defect 3); "
        "it runs in the launcher, after the model config is known",
        snippet="run_hook(handle_speculative_decoding, server_args)",
    ),
    Anchor(
        "sglang.srt.arg_groups.resolution_hooks.register_resolution_hook",
        "upstream's plugin API for wrapping a named resolution step (it raises if handle_speculative_decoding "
        "is no longer overridable)",
    ),
    Anchor(
        "sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify",
        "CPU: AROUND hook committing the accepted verify step in torch (upstream's scatter is CUDA/XPU only)",
    ),
    Anchor(
        "sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend._scatter_speculative_state_with_mask",
        "CPU: the torch masked scatter our commit-after-verify hook reuses",
        snippet="dst[:, dst_indices[valid_indices]] = src[",
    ),
    Anchor(
        "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend._require_chain_speculation",
        "CPU: REPLACE keeping the topk = 1 check but not the compress-ratio width limit (our reference QSA has no key ring)",
        snippet="draft_tokens > self.compress_ratio",
    ),
    Anchor(
        "sglang.srt.configs.model_config.ModelConfig",
        "the draft of Qwen4ExpForConditionalGeneration is named Qwen4ExpForCausalLMMTP (our CPU draft registers under it)",
        snippet='self.hf_config.architectures[0] = "Qwen4ExpForCausalLMMTP"',
    ),
    # Boot gates (sglang_hybrid.boot.hooks, issue 9)
    Anchor(
        "sglang.srt.server_args.ServerArgs.add_cli_args",
        "AFTER hook adding --skip-boot-gates to upstream's parser",
        snippet="def add_cli_args(parser",
    ),
    Anchor(
        "sglang.srt.server_args.ServerArgs.from_cli_args",
        "AROUND hook exporting --skip-boot-gates as SGLANG_HYBRID_SKIP_BOOT_GATES=1 (the record has no such field)",
        snippet="def from_cli_args(cls, args",
    ),
    Anchor(
        "sglang.srt.model_executor.model_runner.ModelRunner.initialize",
        "the boot gates run BEFORE load_model, which initialize calls once the device is set",
        snippet="self.load_model()",
    ),
    Anchor(
        "sglang.srt.model_executor.model_runner.ModelRunner.load_model",
        "BEFORE hook: op table + boot gates, before the weights load",
        snippet="def load_model(self",
    ),
    Anchor(
        "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph",
        "AROUND hook (layer taps only): a pass the taps record runs eagerly, since module hooks do not run "
        "inside a replayed CUDA graph",
        snippet="def can_run_graph(self, forward_batch",
    ),
    # Hybrid radix cache (sglang_hybrid.mem_cache, issue 3)
    Anchor(
        "sglang.srt.mem_cache.registry.default_radix_cache_factory",
        "AROUND hook: our hybrid architectures get --radix-cache-backend hybrid by default",
        snippet="def default_radix_cache_factory(ctx",
    ),
    Anchor(
        "sglang.srt.mem_cache.registry.create_unified_radix_cache",
        "our factory builds HybridRadixCache through upstream's builder (components, HiCache checks)",
        snippet="cache = (cache_class or UnifiedRadixCache)(params)",
    ),
    Anchor(
        "sglang.srt.managers.schedule_policy.PrefillAdder._select_prefill_admission",
        "AROUND hook ending a prefill chunk at the branch point so branch point and prompt end both get checkpoints",
        snippet="return _PrefillAdmission(",
    ),
    Anchor(
        "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend",
        "AFTER hook moving the hybrid cache's host-restored tokens from the device to the host share of "
        "cached_tokens_details (upstream splits the prefix by tier once, on the first extend)",
        snippet="req._cache_breakdown_computed = True",
    ),
    Anchor(
        "sglang.srt.managers.schedule_batch.ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend",
        "upstream tracks the branch point instead of the chunk end when it falls inside the chunk (why we split there)",
        snippet="if req.mamba_branching_seqlen is not None:",
    ),
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
    # Speculative depth controller (sglang_hybrid.speculative.controller_hooks, issue 7);
    # ServerArgs.add_cli_args / from_cli_args are anchored above (AFTER hooks for the flag)
    Anchor(
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__",
        "AFTER hook replacing adaptive_controller.params (upstream's EMA policy) with ours",
        snippet="self.adaptive_controller = AdaptiveController(",
    ),
    Anchor(
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
        "AROUND hook: request ids of a decode batch / timer mark at prefill; decode asks the policy here",
        snippet="self.activate_step_by_batch(batch.seq_lens.shape[0])",
    ),
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
    ),    # NaN guard before sampling (sglang_hybrid.reliability.nan_guard, issue 11)
    Anchor(
        "sglang.srt.model_executor.model_runner.ModelRunner.sample",
        "BEFORE hook: rows of non-finite logits are zeroed and their request ids remembered",
        snippet="def sample(\n        self,\n        logits_output: LogitsProcessorOutput,\n        forward_batch: ForwardBatch,",
    ),
    Anchor(
        "sglang.srt.managers.scheduler.Scheduler.process_batch_result",
        "BEFORE hook: a request with non-finite logits gets FINISH_ABORT (HTTP 500) before its token is used",
        snippet="def process_batch_result(",
    ),
    Anchor(
        "sglang.srt.managers.schedule_batch.FINISH_ABORT",
        "the NaN guard's abort carries status_code / err_type to the tokenizer manager (HTTP 500)",
        snippet="def __init__(self, message=None, status_code=None, err_type=None):",
    ),
    Anchor(  # idle pool audit (sglang_hybrid.reliability.idle_audit, issue 11; on with SGLANG_HYBRID_IDLE_AUDIT=1)
        "sglang.srt.managers.scheduler.Scheduler.on_idle",
        "AFTER hook: free + evictable + locked == capacity and no lock held, KV and state pools, once per idle period",
        snippet="self.invariant_checker._check_all_pools(",
    ),
    Anchor(  # CPU --tp > 1 (sglang_hybrid.parallel.cpu_tp, issue 8)
        "sglang.srt.distributed.parallel_state.init_model_parallel_group",
        "AROUND hook on CPU: groups are built without PyNccl / custom all-reduce (CUDA-only; a CUDA torch build loads libnccl)",
        snippet="use_pynccl = not (_is_npu or _is_xpu or backend == \"mooncake\")",
    ),
    Anchor(  # CPU --dcp-size > 1 (sglang_hybrid.parallel.cpu_tp, issue 8)
        "sglang.srt.distributed.parallel_state.initialize_model_parallel",
        "AROUND hook on CPU: the DCP platform guard (its module's only is_cuda() call) admits the CPU device",
        snippet="is_hip() or is_cuda() or _is_npu or _is_xpu",
    ),
    Anchor(  # --warmups sglang_hybrid (entrypoints/warmup.py): registered in upstream's custom warm-ups
        "sglang.srt.entrypoints.warmup.warmup",
        "registers the 'sglang_hybrid' warm-up (chunked prefill, resumed extend, batched decode)",
        snippet="_warmup_registry[name] = fn",
    ),
    Anchor(
        "sglang.srt.entrypoints.http_server._execute_server_warmup",
        "upstream's own warm-up, one 3-token prompt, which compiles none of the long-prompt kernels",
        snippet="[10, 11, 12]",
    ),
    Anchor(  # /get_server_info carries the plugin's version, kernel paths and call counts (entrypoints/server_info.py)
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state",
        "AFTER hook adding internal_state['sglang_hybrid']",
        snippet="return GetInternalStateReqOutput(internal_state=",
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


def verify_anchors(anchors: Iterable[Anchor] = ANCHORS) -> None:
    """Raise :class:`AnchorError` if any anchor is broken (message lists all of them).

    Raises:
        UpstreamImportError: an upstream module could not be imported because a module it
            imports is missing (named in the message and in ``missing``); reported instead of
            the anchors, which cannot be checked until the installation is fixed.
        AnchorError: anchors missing or changed in the installed sglang.
    """
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
