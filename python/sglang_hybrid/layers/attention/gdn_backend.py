"""GDN linear-attention backend with a CPU (plain-torch) path.

Upstream SGLang 0.5.23 builds ``GDNAttnBackend`` for every Qwen3-Next-family
model (Qwen3.5, Qwen4-Exp = Qwen3.8-Flash-Next); its kernels are Triton/CUDA
(or Intel AMX ``sgl_kernel`` CPU ops that no PyPI package ships), so on our CPU
platform it cannot run. The plugin replaces that class (``HookRegistry`` class
REPLACE, which keeps ``isinstance`` true) with :class:`HybridGDNAttnBackend`, a
subclass that

* on CPU runs prefill/extend and decode with :mod:`sgl_hybrid_kernel` references
  (causal conv1d, GDN gate, gated delta rule) and writes the prefix-cache track
  snapshots (``extra_buffer`` strategy: conv window and state at the last
  64-token boundary) in plain torch;
* on GPU defers to upstream unchanged.

Tensor contract with the model (upstream's ``RadixLinearAttention`` call):
``mixed_qkv`` ``[N, 2 * H_k * d_k + H_v * d_v]`` (q | k | v, before the conv),
``a`` ``[N, H_v]`` raw decay input, ``b`` ``[N, H_v]`` raw beta. Returns
``[1, N, H_v, d_v]``. State layout is SGLang's GDN pool: conv
``[slots, C, K - 1]``, recurrent ``[slots, H_v, d_v, d_k]`` (FP32).
"""

from __future__ import annotations

import logging

import torch

from sgl_hybrid_kernel.conv.reference import causal_conv1d, causal_conv1d_step
from sgl_hybrid_kernel.delta_rule.naive import deferred_records, gated_delta_recurrent, gdn_gate
from sgl_hybrid_kernel.dispatch import record_choice
from sgl_hybrid_kernel.norm.reference import l2_norm
from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

from sglang_hybrid.layers.attention.cpu_metadata import CpuLinearAttnMetadataMixin
from sglang_hybrid.layers.attention.delta_rule_common import forward_extend_lengths
from sglang_hybrid.layers.attention.gdn_deferred import records_for_layer
from sglang_hybrid.platforms import current_platform

logger = logging.getLogger(__name__)

MAMBA_CHUNK = 64  # upstream's track grid (mamba_chunk_size)


# Upstream logs "Linear attention kernel backend: decode=triton, ..." from its own dispatcher settings
# before this backend is built; on CPU none of those kernels runs, and the reason says so.
CPU_REASON = ("CPU platform: plain-torch reference; upstream's 'Linear attention kernel backend' line "
              "names kernels not used on CPU")

class HybridGDNAttnBackend(CpuLinearAttnMetadataMixin, GDNAttnBackend):
    """Upstream's GDN backend, with a plain-torch path on CPU (see module docstring)."""

    def __init__(self, model_runner):
        self._torch_path = current_platform().is_cpu
        if not self._torch_path:
            super().__init__(model_runner)
            return
        # Upstream's __init__ builds Triton/CUDA kernel dispatchers; on CPU we only
        # need the shared metadata machinery of the base class.
        MambaAttnBackendBase.__init__(self, model_runner)
        self.conv_states_shape = model_runner.req_to_token_pool.mamba_pool.mamba_cache.conv[0].shape
        self.kernel_dispatcher = None
        self.enable_mis = False
        self.mis_metadata = None
        self._use_strided_target_verify_qkv = False
        for op in ("gdn_prefill", "gdn_decode", "causal_conv1d"):
            record_choice(op, "torch", CPU_REASON, log=logger)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _qkv(layer, x: torch.Tensor):
        """Post-conv ``[N, q|k|v]`` -> L2-normalised ``q, k`` ``[N, H_k, d_k]`` and ``v`` ``[N, H_v, d_v]``."""
        q, k, v = x.split([layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
        q = l2_norm(q.unflatten(-1, (layer.num_q_heads, layer.head_q_dim)))
        k = l2_norm(k.unflatten(-1, (layer.num_k_heads, layer.head_k_dim)))
        return q, k, v.unflatten(-1, (layer.num_v_heads, layer.head_v_dim))

    @staticmethod
    def _gates(layer, a: torch.Tensor, b: torch.Tensor):
        n = a.shape[0]
        g = gdn_gate(a.reshape(n, layer.num_v_heads), layer.A_log.reshape(-1), layer.dt_bias.reshape(-1))
        return g, torch.sigmoid(b.reshape(n, layer.num_v_heads).float())

    # ------------------------------------------------------------------ extend
    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if not self._torch_path:
            # upstream calls the kernel's extend without host lengths; ours reads them from here
            # instead of reading query_start_loc on the host once per layer (delta_rule_common)
            with forward_extend_lengths(getattr(forward_batch, "extend_seq_lens_cpu", None)):
                return super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        if forward_batch.forward_mode.is_target_verify():
            return self._forward_verify(layer, forward_batch, mixed_qkv, a, b)
        md = self.forward_metadata
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_pool = cache.conv[0]  # [slots, C, K-1]
        ssm_pool = cache.temporal  # [slots, HV, V, K]
        weight = layer.conv_weights.reshape(conv_pool.shape[1], -1)
        slots = md.mamba_cache_indices.tolist()
        lens = list(forward_batch.extend_seq_lens_cpu)
        prefix_lens = list(forward_batch.extend_prefix_lens_cpu)
        n_total = sum(lens)
        mixed_qkv = mixed_qkv[:n_total]

        if md.has_mamba_track_mask:
            # The raw conv window ending at the last track-aligned boundary (the
            # prefix-cache checkpoint), as upstream writes it.
            conv_pool[md.conv_states_mask_indices] = mixed_qkv[md.track_conv_indices].transpose(-1, -2).to(conv_pool.dtype)
        track = [-1] * len(lens)
        if md.has_mamba_track_mask and md.track_chunk_idx is not None:
            track = md.track_chunk_idx.tolist()
        h_track = None
        if any(c >= 0 for c in track):
            h_track = torch.zeros((len(lens), *ssm_pool.shape[1:]), dtype=torch.float32)

        g, beta = self._gates(layer, a[:n_total], b[:n_total])
        out = mixed_qkv.new_empty(1, n_total, layer.num_v_heads, layer.head_v_dim)
        start = 0
        for i, (n, prefix, slot) in enumerate(zip(lens, prefix_lens, slots)):
            sl = slice(start, start + n)
            start += n
            if n == 0:
                continue
            # A sequence continues from its slot only after a cached or earlier-chunk prefix.
            conv_state = conv_pool[slot].t() if prefix > 0 else None
            x, new_conv = causal_conv1d(mixed_qkv[sl], weight, conv_state, activation="silu")
            conv_pool[slot] = new_conv.t().to(conv_pool.dtype)
            q, k, v = self._qkv(layer, x)
            s0 = ssm_pool[slot].transpose(-1, -2) if prefix > 0 else None
            want = [track[i] * MAMBA_CHUNK] if track[i] > 0 else []
            o, S, saved = gated_delta_recurrent(q, k, v, g[sl], beta[sl], initial_state=s0, save_positions=want)
            if track[i] == 0:  # a checkpoint at the extend start is the incoming state
                h_track[i] = s0.transpose(-1, -2) if s0 is not None else 0
            elif track[i] > 0:
                h_track[i] = saved[0].transpose(-1, -2)
            ssm_pool[slot] = S.transpose(-1, -2).to(ssm_pool.dtype)
            out[0, sl] = o
        if md.has_mamba_track_mask:
            self._track_mamba_state_extend(forward_batch, None, ssm_pool, md, h_track_buf=h_track)
        return out

    # ------------------------------------------------------------------ verify
    def _forward_verify(self, layer, forward_batch, mixed_qkv, a, b):
        """Speculative verify (``TARGET_VERIFY``, issue 6): ``w`` draft rows per request.

        Per-position states, never the slot: the conv window and recurrent state
        after each row ``j`` go to scratch row ``i`` (the request's batch index) of
        the pool's ``intermediate_conv_window`` ``[rows, w, C, K-1]`` and
        ``intermediate_ssm`` ``[rows, w, H_v, d_v, d_k]``; the slot keeps the
        state before the drafts. After acceptance upstream's
        ``update_mamba_state_after_mtp_verify`` copies the last accepted step into
        the slot (and into a track slot when the accepted prefix crosses the
        checkpoint grid), so a rejected draft never reaches a stored state.

        With the deferred commit (``gdn_deferred.py``, the default) the recurrent
        state after row 0 goes to the slot and rows 1..w-1 keep records in the
        scratch's memory instead; the commit replays the accepted rows.
        """
        md = self.forward_metadata
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_pool, ssm_pool = cache.conv[0], cache.temporal
        conv_steps, ssm_steps = cache.intermediate_conv_window[0], cache.intermediate_ssm
        if ssm_steps is None:
            raise NotImplementedError("GDN verify on CPU needs the per-step scratch (no --enable-linear-replayssm-spec)")
        weight = layer.conv_weights.reshape(conv_pool.shape[1], -1)
        slots = md.mamba_cache_indices.tolist()
        B = len(slots)
        w = mixed_qkv.shape[0] // B
        km1 = conv_pool.shape[-1]
        records, _ = records_for_layer(ssm_pool, ssm_steps, w, layer.num_k_heads, mixed_qkv.dtype)
        g, beta = self._gates(layer, a[: B * w], b[: B * w])
        out = mixed_qkv.new_zeros(1, B * w, layer.num_v_heads, layer.head_v_dim)
        for i, slot in enumerate(slots):
            if slot < 0:
                continue
            sl = slice(i * w, (i + 1) * w)
            state = conv_pool[slot].t()  # [K-1, C]
            x, _ = causal_conv1d(mixed_qkv[sl], weight, state, activation="silu")
            raw = torch.cat([state.to(mixed_qkv.dtype), mixed_qkv[sl]])  # [K-1+w, C]
            for j in range(w):
                conv_steps[i, j] = raw[j + 1 : j + 1 + km1].t().to(conv_steps.dtype)
            q, k, v = self._qkv(layer, x)
            o, _, saved = gated_delta_recurrent(q, k, v, g[sl], beta[sl], initial_state=ssm_pool[slot].transpose(-1, -2),
                                                save_positions=[1] if records is not None else list(range(1, w + 1)))
            if records is not None:  # deferred commit (gdn_deferred.py): token 0's state and records of the rest
                ssm_pool[slot] = saved[0].transpose(-1, -2).to(ssm_pool.dtype)
                records[slot] = deferred_records(k[1:], g[sl][1:], beta[sl][1:], v[1:])
            else:
                for j, S in enumerate(saved):
                    ssm_steps[i, j] = S.transpose(-1, -2).to(ssm_steps.dtype)
            out[0, sl] = o
        return out

    # ------------------------------------------------------------------ decode
    def forward_decode(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if not self._torch_path:
            return super().forward_decode(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        md = self.forward_metadata
        cache = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
        conv_pool, ssm_pool = cache.conv[0], cache.temporal
        weight = layer.conv_weights.reshape(conv_pool.shape[1], -1)
        idx = md.mamba_cache_indices.long()
        n = mixed_qkv.shape[0]
        # causal_conv1d_step takes the window as [slots, K-1, C]; a transposed view writes through.
        x = causal_conv1d_step(mixed_qkv, weight, conv_pool.transpose(1, 2), idx, activation="silu")
        q, k, v = self._qkv(layer, x)
        g, beta = self._gates(layer, a[:n], b[:n])
        out = mixed_qkv.new_zeros(1, n, layer.num_v_heads, layer.head_v_dim)
        for i, slot in enumerate(idx.tolist()):
            if slot < 0:
                continue
            o, S, _ = gated_delta_recurrent(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1],
                                            initial_state=ssm_pool[slot].transpose(-1, -2))
            ssm_pool[slot] = S.transpose(-1, -2).to(ssm_pool.dtype)
            out[0, i] = o[0]
        self._track_decode_torch(forward_batch, conv_pool, ssm_pool, idx)
        return out
