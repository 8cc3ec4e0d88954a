"""KDA linear-attention backend with a CPU (plain-torch) path.

Upstream SGLang 0.5.23 builds ``KDAAttnBackend`` for every Kimi-Linear-family
model; its kernels are Triton/CUDA only, so on CPU it cannot run. The plugin
replaces that class (``HookRegistry`` class REPLACE, which keeps ``isinstance``
true) with :class:`HybridKDAAttnBackend`, a subclass that:

* on CPU runs prefill/extend and decode with :mod:`sgl_hybrid_kernel` ops
  (conv1d, KDA gate, chunked KDA, recurrent KDA) and writes the prefix-cache
  track snapshots (``extra_buffer`` strategy) in plain torch;
* on GPU defers to upstream, except that a decode step whose model offered its
  output-norm gate runs our one-launch fused kernel when the decode kernel is ours
  (``kda_fused_decode.py``).

Tensor contract with the model (``RadixLinearAttention`` call): ``mixed_qkv``
``[N, 3 * H * D]`` (q | k | v, pre-convolution), ``a`` the raw forget-gate
projection ``[N, H * D]`` (or any shape with ``N * H * D`` elements), ``b``
the raw beta projection (``N * H`` elements). Returns ``[1, N, H, D]``; the
model applies the gated output norm. State layout is SGLang's KDA pool:
conv ``[slots, K - 1, 3 * H * D]``, recurrent ``[slots, H, D_v, D_k]``.
"""

from __future__ import annotations

import logging
import torch

from sgl_hybrid_kernel.conv.reference import causal_conv1d, causal_conv1d_step
from sgl_hybrid_kernel.dispatch import record_choice
from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend

from sglang_hybrid.layers.attention.kda_fused_decode import try_fused_decode
from sglang_hybrid.layers.attention.kda_kernel import SglHybridKDAKernel
from sglang_hybrid.layers.attention.cpu_metadata import CpuLinearAttnMetadataMixin
from sglang_hybrid.platforms import current_platform

logger = logging.getLogger(__name__)


# Upstream logs "Linear attention kernel backend: decode=triton, ..." from its own dispatcher settings
# before this backend is built; on CPU none of those kernels runs, and the reason says so.
CPU_REASON = ("CPU platform: plain-torch reference; upstream's 'Linear attention kernel backend' line "
              "names kernels not used on CPU")

class HybridKDAAttnBackend(CpuLinearAttnMetadataMixin, KDAAttnBackend):
    """Upstream's KDA backend, with a plain-torch path on CPU (see module docstring)."""

    def __init__(self, model_runner):
        self._torch_path = current_platform().is_cpu
        if not self._torch_path:
            super().__init__(model_runner)
            # decode through our kernels: the fused step is tried first (kda_fused_decode.py)
            self._fused_decode_ours = isinstance(getattr(self.kernel_dispatcher, "decode_kernel", None),
                                                 SglHybridKDAKernel)
            return
        # Upstream's __init__ builds a Triton/CUDA kernel dispatcher; on CPU we
        # only need the shared metadata machinery of the base class.
        MambaAttnBackendBase.__init__(self, model_runner)
        self.conv_states_shape = (
            model_runner.req_to_token_pool.mamba_pool.mamba_cache.conv[0].transpose(-1, -2).shape
        )
        self.kernel_dispatcher = None
        # The recurrence runs through our kernel interface; on CPU it takes the
        # plain-torch path (sgl_hybrid_kernel references).
        self._kernel = SglHybridKDAKernel()
        self.prefill_graph_metadata = None
        self._fused_chain_verify_fn = None
        for op in ("kda_prefill", "kda_decode", "causal_conv1d"):
            record_choice(op, "torch", CPU_REASON, log=logger)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _split_qkv(layer, x: torch.Tensor):
        """Post-conv ``[N, q|k|v]`` -> ``[1, N, heads, dim]`` each (L2 norm happens in the kernel)."""
        q, k, v = x.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        return (
            q.unflatten(-1, (layer.num_q_heads, layer.head_q_dim)).unsqueeze(0),
            k.unflatten(-1, (layer.num_k_heads, layer.head_k_dim)).unsqueeze(0),
            v.unflatten(-1, (layer.num_v_heads, layer.head_v_dim)).unsqueeze(0),
        )

    # ------------------------------------------------------------------ extend
    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if not self._torch_path:
            return super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        if forward_batch.forward_mode.is_target_verify():
            raise NotImplementedError("speculative verify on CPU is not supported yet (KDA backend)")
        md = self.forward_metadata
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_pool = cache.conv[0]  # [slots, K-1, C]
        ssm_pool = cache.temporal  # [slots, H, V, K]
        slots = md.mamba_cache_indices.tolist()
        lens = list(forward_batch.extend_seq_lens_cpu)
        prefix_lens = list(forward_batch.extend_prefix_lens_cpu)
        n_total = sum(lens)
        mixed_qkv = mixed_qkv[:n_total]

        if md.has_mamba_track_mask:
            # Snapshot the raw conv window that ends at the last track-aligned
            # boundary (the prefix-cache checkpoint), as upstream does.
            conv_pool[md.conv_states_mask_indices] = mixed_qkv[md.track_conv_indices].to(conv_pool.dtype)
        track_chunks = md.track_chunk_idx.tolist() if (md.has_mamba_track_mask and md.track_chunk_idx is not None) else None
        h_track = None
        if track_chunks is not None and any(c >= 0 for c in track_chunks):
            h_track = torch.zeros((len(lens), *ssm_pool.shape[1:]), dtype=torch.float32)

        # Conv per sequence (its window continues only after a prefix), then the
        # recurrence through the same kernel interface upstream's backend uses.
        x = torch.empty_like(mixed_qkv)
        start = 0
        for n, prefix, slot in zip(lens, prefix_lens, slots):
            sl = slice(start, start + n)
            start += n
            if n == 0:
                continue
            conv_state = conv_pool[slot] if prefix > 0 else None
            x[sl], new_conv = causal_conv1d(mixed_qkv[sl], layer.conv_weights, conv_state, activation="silu")
            conv_pool[slot] = new_conv.to(conv_pool.dtype)
        q, k, v = self._split_qkv(layer, x)
        cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
        out = self._kernel.extend(
            q, k, v, a.reshape(1, n_total, layer.num_v_heads, layer.head_k_dim), b.reshape(1, n_total, layer.num_v_heads),
            ssm_states=ssm_pool, cache_indices=md.mamba_cache_indices, query_start_loc=cu, A_log=layer.A_log,
            dt_bias=layer.dt_bias, lower_bound=layer.lower_bound, beta_is_raw=True,
            extend_prefix_lens=torch.tensor(prefix_lens), track_state=h_track,
            track_chunk_idx=md.track_chunk_idx if h_track is not None else None,
        )
        if md.has_mamba_track_mask:
            self._track_mamba_state_extend(forward_batch, None, ssm_pool, md, h_track_buf=h_track)
        return out

    # ------------------------------------------------------------------ decode
    def forward_decode(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if not self._torch_path:
            if self._fused_decode_ours:  # the one-launch step where the model offered its output-norm gate
                out = try_fused_decode(self, layer, forward_batch, mixed_qkv, a, b)
                if out is not None:
                    return out
            return super().forward_decode(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        md = self.forward_metadata
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_pool, ssm_pool = cache.conv[0], cache.temporal
        idx = md.mamba_cache_indices.long()
        n = mixed_qkv.shape[0]
        x = causal_conv1d_step(mixed_qkv, layer.conv_weights, conv_pool, idx, activation="silu")
        q, k, v = self._split_qkv(layer, x)
        out = self._kernel.decode(
            q, k, v, a.reshape(n, -1), b.reshape(1, n, -1), A_log=layer.A_log, dt_bias=layer.dt_bias,
            ssm_states=ssm_pool, cache_indices=md.mamba_cache_indices, query_start_loc=None, lower_bound=layer.lower_bound,
        )
        self._track_decode_torch(forward_batch, conv_pool, ssm_pool, idx)
        return out
