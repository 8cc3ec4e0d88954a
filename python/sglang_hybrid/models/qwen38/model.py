"""Qwen3.8-Flash-Next text model, plain-torch reference (CPU device only).

Same architecture name (``Qwen4ExpForConditionalGeneration``), config class
(upstream's ``Qwen4ExpConfig``, model type ``qwen4_exp``, text part
``Qwen4ExpTextConfig``) and checkpoint names as upstream SGLang 0.5.23's
``models/qwen4_exp.py``; text only (run the server with ``--language-model-only``).

Layer ``i`` (``layer_types[i]``: ``linear_attention`` = GDN, otherwise QSA)::

    streams  = hc copies of embed(tokens)                            [N, hc * D]
    streams += PLE(streams)                  if i + 1 in ple_layer_ids
    x, n     = attn_hyper_connection.mix(streams)
    streams  = attn_hyper_connection.combine(GDN(x) or QSA(x), streams, n)
    x, n     = mlp_hyper_connection.mix(streams)
    streams  = mlp_hyper_connection.combine(MoE(x), streams, n)
    hidden   = hyper_connection_mixer.mix(streams)  ->  lm_head     (no final norm)

State per request lives in upstream's pools, addressed by the request's mamba
slot: GDN conv window and recurrent state (through the GDN backend), the PLE
short-conv windows and the n-gram token context (upstream's PLE side pools);
QSA K/V in the KV pool. With the ``extra_buffer`` cache strategy every side
state is also snapshotted at the 64-token track boundary, as upstream does.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sgl_hybrid_kernel.dispatch import record_choice
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_context import get_attn_backend

from sglang_hybrid.models.kimi_k3.weights import ShardSpec, load_checkpoint
from sglang_hybrid.models.qwen38.gdn import Qwen38GatedDeltaNet
from sglang_hybrid.models.qwen38.hyper import GatedStreams, widen
from sglang_hybrid.models.qwen38.moe import Qwen38MoE
from sglang_hybrid.models.qwen38.ple import PLELayer
from sglang_hybrid.models.qwen38.precision import apply_precision_paths
from sglang_hybrid.models.qwen38.qsa import Qwen38QSA
from sglang_hybrid.parallel.qwen38_tp import check_qwen38_heads, checkpoint_sized_config, shard_qwen38_text_model
from sglang_hybrid.parallel.spec import ParallelSpec

logger = logging.getLogger(__name__)

CKPT_LM = "model.language_model."  # Qwen3.5 / Qwen4-Exp VL checkpoints; normalised to "model."


def text_config_of(config):
    """The text part of a ``Qwen4ExpConfig`` (or the config itself if already text-only)."""
    return getattr(config, "text_config", None) or config


def is_linear_layer(config, layer_id: int) -> bool:
    return config.layers_block_type[layer_id] == "linear_attention"


class Qwen38DecoderLayer(nn.Module):
    """One decoder layer: optional PLE, GDN or QSA, MoE, two gated stream sites."""

    def __init__(self, config, layer_id: int, ple_index: Optional[int] = None, force_attention: bool = False):
        super().__init__()
        self.layer_id = layer_id
        self.is_linear = (not force_attention) and is_linear_layer(config, layer_id)
        hc, D, r, eps = config.hc_count, config.hidden_size, config.hc_lowrank, config.rms_norm_eps
        self.ple = PLELayer(config, ple_index) if ple_index is not None else None
        if self.is_linear:
            self.linear_attn = Qwen38GatedDeltaNet(config, layer_id)
        else:
            self.self_attn = Qwen38QSA(config, layer_id)
        self.mlp = Qwen38MoE(config)
        self.attn_hyper_connection = GatedStreams(hc, D, r, eps)
        self.mlp_hyper_connection = GatedStreams(hc, D, r, eps)

    def checkpoint_mapping(self, ckpt: str, me: str) -> Dict[str, ShardSpec]:
        m: Dict[str, ShardSpec] = {}
        if self.is_linear:
            m.update(self.linear_attn.checkpoint_mapping(f"{ckpt}.linear_attn", f"{me}.linear_attn"))
        else:
            m.update(self.self_attn.checkpoint_mapping(f"{ckpt}.self_attn", f"{me}.self_attn"))
        m.update(self.mlp.checkpoint_mapping(f"{ckpt}.mlp", f"{me}.mlp"))
        for site in ("attn_hyper_connection", "mlp_hyper_connection"):
            m.update(getattr(self, site).checkpoint_mapping(f"{ckpt}.{site}", f"{me}.{site}"))
        if self.ple is not None:
            m.update(self.ple.checkpoint_mapping(f"{ckpt}.ple", f"{me}.ple"))
        return m

    def mix_attention_ffn(self, streams: torch.Tensor, attention) -> torch.Tensor:
        """The layer after its PLE step: ``attention`` maps ``[N, D] -> [N, D]``."""
        x, n = self.attn_hyper_connection.mix(streams)
        streams = self.attn_hyper_connection.combine(attention(x), streams, n)
        x, n = self.mlp_hyper_connection.mix(streams)
        return self.mlp_hyper_connection.combine(self.mlp(x), streams, n)


class _PLEBatch:
    """Per-forward PLE bookkeeping: each request's slot, token range and n-gram context."""

    def __init__(self, model: "Qwen38TextModel", input_ids: torch.Tensor, forward_batch, pool):
        self.pool = pool
        self.decode = forward_batch.forward_mode.is_decode()
        # Speculative verify: rows continue from the slot; per-step states go to the
        # pool's intermediate caches and upstream commits the accepted step's.
        self.verify = forward_batch.forward_mode.is_target_verify()
        B = forward_batch.req_pool_indices.shape[0]
        if self.verify:
            self.lens = [input_ids.shape[0] // B] * B if B else []
        else:
            self.lens = [1] * B if self.decode else list(forward_batch.extend_seq_lens_cpu)
        self.fresh = [False] * B if (self.decode or self.verify) else [p == 0 for p in forward_batch.extend_prefix_lens_cpu]
        self.slots = pool.translate_mamba_indices(pool.get_mamba_indices(forward_batch.req_pool_indices)).long().tolist()
        n, eos = model.ngram_size, model.eos
        history = pool.get_ngram_context(torch.tensor(self.slots, dtype=torch.long))
        self.contexts: List[torch.Tensor] = []
        windows, start = [], 0
        for i, length in enumerate(self.lens):
            hist = torch.full((n - 1,), eos, dtype=torch.long) if self.fresh[i] else history[i].long()
            ctx = torch.cat([hist, input_ids[start : start + length].long()])
            start += length
            self.contexts.append(ctx)
            windows.append(ctx.unfold(0, n, 1))
        self.windows = torch.cat(windows) if windows else torch.empty(0, n, dtype=torch.long)
        # Track snapshots (extra_buffer): destination slot and tokens covered, per tracked request.
        self.track: Dict[int, Tuple[int, int]] = {}
        mask = forward_batch.mamba_track_mask
        if mask is not None and forward_batch.mamba_track_indices is not None and not self.verify:
            aligned = None if self.decode else forward_batch.mamba_track_aligned_lens()
            if self.decode or aligned is not None:
                for i in mask.nonzero(as_tuple=True)[0].tolist():
                    off = self.lens[i] if self.decode else min(max(int(aligned[i]), 0), self.lens[i])
                    self.track[i] = (int(forward_batch.mamba_track_indices[i]), off)

    def run_layer(self, layer: Qwen38DecoderLayer, streams: torch.Tensor) -> torch.Tensor:
        """Add ``layer``'s PLE contribution to ``streams``, updating its short-conv windows."""
        ple = layer.ple
        conv = self.pool.short_conv_layer_cache(layer.layer_id)  # [slots, C, S]
        out = torch.empty_like(streams)
        start = 0
        for i, length in enumerate(self.lens):
            sl = slice(start, start + length)
            start += length
            state = None if self.fresh[i] else conv[self.slots[i]].t()
            out[sl], xx = ple.forward_sequence(streams[sl], self.windows[sl], state)
            if self.verify:
                # Window after step j (j + 1 tokens) into scratch row i; the slot is untouched.
                steps = self.pool.short_conv_layer_intermediate_cache(layer.layer_id)  # [rows, steps, C, S]
                for j in range(length):
                    steps[i, j] = xx[j + 1 : j + 1 + ple.state_len].t().to(steps.dtype)
                continue
            conv[self.slots[i]] = xx[length:].t().to(conv.dtype)
            if i in self.track:
                dst, off = self.track[i]
                conv[dst] = xx[off : off + ple.state_len].t().to(conv.dtype)
        return streams + out

    def commit(self, context_len: int) -> None:
        """Store each request's last ``ngram_size - 1`` tokens (and the tracked snapshots);
        in verify, the context after every step into the intermediate rows instead."""
        if self.verify:
            if self.contexts:
                steps = torch.stack([ctx.unfold(0, context_len, 1)[1:] for ctx in self.contexts])  # [B, steps, n-1]
                self.pool.set_ngram_intermediate_context(steps)
            return
        for i, ctx in enumerate(self.contexts):
            self.pool.set_ngram_context(torch.tensor([self.slots[i]]), ctx[-context_len:].unsqueeze(0))
            if i in self.track:
                dst, off = self.track[i]
                self.pool.set_ngram_context(torch.tensor([dst]), ctx[off : off + context_len].unsqueeze(0))


class Qwen38TextModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hc = config.hc_count
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        ple_ids = sorted(set(int(i) for i in (config.ple_layer_ids or [])))
        self.layers = nn.ModuleList(
            [
                Qwen38DecoderLayer(config, i, ple_ids.index(i + 1) if (i + 1) in ple_ids else None)
                for i in range(config.num_hidden_layers)
            ]
        )
        self.hyper_connection_mixer = GatedStreams(
            config.hc_count, config.hidden_size, config.hc_lowrank, config.rms_norm_eps, combine=False
        )
        self.has_ple = bool(ple_ids)
        self.ngram_size = int(config.ngram_size)
        eos = config.eos_token_id
        self.eos = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else -1

    def checkpoint_mapping(self) -> Dict[str, ShardSpec]:
        m = {"model.embed_tokens.weight": ShardSpec("model.embed_tokens.weight")}
        for i, layer in enumerate(self.layers):
            m.update(layer.checkpoint_mapping(f"model.layers.{i}", f"model.layers.{i}"))
        m.update(self.hyper_connection_mixer.checkpoint_mapping("model.hyper_connection_mixer", "model.hyper_connection_mixer"))
        return m

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(hidden [N, D] for the LM head, streams [N, hc * D] after the last layer)``."""
        backend = get_attn_backend()
        kv_pool, pool = backend.token_to_kv_pool, backend.req_to_token_pool
        req_to_token = pool.req_to_token
        h = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        # An MTP draft hands in streams that are already widened.
        streams = h if h.shape[-1] == self.hc * self.config.hidden_size else widen(h, self.hc)
        if positions.dim() == 2:
            positions = positions[0]
        ple = _PLEBatch(self, input_ids, forward_batch, pool) if (self.has_ple and streams.shape[0]) else None
        for layer in self.layers:
            if ple is not None and layer.ple is not None:
                streams = ple.run_layer(layer, streams)
            if layer.is_linear:
                attention = lambda x, layer=layer: layer.linear_attn(x, forward_batch)
            else:
                attention = lambda x, layer=layer: layer.self_attn(x, positions, forward_batch, kv_pool, req_to_token)
            streams = layer.mix_attention_ffn(streams, attention)
        if ple is not None:
            ple.commit(self.ngram_size - 1)
        hidden, _ = self.hyper_connection_mixer.mix(streams)
        return hidden, streams


class Qwen38ReferenceForConditionalGeneration(nn.Module):
    """Plain-torch Qwen3.8-Flash-Next causal LM served by upstream SGLang on CPU.

    ``forward(input_ids [N], positions [N], forward_batch)`` returns upstream's
    ``LogitsProcessorOutput``. Limits (each raises ``NotImplementedError`` at
    construction): unquantized weights, text only, SiLU experts,
    default 1-D RoPE, ``--dcp-size 1``. ``--tp t`` (issue 8): the blocks are cut
    to this rank after loading (``sglang_hybrid.parallel.qwen38_tp``; GDN heads
    and their states, QSA query heads, MoE intermediate), the vocabulary is split
    by upstream's layers (docs/parallelism.md). The MTP head (``mtp.*`` tensors) is
    :class:`sglang_hybrid.models.qwen38.mtp.Qwen38ReferenceMTP`; this class
    skips those tensors as upstream's target model does.
    """

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError("the Qwen3.8 CPU reference model runs unquantized weights only")
        # --tp t (issue 8): upstream's TP group; the vocabulary is split by upstream's
        # VocabParallelEmbedding / ParallelLMHead, the blocks are cut after loading.
        self.parallel = ParallelSpec.from_sglang()
        self.config = config
        # The checkpoint's head counts / intermediates (upstream pads them for its CPU TP kernels).
        text = checkpoint_sized_config(text_config_of(config))
        check_qwen38_heads(text, self.parallel.tp_size)  # before any weight: the fields by name, not a shape mismatch
        self.text_config = text
        for op in ("qsa_attention", "qsa_select", "moe_routing", "moe_experts", "hyper_connection", "ple"):
            record_choice(op, "torch", "Qwen3.8 CPU reference model (plain-torch oracle)", log=logger)
        self.model = Qwen38TextModel(text)
        self.lm_head = ParallelLMHead(text.vocab_size, text.hidden_size)
        if getattr(text, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.logits_processor = LogitsProcessor(text)
        self.precision = apply_precision_paths(self, logger)  # FP8 projections / vocab screening flags (issue 6)
        self.start_layer, self.end_layer = 0, text.num_hidden_layers

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_embed_and_head(self):
        return self.model.embed_tokens.weight, self.lm_head.weight

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        hidden, streams = self.model(input_ids, positions, forward_batch, input_embeds)
        out = self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)
        capture = forward_batch.capture_hidden_mode
        if capture is not None and capture.need_capture():
            # The MTP draft reads the residual streams [N, hc * D], as upstream's Qwen4-Exp hands them over.
            out.hidden_states = streams
        return out

    def checkpoint_mapping(self) -> Dict[str, ShardSpec]:
        m = self.model.checkpoint_mapping()
        if not getattr(self.text_config, "tie_word_embeddings", False):
            m["lm_head.weight"] = ShardSpec("lm_head.weight")
        return m

    @staticmethod
    def target_weights(weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterable[Tuple[str, torch.Tensor]]:
        """The target model's tensors with names normalised (``model.language_model.`` -> ``model.``);
        MTP (``mtp.*``) and vision-tower tensors are left out, as upstream's target model does."""
        for name, tensor in weights:
            if name.startswith("mtp.") or name.startswith("model.visual.") or name.startswith("visual."):
                continue
            yield (("model." + name[len(CKPT_LM) :]) if name.startswith(CKPT_LM) else name), tensor

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        """Load upstream-named checkpoint tensors, then cut the blocks to this TP rank.

        Under ``--tp t`` the whole checkpoint is loaded and then cut in place by
        ``shard_qwen38_text_model`` (GDN heads and their states, QSA query heads,
        MoE intermediate; docs/parallelism.md); the embedding and LM head are
        vocab-split by upstream's layers while loading.

        Raises:
            ValueError: any checkpoint mismatch; a second load after the blocks
                were cut (the cut shapes no longer match the checkpoint).
        """
        if getattr(self.model, "parallel", None) is not None and self.parallel.tp_size > 1:
            raise ValueError("weights can be loaded once under --tp > 1 (the blocks are already cut)")
        written = load_checkpoint(self, self.target_weights(weights), self.checkpoint_mapping())
        shard_qwen38_text_model(self.model, self.parallel)
        return written
