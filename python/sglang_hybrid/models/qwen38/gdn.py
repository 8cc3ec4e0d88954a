"""Gated DeltaNet (GDN) layer of the Qwen3.8-Flash-Next reference model.

Upstream ``Qwen3_5GatedDeltaNet`` (Qwen3.5 head-first projection layout)::

    [q | k | v | z] = W_qkvz x        q, k: H_k heads of d_k; v, z: H_v heads of d_v
    [b | a]         = W_ba x          one scalar per value head
    q, k, v         = silu(causal_conv1d([q | k | v]))   (kernel linear_conv_kernel_dim)
    q, k            = L2-normalised per head; value head j reads q/k head j // (H_v / H_k)
    g = -exp(A_log) * softplus(a + dt_bias),  beta = sigmoid(b)
    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - S^T k_t)^T,  o_t = d_k^{-1/2} S_t^T q_t
    y   = W_out (RMSNorm(o) * w_norm * silu(z))          per value head

The conv, gate and recurrence run in the linear-attention backend
(``HybridGDNAttnBackend``) through upstream's ``RadixLinearAttention``, so the
state lives in SGLang's hybrid state pool (article 002: 48 value heads, state
128 x 128 FP32 per head).
"""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from sgl_hybrid_kernel.norm.reference import gated_rms_norm
from sglang.srt.layers.radix_linear_attention import RadixLinearAttention

from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.models.qwen38.hyper import _param


class Qwen38GatedDeltaNet(nn.Module):
    """One GDN layer (TP = 1); see the module docstring for the math."""

    def __init__(self, config, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        D = config.hidden_size
        self.Hk, self.Hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        if self.Hv % self.Hk:
            raise ValueError(f"linear_num_value_heads={self.Hv} must be a multiple of linear_num_key_heads={self.Hk}")
        self.gate_act = config.output_gate_type or config.hidden_act
        if self.gate_act not in ("silu", "sigmoid"):
            raise NotImplementedError(f"GDN output gate activation {self.gate_act!r} (upstream allows silu or sigmoid)")
        self.Kd, self.Vd = self.Hk * self.dk, self.Hv * self.dv
        self.eps = config.rms_norm_eps
        C = 2 * self.Kd + self.Vd
        self.in_proj_qkvz = _param(C + self.Vd, D)
        self.in_proj_ba = _param(2 * self.Hv, D)
        self.conv1d = _param(C, config.linear_conv_kernel_dim)
        self.A_log = _param(self.Hv, dtype=torch.float32)
        self.dt_bias = _param(self.Hv, dtype=torch.float32)
        self.norm = _param(self.dv)
        self.out_proj = _param(D, self.Vd)
        self.attn = RadixLinearAttention(
            layer_id=layer_id,
            num_q_heads=self.Hk,
            num_k_heads=self.Hk,
            num_v_heads=self.Hv,
            head_q_dim=self.dk,
            head_k_dim=self.dk,
            head_v_dim=self.dv,
            conv_weights=self.conv1d,
            bias=None,
            activation="silu",
            A_log=self.A_log,
            dt_bias=self.dt_bias,
        )

    def checkpoint_mapping(self, ckpt: str, me: str) -> Dict[str, ShardSpec]:
        C = 2 * self.Kd + self.Vd
        return {
            f"{ckpt}.in_proj_qkv.weight": ShardSpec(f"{me}.in_proj_qkvz", (slice(0, C),)),
            f"{ckpt}.in_proj_z.weight": ShardSpec(f"{me}.in_proj_qkvz", (slice(C, C + self.Vd),)),
            f"{ckpt}.in_proj_b.weight": ShardSpec(f"{me}.in_proj_ba", (slice(0, self.Hv),)),
            f"{ckpt}.in_proj_a.weight": ShardSpec(f"{me}.in_proj_ba", (slice(self.Hv, 2 * self.Hv),)),
            f"{ckpt}.conv1d.weight": ShardSpec(f"{me}.conv1d", (slice(None), None)),
            f"{ckpt}.A_log": ShardSpec(f"{me}.A_log"),
            f"{ckpt}.dt_bias": ShardSpec(f"{me}.dt_bias"),
            f"{ckpt}.norm.weight": ShardSpec(f"{me}.norm"),
            f"{ckpt}.out_proj.weight": ShardSpec(f"{me}.out_proj"),
        }

    def forward(self, x: torch.Tensor, forward_batch) -> torch.Tensor:
        """``x`` ``[N, D]`` -> ``[N, D]``; conv window and recurrent state updated in the pool."""
        N = x.shape[0]
        C = 2 * self.Kd + self.Vd
        qkvz = x @ self.in_proj_qkvz.t()
        mixed_qkv, z = qkvz[:, :C], qkvz[:, C:]
        ba = x @ self.in_proj_ba.t()
        b, a = ba[:, : self.Hv].contiguous(), ba[:, self.Hv :].contiguous()
        core = self.attn(forward_batch, mixed_qkv=mixed_qkv.contiguous(), a=a, b=b)
        core = core.reshape(N, self.Hv, self.dv)
        o = gated_rms_norm(core, z.reshape(N, self.Hv, self.dv), self.norm, self.eps, self.gate_act)
        return o.reshape(N, self.Vd) @ self.out_proj.t()
