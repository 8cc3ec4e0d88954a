"""What upstream's EAGLE/MTP speculative worker needs on a CPU (issue 6).

Upstream SGLang 0.5.23 runs the speculative worker on CPU almost unchanged
(its ``sgl_kernel`` CPU ops come from our shim, see ``sgl-kernel/cpu_shim``);
the one recurrent-state step without a CPU path is the commit after verify:
``scatter_mamba_states_after_mtp_verify`` (``kernels/ops/mamba/
mamba_state_scatter_triton.py``) launches Triton scatters that accept only
CUDA/XPU tensors. :func:`install` wraps it (AROUND hook, anchor checked): on
CPU tensors the same copies run in torch through upstream's own masked scatter
(``HybridLinearAttnBackend._scatter_speculative_state_with_mask``, the one its
PLE side states already use); on a GPU the original runs.

Commit semantics (per request ``i``, ``step = last_correct_step_indices[i]``):
``temporal[:, slot_i] = intermediate_ssm[:, i, step]`` and the same for every
conv window; with a checkpoint track plan also ``[:, track_i] = [:, i,
mamba_steps_to_track[i]]`` where that step is ``>= 0``. Steps are indices of
accepted rows, so a rejected draft's state is never copied anywhere.

Second hook: upstream's QSA backend refuses a verify window wider than the
QSA compress ratio (``QwenSparseAttnBackend._require_chain_speculation``: its
CUDA path keeps a one-group ring of pending index keys). On CPU our reference
model computes QSA itself (compressed keys recomputed from FP32 raw index keys
each forward, ``models/qwen38/qsa.py``) and reads none of that backend's
metadata, so the width limit does not apply there; the chain-only (topk = 1)
check is kept.
"""

from __future__ import annotations

import logging

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

logger = logging.getLogger(__name__)

SCATTER_TARGET = "sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify"


def scatter_states_after_verify_torch(
    mamba_caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track,
    src_indices_raw=None,
) -> None:
    """Torch version of upstream's post-verify scatter (module docstring).

    ``mamba_caches``: upstream's ``MambaPool.SpeculativeState`` (``temporal``
    ``[L, slots, ...]``, ``intermediate_ssm`` ``[L, rows, steps, ...]``, ``conv`` /
    ``intermediate_conv_window`` lists of the same layout). Index tensors are
    ``[B]``; a negative step skips its request. Raises ``ValueError`` if a track
    plan is given without its steps.
    """
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    scatter = HybridLinearAttnBackend._scatter_speculative_state_with_mask
    if mamba_track_indices is not None and mamba_steps_to_track is None:
        raise ValueError("mamba_steps_to_track is required with mamba_track_indices")
    pairs = []
    if mamba_caches.temporal.numel() > 0:
        pairs.append((mamba_caches.temporal, mamba_caches.intermediate_ssm))
    pairs += [(c, w) for c, w in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window) if c.numel() > 0]
    for dst, src in pairs:
        scatter(dst, src, state_indices_tensor, last_correct_step_indices, src_indices_raw)
        if mamba_track_indices is not None:
            scatter(dst, src, mamba_track_indices, mamba_steps_to_track, src_indices_raw)


def _scatter_around(original_fn, mamba_caches, *args, **kwargs):
    if mamba_caches.temporal.is_cuda or getattr(mamba_caches.temporal, "is_xpu", False):
        return original_fn(mamba_caches, *args, **kwargs)
    return scatter_states_after_verify_torch(mamba_caches, *args, **kwargs)


QSA_CHAIN_TARGET = "sglang.srt.layers.attention.qwen_sparse_attn_backend.QwenSparseAttnBackend._require_chain_speculation"


def require_chain_speculation_cpu(self, forward_mode, spec_info) -> None:
    """Verify must be a chain (``--speculative-eagle-topk 1``); any width (module docstring).

    Raises:
        NotImplementedError: a tree verify (topk > 1).
    """
    if forward_mode is None or not forward_mode.is_target_verify():
        return
    if int(getattr(spec_info, "topk", 1) or 1) != 1:
        raise NotImplementedError("Qwen3.8 verify on CPU supports only --speculative-eagle-topk 1 (a draft chain)")


def install() -> None:
    """Register the CPU speculative hooks (call on the CPU platform only)."""
    HookRegistry.register(SCATTER_TARGET, _scatter_around, HookType.AROUND)
    HookRegistry.register(QSA_CHAIN_TARGET, require_chain_speculation_cpu, HookType.REPLACE)
