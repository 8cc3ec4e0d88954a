"""Fused KDA decode on the served path: upstream's Kimi K3 class, our one-launch kernel.

Upstream's ``KimiK3DeltaAttention`` already has a hand-off for a fused decode step
(``models/kimi_k3.py``, "attempt-and-verify stash"): when its ``_kda_fused_decode_ready``
is set, every decode / target-verify forward puts the output-norm gate on the attention
layer (``layer._k3_onorm_gate``); a backend that consumes it returns the *normalised*
output and sets ``layer._k3_onorm_consumed``, otherwise the model applies ``o_norm``
itself. Upstream sets the flag only for its CUDA kernel's shapes (12 heads of 128).

This module makes the hand-off serve our kernel
(``sgl_hybrid_kernel.kda.fused_decode``: conv window update + SiLU + Q/K L2 norm + gates +
delta-rule update + gated RMSNorm, one launch, conv window and state updated in place,
output written into its buffer; seeds digest, item 5):

* AFTER ``KimiK3DeltaAttention._prepare_fused_decode`` (run once after the weights load,
  before CUDA-graph capture): when the layer is inside the kernel's contract
  (:func:`static_contract`), record our static inputs on the attention layer, set the
  model's ready flag and reserve the kernel's workspace for the largest captured batch;
* :func:`try_fused_decode`, called first by ``HybridKDAAttnBackend.forward_decode`` on a
  GPU when the decode kernel is ours (``--linear-attn-backend sgl_hybrid`` or
  ``--linear-attn-decode-backend sgl_hybrid``): runs the kernel when the stash is there
  and the runtime tensors are inside the contract, else returns ``None`` and the ordinary
  path (conv + our recurrent kernel, the model's ``o_norm``) serves the step.

Where upstream's own CUDA fused kernel covers a step (it publishes ``_k3_fused_decode_args`` for 3 /
6 / 12 heads of 128 and its ``covered()`` accepts the tensors), that step goes to it: on NVIDIA it is
the faster of the two (:func:`_upstream_covered`); ``SGLANG_HYBRID_KDA_FUSED_DECODE=ours`` keeps ours
there too. ``SGLANG_HYBRID_UPSTREAM_OPS=kda_fused_decode`` leaves the hook out (A/B runs). Counters:
``kda_decode=fused`` (ours) and ``kda_decode=upstream_cuda_fused`` (handed to upstream's) per call
(``/get_server_info``); the start-up table names the choice.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sgl_hybrid_kernel.dispatch import count_call, record_choice
from sglang_hybrid.patches import register_patches

logger = logging.getLogger(__name__)

OP = "kda_decode_fused"
MODE_ENV = "SGLANG_HYBRID_KDA_FUSED_DECODE"
# Workspace rows reserved before capture, in requests (a larger eager batch grows it then).
DEFAULT_RESERVED_BATCH = 512
MAX_RESERVED_BATCH = 8192


@dataclass(frozen=True)
class FusedDecodeStatic:
    """What the kernel needs besides the step's tensors: the gated output norm's weight ``[V]``
    and epsilon (``o_norm``, sigmoid gate); ``upstream_covered``: upstream's ``covered()`` where
    steps it accepts go to upstream's CUDA kernel (:func:`_upstream_covered`), else ``None``."""

    norm_weight: torch.Tensor
    eps: float
    upstream_covered: Optional[Callable[..., bool]] = None


def _upstream_covered(layer, mode: str) -> Optional[Callable[..., bool]]:
    """Upstream's ``covered()`` when steps it accepts should go to its CUDA fused decode
    (``sglang.kernels.ops.attention.kda_fused_decode``, a vendored kernel for 3 / 6 / 12 heads of 128,
    BF16), resolved once at model load: the model published its static inputs
    (``_k3_fused_decode_args``) and ``mode`` is ``auto``. There it is the faster one-launch step on
    NVIDIA (H100, one GPU's share of K3 at TP8, C = 1 / 8 / 32: 6.1 / 7.9 / 18.6 µs per layer against
    our Triton kernel's 8.8 / 11.5 / 28.0; ``benchmark/gpu/profile_decode_step.py``, docs/benchmarks.md)."""
    if mode != "auto" or getattr(layer, "_k3_fused_decode_args", None) is None:
        return None
    try:
        from sglang.kernels.ops.attention import kda_fused_decode as upstream
    except Exception:  # not importable here (no JIT toolchain): ours serves
        return None
    return upstream.covered


def static_contract(layer, o_norm) -> Optional[str]:
    """``None`` when attention layer ``layer`` (upstream's ``RadixLinearAttention``) and the model's
    ``o_norm`` are inside the fused kernel's contract, else the reason it is not.

    The contract (``sgl_hybrid_kernel/kda/fused_decode.py``): no conv bias; conv filter
    ``[2 * H * K + H * V, W]`` with ``W >= 2``; ``H`` q, k and v heads (no GQA); per-head ``A_log``,
    per-channel ``dt_bias`` ``[H * K]``; the output norm gated by a sigmoid."""
    w = getattr(layer, "conv_weights", None)
    H, K, V = layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    if getattr(layer, "bias", None) is not None:
        return "conv bias (the kernel has none)"
    if layer.num_q_heads != H or layer.num_k_heads != H:
        return f"q/k heads {layer.num_q_heads}/{layer.num_k_heads} != v heads {H}"
    if w is None or w.dim() != 2 or w.shape[0] != 2 * H * K + H * V or w.shape[1] < 2:
        return f"conv filter {None if w is None else tuple(w.shape)}"
    if layer.A_log is None or layer.A_log.numel() != H:
        return "A_log is not one value per head"
    if layer.dt_bias is None or layer.dt_bias.numel() != H * K:
        return "dt_bias is not one value per key channel"
    weight = getattr(o_norm, "weight", None)
    if getattr(o_norm, "activation", None) != "sigmoid" or weight is None or weight.numel() != V:
        return "output norm is not a sigmoid-gated RMSNorm over the value width"
    return None


def _reserved_batch() -> int:
    """Requests one decode step can hold: the scheduler's ``max_running_requests`` (bounded), which
    also bounds every captured CUDA-graph batch."""
    try:
        from sglang.srt.runtime_context import get_schedule

        bound = get_schedule().max_running_requests
    except Exception:  # no scheduler context (a model built outside a server)
        bound = None
    return min(max(int(bound or 0), DEFAULT_RESERVED_BATCH), MAX_RESERVED_BATCH)


def _after_prepare(result, self, *args, **kwargs):
    """AFTER upstream's ``_prepare_fused_decode``: offer the stash to our kernel where it fits."""
    layer = self.attn
    if getattr(self, "_kda_hip_fused_decode_ready", False):
        # upstream's ROCm kernel defers f_b (the backend gets f_a): that hand-off is upstream's
        reason = "upstream's ROCm fused decode engaged (deferred f_b)"
    elif layer.conv_weights is None or layer.conv_weights.device.type == "cpu":
        reason = "CPU"
    else:
        reason = static_contract(layer, self.o_norm)
    if reason is not None:
        record_choice(OP, "unfused", f"outside the fused kernel's contract: {reason}", log=logger)
        return result
    from sgl_hybrid_kernel.kda.fused_decode import reserve_workspace

    mode = os.environ.get(MODE_ENV, "auto").strip().lower()
    if mode not in ("auto", "ours"):
        raise ValueError(f"{MODE_ENV} must be 'auto' or 'ours', got {mode!r}")
    upstream_covered = _upstream_covered(layer, mode)
    layer._sgl_hybrid_fused_decode = FusedDecodeStatic(self.o_norm.weight, float(self.o_norm.eps), upstream_covered)
    self._kda_fused_decode_ready = True  # the model now offers the output-norm gate on decode
    reserve_workspace(layer.conv_weights.device, _reserved_batch(), layer.num_v_heads, layer.head_v_dim)
    upstream_too = upstream_covered is not None
    record_choice(OP, "sgl_hybrid", "conv + gates + recurrence + gated RMSNorm in one launch when the decode "
                  "kernel is sgl_hybrid" + ("; steps upstream's CUDA fused kernel covers go to it (faster on NVIDIA; "
                                           f"{MODE_ENV}=ours keeps ours)" if upstream_too else ""), log=logger)
    return result


def try_fused_decode(backend, layer, forward_batch, mixed_qkv, a, b) -> Optional[torch.Tensor]:
    """One decode step through the fused kernel, or ``None`` when it does not apply.

    Args:
        backend: upstream's ``KDAAttnBackend`` (its pools, metadata and decode track copy).
        layer: ``RadixLinearAttention`` carrying the model's stash.
        mixed_qkv: ``[B, 2 * H * K + H * V]`` raw q|k|v (pre-conv), BF16 or FP32, unit inner stride.
        a: raw forget-gate projection, ``B * H * K`` values; b: raw beta, ``[1, B, H]``.

    Returns:
        ``[1, B, H, V]``: ``rms_norm(o) * o_norm.weight * sigmoid(gate)`` (the model skips its
        ``o_norm``: ``layer._k3_onorm_consumed`` is set), or ``None``.
    """
    static = getattr(layer, "_sgl_hybrid_fused_decode", None)
    gate = getattr(layer, "_k3_onorm_gate", None)
    if static is None or gate is None or getattr(layer, "_k3_deferred_f_b", False):
        return None
    if not isinstance(mixed_qkv, torch.Tensor) or mixed_qkv.dim() != 2 or mixed_qkv.stride(-1) != 1:
        return None
    cache = backend.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
    if getattr(cache, "replayssm_d", None) is not None:  # upstream's ReplaySSM pools: its own decode
        return None
    conv, ssm = cache.conv[0], cache.temporal
    idx = backend.forward_metadata.mamba_cache_indices
    B, H, V = mixed_qkv.shape[0], layer.num_v_heads, layer.head_v_dim
    if (idx.shape[0] != B or ssm.dim() != 4 or ssm.shape[1:] != (H, V, layer.head_k_dim)
            or ssm.dtype != torch.float32 or conv.dim() != 3 or conv.stride(-1) != 1
            or a.numel() != B * H * layer.head_k_dim or b.numel() != B * H or gate.numel() != B * H * V):
        return None
    if static.upstream_covered is not None and static.upstream_covered(mixed_qkv, a, b.reshape(B, H), conv, ssm,
                                                                          idx, gate):
        count_call("kda_decode", "upstream_cuda_fused")
        return None  # upstream's forward_decode runs its CUDA kernel on the same stash
    from sgl_hybrid_kernel.kda.fused_decode import kda_fused_decode

    out = mixed_qkv.new_empty((1, B, H, V))
    kda_fused_decode(mixed_qkv, conv, layer.conv_weights, a.reshape(B, -1), b.reshape(B, H), layer.A_log.reshape(-1),
                     layer.dt_bias.reshape(-1), ssm, idx, gate.reshape(B, -1), static.norm_weight, eps=static.eps,
                     lower_bound=layer.lower_bound, scale=layer.head_k_dim ** -0.5, state_layout="vk", out=out[0])
    layer._k3_onorm_consumed = True
    count_call("kda_decode", "fused")
    backend._track_mamba_state_decode(forward_batch, conv, ssm, idx, layer.layer_id)
    return out


def install() -> None:
    """Hook upstream's ``_prepare_fused_decode`` (AFTER) so that the model offers our kernel the stash."""
    register_patches(__name__)
