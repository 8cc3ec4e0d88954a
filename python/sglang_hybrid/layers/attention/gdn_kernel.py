"""Our GDN kernels behind upstream's linear-attention kernel interface (issue 4, Wiring).

``--linear-attn-backend sgl_hybrid`` (or the per-phase ``--linear-attn-decode-backend``
/ ``--linear-attn-prefill-backend`` / ``--linear-attn-verify-backend sgl_hybrid``)
makes upstream's ``GDNAttnBackend`` — and so upstream's own Qwen3.8-Flash-Next
class (``models/qwen4_exp.py``) on GPU/ROCm — call :class:`SglHybridGDNKernel`.
Upstream parses the unknown name as ``LinearAttnKernelBackend.CUSTOM`` and
rejects it in ``GDNKernelDispatcher.__init__``; an AROUND hook builds the
dispatcher with Triton in those places and then installs our kernel. When the
verify backend is left unset and decode is ours, verify is ours too (upstream
would default it to Triton). Tree verify (``retrieve_parent_token`` given) stays
on upstream's kernel: upstream routes it to ``tree_verify_kernel`` anyway.

On a GPU, shapes outside our kernels' contract go to upstream's Triton kernel
rather than the torch loop (prefill takes our chunk-64 form on CUDA and ROCm),
except an extend with a prefix-cache track request (upstream's kernel does not
fill ``track_state``; the torch path does).

Tensor conventions are upstream's: ``q, k`` ``[1, N, H, K]``, ``v`` ``[1, N, HV, V]``
after the conv (L2 norm applied here); decode/verify take raw ``a, b`` ``[N, HV]``;
extend takes upstream's gated ``g`` (log decay) and ``beta`` (sigmoid applied),
``[1, N, HV]`` FP32; FP32 state pool ``[slots, HV, V, K]``.
"""

from __future__ import annotations

import logging

import torch

from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.chunk.variants import ensure_compiled as ensure_chunk_binaries
from sgl_hybrid_kernel.delta_rule.dispatch import choose_chunk, choose_recurrent
from sgl_hybrid_kernel.delta_rule.gate import GATE_GDN
from sgl_hybrid_kernel.delta_rule.ops import decode_torch
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton
from sgl_hybrid_kernel.dispatch import count_call, record_choice
from sgl_hybrid_kernel.delta_rule.naive import kda_chunk
from sgl_hybrid_kernel.norm.reference import l2_norm
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from sglang_hybrid.patches import register_patches

from sglang_hybrid.layers.attention.delta_rule_common import (MAMBA_CHUNK, extend_lengths, initial_state_flags,
                                                            plan_track_snapshots, verify_chain)
from sglang_hybrid.layers.attention.gdn_deferred import records_for_layer

logger = logging.getLogger(__name__)

BACKEND_NAME = "sgl_hybrid"


def raw_gdn_gates(g: torch.Tensor, beta: torch.Tensor):
    """Adapter: upstream's gated ``(g, beta)`` back to raw inputs of our GDN gate with
    ``A_log = 0, dt_bias = 0`` (then ``-exp(0) * softplus(f) = g`` and ``sigmoid(b) = beta``).

    ``f = log(expm1(-g))`` (``-g`` itself above the kernels' softplus threshold 20),
    ``b = logit(beta)``; ``g = 0`` gives ``f = -inf`` and ``softplus(-inf) = 0``.
    FP32 round trip: absolute error in ``g`` about ``6e-8`` (the kernel's ``log(1 + exp)``).

    Args:
        g: ``[..., HV]`` log decay (<= 0); beta: ``[..., HV]`` in [0, 1].

    Returns:
        ``(f, b)`` FP32, same shapes.
    """
    y = -g.float()
    f = torch.where(y > 20.0, y, torch.log(torch.expm1(y.clamp(max=20.0))))
    return f, torch.logit(beta.float())


class SglHybridGDNKernel(TritonGDNKernel):
    """Decode, chain verify and chunked extend of GDN through ``sgl_hybrid_kernel``
    (Triton on CUDA/ROCm, plain torch on CPU or outside the kernels' contract)."""

    supports_packed_decode = False
    supports_strided_target_verify_qkv = False
    supports_track_state_snapshot = True
    uses_state_checkpoints = False

    def __init__(self, force_triton: bool = False):
        self.force_triton = force_triton

    def decode(self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices, query_start_loc, **kwargs):
        """One token per request: ``q, k`` ``[1, B, H, K]``, ``v`` ``[1, B, HV, V]``, raw ``a, b`` ``[B, HV]``;
        slot < 0 = padding (zero output). Returns ``[1, B, HV, V]``; the pool is updated in place."""
        _, B, H, K = q.shape
        HV = v.shape[2]
        if query_start_loc is not None and query_start_loc.numel() - 1 != B:
            raise ValueError(f"query_start_loc: decode expects one token per request, {B} tokens")
        args = (q[0], k[0], v[0], a.reshape(B, HV), b.reshape(B, HV), A_log.reshape(-1), dt_bias.reshape(-1),
                ssm_states, cache_indices)
        if self.force_triton or choose_recurrent(q[0], v[0], ssm_states, 1, GATE_GDN) == "triton":
            count_call("gdn_decode", "triton")
            return gated_delta_recurrent_triton(*args, 1, "gdn", state_layout="vk").unsqueeze(0)
        if q.device.type != "cpu":  # outside our contract on a GPU: upstream's kernel, not a Python loop
            count_call("gdn_decode", "upstream")
            return super().decode(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_states,
                                  cache_indices=cache_indices, query_start_loc=query_start_loc, **kwargs)
        count_call("gdn_decode", "torch")
        return decode_torch(*args, 1, "gdn", None, "vk").unsqueeze(0)

    def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
                      intermediate_states_buffer, intermediate_state_indices, cache_steps, retrieve_parent_token=None,
                      **kwargs):
        """Chain verify (:func:`delta_rule_common.verify_chain`), deferred commit where it applies
        (:mod:`gdn_deferred`); tree verify goes to upstream's Triton kernel."""
        if retrieve_parent_token is not None:
            return super().target_verify(A_log, dt_bias, q, k, v, a, b, ssm_states=ssm_states,
                                         cache_indices=cache_indices, query_start_loc=query_start_loc,
                                         intermediate_states_buffer=intermediate_states_buffer,
                                         intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
                                         retrieve_parent_token=retrieve_parent_token, **kwargs)
        records, _ = records_for_layer(ssm_states, intermediate_states_buffer, int(cache_steps), q.shape[2], v.dtype)
        count_call("gdn_verify", "sgl_hybrid_deferred" if records is not None else "sgl_hybrid")
        return verify_chain(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_states,
                            cache_indices=cache_indices, query_start_loc=query_start_loc,
                            intermediate_states_buffer=intermediate_states_buffer,
                            intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
                            gate="gdn", force_triton=self.force_triton, replay_buffer=records)

    def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, inplace_update: bool = True,
               **kwargs):
        """Packed varlen extend. ``g, beta`` ``[1, N, HV]`` as upstream's ``fused_gdn_gating``
        returns them. A sequence starts from its slot only when ``extend_prefix_lens > 0``
        (all do when that is not given). Honours ``track_state`` / ``track_chunk_idx``.

        Returns:
            ``(o [1, N, HV, V], None, None)`` (upstream's ``(o, last_state, h)``; the final
            state is written to the pool, snapshots to ``track_state``).

        Raises:
            NotImplementedError: ``inplace_update=False`` (multi-item scoring) or FlashInfer checkpoint plans.
        """
        if (q.device.type != "cpu" and not self.force_triton and kwargs.get("track_state") is None
                and choose_chunk(q[0], v[0], ssm_states, GATE_GDN) != "triton"):
            # Outside the contract: upstream's kernel. Not with a
            # track request: upstream's kernel ignores track_state, which we declare we fill.
            count_call("gdn_extend", "upstream")
            return super().extend(q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                                  query_start_loc=query_start_loc, inplace_update=inplace_update, **kwargs)
        if not inplace_update:
            raise NotImplementedError("sgl_hybrid GDN extend always writes the final state (no multi-item scoring)")
        if kwargs.get("num_state_checkpoints"):
            raise NotImplementedError("sgl_hybrid GDN extend does not take FlashInfer checkpoint plans")
        _, N, H, K = q.shape
        HV = v.shape[2]
        q2, k2, v2 = q[0], k[0], v[0]
        g2, b2 = g.reshape(N, HV), beta.reshape(N, HV)
        cu = query_start_loc.to(torch.int32)
        # upstream's GDN path passes no host lengths: HybridGDNAttnBackend.forward_extend provides them
        lens = extend_lengths(cu, kwargs.get("extend_seq_lens_cpu"))
        has_init = initial_state_flags(kwargs.get("extend_prefix_lens"), len(lens), q.device)  # on the device
        track_state = kwargs.get("track_state")
        ckpts = plan_track_snapshots(track_state, kwargs.get("track_chunk_idx"), ssm_states, cache_indices, has_init)
        out = kwargs.get("output")
        if self.force_triton or choose_chunk(q2, v2, ssm_states, GATE_GDN) == "triton":
            count_call("gdn_extend", "triton")
            f, braw = raw_gdn_gates(g2, b2)
            zeros = torch.zeros(HV, dtype=torch.float32, device=q.device)
            ensure_chunk_binaries(q2, k2, v2, f, braw, zeros, zeros, ssm_states, "gdn")
            o = gated_delta_chunk_triton(q2, k2, v2, f, braw, zeros, zeros, cu, ssm_states, cache_indices.to(torch.int32),
                                         has_init, "gdn",
                                         state_layout="vk", checkpoints=ckpts,
                                         checkpoint_pool=track_state if ckpts else None,
                                         seq_lens_cpu=lens)  # host lengths: no second read of cu (issue 4)
        else:
            count_call("gdn_extend", "torch")
            o = torch.empty_like(v2)
            G = HV // H
            start = 0
            has_init = has_init.tolist()
            for i, (n, slot) in enumerate(zip(lens, cache_indices.tolist())):
                sl = slice(start, start + n)
                start += n
                if n == 0:
                    continue
                want = [p for (s, p, _) in ckpts if s == i]
                s0 = ssm_states[slot].transpose(-1, -2).float() if has_init[i] else None
                qi = l2_norm(q2[sl]).repeat_interleave(G, 1)
                ki = l2_norm(k2[sl]).repeat_interleave(G, 1)
                oi, S, states = kda_chunk(qi, ki, v2[sl], g2[sl].float().unsqueeze(-1).expand_as(qi), b2[sl].float(),
                                          initial_state=s0, chunk_size=MAMBA_CHUNK, checkpoints=want)
                ssm_states[slot] = S.transpose(-1, -2).to(ssm_states.dtype)
                for p in want:
                    track_state[i] = states[p].transpose(-1, -2).to(track_state.dtype)
                o[sl] = oi
        if out is not None and out.numel() == o.numel():
            out.view_as(o).copy_(o)
        return o.unsqueeze(0), None, None


def _around_dispatcher_init(original, self, decode_backend, prefill_backend, verify_backend=None, *args, **kwargs):
    if not (decode_backend.is_custom() or prefill_backend.is_custom() or (verify_backend is not None and verify_backend.is_custom())):
        return original(self, decode_backend, prefill_backend, verify_backend, *args, **kwargs)
    from sglang.srt.runtime_context import get_exec

    mamba = get_exec().mamba
    # Unset verify follows decode when decode is ours (upstream would default it to Triton).
    verify_follows = mamba.linear_attn_verify_backend is None and decode_backend.is_custom()
    custom = {"decode": decode_backend.is_custom(), "prefill": prefill_backend.is_custom(),
              "verify": verify_follows or (verify_backend is not None and verify_backend.is_custom())}
    names = {mamba.linear_attn_backend, mamba.linear_attn_decode_backend, mamba.linear_attn_prefill_backend,
             mamba.linear_attn_verify_backend} - {None}
    unknown = names - {BACKEND_NAME} - {b.value for b in LinearAttnKernelBackend}
    if unknown:
        raise ValueError(f"unknown linear-attention kernel backend(s) {sorted(unknown)}; ours is {BACKEND_NAME!r}")
    triton = LinearAttnKernelBackend.TRITON
    original(self, triton if custom["decode"] else decode_backend, triton if custom["prefill"] else prefill_backend,
             triton if custom["verify"] else verify_backend, *args, **kwargs)
    ours = SglHybridGDNKernel()
    if custom["decode"]:
        self.decode_kernel = ours
        self.supports_packed_decode = False
    if custom["prefill"]:
        self.extend_kernel = ours
    if custom["verify"]:
        self.verify_kernel = ours  # chain verify; tree verify stays on self.tree_verify_kernel (upstream Triton)
        self.verify_kernel_is_flashinfer = False
    for phase, kernel in (("decode", self.decode_kernel), ("extend", self.extend_kernel), ("verify", self.verify_kernel)):
        record_choice(f"gdn_{phase}_kernel", "sgl_hybrid" if kernel is ours else f"upstream:{type(kernel).__name__}",
                      "--linear-attn-*-backend sgl_hybrid" if kernel is ours else "upstream's choice", log=logger)


def install() -> None:
    """Register ``sgl_hybrid`` as a ``--linear-attn-*-backend`` choice and hook the GDN dispatcher."""
    from sglang.srt.arg_groups.choices import LINEAR_ATTN_KERNEL_BACKEND_CHOICES, add_linear_attn_kernel_backend_choices

    if BACKEND_NAME not in LINEAR_ATTN_KERNEL_BACKEND_CHOICES:
        add_linear_attn_kernel_backend_choices([BACKEND_NAME])
    register_patches(__name__)  # AROUND GDNKernelDispatcher.__init__ (patches.py)
