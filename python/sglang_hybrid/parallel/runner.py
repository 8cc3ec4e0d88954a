"""Model-level runner of a reference model for one sequence: prefill, then decode; no server.

It plays the parts of SGLang's model runner that the reference model reads: a
``ForwardBatch``-like object (mode, positions, cache locations, lengths), an
attention backend with the MLA KV pool (``get_key_buffer``), ``req_to_token``
and the KDA state pool, installed through upstream's ``set_forward_context``.
KDA runs the CPU path of our ``HybridKDAAttnBackend`` (the served code). Under
DCP the KV locations are upstream's widened ones, as the server's allocator
hands them out: position ``p`` gets location ``c + p`` (the first ``c``
locations are the scratch page), which its owner (``p mod c == dcp_rank``)
keeps at pool row ``1 + p // c``; so a rank's KV memory is ``ceil(L / c)`` rows
per layer.

Used by the multi-process TP/DCP tests (test/srt/parallel) and the benchmark
(benchmark/parallel); issue 8.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context

from sglang_hybrid.layers.attention.kda_backend import HybridKDAAttnBackend
from sglang_hybrid.layers.attention.kda_kernel import SglHybridKDAKernel
from sglang_hybrid.parallel.dcp import dcp_rows


class _KVPool:
    def __init__(self, buffers):
        self.buffers = buffers

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.buffers[layer_id]


class _ReqToTokenPool:
    def __init__(self, req_to_token, linear_states):
        self.req_to_token = req_to_token
        self.linear_states = linear_states

    def mamba2_layer_cache(self, layer_id: int):
        return self.linear_states[layer_id]


class GreedySequenceRunner:
    """Shared driver of the model-level runners: the attention-backend entry, ``step`` and ``greedy``.

    Subclasses provide ``_batch(n)`` (a ``ForwardBatch``-like object for ``n`` new
    tokens at ``self.seq_len``) and ``_logits(token_ids, forward_batch)`` (FP32
    ``[n, vocab]``), plus the backend's ``forward_extend`` / ``forward_decode``.
    """

    # The attention-backend entry that RadixLinearAttention calls.
    def forward(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(layer, forward_batch, mixed_qkv, a, b)
        return self.forward_extend(layer, forward_batch, mixed_qkv, a, b)

    @torch.no_grad()
    def step(self, token_ids: List[int]) -> torch.Tensor:
        """Append ``token_ids`` (prefill, or decode for one token after a prefill); FP32 logits ``[n, vocab]``.

        Raises:
            ValueError: ``token_ids`` is empty.
        """
        n = len(token_ids)
        if n < 1:
            raise ValueError("token_ids must hold at least one token")
        fb = self._batch(n)
        prev = set_forward_context(ForwardContext(attn_backend=self))
        try:
            logits = self._logits(torch.tensor(token_ids), fb)
        finally:
            set_forward_context(prev)
        self.seq_len += n
        return logits

    @torch.no_grad()
    def greedy(self, prompt: List[int], steps: int):
        """Prefill ``prompt`` then decode ``steps`` tokens greedily; returns (tokens, [logits of each step])."""
        logits = [self.step(prompt)[-1]]
        tokens = []
        for _ in range(steps):
            tokens.append(int(logits[-1].argmax()))
            logits.append(self.step([tokens[-1]])[-1])
        return tokens, torch.stack(logits)


class SequenceRunner(GreedySequenceRunner):
    """Runs ``model`` (a ``KimiK3ReferenceForCausalLM`` built with a ``ParallelSpec``) on one sequence.

    Args:
        model: the rank's model; ``model.parallel`` gives TP / DCP placement.
        max_len: most tokens the sequence may reach.

    ``step(token_ids)`` appends tokens (prefill when more than one or first call
    with several, decode for one after a prefill) and returns FP32 logits
    ``[n, vocab]`` of the new tokens. ``kv_rows_used`` counts MLA pool rows this
    rank holds per MLA layer.
    """

    forward_extend = HybridKDAAttnBackend.forward_extend
    forward_decode = HybridKDAAttnBackend.forward_decode
    _split_qkv = staticmethod(HybridKDAAttnBackend._split_qkv)
    _track_decode_torch = HybridKDAAttnBackend._track_decode_torch

    def __init__(self, model, max_len: int = 64):
        cfg = model.config
        self.model, self.par = model, model.parallel
        dtype = model.lm_head.weight.dtype
        c = self.par.dcp_size
        rows = -(-max_len // c) + 1  # row 0 is the never-read scratch row
        kv_width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
        self.kv = {}
        self.states = {}
        for layer in model.model.layers:
            a = layer.self_attn
            if layer.is_kda:
                conv = torch.zeros(2, a.conv_size - 1, 3 * a.proj, dtype=dtype)
                ssm = torch.zeros(2, a.num_heads, a.head_dim, a.head_dim, dtype=torch.float32)
                self.states[layer.layer_id] = SimpleNamespace(conv=[conv], temporal=ssm)
            else:
                self.kv[layer.layer_id] = torch.zeros(rows, 1, kv_width, dtype=dtype)
        self.token_to_kv_pool = _KVPool(self.kv)
        self.req_to_token_pool = _ReqToTokenPool(torch.zeros(1, max_len, dtype=torch.int32), self.states)
        self.forward_metadata = SimpleNamespace(
            has_mamba_track_mask=False, mamba_cache_indices=torch.tensor([1], dtype=torch.int32), track_chunk_idx=None
        )
        self._kernel = SglHybridKDAKernel()
        self._torch_path = True  # HybridKDAAttnBackend's CPU path
        self.seq_len = 0
        self.kv_rows_used = 0

    def _batch(self, n: int):
        c, r = self.par.dcp_size, self.par.dcp_rank
        positions = torch.arange(self.seq_len, self.seq_len + n)
        out_loc = positions + c  # widened locations; the first page (locations [0, c)) is scratch
        self.req_to_token_pool.req_to_token[0, self.seq_len : self.seq_len + n] = out_loc.to(torch.int32)
        self.kv_rows_used += int((dcp_rows(out_loc, r, c) >= 0).sum()) if c > 1 else n
        decode = self.seq_len > 0 and n == 1
        mode = ForwardMode.DECODE if decode else ForwardMode.EXTEND
        return SimpleNamespace(
            forward_mode=mode, logical_forward_mode=mode, positions=positions, out_cache_loc=out_loc,
            seq_lens_cpu=torch.tensor([self.seq_len + n]), extend_seq_lens_cpu=[n],
            extend_prefix_lens_cpu=[self.seq_len], req_pool_indices=torch.tensor([0]),
            global_num_token_non_padded_cpu=n, mamba_track_mask=None,
        )

    def _logits(self, ids: torch.Tensor, fb) -> torch.Tensor:
        return (self.model.model(ids, fb) @ self.model.lm_head.weight.t()).float()
