"""Kimi Delta Attention layer of the Kimi K3 reference model.

Per token (Kimi Linear tech report; upstream ``KimiK3DeltaAttention``):
q/k/v projections -> short causal conv + SiLU -> Q/K L2 norm -> per-channel
log-space decay ``g`` from a low-rank forget projection (``f_a``/``f_b``),
``A_log`` and ``dt_bias`` (optionally the "safe" lower-bounded gate) and
``beta = sigmoid(b)`` -> gated delta-rule recurrence -> output RMSNorm gated by
``sigmoid(g_proj(x))`` -> ``o_proj``. The recurrence, conv and state handling
run in the linear-attention backend (``HybridKDAAttnBackend``) through
upstream's ``RadixLinearAttention``, so states live in SGLang's hybrid state
pool and the radix cache can checkpoint them.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from sgl_hybrid_kernel.norm.reference import gated_rms_norm
from sglang.srt.layers.radix_linear_attention import RadixLinearAttention

from sglang_hybrid.models.kimi_k3.weights import ShardSpec
from sglang_hybrid.parallel.spec import ParallelSpec, shard_range


def _param(*shape, dtype=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class KimiK3KDA(nn.Module):
    """One KDA layer. Shapes: hidden ``D``, heads ``H``, head dim ``K``, ``P = H * K``.

    Under TP (``parallel.tp_size = t``) a rank keeps ``H / t`` heads: their rows
    of q/k/v/g/b/f_b and the convolution, their ``A_log`` / ``dt_bias``, and the
    matching columns of ``o_proj`` (row-parallel, one all-reduce); its recurrent
    and conv states hold only those heads. ``f_a_proj`` and ``o_norm`` are
    replicated.
    """

    def __init__(self, config, layer_id: int, parallel: Optional[ParallelSpec] = None):
        super().__init__()
        la = config.linear_attn_config
        self.parallel = parallel or ParallelSpec()
        self.layer_id = layer_id
        self.total_heads = la["num_heads"]
        self.heads = self.parallel.tp_shard(self.total_heads)
        self.num_heads = self.total_heads // self.parallel.tp_size
        self.head_dim = la["head_dim"]
        self.conv_size = la["short_conv_kernel_size"]
        if not la.get("use_full_rank_gate", False):
            raise NotImplementedError(
                "KDA reference implements the Kimi K3 full-rank output gate only "
                "(linear_attn_config.use_full_rank_gate = true)"
            )
        D, H, K = config.hidden_size, self.num_heads, self.head_dim
        P = H * K
        self.proj = P
        self.qkv_proj = _param(3 * P, D)
        self.g_proj = _param(P, D)
        self.b_proj = _param(H, D)
        self.f_a_proj = _param(K, D)
        self.f_b_proj = _param(P, K)
        self.qkv_conv1d = _param(3 * P, self.conv_size)
        self.A_log = _param(H, dtype=torch.float32)
        self.dt_bias = _param(P, dtype=torch.float32)
        self.o_norm = _param(K)
        self.o_proj = _param(D, P)
        self.norm_eps = 1e-5  # upstream KimiK3DeltaAttention's o_norm default
        self.attn = RadixLinearAttention(
            layer_id=layer_id,
            num_q_heads=H,
            num_k_heads=H,
            num_v_heads=H,
            head_q_dim=K,
            head_k_dim=K,
            head_v_dim=K,
            conv_weights=self.qkv_conv1d,
            A_log=self.A_log,
            dt_bias=self.dt_bias,
            lower_bound=la.get("gate_lower_bound", None),
        )

    def checkpoint_mapping(self, prefix: str) -> Dict[str, ShardSpec]:
        """Checkpoint names (upstream's, e.g. ``...self_attn.q_proj.weight``) -> our params."""
        P = self.proj
        me = f"{prefix}."
        if self.parallel.tp_size == 1:
            m = {
                f"{me}q_proj.weight": ShardSpec(f"{me}qkv_proj", (slice(0, P),)),
                f"{me}k_proj.weight": ShardSpec(f"{me}qkv_proj", (slice(P, 2 * P),)),
                f"{me}v_proj.weight": ShardSpec(f"{me}qkv_proj", (slice(2 * P, 3 * P),)),
                f"{me}q_conv1d.weight": ShardSpec(f"{me}qkv_conv1d", (slice(0, P), None)),
                f"{me}k_conv1d.weight": ShardSpec(f"{me}qkv_conv1d", (slice(P, 2 * P), None)),
                f"{me}v_conv1d.weight": ShardSpec(f"{me}qkv_conv1d", (slice(2 * P, 3 * P), None)),
                f"{me}o_norm.weight": ShardSpec(f"{me}o_norm"),
            }
            for name in ("g_proj", "b_proj", "f_a_proj", "f_b_proj", "o_proj"):
                m[f"{me}{name}.weight"] = ShardSpec(f"{me}{name}")
            for name in ("A_log", "dt_bias"):
                m[f"{me}{name}"] = ShardSpec(f"{me}{name}")
            return m
        # TP: this rank's heads (column-parallel rows), o_proj columns (row-parallel).
        t, r = self.parallel.tp_size, self.parallel.tp_rank
        rows = shard_range(P * t, r, t)  # head-major channels of the full projection
        hrows = self.heads
        m = {
            f"{me}o_norm.weight": ShardSpec(f"{me}o_norm"),
            f"{me}f_a_proj.weight": ShardSpec(f"{me}f_a_proj"),
            f"{me}o_proj.weight": ShardSpec(f"{me}o_proj", (), (slice(None), rows)),
            f"{me}g_proj.weight": ShardSpec(f"{me}g_proj", (), (rows,)),
            f"{me}f_b_proj.weight": ShardSpec(f"{me}f_b_proj", (), (rows,)),
            f"{me}b_proj.weight": ShardSpec(f"{me}b_proj", (), (hrows,)),
            f"{me}A_log": ShardSpec(f"{me}A_log", (), (hrows,)),
            f"{me}dt_bias": ShardSpec(f"{me}dt_bias", (), (rows,)),
        }
        for i, x in enumerate("qkv"):
            part = (slice(i * P, (i + 1) * P),)
            m[f"{me}{x}_proj.weight"] = ShardSpec(f"{me}qkv_proj", part, (rows,))
            m[f"{me}{x}_conv1d.weight"] = ShardSpec(f"{me}qkv_conv1d", (part[0], None), (rows,))
        return m

    def forward(self, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        """``hidden_states`` ``[N, D]`` -> ``[N, D]``; recurrent state updated in the pool."""
        x = hidden_states
        mixed_qkv = x @ self.qkv_proj.t()
        beta = x @ self.b_proj.t()
        forget = (x @ self.f_a_proj.t()) @ self.f_b_proj.t()
        gate = x @ self.g_proj.t()
        core = self.attn(forward_batch, mixed_qkv=mixed_qkv, a=forget, b=beta)  # [1, N, H, K]
        core = core.reshape(x.shape[0], self.num_heads, self.head_dim)
        core = gated_rms_norm(core, gate.view_as(core), self.o_norm, self.norm_eps, "sigmoid")
        return self.parallel.all_reduce(core.reshape(x.shape[0], self.proj) @ self.o_proj.t())
