"""GDN deferred commit on the MTP verify path (issue 41 item 1; seeds digest item 12).

Upstream's chain verify (``target_verify`` of a linear-attention kernel) writes the recurrent state after
every one of the ``T = 1 + drafts`` tokens of a request into the speculative scratch ``intermediate_ssm``
``[L, rows, T, HV, V, K]``, and the commit after acceptance (``scatter_mamba_states_after_mtp_verify``)
copies the last accepted one into the request's slot: ``T`` full states written per request and layer,
``T - 1`` of them mostly thrown away. With the deferred commit our GDN verify

* writes the state after **token 0** straight into the request's slot (token 0 is the previous step's
  bonus token: a chain verify always accepts it), and
* keeps, for tokens ``1 .. T - 1``, only their inputs (L2-normalised key, log decay, beta, value:
  ``K + 1 + 1 + V`` floats per value head, about 2 % of a ``[V, K]`` state) as **records**;

and the commit, in place of upstream's copy of the accepted snapshot, **replays** the accepted tokens
``1 .. n - 1`` from their records onto the slot's state (one launch per GDN layer for all requests,
:func:`sgl_hybrid_kernel.delta_rule.recurrent.wrapper.replay_commit`). Per request and layer that is one
state written by the verify instead of ``T``; the commit reads and writes one state, as upstream's copy does.

Prefix-cache checkpoints: where upstream's commit also copies the snapshot of step ``s`` into a track slot
(``mamba_track_indices`` / ``mamba_steps_to_track``: the accepted prefix crosses the checkpoint grid), the
commit copies the request's token-0 state and records to the track slot (upstream's masked scatter, rows
with ``s < 0`` skipped on the device) and replays ``s + 1`` tokens there, so a cache reader gets the state
at the position it expects. The conv windows are committed by upstream's scatter unchanged.

Where the records live: in the memory of ``intermediate_ssm``, which a deferred verify no longer fills.
Viewed from its start as FP32 ``[L * slots, T - 1, HV, K + 2 + V]`` (row ``l * slots + slot``), the
records of every layer fit when ``slots * (T - 1) * (K + 2 + V) * 4`` bytes per layer do not exceed a
layer's scratch (``rows * T * V * K`` elements of the SSM dtype); otherwise, and for tree verify,
upstream's snapshots are kept (logged once at the first verify, reason included).

A deferred verify is remembered per state pool (its storage), so the commit hook knows the scratch holds
records: every verify of that pool is deferred from then on (the choice depends only on shapes fixed at
start-up), on the Triton kernel and on the torch path alike (:func:`deferred_verify_torch`).

``SGLANG_HYBRID_GDN_VERIFY_COMMIT``: ``deferred``, ``snapshots`` (upstream's protocol) or ``auto`` (the default:
deferred on CPU, snapshots on a GPU until a GPU run of the deferred commit has passed; :func:`commit_mode`).
Numerics: the torch path runs the snapshot path's operations in the same order (equal to FP32 rounding of
the CPU's vector kernels, which depend on memory alignment); the Triton replay runs the verify's kernel with
the replayed tokens (``replay_commit``), equal to the snapshot of the last accepted token to FP32 rounding
(bit for bit where it runs the verify's tile: the replay launches one layer at a time at the commit's batch).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from sgl_hybrid_kernel.delta_rule.naive import replay_commit_torch
from sgl_hybrid_kernel.dispatch import count_call, record_choice
from sglang_hybrid.patches import register_patches

logger = logging.getLogger(__name__)

ENV = "SGLANG_HYBRID_GDN_VERIFY_COMMIT"
MODES = ("auto", "deferred", "snapshots")


def commit_mode(device: Optional[torch.device] = None) -> str:
    """``deferred`` or ``snapshots`` from ``$SGLANG_HYBRID_GDN_VERIFY_COMMIT`` (``auto`` when unset).

    ``auto``: deferred on CPU; on a GPU upstream's snapshots until the deferred commit has run on one
    (``test/gpu/test_qwen38_gpu.py::TestQwen38MTPGPU`` sets ``deferred``): a served path that has not run on
    the hardware stays opt-in.

    Raises:
        ValueError: a value other than ``auto`` / ``deferred`` / ``snapshots``, naming the variable.
    """
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    if value == "auto":
        return "deferred" if device is None or torch.device(device).type == "cpu" else "snapshots"
    return value


@dataclass(frozen=True)
class DeferredWindow:
    """What the commit needs to replay a deferred verify of one state pool.

    Attributes:
        tokens: ``T`` (1 + drafts); num_k_heads, num_v_heads, head_k_dim, head_v_dim: the layer's GDN shape;
        activation_dtype: the verify's q / k / v dtype (the replay repeats it);
        records: FP32 ``[L * slots, T - 1, HV, K + 2 + V]`` over the scratch's memory;
        layers, slots: the pool's ``[L, slots, ...]``.
    """

    tokens: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    activation_dtype: torch.dtype
    records: torch.Tensor
    layers: int
    slots: int


# keyed by the whole state pool tensor (upstream's ``temporal``), weakly: a freed pool takes its entry along
_WINDOWS: "WeakIdKeyDictionary" = WeakIdKeyDictionary()
_REFUSED: "WeakIdKeyDictionary" = WeakIdKeyDictionary()  # pool -> why its verify keeps snapshots


def window_of(states: torch.Tensor) -> Optional[DeferredWindow]:
    """The deferred window registered for the pool ``states`` (upstream's ``temporal`` ``[L, slots, ...]``),
    or ``None``. Looked up by the root tensor of its layer views, the key the verify registered under
    (``records_for_layer`` sees only a layer's view), so a ``temporal`` that is itself a view finds it too."""
    if states.dim() < 2 or states.numel() == 0:
        return None
    root = _whole(states[0])
    return _WINDOWS.get(root) if root is not None else None


def _whole(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The pool tensor ``t`` is a layer of (``t._base``: the root of upstream's ``pool[layer]`` view), when
    ``t`` is its contiguous layer ``t.storage_offset() // t.numel()``."""
    base = t._base
    if base is None or not base.is_contiguous() or not t.is_contiguous() or base.dim() != t.dim() + 1:
        return None
    if tuple(base.shape[1:]) != tuple(t.shape) or t.storage_offset() % t.numel() != 0:
        return None
    return base


def records_for_layer(ssm_states: torch.Tensor, scratch: torch.Tensor, tokens: int, num_k_heads: int,
                      activation_dtype: torch.dtype) -> Tuple[Optional[torch.Tensor], str]:
    """The records of one GDN layer's deferred verify, or why it keeps upstream's snapshots.

    Args:
        ssm_states: the layer's FP32 pool ``[slots, HV, V, K]`` (a layer of upstream's ``[L, slots, ...]``).
        scratch: the layer's ``intermediate_states_buffer`` ``[rows, steps, HV, V, K]`` (a layer of
            ``intermediate_ssm``).
        tokens: ``T``; num_k_heads: ``H``; activation_dtype: q / k / v dtype.

    Returns:
        ``(records [slots, T - 1, HV, K + 2 + V] FP32, "deferred")`` (rows ``l * slots ..`` of the whole view),
        or ``(None, reason)``. The first call per pool decides
        and logs; later calls of that pool follow it.
    """
    whole_states = _whole(ssm_states)
    if whole_states is None:
        return None, "the state pool is not upstream's contiguous [layers, slots, ...] tensor"
    window = _WINDOWS.get(whole_states)
    if window is None and whole_states in _REFUSED:
        return None, _REFUSED[whole_states]
    if window is None:
        reason = _refusal(ssm_states, whole_states, scratch, tokens)
        if reason is None:
            slots, HV, V, K = ssm_states.shape
            whole_scratch = _whole(scratch)
            L = whole_states.shape[0]
            rw = K + 2 + V
            flat = whole_scratch.view(-1).view(torch.uint8).view(torch.float32)
            records = flat[: L * slots * (tokens - 1) * HV * rw].view(L * slots, tokens - 1, HV, rw)
            window = DeferredWindow(tokens, num_k_heads, HV, K, V, activation_dtype, records, L, slots)
            _WINDOWS[whole_states] = window
            record_choice("gdn_verify_commit", "deferred",
                          f"T={tokens}: token 0's state into the slot, records of tokens 1..{tokens - 1} "
                          f"({rw} floats per head) in the verify scratch, replayed at the commit", log=logger)
        else:
            _REFUSED[whole_states] = reason
            record_choice("gdn_verify_commit", "snapshots", reason, log=logger)
            return None, reason
    if window.tokens != tokens:
        raise ValueError(f"GDN deferred commit: a verify of {tokens} tokens on a pool whose deferred windows "
                         f"have {window.tokens} (the draft count is fixed per server)")
    layer = ssm_states.storage_offset() // ssm_states.numel()
    return window.records[layer * window.slots:(layer + 1) * window.slots], "deferred"


def _refusal(ssm_states, whole_states, scratch, tokens) -> Optional[str]:
    mode = commit_mode(ssm_states.device)
    if mode != "deferred":
        return f"{ENV}={os.environ.get(ENV, 'auto')} on {ssm_states.device.type}"
    if tokens < 2:
        return "a window of one token has nothing to defer"
    if ssm_states.dtype != torch.float32:
        return f"SSM state dtype {ssm_states.dtype} (the records and replay are FP32)"
    whole_scratch = _whole(scratch) if scratch is not None else None
    if whole_scratch is None:
        return "the verify scratch is not upstream's contiguous [layers, rows, steps, ...] tensor"
    if whole_scratch.shape[0] != whole_states.shape[0]:
        return f"{whole_scratch.shape[0]} scratch layers for {whole_states.shape[0]} state layers"
    slots, HV, V, K = ssm_states.shape
    need = slots * (tokens - 1) * HV * (K + 2 + V) * 4
    have = scratch.numel() * scratch.element_size()
    if need > have:
        return (f"records of {slots} slots need {need / 2**20:.1f} MiB per layer, the verify scratch has "
                f"{have / 2**20:.1f} MiB")
    return None


def _replay(states: torch.Tensor, records: torch.Tensor, idx: torch.Tensor, accept: torch.Tensor,
            window: DeferredWindow) -> None:
    if states.device.type != "cpu":
        from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import replay_commit

        replay_commit(states, idx, accept, records, window.head_k_dim, "gdn", "vk",
                      num_k_heads=window.num_k_heads, activation_dtype=window.activation_dtype)
    else:
        replay_commit_torch(states, idx, accept, records, window.head_k_dim, "gdn", "vk")


def commit_deferred(window: DeferredWindow, states: torch.Tensor, state_indices: torch.Tensor, last_correct_step_indices: torch.Tensor,
                    mamba_track_indices: Optional[torch.Tensor], mamba_steps_to_track: Optional[torch.Tensor]) -> None:
    """Commit a deferred verify of every GDN layer (module docstring): track slots get the request's token-0
    state and records and replay ``s + 1`` tokens; each request's slot replays ``last + 1`` tokens.

    Args:
        states: the whole FP32 pool ``[L, slots, HV, V, K]`` (upstream's ``temporal``);
        state_indices: ``[B]`` slots (negative: padding); last_correct_step_indices: ``[B]`` index of the last
            accepted token in the window (``n - 1``; negative: nothing committed beyond token 0);
        mamba_track_indices / mamba_steps_to_track: ``[B]`` track slots and the window index whose state
            each needs (negative: none), or ``None``.

    Raises:
        ValueError: track slots without their steps.

    No host read of any index tensor (the commit runs in the scheduler's overlap path). One replay launch per
    layer, the track rows in the same launch as the requests' slots.
    """
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    L, S = window.layers, window.slots
    dev = states.device
    B = state_indices.shape[0]
    slots = state_indices.to(device=dev, dtype=torch.long)
    idx, acc = slots, (last_correct_step_indices.to(device=dev, dtype=torch.long)[:B] + 1).clamp(min=1)
    if mamba_track_indices is not None:
        if mamba_steps_to_track is None:
            raise ValueError("mamba_steps_to_track is required with mamba_track_indices")
        track = mamba_track_indices.to(device=dev, dtype=torch.long)[:B]
        steps = mamba_steps_to_track.to(device=dev, dtype=torch.long)[:B]
        copy_step = torch.where(steps >= 0, 0, -1)
        scatter = HybridLinearAttnBackend._scatter_speculative_state_with_mask
        # token-0 state and records of each request into its track slot (rows with no track step skipped)
        scatter(states, states.unsqueeze(2), track, copy_step, slots)
        per_slot = window.records.view(L, S, -1)
        scatter(per_slot, per_slot.unsqueeze(2), track, copy_step, slots)
        take = (steps >= 0) & (track >= 0) & (slots >= 0)
        idx = torch.cat([slots, torch.where(take, track, -1)])
        acc = torch.cat([acc, (steps + 1).clamp(min=1)])
    idx = idx.to(torch.int32)
    acc = acc.to(torch.int32)
    count_call("gdn_verify_commit", "deferred_replay_" + ("torch" if dev.type == "cpu" else "triton"))
    for layer in range(L):
        _replay(states[layer], window.records[layer * S:(layer + 1) * S], idx, acc, window)


class _ConvOnly:
    """Upstream's ``SpeculativeState`` with the SSM part left out, for the conv-window half of the commit."""

    def __init__(self, caches):
        self.temporal = caches.temporal.new_empty(0)
        self.intermediate_ssm = None
        self.conv = caches.conv
        self.intermediate_conv_window = caches.intermediate_conv_window


def scatter_after_verify(original_fn, mamba_caches, state_indices_tensor, last_correct_step_indices,
                         mamba_track_indices, mamba_steps_to_track, src_indices_raw=None):
    """AROUND hook of upstream's ``scatter_mamba_states_after_mtp_verify`` (every platform).

    A pool whose verify was deferred: conv windows through upstream's scatter (torch on CPU), the SSM
    states by :func:`commit_deferred`. Any other pool: upstream's scatter (GPU) or its torch version (CPU,
    ``platforms/cpu_spec.py``)."""
    window = window_of(mamba_caches.temporal)
    caches = _ConvOnly(mamba_caches) if window is not None else mamba_caches
    on_gpu = any(t.is_cuda or getattr(t, "is_xpu", False) for t in [mamba_caches.temporal, *mamba_caches.conv])
    if on_gpu:
        original_fn(caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices,
                    mamba_steps_to_track, src_indices_raw)
    else:
        from sglang_hybrid.platforms.cpu_spec import scatter_states_after_verify_torch

        scatter_states_after_verify_torch(caches, state_indices_tensor, last_correct_step_indices,
                                          mamba_track_indices, mamba_steps_to_track, src_indices_raw)
    if window is not None:
        commit_deferred(window, mamba_caches.temporal, state_indices_tensor, last_correct_step_indices, mamba_track_indices,
                        mamba_steps_to_track)


def install() -> None:
    """Register the AROUND hook of the post-verify scatter (``patches.py``); every platform."""
    register_patches(__name__)
