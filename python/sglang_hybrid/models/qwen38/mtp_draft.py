"""The MTP head served as upstream's speculative draft model on CPU (issue 6).

Upstream SGLang 0.5.23 drafts for ``Qwen4ExpForConditionalGeneration`` with
``Qwen4ExpForCausalLMMTP`` (``models/qwen4_exp_mtp.py``): its model config
rewrites the draft's text config to one full-attention (QSA) layer. On CPU the
plugin registers :class:`Qwen38ReferenceMTPForCausalLM` under that name; it
wraps :class:`sglang_hybrid.models.qwen38.mtp.Qwen38ReferenceMTP` (same weights,
same math) and keeps the MTP layer's K/V in the draft worker's own KV pool::

    streams_in = spec_info.hidden_states                 [N, hc * D]  target (or previous draft) streams
    streams    = MTP.fuse(embed(input_ids), streams_in)  [N, hc * D]
    streams    = QSA decoder layer (paged K/V of the draft pool)
    logits     = lm_head(hyper_connection_mixer.mix(streams))      shared embed / lm_head

``LogitsProcessorOutput.hidden_states`` carries ``streams`` for the next draft
step (draft extend: the row upstream selects per request; prefill: the last row).
Forward modes: ``EXTEND`` (after a prefill), ``DECODE`` (draft steps, one row
per request), ``DRAFT_EXTEND_V2`` (after a verify, ``num_draft_tokens`` rows per
request), ``IDLE``.
"""

from __future__ import annotations

from typing import Iterable, Tuple

import torch
from torch import nn

from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
from sglang.srt.model_executor.forward_context import get_attn_backend

from sglang_hybrid.models.qwen38.model import text_config_of
from sglang_hybrid.models.qwen38.mtp import Qwen38ReferenceMTP

DRAFT_ARCHITECTURE = "Qwen4ExpForCausalLMMTP"


class Qwen38ReferenceMTPForCausalLM(nn.Module):
    """CPU draft model for ``--speculative-algorithm EAGLE/NEXTN`` on Qwen3.8-Flash-Next.

    ``forward(input_ids [N], positions [N], forward_batch)`` -> upstream's
    ``LogitsProcessorOutput`` with ``hidden_states`` = MTP streams ``[rows, hc*D]``.
    Raises ``NotImplementedError`` at construction for quantized weights or TP > 1.
    """

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError("the Qwen3.8 CPU MTP draft runs unquantized weights only")
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().tp_size != 1:
            raise NotImplementedError("the Qwen3.8 CPU MTP draft supports --tp 1 only")
        text = text_config_of(config)
        self.config = config
        self.hc, self.D = text.hc_count, text.hidden_size
        self.mtp = Qwen38ReferenceMTP(config)
        self.lm_head = ParallelLMHead(text.vocab_size, text.hidden_size)
        self.logits_processor = LogitsProcessor(text)
        self.start_layer, self.end_layer = 0, 1

    # ------------------------------------------------------------- sharing
    def get_embed_and_head(self):
        return self.mtp.embed, self.lm_head.weight

    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        """Share the target's ``embed [V, D]`` and ``lm_head [V, D]`` (upstream's EAGLE worker calls this)."""
        del self.lm_head.weight
        self.lm_head.weight = head
        self.mtp.set_embed_and_head(embed, head)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        """Load the checkpoint's ``mtp.*`` tensors; ``ValueError`` on any mismatch."""
        return self.mtp.load_weights(weights)

    # ------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        mode = forward_batch.forward_mode
        if positions.dim() == 2:
            positions = positions[0]
        N = input_ids.shape[0]
        streams_in = forward_batch.spec_info.hidden_states
        if mode.is_idle() or N == 0:
            streams = streams_in.new_zeros(0, self.hc * self.D) if streams_in is not None else None
            hidden = self.lm_head.weight.new_zeros(0, self.D)
        else:
            if streams_in is None or streams_in.shape != (N, self.hc * self.D):
                raise ValueError(
                    f"spec_info.hidden_states must be [{N}, {self.hc * self.D}] target streams, got "
                    f"{None if streams_in is None else tuple(streams_in.shape)}"
                )
            backend = get_attn_backend()
            kv_pool, req_to_token = backend.token_to_kv_pool, backend.req_to_token_pool.req_to_token
            layer = self.mtp.layer
            streams = self.mtp.fuse(self.mtp.embed[input_ids], streams_in.to(self.mtp.fc_hidden.dtype))
            streams = layer.mix_attention_ffn(
                streams, lambda x: layer.self_attn(x, positions, forward_batch, kv_pool, req_to_token)
            )
            hidden, _ = self.mtp.hyper_connection_mixer.mix(streams)
        out = self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)
        out.hidden_states = self._rows_for_next_step(streams, forward_batch)
        return out

    @staticmethod
    def _rows_for_next_step(streams, forward_batch):
        """The streams rows the next draft step reads (upstream's MTP convention)."""
        if streams is None or streams.shape[0] == 0:
            return streams
        mode = forward_batch.forward_mode
        if mode.is_draft_extend_v2():
            select = getattr(forward_batch.spec_info, "select_index", None)
            return streams[select] if select is not None else streams
        lens = forward_batch.extend_seq_lens
        if mode.is_extend() and lens is not None and streams.shape[0] != lens.shape[0]:
            return streams[torch.cumsum(lens.to(torch.int64), dim=0) - 1]
        return streams
