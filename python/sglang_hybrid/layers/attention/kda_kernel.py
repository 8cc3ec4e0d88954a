"""Our KDA kernels behind upstream's linear-attention kernel interface.

``--linear-attn-backend sgl_hybrid`` (or ``--linear-attn-decode-backend`` /
``--linear-attn-prefill-backend sgl_hybrid``) makes upstream's ``KDAAttnBackend``
— and so upstream's own Kimi K3 / Kimi Linear classes on GPU — call
:class:`SglHybridKDAKernel` for decode and prefill. Upstream parses every
unknown name as ``LinearAttnKernelBackend.CUSTOM`` and has no KDA kernel for it,
so an AROUND hook on ``KDAKernelDispatcher.__init__`` builds the dispatcher with
Triton in those places and then installs our kernel. Speculative chain verify is
ours too (``--linear-attn-verify-backend sgl_hybrid``, or unset with decode
ours); tree verify (``retrieve_parent_token``) and upstream's fused ring /
fused-accept verify extras go to upstream's Triton kernel. The conv-window
checkpointing of verify lives in upstream's backend, unchanged.

The class subclasses upstream's ``TritonKDAKernel`` because upstream only lets a
``TritonKDAKernel`` run the safe gate (``lower_bound``) that Kimi K3 uses.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.chunk.variants import ensure_compiled as ensure_chunk_binaries
from sgl_hybrid_kernel.delta_rule.dispatch import choose_chunk, choose_recurrent
from sgl_hybrid_kernel.delta_rule.gate import gate_kind
from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import gated_delta_recurrent_triton
from sgl_hybrid_kernel.dispatch import count_call, record_choice
from sgl_hybrid_kernel.delta_rule.naive import kda_chunk, kda_gate, kda_recurrent
from sgl_hybrid_kernel.norm.reference import l2_norm
from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
from sglang_hybrid.patches import register_patches

from sglang_hybrid.layers.attention.delta_rule_common import (MAMBA_CHUNK, extend_lengths, initial_state_flags,
                                                            plan_track_snapshots, verify_chain)

logger = logging.getLogger(__name__)

BACKEND_NAME = "sgl_hybrid"


class SglHybridKDAKernel(TritonKDAKernel):
    """Decode and chunked prefill through ``sgl_hybrid_kernel`` (Triton on CUDA/ROCm,
    plain torch on CPU or outside the kernels' contract).

    Tensor conventions are upstream's: ``q, k, v`` ``[1, N, H, D]`` after the conv
    (L2 norm applied here), raw gate ``[.., H*K]`` and raw beta, FP32 state pool
    ``[slots, H, V, K]`` indexed by ``cache_indices``.
    """

    supports_packed_decode = False
    supports_fused_chain_verify = False
    supports_track_state_snapshot = True

    def __init__(self, force_triton: bool = False):
        super().__init__()
        self.force_triton = force_triton

    # ------------------------------------------------------------------ decode
    def decode(self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices, query_start_loc,
               lower_bound: Optional[float] = None, **kwargs) -> torch.Tensor:
        _, B, H, K = q.shape
        if query_start_loc is not None and query_start_loc.numel() - 1 != B:
            raise ValueError(f"decode expects one token per request: {B} tokens, {query_start_loc.numel() - 1} requests")
        q2, k2, v2 = q[0], k[0], v[0]
        f, beta = a.reshape(B, H, K), b.reshape(B, H)
        if self.force_triton or choose_recurrent(q2, v2, ssm_states, 1, gate_kind("kda", lower_bound)) == "triton":
            count_call("kda_decode", "triton")
            o = gated_delta_recurrent_triton(q2, k2, v2, f, beta, A_log.reshape(-1), dt_bias.reshape(-1), ssm_states,
                                             cache_indices, 1, "kda", lower_bound, state_layout="vk")
            return o.unsqueeze(0)
        count_call("kda_decode", "torch")
        o = torch.empty_like(v2)
        g = kda_gate(f, A_log.reshape(-1), dt_bias, lower_bound)
        for i, slot in enumerate(cache_indices.tolist()):
            if slot < 0:
                o[i] = 0
                continue
            oi, S = kda_recurrent(l2_norm(q2[i : i + 1]), l2_norm(k2[i : i + 1]), v2[i : i + 1], g[i : i + 1],
                                  torch.sigmoid(beta[i : i + 1].float()), initial_state=ssm_states[slot].transpose(-1, -2))
            ssm_states[slot] = S.transpose(-1, -2).to(ssm_states.dtype)
            o[i] = oi[0]
        return o.unsqueeze(0)

    # ------------------------------------------------------------------ verify
    _UPSTREAM_VERIFY_EXTRAS = ("cache_ring", "replayssm_rawv", "replayssm_rawk", "replayssm_g", "replayssm_beta",
                               "fused_accept_state_indices", "fused_accept_num_accepted")

    def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
                      intermediate_states_buffer, intermediate_state_indices, cache_steps, retrieve_parent_token=None,
                      lower_bound: Optional[float] = None, **kwargs) -> torch.Tensor:
        """Chain verify through :func:`delta_rule_common.verify_chain` (committed state read,
        not written; per-token states to ``intermediate_states_buffer``). Tree verify and
        upstream's ring / fused-accept extras go to upstream's Triton kernel."""
        if retrieve_parent_token is not None or any(kwargs.get(n) is not None and kwargs.get(n) is not False
                                                     for n in self._UPSTREAM_VERIFY_EXTRAS):
            return super().target_verify(A_log, dt_bias, q, k, v, a, b, ssm_states=ssm_states,
                                         cache_indices=cache_indices, query_start_loc=query_start_loc,
                                         intermediate_states_buffer=intermediate_states_buffer,
                                         intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
                                         retrieve_parent_token=retrieve_parent_token, lower_bound=lower_bound, **kwargs)
        count_call("kda_verify", "sgl_hybrid")
        return verify_chain(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_states,
                            cache_indices=cache_indices, query_start_loc=query_start_loc,
                            intermediate_states_buffer=intermediate_states_buffer,
                            intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
                            gate="kda", lower_bound=lower_bound, force_triton=self.force_triton)

    # ------------------------------------------------------------------ extend
    def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, A_log=None, dt_bias=None,
               lower_bound: Optional[float] = None, beta_is_raw: bool = False, return_intermediate_states: bool = False,
               **kwargs):
        if A_log is None or not beta_is_raw:
            raise NotImplementedError("sgl_hybrid KDA extend takes the raw gate and raw beta (A_log given, beta_is_raw=True)")
        if kwargs.get("state_checkpoint_indices") is not None:
            raise NotImplementedError("sgl_hybrid KDA extend does not take FlashInfer checkpoint plans")
        _, N, H, K = q.shape
        q2, k2, v2 = q[0], k[0], v[0]
        f, b2 = g.reshape(N, H, K), beta.reshape(N, H)
        cu = query_start_loc.to(torch.int32)
        # host lengths from upstream's extend_seq_lens_cpu: no device read (issue 4)
        lens = extend_lengths(cu, kwargs.get("extend_seq_lens_cpu"))
        # A sequence starts from its slot's state only when it has a cached/previous
        # prefix (upstream passes extend_prefix_lens); otherwise from zeros. Built on the device.
        has_init = initial_state_flags(kwargs.get("extend_prefix_lens"), len(lens), q.device)
        track_state = kwargs.get("track_state")
        ckpts = plan_track_snapshots(track_state, kwargs.get("track_chunk_idx"), ssm_states, cache_indices, has_init)
        if self.force_triton or choose_chunk(q2, v2, ssm_states, gate_kind("kda", lower_bound), lower_bound) == "triton":
            count_call("kda_extend", "triton")
            ensure_chunk_binaries(q2, k2, v2, f, b2, A_log.reshape(-1), dt_bias.reshape(-1), ssm_states, "kda",
                                  lower_bound)
            o = gated_delta_chunk_triton(q2, k2, v2, f, b2, A_log.reshape(-1), dt_bias.reshape(-1), cu, ssm_states,
                                         cache_indices.to(torch.int32),
                                         has_init, "kda", lower_bound,
                                         state_layout="vk",
                                         checkpoints=ckpts, checkpoint_pool=track_state if ckpts else None,
                                         seq_lens_cpu=lens)  # host lengths: no second read of cu (issue 4)
        else:
            count_call("kda_extend", "torch")
            o = torch.empty_like(v2)
            gate = kda_gate(f, A_log.reshape(-1), dt_bias, lower_bound)
            start = 0
            has_init = has_init.tolist()
            for i, (n, slot) in enumerate(zip(lens, cache_indices.tolist())):
                sl = slice(start, start + n)
                start += n
                if n == 0:
                    continue
                want = [p for (s, p, _) in ckpts if s == i]
                s0 = ssm_states[slot].transpose(-1, -2).float() if has_init[i] else None
                oi, S, states = kda_chunk(l2_norm(q2[sl]), l2_norm(k2[sl]), v2[sl], gate[sl], torch.sigmoid(b2[sl].float()),
                                          initial_state=s0, chunk_size=MAMBA_CHUNK, checkpoints=want)
                ssm_states[slot] = S.transpose(-1, -2).to(ssm_states.dtype)
                for p in want:
                    track_state[i] = states[p].transpose(-1, -2).to(track_state.dtype)
                o[sl] = oi
        o = o.unsqueeze(0)
        return (o, None) if return_intermediate_states else o


def _around_dispatcher_init(original, self, decode_backend, prefill_backend, verify_backend, *args, **kwargs):
    if not (decode_backend.is_custom() or prefill_backend.is_custom() or verify_backend.is_custom()):
        return original(self, decode_backend, prefill_backend, verify_backend, *args, **kwargs)
    from sglang.srt.runtime_context import get_exec

    mamba = get_exec().mamba
    # Unset verify follows decode when decode is ours (upstream would default it to Triton).
    verify_follows = mamba.linear_attn_verify_backend is None and decode_backend.is_custom()
    custom = {"decode": decode_backend.is_custom(), "prefill": prefill_backend.is_custom(),
              "verify": verify_follows or verify_backend.is_custom()}
    names = {mamba.linear_attn_backend, mamba.linear_attn_decode_backend, mamba.linear_attn_prefill_backend,
             mamba.linear_attn_verify_backend} - {None}
    unknown = names - {BACKEND_NAME} - {b.value for b in LinearAttnKernelBackend}
    if unknown:
        raise ValueError(f"unknown linear-attention kernel backend(s) {sorted(unknown)}; ours is {BACKEND_NAME!r}")
    triton = LinearAttnKernelBackend.TRITON
    original(self, triton if custom["decode"] else decode_backend, triton if custom["prefill"] else prefill_backend,
             triton if custom["verify"] else verify_backend, *args, **kwargs)
    ours = SglHybridKDAKernel()
    if custom["decode"]:
        self.decode_kernel = ours
        self.supports_packed_decode = False
        self.supports_packed_decode_safe_gate = False
    if custom["prefill"]:
        self.extend_kernel = ours
    if custom["verify"]:
        self.verify_kernel = ours
    for phase, kernel in (("decode", self.decode_kernel), ("extend", self.extend_kernel), ("verify", self.verify_kernel)):
        record_choice(f"kda_{phase}_kernel", "sgl_hybrid" if kernel is ours else f"upstream:{type(kernel).__name__}",
                      "--linear-attn-*-backend sgl_hybrid" if kernel is ours else "upstream's choice", log=logger)


VERIFY_FLAG = "--linear-attn-verify-backend"


def _add_verify_choice(result, parser, *args, **kwargs):
    """AFTER ``ServerArgs.add_cli_args``: ``sgl_hybrid`` as a ``--linear-attn-verify-backend`` choice too.

    Upstream's public ``add_linear_attn_kernel_backend_choices`` extends the list that the backend,
    decode and prefill flags share, but the verify flag's choices are a copy made at import
    (that list plus ``nv_cutedsl``), so without this the documented ``--linear-attn-verify-backend
    sgl_hybrid`` was refused by the argument parser.
    """
    action = parser._option_string_actions.get(VERIFY_FLAG)
    if action is not None and action.choices is not None and BACKEND_NAME not in action.choices:
        action.choices.append(BACKEND_NAME)
    return result


class _BaseBackendAsTriton:
    """Read view of the resolving server arguments in which ``linear_attn_backend`` reads ``"triton"``."""

    def __init__(self, view):
        self._view = view

    def __getattr__(self, name):
        return "triton" if name == "linear_attn_backend" else getattr(self._view, name)


def _around_extra_buffer_check(original, view, hf_config, *args, **kwargs):
    """AROUND upstream's ``supports_mamba_cache_extra_buffer``: ``--linear-attn-backend sgl_hybrid`` counts
    as ``triton``.

    Upstream allows the ``extra_buffer`` mamba radix-cache strategy only when the base linear-attention
    backend is ``triton``; with ``sgl_hybrid`` the ``auto`` strategy resolved to ``no_buffer``, so Kimi K3
    got no prefix hit on an exact repeat and Qwen3.8 (page 64, forced by compressed QSA) failed with
    "no_buffer only supports page_size=1". Our KDA / GDN kernels write the track snapshots the strategy
    needs (``supports_track_state_snapshot``), as the per-mode flags, which keep the base ``triton``,
    already showed. The function is also the check of an explicit ``extra_buffer``
    (``mamba_hook.validate_mamba_extra_buffer``; the hook registry rebinds that import too).
    """
    if getattr(view, "linear_attn_backend", None) == BACKEND_NAME:
        view = _BaseBackendAsTriton(view)
    return original(view, hf_config, *args, **kwargs)


def install() -> None:
    """Register ``sgl_hybrid`` as a ``--linear-attn-*-backend`` choice (the verify flag's through
    :func:`_add_verify_choice`), let ``--linear-attn-backend sgl_hybrid`` keep the ``extra_buffer``
    mamba cache strategy (:func:`_around_extra_buffer_check`) and hook the KDA dispatcher."""
    from sglang.srt.arg_groups.choices import LINEAR_ATTN_KERNEL_BACKEND_CHOICES, add_linear_attn_kernel_backend_choices

    if BACKEND_NAME not in LINEAR_ATTN_KERNEL_BACKEND_CHOICES:
        add_linear_attn_kernel_backend_choices([BACKEND_NAME])
    register_patches(__name__)  # the three hooks declared in patches.py
