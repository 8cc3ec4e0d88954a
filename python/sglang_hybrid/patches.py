"""Every hook the plugin puts on upstream SGLang, declared once (issue 43).

A :class:`Patch` names the upstream target, the hook type, our hook function
(``"module:attribute"``), why the patch exists and when it can go; optionally a
text snippet that must stay in the target's source, and further :class:`Anchor`
s on other upstream names the hook relies on. Both uses come from that one
declaration:

* :func:`register_patches` registers the hooks with upstream's ``HookRegistry``
  (or, for ``hook_type="resolution"``, with ``register_resolution_hook``);
  each module's ``install()`` calls it for the hooks that module defines, so
  when and whether a hook is installed (platform, environment switches) stays
  where it was;
* :func:`patch_anchors` turns the declarations into anchors, which
  ``anchors.verify_anchors`` checks at start-up together with the anchors that
  guard things other than hooks (``anchors.ANCHORS``: registries, attributes we
  overwrite, source text our code relies on). A missing target or snippet stops
  the process before any hook is applied.

``docs/patches.md`` is generated from :data:`PATCHES`
(``python -m sglang_hybrid.patches > docs/patches.md``); a test checks the
committed page matches. This module imports neither SGLang nor the modules it
names, so it can be read (and the page built) without either.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

HOOK_TYPES = ("before", "after", "around", "replace", "resolution")
"""``before`` / ``after`` / ``around`` / ``replace``: upstream's ``HookType``; ``resolution``:
a wrapper of a named server-argument resolution step (``register_resolution_hook``)."""


@dataclass(frozen=True)
class Anchor:
    """``target``: dotted path; ``snippet``: text its source must contain (optional); ``why``: what we do there."""

    target: str
    why: str
    snippet: Optional[str] = None


@dataclass(frozen=True)
class Patch:
    """One hook on upstream, declared once.

    Attributes:
        target: dotted path of the upstream function, method or class the hook wraps
            (a ``resolution`` hook: the step function, whose name is the step's).
        hook_type: one of :data:`HOOK_TYPES`.
        hook: ``"package.module:attribute"`` of our hook function (a class for a class ``replace``).
        why: what upstream does that we change, and why.
        remove_when: the upstream change after which the patch can go.
        snippet: text the target's source must contain (what the hook relies on), or None.
        also: anchors on other upstream names the hook relies on.

    Raises:
        ValueError: an empty ``target`` / ``why`` / ``remove_when``, a ``target`` without a dot,
            a ``hook_type`` not in :data:`HOOK_TYPES`, a ``hook`` not of the form ``module:attribute``,
            an empty ``snippet`` or an ``also`` entry that is not an :class:`Anchor`.
    """

    target: str
    hook_type: str
    hook: str
    why: str
    remove_when: str
    snippet: Optional[str] = None
    also: Tuple[Anchor, ...] = ()

    def __post_init__(self):
        if not isinstance(self.target, str) or "." not in self.target.strip(". "):
            raise ValueError(f"target: a dotted upstream path is required, got {self.target!r}")
        if self.hook_type not in HOOK_TYPES:
            raise ValueError(f"hook_type: {self.hook_type!r} is not one of {', '.join(HOOK_TYPES)}")
        module, _, attr = (self.hook if isinstance(self.hook, str) else "").partition(":")
        if not module or not attr or "." in attr:
            raise ValueError(f"hook: 'package.module:attribute' is required, got {self.hook!r}")
        for name in ("why", "remove_when"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"{name}: a non-empty text is required ({self.target})")
        if self.snippet is not None and not self.snippet.strip():
            raise ValueError(f"snippet: None or non-empty text, got {self.snippet!r} ({self.target})")
        if not isinstance(self.also, tuple) or not all(isinstance(a, Anchor) for a in self.also):
            raise ValueError(f"also: a tuple of Anchor is required ({self.target})")

    @property
    def module(self) -> str:
        """The module that defines the hook (and whose ``install()`` registers it)."""
        return self.hook.partition(":")[0]

    @property
    def attribute(self) -> str:
        """The hook's name inside :attr:`module`."""
        return self.hook.partition(":")[2]

    def anchors(self) -> Tuple[Anchor, ...]:
        """The anchors checked at start-up for this patch: its own target (and snippet), then :attr:`also`."""
        own = Anchor(self.target, f"{self.hook_type.upper()} hook {self.hook}: {self.why}", self.snippet)
        return (own,) + self.also

    def resolve_hook(self):
        """Our hook object (imports :attr:`module`).

        Raises:
            ValueError: the module has no attribute :attr:`attribute`.
        """
        module = sys.modules.get(self.module) or importlib.import_module(self.module)
        try:
            return getattr(module, self.attribute)
        except AttributeError:
            raise ValueError(f"hook: {self.module} has no attribute {self.attribute!r}") from None


_SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_LINEAR = "sglang.srt.layers.attention.linear"
_ATTN_WRAPPER = "sglang.srt.layers.attention.attention_registry.attn_backend_wrapper"
_TRITON = "sglang.srt.layers.attention.triton_backend"
_QSA = "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend"
_TOPK = "sglang.srt.layers.moe.topk"
_ATTN_RES = "sglang.srt.layers.attn_residual"
_PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
_EAGLE_V2 = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
_OURS = "sglang_hybrid"

_CLI_FLAGS_REMOVE = ("upstream lets a plugin add its own server arguments (a field on ServerArgs or "
                     "a plugin argument group that reaches the scheduler processes)")

PATCHES: Tuple[Patch, ...] = (
    # --- model backends (plugin.py) ---------------------------------------------------------------
    Patch(
        f"{_LINEAR}.kda_backend.KDAAttnBackend", "replace",
        f"{_OURS}.layers.attention.kda_backend:HybridKDAAttnBackend",
        "upstream's KDA kernels are Triton / CUDA only; our subclass runs the sgl_hybrid_kernel ops on CPU "
        "and writes the prefix-cache track snapshots in torch (on a GPU it defers to upstream)",
        "upstream's KDA backend has a CPU path that writes the track snapshots",
        also=(Anchor(_ATTN_WRAPPER, "upstream builds KDAAttnBackend for Kimi-Linear-family configs inside this "
                     "function (so the replaced class is the one built)",
                     snippet="linear_attn_backend = KDAAttnBackend(runner)"),),
    ),
    Patch(
        f"{_LINEAR}.gdn_backend.GDNAttnBackend", "replace",
        f"{_OURS}.layers.attention.gdn_backend:HybridGDNAttnBackend",
        "Qwen3.8's GDN layers need a CPU path (upstream's is Triton / CUDA only); on a GPU our subclass "
        "defers to upstream",
        "upstream's GDN backend has a CPU path",
        also=(Anchor(_ATTN_WRAPPER, "upstream builds GDNAttnBackend for hybrid GDN configs (Qwen4ExpTextConfig) "
                     "inside this function", snippet="linear_attn_backend = GDNAttnBackend(runner)"),),
    ),
    # --- request validation (entrypoints/validation.py) ----------------------------------------------
    Patch(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "before",
        f"{_OURS}.entrypoints.validation:check_input_ids_in_vocab",
        "prompts that crash upstream's scheduler (empty after tokenisation, token ids outside the vocabulary, "
        "logprob_start_len < -1) and n > 1 sampling under CPU speculation get HTTP 400 instead",
        "upstream validates these requests in the tokenizer manager",
        snippet="def _validate_one_request(",
    ),
    # --- --linear-attn-backend sgl_hybrid for KDA (layers/attention/kda_kernel.py) -------------------
    Patch(
        f"{_SERVER_ARGS}.add_cli_args", "after", f"{_OURS}.layers.attention.kda_kernel:_add_verify_choice",
        "the --linear-attn-verify-backend choices are a copy made at import, so the public "
        "add_linear_attn_kernel_backend_choices does not reach them; sgl_hybrid is added to that flag here",
        "upstream's verify flag reads the shared linear-attention backend choices",
        snippet="def add_cli_args(parser",
    ),
    Patch(
        "sglang.srt.arg_groups.overrides.supports_mamba_cache_extra_buffer", "around",
        f"{_OURS}.layers.attention.kda_kernel:_around_extra_buffer_check",
        "upstream allows the extra_buffer mamba radix-cache strategy only for the triton linear-attention "
        "backend; --linear-attn-backend sgl_hybrid writes the same snapshots and counts as triton",
        "upstream asks the backend whether it supports extra_buffer instead of comparing its name",
        snippet='return view.linear_attn_backend == "triton"',
        also=(Anchor("sglang.srt.arg_groups.overrides._mamba_radix_cache_resolution",
                     "the auto mamba radix-cache strategy resolves through supports_mamba_cache_extra_buffer",
                     snippet="supports_mamba_cache_extra_buffer(\n            view, hf_config\n        )"),),
    ),
    Patch(
        f"{_LINEAR}.kda_backend.KDAKernelDispatcher.__init__", "around",
        f"{_OURS}.layers.attention.kda_kernel:_around_dispatcher_init",
        "installs SglHybridKDAKernel for the phases whose --linear-attn-*-backend is sgl_hybrid",
        "upstream's KDA dispatcher takes kernels from a registry a plugin can add to",
        snippet="def __init__(",
    ),
    # --- --linear-attn-backend sgl_hybrid for GDN (layers/attention/gdn_kernel.py) -------------------
    Patch(
        f"{_LINEAR}.gdn_backend.GDNKernelDispatcher.__init__", "around",
        f"{_OURS}.layers.attention.gdn_kernel:_around_dispatcher_init",
        "installs SglHybridGDNKernel for the phases whose --linear-attn-*-backend is sgl_hybrid "
        "(tree verify stays upstream's)",
        "upstream's GDN dispatcher takes kernels from a registry a plugin can add to",
        snippet="self.tree_verify_kernel = triton_kernel",
    ),
    # --- sgl_hybrid_mla under DCP (layers/attention/dcp_merge_hook.py) -------------------------------
    Patch(
        f"{_TRITON}.cp_lse_ag_out_rs_mha", "around", f"{_OURS}.layers.attention.dcp_merge_hook:_around_cp_lse_ag_out_rs_mha",
        "under --attention-backend sgl_hybrid_mla the DCP merge of partial attention outputs is an all-to-all "
        "of head groups plus our exact LSE merge instead of upstream's all-gather + reduce-scatter",
        "upstream's MLA backends take the DCP merge from a pluggable communicator",
        snippet="return_lse: bool = False,",
        also=(
            Anchor(f"{_TRITON}.TritonAttnBackend.forward_decode",
                   "DCP decode merges all-head partials [R, H, D] through the hooked module-level name",
                   snippet="o = cp_lse_ag_out_rs_mha(o_for_decode, local_lse, group)"),
            Anchor(f"{_TRITON}.TritonAttnBackend._forward_extend_dcp",
                   "DCP extend merges the prefix partials through the hooked name (LSE returned)",
                   snippet="prefix_out, prefix_lse = cp_lse_ag_out_rs_mha(\n            prefix_out, prefix_lse, "
                           "group, return_lse=True\n        )"),
            Anchor(f"{_PARALLEL_STATE}.GroupCoordinator.all_to_all_single",
                   "the merge exchanges head groups with the DCP group's all_to_all_single(output, input)",
                   snippet="def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor):"),
            Anchor(f"{_PARALLEL_STATE}.GroupCoordinator._all_to_all_single",
                   "on CPU tensors the merge calls the body of the GPU-only custom op (all_to_all_single on the "
                   "gloo device_group)",
                   snippet="torch.distributed.all_to_all_single(output, input, group=self.device_group)"),
        ),
    ),
    # --- --attention-backend sgl_hybrid_qsa (layers/attention/qsa_backend.py) ------------------------
    Patch(
        f"{_QSA}._forward_paged_attention", "around", f"{_OURS}.layers.attention.qsa_backend:_around_paged",
        "decode and chain-verify rows run sgl_hybrid_kernel.qsa with upstream's per-row metadata",
        "upstream's QSA backend takes its paged-attention kernel from a registry a plugin can add to",
        snippet="def _forward_paged_attention(\n        self,\n        q: torch.Tensor,\n        layer,\n"
                "        forward_batch,\n        topk_indices: torch.Tensor,",
        also=(
            Anchor(_ATTN_WRAPPER, "upstream builds QwenSparseAttnBackend for Qwen3.8's QSA layers inside this "
                   "function", snippet="full_attn_backend = QwenSparseAttnBackend(runner)"),
            Anchor(f"{_QSA}._metadata_from_forward_batch",
                   "per-row metadata for speculative rows: one token_slot_table row and length (position + 1) "
                   "per query row", snippet="sequence_lengths = (logical_positions + 1).to(torch.int32)"),
        ),
    ),
    Patch(
        f"{_QSA}._try_fused_kv_attention", "around", f"{_OURS}.layers.attention.qsa_backend:_around_fused_kv",
        "returns None for the rows we serve, so upstream writes K/V and calls _forward_paged_attention (hooked)",
        "as for _forward_paged_attention",
        snippet="def _try_fused_kv_attention(self, q, k, v, layer, forward_batch, indices):",
    ),
    # --- MoE routing (layers/moe/routing_hook.py) ------------------------------------------------------
    Patch(
        f"{_TOPK}.biased_grouped_topk", "around", f"{_OURS}.layers.moe.routing_hook:_around_biased_grouped_topk",
        "Kimi K3's grouped sigmoid routing with correction bias runs on our kernel on GPU / ROCm "
        "(the platform's alias bound at import; CPU unchanged)",
        "upstream's TopK takes its routing kernel from a registry a plugin can add to",
        also=(
            Anchor(f"{_TOPK}.select_experts", "select_experts reaches the module-level name the hook wraps",
                   snippet="topk_weights, topk_ids = biased_grouped_topk("),
            Anchor(f"{_TOPK}.biased_grouped_topk_gpu", "the hook keeps upstream's (hidden_states, gating_output, "
                   "correction_bias, topk, ...) signature",
                   snippet="apply_routed_scaling_factor_on_output: Optional[bool] = False,"),
            Anchor("sglang.srt.models.kimi_k3.KimiK3MoE.__init__",
                   "Kimi K3 routes through upstream's TopK (grouped sigmoid with correction bias)",
                   snippet="self.topk = TopK("),
        ),
    ),
    Patch(
        f"{_TOPK}.fused_topk", "around", f"{_OURS}.layers.moe.routing_hook:_around_fused_topk",
        "Qwen3.8's softmax top-k routing runs on our kernel on GPU / ROCm (CPU unchanged)",
        "as for biased_grouped_topk",
        snippet="gating_output: torch.Tensor,",
        also=(Anchor(f"{_TOPK}.select_experts", "the softmax (Qwen) route goes through fused_topk",
                     snippet="topk_weights, topk_ids = fused_topk("),),
    ),
    # --- AttnRes + RMSNorm (layers/attn_res_hook.py) ---------------------------------------------------
    Patch(
        f"{_ATTN_RES}._aggregate", "around", f"{_OURS}.layers.attn_res_hook:_around_aggregate",
        "score -> softmax -> mix -> RMSNorm of the residual bank in one fused kernel (GPU / ROCm only)",
        "upstream fuses the aggregation or lets a plugin supply it",
        snippet="write_bank_row: bool = False,",
        also=(
            Anchor(f"{_ATTN_RES}.AttnResidual.forward",
                   "AttnResidual.forward calls the module-level aggregation functions the hooks wrap",
                   snippet="normed, prefix = _aggregate_fused_add("),
            Anchor("sglang.srt.layers.layer_boundary.residual.attn_bank.AttnBankState._aggregate",
                   "Kimi K3's residual stream reads go through AttnResidual.forward", snippet="return bank.forward("),
        ),
    ),
    Patch(
        f"{_ATTN_RES}._aggregate_fused_add", "around", f"{_OURS}.layers.attn_res_hook:_around_aggregate_fused_add",
        "the aggregation after a pending residual add on our fused kernel; returns (normed, prefix) (GPU / ROCm)",
        "as for _aggregate",
        snippet="prefix_b: torch.Tensor,",
    ),
    # --- Kimi K3 fused KDA decode (layers/attention/kda_fused_decode.py) -------------------------------
    Patch(
        "sglang.srt.models.kimi_k3.KimiK3DeltaAttention._prepare_fused_decode", "after",
        f"{_OURS}.layers.attention.kda_fused_decode:_after_prepare",
        "offers our one-launch fused KDA decode step the model's stash where our kernel's contract holds",
        "upstream's fused KDA decode covers every shape ours does at the same speed",
        snippet="self._kda_fused_decode_ready = True",
        also=(Anchor("sglang.srt.models.kimi_k3.KimiK3DeltaAttention.forward",
                     "the model offers the output-norm gate on the attention layer and skips o_norm when the "
                     "backend consumed it", snippet="fused_onorm = self.attn._k3_onorm_consumed"),),
    ),
    # --- hybrid radix cache (mem_cache/serving.py) -----------------------------------------------------
    Patch(
        "sglang.srt.mem_cache.registry.default_radix_cache_factory", "around",
        f"{_OURS}.mem_cache.serving:_default_factory",
        "our hybrid architectures get --radix-cache-backend hybrid by default",
        "upstream lets a model registration name its default radix-cache backend",
        snippet="def default_radix_cache_factory(ctx",
        also=(Anchor("sglang.srt.mem_cache.registry.create_unified_radix_cache",
                     "our factory builds HybridRadixCache through upstream's builder (components, HiCache checks)",
                     snippet="cache = (cache_class or UnifiedRadixCache)(params)"),),
    ),
    Patch(
        "sglang.srt.managers.schedule_policy.PrefillAdder._select_prefill_admission", "around",
        f"{_OURS}.mem_cache.serving:_split_at_branch_point",
        "a prefill chunk ends at the branch point, so branch point and prompt end both get recurrent checkpoints "
        "(upstream tracks only one per chunk and resumes the next turn one turn behind)",
        "upstream checkpoints both the branch point and the prompt end of a chunk",
        snippet="return _PrefillAdmission(",
        also=(Anchor(f"{_SCHEDULE_BATCH}._mamba_radix_cache_v2_req_prepare_for_extend",
                     "upstream tracks the branch point instead of the chunk end when it falls inside the chunk",
                     snippet="if req.mamba_branching_seqlen is not None:"),),
    ),
    Patch(
        f"{_SCHEDULE_BATCH}.prepare_for_extend", "after", f"{_OURS}.mem_cache.serving:_report_host_hits",
        "tokens the hybrid cache restored from its host tier move from the device to the host share of "
        "cached_tokens_details (upstream splits the prefix by tier once, on the first extend)",
        "upstream asks the radix cache for the per-tier split",
        snippet="req._cache_breakdown_computed = True",
    ),
    Patch(
        f"{_SERVER_ARGS}.add_cli_args", "after", f"{_OURS}.mem_cache.serving:_add_flag",
        "adds --radix-cache-backend upstream, --hybrid-device-cache-gb, --hybrid-host-cache-gb, --hybrid-store",
        _CLI_FLAGS_REMOVE,
    ),
    Patch(
        f"{_SERVER_ARGS}.from_cli_args", "before", f"{_OURS}.mem_cache.serving:_export_flag",
        "ServerArgs has no fields for the cache flags: they reach the scheduler processes as environment "
        "variables (checked at parse time)",
        _CLI_FLAGS_REMOVE,
        snippet="def from_cli_args(cls, args",
    ),
    # --- boot gates (boot/hooks.py) --------------------------------------------------------------------
    Patch(
        f"{_SERVER_ARGS}.add_cli_args", "after", f"{_OURS}.boot.hooks:_add_skip_flag",
        "adds --skip-boot-gates", _CLI_FLAGS_REMOVE,
    ),
    Patch(
        f"{_SERVER_ARGS}.from_cli_args", "before", f"{_OURS}.boot.hooks:_export_skip_flag",
        "ServerArgs has no --skip-boot-gates field: the launcher exports SGLANG_HYBRID_SKIP_BOOT_GATES=1, "
        "which every scheduler process inherits", _CLI_FLAGS_REMOVE,
    ),
    Patch(
        f"{_SERVER_ARGS}.from_cli_args", "before", f"{_OURS}.boot.hooks:_export_conv_dtype",
        "--dtype float32 sets SGLANG_MAMBA_CONV_DTYPE=float32 unless the user set it: upstream keeps the conv "
        "window in BF16 and its KDA extend then writes FP32 rows into it (index_put dtype error)",
        "upstream's conv window follows --dtype",
    ),
    Patch(
        f"{_MODEL_RUNNER}.load_model", "before", f"{_OURS}.boot.hooks:_before_load_model",
        "op table + boot gates once per scheduler process, after the device is set and before the weights load",
        "upstream offers a start-up hook between device set-up and weight loading",
        snippet="def load_model(self",
        also=(Anchor(f"{_MODEL_RUNNER}.initialize", "initialize calls load_model once the device is set",
                     snippet="self.load_model()"),),
    ),
    # --- speculative depth controller (speculative/controller_hooks.py) --------------------------------
    Patch(
        f"{_SERVER_ARGS}.add_cli_args", "after", f"{_OURS}.speculative.controller_hooks:add_cli_flag",
        "adds --speculative-depth-controller (and the benchmark-only --speculative-synthetic-acceptance)",
        _CLI_FLAGS_REMOVE,
    ),
    Patch(
        f"{_SERVER_ARGS}.from_cli_args", "after", f"{_OURS}.speculative.controller_hooks:keep_cli_choice",
        "stores the controller choice on the record (and in the environment)", _CLI_FLAGS_REMOVE,
    ),
    Patch(
        f"{_EAGLE_V2}.__init__", "after", f"{_OURS}.speculative.controller_hooks:install_policy",
        "replaces adaptive_controller.params (upstream's EMA depth policy) with the chosen controller",
        "upstream lets a plugin register a speculative depth policy",
        snippet="self.adaptive_controller = AdaptiveController(",
    ),
    Patch(
        f"{_EAGLE_V2}.forward_batch_generation", "around",
        f"{_OURS}.speculative.controller_hooks:around_forward_batch_generation",
        "hands the controller what upstream's policy call lacks: request ids of a decode batch, a timer mark at "
        "prefill",
        "upstream's depth policy call receives the batch",
        snippet="self.activate_step_by_batch(batch.seq_lens.shape[0])",
    ),
    Patch(
        "sglang.srt.speculative.eagle_utils.verify_tree_greedy_func", "around",
        f"{_OURS}.speculative.controlled_acceptance:around_verify_tree_greedy",
        "benchmark only: forces the accepted lengths when controlled acceptance is on (the name eagle_utils "
        "imports)",
        "the controller benchmarks no longer need forced acceptance",
    ),
    # --- Qwen3.8 precision paths (models/qwen38/precision.py) ------------------------------------------
    Patch(
        f"{_SERVER_ARGS}.add_cli_args", "after", f"{_OURS}.models.qwen38.precision:add_precision_flags",
        "adds --qwen38-fp8-residual-proj, --vocab-screening-topk, --vocab-screening-format", _CLI_FLAGS_REMOVE,
    ),
    Patch(
        f"{_SERVER_ARGS}.from_cli_args", "before", f"{_OURS}.models.qwen38.precision:export_precision_flags",
        "the precision flags reach the scheduler processes as environment variables", _CLI_FLAGS_REMOVE,
    ),
    # --- NaN guard (reliability/nan_guard.py) ----------------------------------------------------------
    Patch(
        f"{_MODEL_RUNNER}.sample", "before", f"{_OURS}.reliability.nan_guard:_before_sample",
        "rows of non-finite logits are zeroed and their request ids remembered (upstream asserts, killing "
        "every request, or samples garbage)",
        "upstream fails only the request whose logits are not finite",
        snippet="def sample(\n        self,\n        logits_output: LogitsProcessorOutput,\n"
                "        forward_batch: ForwardBatch,",
    ),
    Patch(
        f"{_SCHEDULER}.process_batch_result", "before", f"{_OURS}.reliability.nan_guard:_before_process_batch_result",
        "a request with non-finite logits gets FINISH_ABORT (HTTP 500) before its token is used",
        "as for ModelRunner.sample",
        snippet="def process_batch_result(",
        also=(Anchor("sglang.srt.managers.schedule_batch.FINISH_ABORT",
                     "the abort carries status_code / err_type to the tokenizer manager (HTTP 500)",
                     snippet="def __init__(self, message=None, status_code=None, err_type=None):"),),
    ),
    Patch(
        f"{_MODEL_RUNNER}.load_model", "after", f"{_OURS}.reliability.nan_guard:_attach_tracer",
        "forward hooks on each decoder layer's children name the first module whose output is not finite",
        "as for ModelRunner.sample",
    ),
    # --- idle pool audit (reliability/idle_audit.py, SGLANG_HYBRID_IDLE_AUDIT=1) -----------------------
    Patch(
        f"{_SCHEDULER}.on_idle", "after", f"{_OURS}.reliability.idle_audit:_after_on_idle",
        "free + evictable + locked == capacity and no lock held, KV and state pools, once per idle period",
        "upstream's invariant checker covers the hybrid cache's pools and locks",
        snippet="self.invariant_checker._check_all_pools(",
    ),
    # --- /get_server_info (entrypoints/server_info.py) -------------------------------------------------
    Patch(
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController."
        "get_internal_state", "after", f"{_OURS}.entrypoints.server_info:_after_get_internal_state",
        "adds internal_state['sglang_hybrid']: plugin version, kernel paths, kernel call counts",
        "upstream lets a plugin contribute to the server info",
        snippet="return GetInternalStateReqOutput(internal_state=",
    ),
    # --- --warmups sglang_hybrid (entrypoints/warmup.py) -----------------------------------------------
    Patch(
        f"{_SERVER_ARGS}.from_cli_args", "before", f"{_OURS}.entrypoints.warmup:_add_warmup",
        "our GPU kernel backends get the sglang_hybrid warm-up (chunked prefill, resumed extend, batched "
        "decode), which compiles the kernels upstream's 3-token warm-up leaves cold",
        "upstream's warm-up compiles the long-prompt kernels",
        also=(Anchor("sglang.srt.entrypoints.http_server._execute_server_warmup",
                     "upstream's own warm-up is one 3-token prompt", snippet="[10, 11, 12]"),),
    ),
    # --- layer taps (tools/layer_taps.py, SGLANG_HYBRID_LAYER_TAPS=DIR) --------------------------------
    Patch(
        f"{_MODEL_RUNNER}.load_model", "after", f"{_OURS}.tools.layer_taps:_attach",
        "attaches the per-layer taps of extend passes (debugging aid)",
        "upstream offers per-layer output dumps",
    ),
    Patch(
        "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph",
        "around", f"{_OURS}.tools.layer_taps:_prefill_graph_unless_tapped",
        "a pass the taps record runs eagerly: module hooks do not run inside a replayed CUDA graph",
        "as for ModelRunner.load_model (layer taps)",
        snippet="def can_run_graph(self, forward_batch",
    ),
    # --- CPU platform (platforms/cpu.py) ---------------------------------------------------------------
    Patch(
        "sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer", "replace",
        f"{_OURS}.platforms.cpu:_extra_buffer_supported",
        "CPU: the extra_buffer strategy is allowed (upstream allows it only on GPU platforms because its "
        "snapshot scatter is Triton; our KDA backend writes the snapshots in torch)",
        "upstream allows extra_buffer on CPU",
    ),
    Patch(
        "torch.Tensor.pin_memory", "around", f"{_OURS}.platforms.cpu:_pin_memory_without_gpu",
        "CPU: pin_memory is a no-op without a GPU; upstream pins the track mask unconditionally and a "
        "CUDA-build torch raises 'Found no NVIDIA driver'",
        "upstream guards the pin_memory call in prepare_for_decode",
        also=(Anchor(f"{_SCHEDULE_BATCH}.prepare_for_decode", "this pins the track mask unconditionally",
                     snippet="track_mask_cpu.pin_memory()"),),
    ),
    # --- commit after verify: GDN deferred commit, CPU torch scatter (layers/attention/gdn_deferred.py) ----
    Patch(
        "sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify", "around",
        f"{_OURS}.layers.attention.gdn_deferred:scatter_after_verify",
        "a GDN pool whose verify was deferred (token 0's state in the slot, records of the drafts in the scratch) "
        "is committed by replaying the accepted drafts, not by copying a snapshot that was never written; on CPU "
        "the accepted verify step is committed in torch (upstream's scatter is CUDA / XPU only)",
        "upstream's GDN verify takes a deferred-commit kernel through the kernel interface and its commit a CPU path",
        also=(Anchor("sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend."
                     "_scatter_speculative_state_with_mask", "the torch masked scatter the hook reuses",
                     snippet="dst[:, dst_indices[valid_indices]] = src["),),
    ),
    # --- CPU speculative decoding (platforms/cpu_spec.py) ----------------------------------------------
    Patch(
        f"{_QSA}._require_chain_speculation", "replace", f"{_OURS}.platforms.cpu_spec:require_chain_speculation_cpu",
        "CPU: keeps the topk = 1 check but not the compress-ratio width limit (our reference QSA has no key ring)",
        "upstream's width limit applies only where a key ring exists",
        snippet="draft_tokens > self.compress_ratio",
    ),
    Patch(
        "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding", "resolution",
        f"{_OURS}.platforms.cpu_spec:refuse_unsupported_cpu_speculation",
        "CPU: Kimi K3 with any --speculative-algorithm is refused in the launcher with one ValueError naming "
        "the flag (our CPU KDA backend has no target-verify path), instead of an unrelated error in the "
        "scheduler (issue 42 defect 3)",
        "our CPU KDA backend gets a target-verify path",
        also=(
            Anchor("sglang.srt.arg_groups.pipeline.run_resolution_pipeline",
                   "the step runs in the launcher, after the model config is known",
                   snippet="run_hook(handle_speculative_decoding, server_args)"),
            Anchor("sglang.srt.arg_groups.resolution_hooks.register_resolution_hook",
                   "upstream's plugin API for wrapping a named resolution step (it raises if the step is no "
                   "longer overridable)"),
        ),
    ),
    # --- CPU --tp > 1 and --dcp-size > 1 (parallel/cpu_tp.py) ------------------------------------------
    Patch(
        f"{_PARALLEL_STATE}.init_model_parallel_group", "around",
        f"{_OURS}.parallel.cpu_tp:_init_group_without_cuda_communicators",
        "CPU: groups are built without PyNccl / custom all-reduce (CUDA-only; a CUDA torch build loads libnccl)",
        "upstream skips the CUDA communicators on the CPU device",
        snippet='use_pynccl = not (_is_npu or _is_xpu or backend == "mooncake")',
    ),
    Patch(
        f"{_PARALLEL_STATE}.initialize_model_parallel", "around", f"{_OURS}.parallel.cpu_tp:_initialize_with_cpu_dcp",
        "CPU: the DCP platform guard (its module's only is_cuda() call) admits the CPU device",
        "upstream's DCP platform guard admits CPU",
        snippet="is_hip() or is_cuda() or _is_npu or _is_xpu",
    ),
)


def patches_of(module: str) -> List[Patch]:
    """The declared patches whose hook ``module`` defines, in declaration order.

    Raises:
        ValueError: ``module`` defines none.
    """
    found = [p for p in PATCHES if p.module == module]
    if not found:
        raise ValueError(f"module: no patch declares a hook in {module!r}")
    return found


def find_patch(hook: str) -> Patch:
    """The declaration of ``hook`` (``"module:attribute"``).

    Raises:
        ValueError: no patch declares ``hook``.
    """
    for p in PATCHES:
        if p.hook == hook:
            return p
    raise ValueError(f"hook: no patch declares {hook!r}")


_RESOLUTION_REGISTERED: set = set()


def register_patches(module: str, only: Optional[Iterable[str]] = None) -> List[Patch]:
    """Register the hooks ``module`` defines, as declared in :data:`PATCHES` (declaration order).

    ``only``: attribute names to restrict to (a module whose hooks are installed by separate
    switches). A ``resolution`` patch is registered once per process (upstream's registry appends,
    so a second wrapper would run twice); the ``HookRegistry`` ones on every call, as before.

    Returns:
        the patches registered.

    Raises:
        ValueError: ``module`` declares no hook, or ``only`` names one it does not declare.
    """
    chosen = patches_of(module)  # reads PATCHES at call time
    if only is not None:
        only = list(only)
        unknown = sorted(set(only) - {p.attribute for p in chosen})
        if unknown:
            raise ValueError(f"only: {module} declares no hook named {unknown}")
        chosen = [p for p in chosen if p.attribute in only]
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for p in chosen:
        fn = p.resolve_hook()
        if p.hook_type == "resolution":
            if p.hook in _RESOLUTION_REGISTERED:
                continue
            from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

            register_resolution_hook(p.target.rsplit(".", 1)[1])(fn)
            _RESOLUTION_REGISTERED.add(p.hook)
        else:
            HookRegistry.register(p.target, fn, HookType(p.hook_type))
    return chosen


def patch_anchors(patches: Optional[Iterable[Patch]] = None) -> List[Anchor]:
    """Every anchor the patches need checked, each patch's own target first (None: :data:`PATCHES`)."""
    return [a for p in (PATCHES if patches is None else patches) for a in p.anchors()]


def render_markdown(patches: Optional[Iterable[Patch]] = None) -> str:
    """``docs/patches.md``: one table row per patch (hook type, target, our hook, why, when to remove,
    anchors checked); None: :data:`PATCHES`."""
    patches = list(PATCHES if patches is None else patches)
    lines = [
        "# Patches on upstream SGLang",
        "",
        "<!-- generated by `python -m sglang_hybrid.patches > docs/patches.md`; edit "
        "python/sglang_hybrid/patches.py instead -->",
        "",
        f"Every hook the plugin puts on the pinned upstream SGLang: {len(patches)} patches, each declared once "
        "in `python/sglang_hybrid/patches.py`. The declaration gives both the hook registration (the module "
        "named in *hook* registers it from its `install()`) and the anchor check: at start-up "
        "`verify_anchors()` resolves the target and every name in *anchors*, and looks for each source "
        "snippet the declaration gives; a missing one stops the server with the list of broken anchors "
        "before any hook is applied ([cpu-platform.md](cpu-platform.md)). Anchors that guard other things "
        "(registries we add to, attributes we overwrite, upstream text our code relies on) are listed in "
        "`python/sglang_hybrid/anchors.py`. Names below drop the leading `sglang.srt.` (targets) and `sglang_hybrid.` (hooks).",
        "",
        "| # | patch | hook | why | remove when | anchors |",
        "|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(patches, 1):
        snippets = sum(a.snippet is not None for a in p.anchors())
        names = len({a.target for a in p.anchors()})
        cells = [str(i), f"{p.hook_type.upper()} `{_short(p.target)}`", f"`{_short(p.hook)}`", p.why,
                 p.remove_when, f"{names} name(s), {snippets} snippet(s)"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    return "\n".join(lines)


def _short(name: str) -> str:
    for prefix in ("sglang.srt.", "sglang_hybrid."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
