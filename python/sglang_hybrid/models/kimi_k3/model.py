"""Kimi K3 text model, plain-torch reference (CPU device only).

Same architecture name (``KimiK3LinearForCausalLM``), config class (upstream's
``KimiLinearConfig``) and checkpoint names as upstream SGLang 0.5.23's
``models/kimi_k3.py``. Layer pattern from ``linear_attn_config``
(``kda_layers`` / ``full_attn_layers``, 1-based); MoE from
``first_k_dense_replace`` on, every ``moe_layer_freq`` layers.

Attention residuals (``attn_res_block_size = B``): the residual stream is a bank
of snapshots plus the running partial sum of the current block. Every read
(attention input, FFN input, final norm) mixes ``[bank..., partial +
contribution]`` with softmax weights (``sgl_hybrid_kernel.attn_res``) and then
applies the read's RMSNorm. Layer ``i`` with ``i % B == 0`` moves the partial
sum it reads into the bank and restarts it. Without ``attn_res_block_size`` the
model uses the ordinary pre-norm residual.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sgl_hybrid_kernel.attn_res.reference import attn_res_mix
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.norm.reference import rms_norm
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_context import get_attn_backend

from sglang_hybrid.models.kimi_k3.kda import KimiK3KDA, _param
from sglang_hybrid.models.kimi_k3.mla import KimiK3MLA
from sglang_hybrid.models.kimi_k3.moe import KimiK3MoE, SwiGLUMLP
from sglang_hybrid.models.kimi_k3.weights import ShardSpec, load_checkpoint
from sglang_hybrid.parallel.spec import ParallelSpec, check_heads_divide

logger = logging.getLogger(__name__)

# Test-only fault injection for the NaN guard (issue 11; python/sglang_hybrid/reliability/nan_guard.py):
# "<layer>:<token id>" puts NaN into the attention input of decoder layer <layer> at every
# prompt position (extend passes) whose input token is <token id>; a decode step whose sampled input
# token happens to be <token id> is left alone (the tiny test models sample it now and then, which made
# unrelated requests of the reliability tests fail). Unset (always, outside tests): no effect.
TEST_INJECT_NAN_ENV = "SGLANG_HYBRID_TEST_INJECT_NAN"


def _parse_test_nan_injection() -> Optional[Tuple[int, int]]:
    spec = os.environ.get(TEST_INJECT_NAN_ENV)
    if not spec:
        return None
    try:
        layer, token = (int(x) for x in spec.split(":"))
    except ValueError as exc:
        raise ValueError(f"{TEST_INJECT_NAN_ENV} must be '<layer>:<token id>', got {spec!r}") from exc
    logger.warning("%s=%s: NaN will be injected (test-only fault injection)", TEST_INJECT_NAN_ENV, spec)
    return layer, token


def _inject_nan_for_test(x: torch.Tensor, input_ids: torch.Tensor, layer_id: int, spec, forward_batch=None) -> torch.Tensor:
    if spec is None or spec[0] != layer_id or input_ids is None:
        return x
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is not None and mode.is_decode():
        return x
    hit = input_ids == spec[1]
    return x.masked_fill(hit[:, None], float("nan")) if bool(hit.any()) else x


def is_moe_layer(config, layer_id: int) -> bool:
    """Upstream's rule: MoE past the dense prefix, on the MoE cadence."""
    return (
        config.num_experts is not None
        and layer_id >= config.first_k_dense_replace
        and layer_id % config.moe_layer_freq == 0
    )


class _ResidualScore(nn.Module):
    """The scoring pair of one AttnRes read: an RMSNorm weight and a ``[1, D]`` projection."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.norm = _param(hidden_size)
        self.proj = _param(1, hidden_size)


class _ReplicatedTable(nn.Module):
    """A ``[vocab, D]`` table held whole on every rank (model-level TP runs, issue 8).

    Used for the embedding and LM head when a ``ParallelSpec`` is given: the
    vocabulary split is upstream's ``VocabParallelEmbedding`` / ``ParallelLMHead``
    job when served, and is not what the TP/DCP tests compare.
    """

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = _param(vocab_size, hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(input_ids, self.weight)


class KimiK3DecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int, parallel: Optional[ParallelSpec] = None):
        super().__init__()
        self.layer_id = layer_id
        self.is_kda = config.is_kda_layer(layer_id)
        attn_cls = KimiK3KDA if self.is_kda else KimiK3MLA
        self.self_attn = attn_cls(config, layer_id, parallel)
        if is_moe_layer(config, layer_id):
            self.mlp = KimiK3MoE(config, parallel)
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, parallel)
        self.input_layernorm = _param(config.hidden_size)
        self.post_attention_layernorm = _param(config.hidden_size)
        self.block_size = config.attn_res_block_size
        if self.block_size is not None:
            self.attn_score = _ResidualScore(config.hidden_size)
            self.mlp_score = _ResidualScore(config.hidden_size)
            self.writes_block = layer_id % self.block_size == 0

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        m = dict(self.self_attn.checkpoint_mapping(f"{prefix}.self_attn"))
        m.update(self.mlp.checkpoint_mapping(f"{prefix}.mlp"))
        for n in ("input_layernorm", "post_attention_layernorm"):
            m[f"{prefix}.{n}.weight"] = ShardSpec(f"{prefix}.{n}")
        if self.block_size is not None:
            for ckpt, ours in (("self_attention_res", "attn_score"), ("mlp_res", "mlp_score")):
                m[f"{prefix}.{ckpt}_norm.weight"] = ShardSpec(f"{prefix}.{ours}.norm")
                m[f"{prefix}.{ckpt}_proj.weight"] = ShardSpec(f"{prefix}.{ours}.proj")
        return m

    def run_attention(self, x, forward_batch, kv_pool, req_to_token):
        if self.is_kda:
            return self.self_attn(x, forward_batch)
        return self.self_attn(x, forward_batch, kv_pool, req_to_token)


class _ResidualStream:
    """The AttnRes bank of one forward pass (see module docstring)."""

    def __init__(self, eps: float):
        self.eps = eps
        self.bank: List[torch.Tensor] = []
        self.partial: Optional[torch.Tensor] = None

    def read(self, contribution: torch.Tensor, score: _ResidualScore, norm_weight, write: bool) -> torch.Tensor:
        head = contribution if self.partial is None else self.partial + contribution
        mixed = attn_res_mix(torch.stack(self.bank + [head], dim=1), score.norm, score.proj, self.eps)
        if write:
            self.bank.append(head)
            self.partial = None
        else:
            self.partial = head
        return rms_norm(mixed, norm_weight, self.eps)


def kimi_k3_head_counts(config) -> Dict[str, int]:
    """The checkpoint's head counts TP splits: MLA query heads (``original_num_attention_heads`` when
    upstream padded them for its CPU TP kernels) and KDA heads (``linear_attn_config num_heads``)."""
    heads = {"num_attention_heads": getattr(config, "original_num_attention_heads", None) or config.num_attention_heads}
    la = getattr(config, "linear_attn_config", None)
    if la and la.get("num_heads") is not None:
        heads["linear_attn_config num_heads"] = la["num_heads"]
    return heads


class KimiK3ReferenceModel(nn.Module):
    def __init__(self, config, parallel: Optional[ParallelSpec] = None, served: bool = True):
        super().__init__()
        if parallel is not None:
            check_heads_divide(parallel.tp_size, kimi_k3_head_counts(config), "Kimi K3")
        self.config = config
        if served:
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        else:
            self.embed_tokens = _ReplicatedTable(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([KimiK3DecoderLayer(config, i, parallel) for i in range(config.num_hidden_layers)])
        self.norm = _param(config.hidden_size)
        if config.attn_res_block_size is not None:
            self.output_score = _ResidualScore(config.hidden_size)
        self._test_nan = _parse_test_nan_injection()

    def checkpoint_mapping(self) -> Dict[str, ShardSpec]:
        m = {"model.embed_tokens.weight": ShardSpec("model.embed_tokens.weight"), "model.norm.weight": ShardSpec("model.norm")}
        for i, layer in enumerate(self.layers):
            m.update(layer.checkpoint_mapping(f"model.layers.{i}"))
        if self.config.attn_res_block_size is not None:
            m["model.output_attn_res_norm.weight"] = ShardSpec("model.output_score.norm")
            m["model.output_attn_res_proj.weight"] = ShardSpec("model.output_score.proj")
        return m

    def forward(self, input_ids: torch.Tensor, forward_batch, input_embeds=None) -> torch.Tensor:
        backend = get_attn_backend()
        kv_pool, req_to_token = backend.token_to_kv_pool, backend.req_to_token_pool.req_to_token
        h = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        eps = self.config.rms_norm_eps
        if self.config.attn_res_block_size is None:
            for layer in self.layers:
                x = _inject_nan_for_test(rms_norm(h, layer.input_layernorm, eps), input_ids, layer.layer_id, self._test_nan,
                                         forward_batch)
                h = h + layer.run_attention(x, forward_batch, kv_pool, req_to_token)
                h = h + layer.mlp(rms_norm(h, layer.post_attention_layernorm, eps))
            return rms_norm(h, self.norm, eps)
        stream = _ResidualStream(eps)
        contribution = h
        for layer in self.layers:
            x = stream.read(contribution, layer.attn_score, layer.input_layernorm, write=layer.writes_block)
            x = _inject_nan_for_test(x, input_ids, layer.layer_id, self._test_nan, forward_batch)
            a = layer.run_attention(x, forward_batch, kv_pool, req_to_token)
            x = stream.read(a, layer.mlp_score, layer.post_attention_layernorm, write=False)
            contribution = layer.mlp(x)
        return stream.read(contribution, self.output_score, self.norm, write=False)


class KimiK3ReferenceForCausalLM(nn.Module):
    """Plain-torch Kimi K3 causal LM served by upstream SGLang on CPU.

    ``forward(input_ids [N], positions [N], forward_batch)`` returns upstream's
    ``LogitsProcessorOutput``. Limits (each raises ``NotImplementedError`` at
    construction): SiLU experts, sigmoid routing, full-rank KDA output gate.

    ``parallel`` (issue 8, docs/parallelism.md): a ``ParallelSpec`` builds this
    rank's TP / DCP shard of the model for model-level runs
    (``sglang_hybrid.parallel.runner``); the embedding and LM head are then
    replicated and ``forward`` is not used (no upstream logits processor).
    ``None`` (the server path) takes the placement from upstream's TP group
    (``ParallelSpec.from_sglang``; ``--tp t`` shards heads, experts and the
    vocabulary as in the model-level runs; ``--dcp-size c`` shards the MLA KV
    by position over upstream's DCP group, docs/parallelism.md).
    """

    def __init__(self, config, quant_config=None, prefix: str = "", parallel: Optional[ParallelSpec] = None):
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError("the Kimi K3 CPU reference model runs unquantized weights only")
        served = parallel is None
        if served:
            # Served (``--tp t``): this rank's shard on upstream's TP group; the
            # vocabulary is split by upstream's VocabParallelEmbedding / ParallelLMHead.
            parallel = ParallelSpec.from_sglang(allow_dcp=True)
        self.parallel = parallel
        self.config = config
        if served and parallel.dcp_size > 1:
            logger.info(
                "Kimi K3 reference: TP rank %d/%d, DCP rank %d/%d: this rank stores the MLA KV of positions "
                "p mod %d == %d and merges (output, LSE) over upstream's DCP group",
                parallel.tp_rank, parallel.tp_size, parallel.dcp_rank, parallel.dcp_size, parallel.dcp_size,
                parallel.dcp_rank,
            )
        for op in ("mla_attention", "moe_routing", "moe_experts", "attn_res_mix", "rms_norm"):
            record_choice(op, "torch", "Kimi K3 CPU reference model (plain-torch oracle)", log=logger)
        self.model = KimiK3ReferenceModel(config, parallel, served)
        if served:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        else:
            self.lm_head = _ReplicatedTable(config.vocab_size, config.hidden_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.logits_processor = LogitsProcessor(config) if served else None
        self.start_layer, self.end_layer = 0, config.num_hidden_layers

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        hidden = self.model(input_ids, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def checkpoint_mapping(self) -> Dict[str, ShardSpec]:
        m = self.model.checkpoint_mapping()
        if not getattr(self.config, "tie_word_embeddings", False):
            m["lm_head.weight"] = ShardSpec("lm_head.weight")
        return m

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        """Load upstream-named checkpoint tensors; raises ``ValueError`` on any mismatch."""
        return load_checkpoint(self, weights, self.checkpoint_mapping())

