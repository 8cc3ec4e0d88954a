"""Qwen Sparse Attention (QSA) layer of the Qwen3.8-Flash-Next reference model.

Attention (upstream ``Qwen3_5AttentionDecoderLayer`` with ``attn_output_gate``)::

    [q_h | gate_h] per head, k, v = W_q x, W_k x, W_v x          GQA: H query heads, KV heads
    q, k = RoPE(GemmaRMSNorm(q)), RoPE(GemmaRMSNorm(k))           NeoX rotation of the first
                                                                  head_dim * partial_rotary_factor dims
    o    = softmax(q k_S^T / sqrt(head_dim)) v_S                  over the selected tokens S only
    y    = W_o (o * sigmoid(gate))

Selection (upstream ``QSAIndexer``; article 002: a 2,048-token budget via
compressed block indices). Per token an index key ``ik`` (one head, raw) and
``n`` index query heads ``iq = RoPE(GemmaRMSNorm(iq))`` come from
``index_qk_proj``. Complete groups of ``r = indexer_compress_ratio`` tokens are
compressed: ``c_b = RoPE_{b*r}(GemmaRMSNorm(mean(ik_{b*r} .. ik_{b*r+r-1})))``.
A query at position ``p`` sees the ``(p + 1) // r`` complete blocks, scores them
``sum_h relu(iq_h . c_b) / sqrt(index_head_dim)``, keeps the best
``indexer_budget / r`` (all of them if there are no more; ties to the smaller
block index) and attends over their tokens plus the incomplete tail
``[(p + 1) // r * r, p]``. If every complete block fits in the budget, this is
exact causal attention (article 002, item 13: the dense special case).

On CPU the attention is computed exactly over the selected tokens. K/V live in
SGLang's KV pool (written at ``out_cache_loc``, read through ``req_to_token``);
the raw index keys live in an FP32 side table indexed by the same KV-pool slot,
so a radix-cache hit keeps them with the prefix's K/V.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch
from torch import nn

from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.models.qwen38.hyper import _param, grouped_rms_norm


def rope_neox(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """NeoX-style rotary embedding of the first ``rotary_dim`` channels.

    Args:
        x: ``[N, H, d]`` (or ``[N, d]``), ``rotary_dim <= d`` and even.
        positions: ``[N]`` token positions.
        rotary_dim: rotated channels; pairs are ``(i, i + rotary_dim / 2)``.
        theta: RoPE base.

    Returns:
        ``x``'s shape and dtype; frequencies computed in FP64.
    """
    half = rotary_dim // 2
    inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = positions.to(torch.float64).unsqueeze(-1) * inv  # [N, half]
    if x.dim() == 3:
        ang = ang.unsqueeze(1)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def qsa_selection_mask(
    index_q: torch.Tensor,
    block_keys: torch.Tensor,
    query_positions: torch.Tensor,
    seq_len: int,
    compress_ratio: int,
    block_topk: int,
) -> torch.Tensor:
    """Which tokens each query attends to under QSA.

    Args:
        index_q: ``[M, n, d]`` normalised and rotated index queries.
        block_keys: ``[B, d]`` compressed keys of the complete blocks (``B = seq_len // r``).
        query_positions: ``[M]`` positions in ``[0, seq_len)``.
        seq_len: tokens of the sequence (keys ``0 .. seq_len - 1``).
        compress_ratio: ``r`` tokens per block.
        block_topk: blocks kept per query (``indexer_budget / r``).

    Returns:
        ``[M, seq_len]`` bool; row ``i`` is true exactly on the selected blocks'
        tokens and the tail ``[(p + 1) // r * r, p]`` of ``p = query_positions[i]``.

    Raises:
        ValueError: a query position outside ``[0, seq_len)``.
    """
    M, d = index_q.shape[0], index_q.shape[-1]
    pos = query_positions.long()
    if M and (int(pos.min()) < 0 or int(pos.max()) >= seq_len):
        raise ValueError(f"query_positions must lie in [0, {seq_len}), got [{int(pos.min())}, {int(pos.max())}]")
    B = block_keys.shape[0]
    visible = torch.div(pos + 1, compress_ratio, rounding_mode="floor")  # complete blocks each query sees
    keep = torch.arange(B).unsqueeze(0) < visible.unsqueeze(1)  # [M, B]
    if B > block_topk and bool((visible > block_topk).any()):
        scores = torch.relu(torch.einsum("mhd,bd->mbh", index_q.float(), block_keys.float())).sum(-1) / math.sqrt(d)
        scores = scores.masked_fill(~keep, float("-inf"))
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :block_topk]
        chosen = torch.zeros_like(keep).scatter_(1, order, True) & keep
        keep = torch.where((visible > block_topk).unsqueeze(1), chosen, keep)
    token = torch.arange(seq_len)
    mask = torch.zeros(M, seq_len, dtype=torch.bool)
    n_block_tokens = B * compress_ratio
    mask[:, :n_block_tokens] = keep.repeat_interleave(compress_ratio, dim=1)
    tail_start = visible * compress_ratio
    mask |= (token.unsqueeze(0) >= tail_start.unsqueeze(1)) & (token.unsqueeze(0) <= pos.unsqueeze(1))
    return mask


def batch_layout(forward_batch, num_tokens: int, positions: torch.Tensor):
    """Per request of a packed batch: ``(new token counts, visible lengths)`` (lists of ints).

    decode: one token; extend: ``extend_seq_lens_cpu``; speculative verify and
    draft extend (``TARGET_VERIFY``, ``DRAFT_EXTEND_V2``): the same number of rows
    per request (``num_tokens / batch``). A request's tokens see the cache up to
    their last position: visible length = last position + 1 (upstream fills
    ``req_to_token`` for those positions before the forward).
    """
    mode = forward_batch.forward_mode
    B = int(forward_batch.req_pool_indices.shape[0])
    if mode.is_decode():
        new_lens = [1] * B
    elif mode.is_target_verify() or mode.is_draft_extend_v2():
        if B == 0 or num_tokens % B:
            raise ValueError(f"{mode}: {num_tokens} rows do not split evenly over {B} requests")
        new_lens = [num_tokens // B] * B
    else:
        new_lens = list(forward_batch.extend_seq_lens_cpu)
    ends = torch.tensor(new_lens, dtype=torch.long).cumsum(0) - 1
    seq_lens = (positions[ends].long() + 1).tolist() if B else []
    return new_lens, seq_lens


class Qwen38QSA(nn.Module):
    """One QSA layer (TP = 1); see the module docstring."""

    def __init__(self, config, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        D = config.hidden_size
        self.H, self.KV, self.hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        if self.H % self.KV:
            raise ValueError(f"num_attention_heads={self.H} must be a multiple of num_key_value_heads={self.KV}")
        self.eps = config.rms_norm_eps
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default" or "mrope_section" in rope:
            raise NotImplementedError(f"QSA reference implements default (1-D) RoPE only, got {rope}")
        self.theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
        self.rotary_dim = int(self.hd * partial)
        self.n_idx, self.idim = int(config.indexer_n_heads), int(config.indexer_head_dim)
        if int(config.indexer_kv_heads) != 1:
            raise ValueError(f"indexer_kv_heads must be 1 (upstream's QSA), got {config.indexer_kv_heads}")
        self.ratio = int(config.indexer_compress_ratio)
        self.block_topk = int(config.indexer_budget) // self.ratio
        if self.rotary_dim > self.idim:
            raise ValueError(f"rotary_dim={self.rotary_dim} must fit indexer_head_dim={self.idim}")
        self.q_size, self.kv_size = self.H * self.hd, self.KV * self.hd
        self.qkv_proj = _param(2 * self.q_size + 2 * self.kv_size, D)
        self.o_proj = _param(D, self.q_size)
        self.q_norm = _param(self.hd)
        self.k_norm = _param(self.hd)
        self.index_qk_proj = _param((self.n_idx + 1) * self.idim, D)
        self.index_q_norm = _param(self.idim)
        self.index_k_norm = _param(self.idim)
        self._index_keys: Optional[torch.Tensor] = None  # FP32 side table, one row per KV-pool slot

    def checkpoint_mapping(self, ckpt: str, me: str) -> Dict[str, ShardSpec]:
        q, kv = 2 * self.q_size, self.kv_size
        return {
            f"{ckpt}.q_proj.weight": ShardSpec(f"{me}.qkv_proj", (slice(0, q),)),
            f"{ckpt}.k_proj.weight": ShardSpec(f"{me}.qkv_proj", (slice(q, q + kv),)),
            f"{ckpt}.v_proj.weight": ShardSpec(f"{me}.qkv_proj", (slice(q + kv, q + 2 * kv),)),
            f"{ckpt}.o_proj.weight": ShardSpec(f"{me}.o_proj"),
            f"{ckpt}.q_norm.weight": ShardSpec(f"{me}.q_norm"),
            f"{ckpt}.k_norm.weight": ShardSpec(f"{me}.k_norm"),
            f"{ckpt}.indexer.index_qk_proj.weight": ShardSpec(f"{me}.index_qk_proj"),
            f"{ckpt}.indexer.q_layernorm.weight": ShardSpec(f"{me}.index_q_norm"),
            f"{ckpt}.indexer.k_layernorm.weight": ShardSpec(f"{me}.index_k_norm"),
        }

    # ------------------------------------------------------------------ pieces
    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """``x`` ``[N, D]`` -> ``q [N, H, hd]``, ``gate [N, H*hd]``, ``k, v [N, KV, hd]``,
        ``index_q [N, n, idim]``, raw ``index_k [N, idim]``."""
        N = x.shape[0]
        qkv = x @ self.qkv_proj.t()
        qg, k, v = qkv.split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = qg.view(N, self.H, 2 * self.hd).split(self.hd, dim=-1)
        q = rope_neox(grouped_rms_norm(q, self.q_norm, self.hd, self.eps), positions, self.rotary_dim, self.theta)
        k = rope_neox(grouped_rms_norm(k.reshape(N, self.KV, self.hd), self.k_norm, self.hd, self.eps), positions,
                      self.rotary_dim, self.theta)
        iqk = x @ self.index_qk_proj.t()
        iq = grouped_rms_norm(iqk[:, : self.n_idx * self.idim].view(N, self.n_idx, self.idim), self.index_q_norm,
                              self.idim, self.eps)
        iq = rope_neox(iq, positions, self.rotary_dim, self.theta)
        return q, gate.reshape(N, self.q_size), k, v.reshape(N, self.KV, self.hd), iq, iqk[:, self.n_idx * self.idim :]

    def block_keys(self, index_keys: torch.Tensor) -> torch.Tensor:
        """Raw index keys ``[L, idim]`` of a sequence -> compressed keys ``[L // r, idim]``."""
        B = index_keys.shape[0] // self.ratio
        pooled = index_keys[: B * self.ratio].float().view(B, self.ratio, self.idim).mean(1).to(index_keys.dtype)
        normed = grouped_rms_norm(pooled, self.index_k_norm, self.idim, self.eps)
        return rope_neox(normed, torch.arange(B) * self.ratio, self.rotary_dim, self.theta)

    def attend(self, q, index_q, keys, values, index_keys, query_positions) -> torch.Tensor:
        """Sparse attention of ``M`` queries over one sequence's ``L`` tokens.

        ``q [M, H, hd]``, ``index_q [M, n, idim]``, ``keys, values [L, KV, hd]``,
        ``index_keys [L, idim]``, ``query_positions [M]`` -> ``[M, H, hd]``.
        """
        L = keys.shape[0]
        mask = qsa_selection_mask(index_q, self.block_keys(index_keys), query_positions, L, self.ratio, self.block_topk)
        g = self.H // self.KV
        k, v = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
        s = torch.einsum("mhd,lhd->hml", q.float(), k.float()) / math.sqrt(self.hd)
        p = s.masked_fill(~mask.unsqueeze(0), float("-inf")).softmax(-1)
        return torch.einsum("hml,lhd->mhd", p, v.float()).to(q.dtype)

    def _output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (o.reshape(o.shape[0], self.q_size) * torch.sigmoid(gate)) @ self.o_proj.t()

    # ------------------------------------------------------------------ forward
    def forward_sequence(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Causal QSA over one whole sequence ``x`` ``[T, D]`` (no cache) -> ``[T, D]``."""
        T = x.shape[0]
        positions = torch.arange(T) if positions is None else positions
        q, gate, k, v, iq, ik = self.project(x, positions)
        return self._output(self.attend(q, iq, k, v, ik, torch.arange(T)), gate)

    def _index_key_table(self, rows: int, dtype: torch.dtype) -> torch.Tensor:
        if self._index_keys is None or self._index_keys.shape[0] < rows:
            self._index_keys = torch.zeros(rows, self.idim, dtype=dtype)
        return self._index_keys

    def forward(self, x: torch.Tensor, positions: torch.Tensor, forward_batch, kv_pool, req_to_token) -> torch.Tensor:
        """``x`` ``[N, D]`` (the batch's new tokens, packed) -> ``[N, D]``.

        Writes each new token's K/V (and index key) at ``forward_batch.out_cache_loc``
        and reads every sequence's history through ``req_to_token``.
        """
        N = x.shape[0]
        q, gate, k, v, iq, ik = self.project(x, positions)
        k_buf, v_buf = kv_pool.get_key_buffer(self.layer_id), kv_pool.get_value_buffer(self.layer_id)
        ik_buf = self._index_key_table(k_buf.shape[0], torch.float32)
        loc = forward_batch.out_cache_loc[:N].long()
        k_buf[loc] = k.to(k_buf.dtype)
        v_buf[loc] = v.to(v_buf.dtype)
        ik_buf[loc] = ik.float()
        new_lens, seq_lens = batch_layout(forward_batch, N, positions)
        o = q.new_zeros(N, self.H, self.hd)
        start = 0
        for row, n, total in zip(forward_batch.req_pool_indices.tolist(), new_lens, seq_lens):
            if n == 0:
                continue
            sl = slice(start, start + n)
            start += n
            hist = req_to_token[row, :total].long()
            o[sl] = self.attend(q[sl], iq[sl], k_buf[hist], v_buf[hist], ik_buf[hist].to(x.dtype),
                                torch.arange(total - n, total))
        return self._output(o, gate)
