"""Multi-head latent attention (MLA) layer of the Kimi K3 reference model.

Follows upstream ``KimiK3MLAAttention`` (a ``DeepseekV2AttentionMLA`` with
``skip_rope=True`` and an optional sigmoid output gate):

* ``kv_a_proj_with_mqa(x) = [c_raw (kv_lora_rank) | k_pe (qk_rope_head_dim)]``,
  ``c = RMSNorm(c_raw)``; the pair ``[c | k_pe]`` is what the MLA KV pool stores
  per token (576 values at Kimi K3 size).
* Kimi K3 applies no rotary embedding (NoPE MLA; the decoupled positional part
  is kept, unrotated), so ``q_pe . k_pe`` enters the score as is.
* Scores use the absorbed form ``q_lat = W_kc^T q_nope`` over the latent cache;
  ``o = W_vc o_lat`` per head, gated by ``sigmoid(g_proj(x))``, then ``o_proj``.
* Softmax scale ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from sgl_hybrid_kernel.dcp import merge_partial_attention
from sgl_hybrid_kernel.mla.reference import mla_attention_absorbed
from sgl_hybrid_kernel.norm.reference import rms_norm

from sglang_hybrid.models.kimi_k3.kda import _param
from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.parallel.dcp import dcp_partial_attention, dcp_rows
from sglang_hybrid.parallel.spec import ParallelSpec


class KimiK3MLA(nn.Module):
    """One MLA layer, reading and writing SGLang's MLA KV pool directly.

    TP (``parallel.tp_size = t``): a rank keeps ``H / t`` query heads (rows of
    ``q_proj`` / ``q_b_proj``, ``kv_b_proj``, ``g_proj``; columns of ``o_proj``,
    row-parallel with one all-reduce); the latent path (``kv_a_proj_with_mqa``)
    is replicated. DCP (``parallel.dcp_size = c``): ``out_cache_loc`` and
    ``req_to_token`` hold upstream's *widened* KV locations (allocator page =
    page x c); the rank stores location ``loc`` only when ``loc mod c ==
    dcp_rank``, at pool row ``loc // c`` (upstream's owner rule,
    ``sglang.srt.layers.dcp.layout.localize_dcp_indices``); with page-aligned
    widened pages that is position ``p mod c == dcp_rank``. See
    ``sglang_hybrid.parallel.dcp``.
    """

    def __init__(self, config, layer_id: int, parallel: Optional[ParallelSpec] = None):
        super().__init__()
        self.parallel = parallel or ParallelSpec()
        self.layer_id = layer_id
        D = config.hidden_size
        self.total_heads = config.num_attention_heads
        self.heads = self.parallel.tp_shard(self.total_heads)
        self.num_heads = self.total_heads // self.parallel.tp_size
        self.nope = config.qk_nope_head_dim
        self.rope = config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        self.eps = config.rms_norm_eps
        self.scale = (self.nope + self.rope) ** -0.5
        H, qk = self.num_heads, self.nope + self.rope
        if self.q_lora_rank is None:
            self.q_proj = _param(H * qk, D)
        else:
            self.q_a_proj = _param(self.q_lora_rank, D)
            self.q_a_layernorm = _param(self.q_lora_rank)
            self.q_b_proj = _param(H * qk, self.q_lora_rank)
        self.kv_a_proj_with_mqa = _param(self.kv_lora_rank + self.rope, D)
        self.kv_a_layernorm = _param(self.kv_lora_rank)
        self.kv_b_proj = _param(H * (self.nope + self.v_dim), self.kv_lora_rank)
        self.o_proj = _param(D, H * self.v_dim)
        self.use_output_gate = bool(getattr(config, "mla_use_output_gate", False))
        if self.use_output_gate:
            self.g_proj = _param(H * self.v_dim, D)

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        me = f"{prefix}."
        names = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
        names += ["q_proj"] if self.q_lora_rank is None else ["q_a_proj", "q_b_proj"]
        if self.use_output_gate:
            names.append("g_proj")
        if self.parallel.tp_size == 1:
            m = {f"{me}{n}.weight": ShardSpec(f"{me}{n}") for n in names}
        else:
            h0, h1 = self.heads.start, self.heads.stop
            per_head = {"q_proj": self.nope + self.rope, "q_b_proj": self.nope + self.rope,
                        "kv_b_proj": self.nope + self.v_dim, "g_proj": self.v_dim}
            m = {}
            for n in names:
                if n in per_head:  # column-parallel: this rank's heads' rows
                    m[f"{me}{n}.weight"] = ShardSpec(f"{me}{n}", (), (slice(h0 * per_head[n], h1 * per_head[n]),))
                elif n == "o_proj":  # row-parallel: this rank's heads' input columns
                    m[f"{me}{n}.weight"] = ShardSpec(f"{me}{n}", (), (slice(None), slice(h0 * self.v_dim, h1 * self.v_dim)))
                else:
                    m[f"{me}{n}.weight"] = ShardSpec(f"{me}{n}")
        m[f"{me}kv_a_layernorm.weight"] = ShardSpec(f"{me}kv_a_layernorm")
        if self.q_lora_rank is not None:
            m[f"{me}q_a_layernorm.weight"] = ShardSpec(f"{me}q_a_layernorm")
        return m

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            q = x @ self.q_proj.t()
        else:
            q = rms_norm(x @ self.q_a_proj.t(), self.q_a_layernorm, self.eps) @ self.q_b_proj.t()
        return q.view(x.shape[0], self.num_heads, self.nope + self.rope)

    def forward(self, x: torch.Tensor, forward_batch, kv_pool, req_to_token: torch.Tensor) -> torch.Tensor:
        """``x`` ``[N, D]`` (the batch's new tokens, packed) -> ``[N, D]``.

        Writes each new token's ``[c | k_pe]`` row at ``forward_batch.out_cache_loc``
        and reads every sequence's history through ``req_to_token``.
        """
        N = x.shape[0]
        H, R = self.num_heads, self.kv_lora_rank
        q = self._queries(x)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        kv = x @ self.kv_a_proj_with_mqa.t()
        latent = rms_norm(kv[:, :R], self.kv_a_layernorm, self.eps)
        k_pe = kv[:, R:]

        kv_buffer = kv_pool.get_key_buffer(self.layer_id)  # [pool, 1, R + rope]
        loc = forward_batch.out_cache_loc[:N].long()
        rows_new = torch.cat([latent, k_pe], dim=-1).unsqueeze(1).to(kv_buffer.dtype)
        c = self.parallel.dcp_size
        if c > 1:
            local = dcp_rows(loc, self.parallel.dcp_rank, c)  # widened loc -> this rank's row, -1 elsewhere
            owned = local >= 0
            kv_buffer[local[owned]] = rows_new[owned]
        else:
            kv_buffer[loc] = rows_new

        w = self.kv_b_proj.view(H, self.nope + self.v_dim, R)
        w_kc, w_vc = w[:, : self.nope], w[:, self.nope :]  # [H, nope, R], [H, v, R]
        q_lat = torch.einsum("nhd,hdr->nhr", q_nope, w_kc)
        if c > 1:
            o_lat = self._attend_dcp(q_lat, q_pe, forward_batch, kv_buffer, req_to_token)
            return self._output(x, o_lat, w_vc)

        if forward_batch.forward_mode.is_decode():
            new_lens = [1] * N
            seq_lens = list(forward_batch.seq_lens_cpu.tolist())
        else:
            new_lens = list(forward_batch.extend_seq_lens_cpu)
            seq_lens = [p + n for p, n in zip(forward_batch.extend_prefix_lens_cpu, new_lens)]
        rows = forward_batch.req_pool_indices.tolist()
        o_lat = q_lat.new_empty(N, H, R)
        start = 0
        for row, n, total in zip(rows, new_lens, seq_lens):
            if n == 0:
                continue
            sl = slice(start, start + n)
            start += n
            hist = kv_buffer[req_to_token[row, :total].long(), 0]  # [total, R + rope]
            o_lat[sl], _ = mla_attention_absorbed(
                q_lat[sl], q_pe[sl], hist[:, :R], hist[:, R:], self.scale, prefix_len=total - n
            )
        return self._output(x, o_lat, w_vc)

    def _output(self, x: torch.Tensor, o_lat: torch.Tensor, w_vc: torch.Tensor) -> torch.Tensor:
        N = x.shape[0]
        o = torch.einsum("nhr,hvr->nhv", o_lat, w_vc).reshape(N, self.num_heads * self.v_dim)
        if self.use_output_gate:
            o = o * torch.sigmoid(x @ self.g_proj.t())
        return self.parallel.all_reduce(o @ self.o_proj.t())

    def _attend_dcp(self, q_lat, q_pe, forward_batch, kv_buffer, req_to_token) -> torch.Tensor:
        """DCP attention: gather the group's query heads, attend over the local shard, merge exactly.

        Returns this rank's heads ``[N, H_local, R]``. Two all-gathers over the
        DCP group per layer: queries ``[N, H_local, R + rope]`` and
        ``(o_lat, LSE)`` ``[N, H_dcp, R + 1]`` (FP32).
        """
        par, c, R = self.parallel, self.parallel.dcp_size, self.kv_lora_rank
        N, H = q_lat.shape[:2]
        q_all = par.dcp_all_gather(torch.cat([q_lat, q_pe], dim=-1))  # [c, N, H, R + rope]
        q_all = q_all.permute(1, 0, 2, 3).reshape(N, c * H, R + self.rope)  # heads in DCP-rank order
        qpos = forward_batch.positions[:N].long()
        if forward_batch.forward_mode.is_decode():
            new_lens, seq_lens = [1] * N, forward_batch.seq_lens_cpu.tolist()
        else:
            new_lens = list(forward_batch.extend_seq_lens_cpu)
            seq_lens = [p + n for p, n in zip(forward_batch.extend_prefix_lens_cpu, new_lens)]
        part = torch.empty(N, c * H, R + 1, dtype=torch.float32)  # FP32 so the LSE keeps its precision
        start = 0
        for row, n, total in zip(forward_batch.req_pool_indices.tolist(), new_lens, seq_lens):
            if n == 0:
                continue
            sl = slice(start, start + n)
            start += n
            local = dcp_rows(req_to_token[row, :total].long(), par.dcp_rank, c)
            key_pos = (local >= 0).nonzero(as_tuple=True)[0]  # positions this rank stores, ascending
            hist = kv_buffer[local[key_pos], 0]  # [local, R + rope]
            o, lse = dcp_partial_attention(
                q_all[sl, :, :R], q_all[sl, :, R:], hist[:, :R], hist[:, R:], key_pos, qpos[sl], self.scale
            )
            part[sl, :, :R] = o
            part[sl, :, R] = lse
        parts = par.dcp_all_gather(part)  # [c, N, c*H, R + 1]
        o_lat, _ = merge_partial_attention(parts[..., :R].contiguous(), parts[..., R].float().contiguous())
        mine = slice(par.dcp_rank * H, (par.dcp_rank + 1) * H)
        return o_lat[:, mine].to(q_lat.dtype)
