"""What upstream's EAGLE/MTP speculative worker needs on a CPU (issue 6).

Upstream SGLang 0.5.23 runs the speculative worker on CPU almost unchanged
(its ``sgl_kernel`` CPU ops come from our shim, see ``sgl-kernel/cpu_shim``);
the one recurrent-state step without a CPU path is the commit after verify:
``scatter_mamba_states_after_mtp_verify`` (``kernels/ops/mamba/
mamba_state_scatter_triton.py``) launches Triton scatters that accept only
CUDA/XPU tensors. The AROUND hook on it (``layers/attention/gdn_deferred.py``,
every platform, since it also commits GDN's deferred verify) runs
:func:`scatter_states_after_verify_torch` on CPU tensors: the same copies in
torch through upstream's own masked scatter
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

Third hook: Kimi K3 (``KimiK3LinearForCausalLM``) with any ``--speculative-algorithm`` on
``--device cpu`` is refused while the launcher resolves its arguments, before a model loads
(issue 42, defect 3). Our CPU KDA backend has no target-verify path
(``HybridKDAAttnBackend.forward_extend`` raises), and our CPU reference model has no MTP
layers, so each algorithm failed later in the scheduler with an unrelated error: NGRAM an
ImportError from the ``sgl_kernel`` stand-in, NEXTN an AttributeError (``get_embed_and_head``),
STANDALONE "torch_native not supported". The check wraps upstream's resolution step
``handle_speculative_decoding`` (``register_resolution_hook``, upstream's plugin API), where
the target's architecture is known (``model_config_of``). GPU devices are not checked.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from sglang_hybrid.patches import register_patches

logger = logging.getLogger(__name__)

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


def require_chain_speculation_cpu(self, forward_mode, spec_info) -> None:
    """Verify must be a chain (``--speculative-eagle-topk 1``); any width (module docstring).

    Raises:
        NotImplementedError: a tree verify (topk > 1).
    """
    if forward_mode is None or not forward_mode.is_target_verify():
        return
    if int(getattr(spec_info, "topk", 1) or 1) != 1:
        raise NotImplementedError("Qwen3.8 verify on CPU supports only --speculative-eagle-topk 1 (a draft chain)")


KIMI_K3_ARCHITECTURE = "KimiK3LinearForCausalLM"
#: Algorithms that draft from the target's own MTP layers when no draft checkpoint is given.
_MTP_ALGORITHMS = frozenset({"NEXTN", "EAGLE", "EAGLE3"})


def cpu_speculation_refusal(algorithm: Optional[str], device: Optional[str], architecture: Optional[str],
                            draft_model_path: Optional[str] = None) -> Optional[str]:
    """The start-up error for speculative decoding this CPU build cannot serve, or ``None``.

    Args:
        algorithm: ``--speculative-algorithm`` as given (any case; ``None``: no speculation).
        device: the resolved ``--device``; only ``"cpu"`` is checked.
        architecture: the target checkpoint's ``architectures[0]``.
        draft_model_path: ``--speculative-draft-model-path`` (``None``: the target's own MTP layers).

    Returns:
        One message naming the flag, the architecture, the reason and what works instead;
        ``None`` when the combination is not refused.
    """
    if not algorithm or device != "cpu" or architecture != KIMI_K3_ARCHITECTURE:
        return None
    name = algorithm.upper()
    no_verify = "the KDA layers have no target-verify path on CPU (sglang-hybrid's CPU KDA backend)"
    if name in _MTP_ALGORITHMS and draft_model_path is None:
        reason = f"sglang-hybrid's CPU reference model has no MTP layers to draft from, and {no_verify}"
    else:
        reason = f"{no_verify}, so {name}'s drafts cannot be verified"
    return (f"--speculative-algorithm {name} is not supported for {architecture} on --device cpu: {reason}. "
            f"On CPU serve Kimi K3 without --speculative-algorithm; speculative decoding of Kimi K3 "
            f"runs on a GPU (upstream's {architecture} class and its KDA target-verify path).")


def refuse_unsupported_cpu_speculation(server_args, previous: Callable) -> None:
    """Resolution hook around upstream's ``handle_speculative_decoding`` (module docstring).

    Raises:
        ValueError: :func:`cpu_speculation_refusal` has a message for these arguments.
    """
    from sglang.srt.arg_groups.overrides import model_config_of, resolving_view

    cfg = resolving_view(server_args)
    if cfg.speculative_algorithm and cfg.device == "cpu":
        architectures = getattr(model_config_of(server_args).hf_config, "architectures", None) or [None]
        message = cpu_speculation_refusal(cfg.speculative_algorithm, cfg.device, architectures[0],
                                          cfg.speculative_draft_model_path)
        if message:
            raise ValueError(message)
    previous(server_args)


def install() -> None:
    """Register the CPU speculative hooks declared in ``patches.py`` (call on the CPU platform only): REPLACE
    ``_require_chain_speculation`` and the resolution hook around ``handle_speculative_decoding`` (registered
    once per process: upstream's registry appends). The post-verify scatter's hook is ``gdn_deferred``'s."""
    register_patches(__name__)
