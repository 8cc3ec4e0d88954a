"""Model-level runner of the Qwen3.8 reference text model for one sequence: prefill, then decode; no server.

The Qwen3.8 counterpart of ``sglang_hybrid.parallel.runner.SequenceRunner``:
it plays the parts of SGLang's model runner that ``Qwen38TextModel`` reads --
a ``ForwardBatch``-like object, the QSA K/V pool, ``req_to_token``, the GDN
state pool (conv window + recurrent state of this rank's heads, run by the CPU
path of our ``HybridGDNAttnBackend``, the served code) and the PLE side pools
(short-conv windows, n-gram context) -- installed through upstream's
``set_forward_context``. Used by the TP tests (test/srt/parallel); issue 8.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_hybrid.layers.attention.gdn_backend import HybridGDNAttnBackend
from sglang_hybrid.parallel.runner import GreedySequenceRunner

_SLOT = 1  # the request's state slot (slot 0 stays unused, as upstream keeps it)


class _KVPool:
    def __init__(self, k, v):
        self.k, self.v = k, v

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v[layer_id]


class _StatePool:
    """``req_to_token`` plus the GDN state pool and the PLE side pools of one request."""

    def __init__(self, rows: int, gdn_states, ple_conv, context_len: int):
        self.req_to_token = torch.zeros(1, rows, dtype=torch.int32)
        self.gdn_states, self.ple_conv = gdn_states, ple_conv
        self.ngram = torch.zeros(2, context_len, dtype=torch.long)

    def mamba2_layer_cache(self, layer_id: int):
        return self.gdn_states[layer_id]

    def get_mamba_indices(self, req_pool_indices: torch.Tensor) -> torch.Tensor:
        return torch.full_like(req_pool_indices, _SLOT)

    def translate_mamba_indices(self, indices: torch.Tensor) -> torch.Tensor:
        return indices

    def get_ngram_context(self, slots: torch.Tensor) -> torch.Tensor:
        return self.ngram[slots]

    def set_ngram_context(self, slots: torch.Tensor, context: torch.Tensor) -> None:
        self.ngram[slots] = context.to(self.ngram.dtype)

    def short_conv_layer_cache(self, layer_id: int) -> torch.Tensor:
        return self.ple_conv[layer_id]


class Qwen38SequenceRunner(GreedySequenceRunner):
    """Runs ``model`` (a ``Qwen38TextModel``, possibly cut by ``shard_qwen38_text_model``) on one sequence.

    Args:
        model: the rank's text model.
        lm_head: ``[vocab, D]`` (replicated).
        max_len: most tokens the sequence may reach.

    ``step(token_ids)`` appends tokens (prefill on the first call, decode for one
    token afterwards) and returns FP32 logits ``[n, vocab]`` of the new tokens.
    """

    forward_extend = HybridGDNAttnBackend.forward_extend
    forward_decode = HybridGDNAttnBackend.forward_decode
    _qkv = staticmethod(HybridGDNAttnBackend._qkv)
    _gates = staticmethod(HybridGDNAttnBackend._gates)
    _track_decode_torch = HybridGDNAttnBackend._track_decode_torch

    def __init__(self, model, lm_head: torch.Tensor, max_len: int = 64):
        self.model, self.lm_head = model, lm_head
        dtype = lm_head.dtype
        rows = max_len + 1  # row 0 is never read
        k, v, states, ple = {}, {}, {}, {}
        for layer in model.layers:
            lid = layer.layer_id
            if layer.is_linear:
                g = layer.linear_attn
                conv = torch.zeros(2, 2 * g.Kd + g.Vd, g.conv1d.shape[-1] - 1, dtype=dtype)
                ssm = torch.zeros(2, g.Hv, g.dv, g.dk, dtype=torch.float32)
                states[lid] = SimpleNamespace(conv=[conv], temporal=ssm)
            else:
                a = layer.self_attn
                k[lid] = torch.zeros(rows, a.KV, a.hd, dtype=dtype)
                v[lid] = torch.zeros(rows, a.KV, a.hd, dtype=dtype)
            if layer.ple is not None:
                ple[lid] = torch.zeros(2, layer.ple.hc * layer.ple.D, layer.ple.state_len, dtype=dtype)
        self.token_to_kv_pool = _KVPool(k, v)
        self.req_to_token_pool = _StatePool(rows, states, ple, max(model.ngram_size - 1, 1))
        self.forward_metadata = SimpleNamespace(
            has_mamba_track_mask=False, mamba_cache_indices=torch.tensor([_SLOT], dtype=torch.int32), track_chunk_idx=None
        )
        self._torch_path = True  # HybridGDNAttnBackend's CPU path
        self.seq_len = 0

    def _batch(self, n: int):
        positions = torch.arange(self.seq_len, self.seq_len + n)
        out_loc = positions + 1
        self.req_to_token_pool.req_to_token[0, self.seq_len : self.seq_len + n] = out_loc.to(torch.int32)
        decode = self.seq_len > 0 and n == 1
        mode = ForwardMode.DECODE if decode else ForwardMode.EXTEND
        return SimpleNamespace(
            forward_mode=mode, positions=positions, out_cache_loc=out_loc,
            seq_lens_cpu=torch.tensor([self.seq_len + n]), extend_seq_lens_cpu=[n],
            extend_prefix_lens_cpu=[self.seq_len], req_pool_indices=torch.tensor([0]),
            mamba_track_mask=None, mamba_track_indices=None, global_num_token_non_padded_cpu=n,
        )

    def _logits(self, ids: torch.Tensor, fb) -> torch.Tensor:
        hidden, _ = self.model(ids, fb.positions, fb)
        return (hidden @ self.lm_head.t()).float()
