"""Multi-token-prediction (MTP) head of Qwen3.8-Flash-Next (upstream ``Qwen4ExpForCausalLMMTP``).

The draft for position ``t + 2`` reads the target's residual streams at ``t``
(``[hc * D]``, before the final read) and the embedding of token ``t + 1``::

    e  = fc_embedding(GemmaRMSNorm(embed(tok_{t+1})))                    [D]
    s  = fc_hidden(view(GemmaRMSNorm_{hc*D}(streams_t), [hc, D]))        [hc, D], shared per stream
    s' = layer(e + s)        one QSA decoder layer with its own gated stream sites and MoE
    logits = lm_head(hyper_connection_mixer.mix(s'))                     embed / lm_head shared with the target

Article 002 drafts up to 4 tokens by applying the head repeatedly (each step
feeds its own streams and its drafted token back). This module computes the
head over a whole sequence without a cache (:meth:`Qwen38ReferenceMTP.draft_logits`);
upstream's speculative worker serves it on CPU through
:class:`sglang_hybrid.models.qwen38.mtp_draft.Qwen38ReferenceMTPForCausalLM`.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from sglang_hybrid.models.kimi_k3.weights import ShardSpec, load_checkpoint
from sglang_hybrid.models.qwen38.hyper import GatedStreams, _param, grouped_rms_norm
from sglang_hybrid.models.qwen38.model import Qwen38DecoderLayer, text_config_of


class Qwen38ReferenceMTP(nn.Module):
    """The MTP head (module docstring). ``embed`` ``[V, D]`` and ``lm_head`` ``[V, D]`` are the
    target's tensors (:meth:`set_embed_and_head`), as upstream shares them."""

    def __init__(self, config):
        super().__init__()
        text = text_config_of(config)
        if not getattr(text, "num_nextn_predict_layers", 0):
            raise ValueError("config has no MTP layer (num_nextn_predict_layers = 0)")
        self.hc, self.D, self.eps = text.hc_count, text.hidden_size, text.rms_norm_eps
        self.fc_embedding = _param(self.D, self.D)
        self.fc_hidden = _param(self.D, self.D)
        self.pre_fc_norm_embedding = _param(self.D)
        self.pre_fc_norm_hidden = _param(self.hc * self.D)
        self.layer = Qwen38DecoderLayer(text, 0, None, force_attention=True)
        self.hyper_connection_mixer = GatedStreams(self.hc, self.D, text.hc_lowrank, self.eps, combine=False)
        self.embed: Optional[torch.Tensor] = None
        self.lm_head: Optional[torch.Tensor] = None

    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        self.embed, self.lm_head = embed, head

    def checkpoint_mapping(self) -> Dict[str, ShardSpec]:
        m = {f"mtp.{n}.weight": ShardSpec(n) for n in ("fc_embedding", "fc_hidden", "pre_fc_norm_embedding", "pre_fc_norm_hidden")}
        m.update(self.layer.checkpoint_mapping("mtp.layers.0", "layer"))
        m.update(self.hyper_connection_mixer.checkpoint_mapping("mtp.hyper_connection_mixer", "hyper_connection_mixer"))
        return m

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        """Load the ``mtp.*`` tensors of a checkpoint (others are skipped); ``ValueError`` on any mismatch."""
        return load_checkpoint(self, ((n, t) for n, t in weights if n.startswith("mtp.")), self.checkpoint_mapping())

    def fuse(self, next_token_embeds: torch.Tensor, target_streams: torch.Tensor) -> torch.Tensor:
        """``[T, D]`` embeddings of the next tokens and ``[T, hc*D]`` target streams -> ``[T, hc*D]``."""
        e = grouped_rms_norm(next_token_embeds, self.pre_fc_norm_embedding, self.D, self.eps) @ self.fc_embedding.t()
        h = grouped_rms_norm(target_streams, self.pre_fc_norm_hidden, self.hc * self.D, self.eps)
        h = h.unflatten(-1, (self.hc, self.D)) @ self.fc_hidden.t()
        return (e.unsqueeze(-2) + h).flatten(-2)

    @torch.no_grad()
    def draft_logits(
        self, next_ids: torch.Tensor, target_streams: torch.Tensor, positions: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Draft logits over one sequence (causal attention inside the MTP layer, no cache).

        Args:
            next_ids: ``[T]`` token ``t + 1`` for each row ``t``.
            target_streams: ``[T, hc * D]`` the target's streams at ``t``.
            positions: ``[T]`` RoPE positions of the rows (default ``0 .. T-1``).

        Returns:
            ``(logits [T, V] for token t + 2, streams [T, hc*D] for the next draft step)``.

        Raises:
            ValueError: :meth:`set_embed_and_head` was not called, or shapes disagree.
        """
        if self.embed is None or self.lm_head is None:
            raise ValueError("call set_embed_and_head(embed, lm_head) with the target's tensors first")
        if target_streams.shape != (next_ids.shape[0], self.hc * self.D):
            raise ValueError(f"target_streams must be [{next_ids.shape[0]}, {self.hc * self.D}], got {tuple(target_streams.shape)}")
        streams = self.fuse(self.embed[next_ids], target_streams)
        attn = self.layer.self_attn
        streams = self.layer.mix_attention_ffn(streams, lambda x: attn.forward_sequence(x, positions))
        hidden, _ = self.hyper_connection_mixer.mix(streams)
        return hidden @ self.lm_head.t(), streams
