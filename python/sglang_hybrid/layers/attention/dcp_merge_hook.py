"""Our DCP merge in place of upstream's all-reduce merge, for ``--attention-backend sgl_hybrid_mla`` (issue 5, Wiring).

Under decode context parallelism (DCP, ``c`` ranks; position ``p`` on rank ``p mod c``)
upstream's ``TritonAttnBackend`` gathers every query head onto each rank, attends
them over the rank's KV shard and merges the ``c`` partial ``(o, lse)`` pairs with
``cp_lse_ag_out_rs_mha`` (``sglang.srt.layers.dcp.comm``, imported by name into
``triton_backend``; called from ``forward_decode`` and ``_forward_extend_dcp``):
all-gather the LSEs, scale the local output, all-reduce the full ``[R, H, D]``
and keep this rank's ``H / c`` heads.

An AROUND hook on ``sglang.srt.layers.attention.triton_backend.cp_lse_ag_out_rs_mha``
replaces that, for calls made while our backend serves (:func:`serving`, entered by
``mla_backend``'s wrapped ``forward_decode`` / ``forward_extend``), with
:func:`a2a_merge`: one ``all_to_all_single`` over upstream's DCP
``GroupCoordinator`` sends head group ``j`` of every rank to rank ``j`` (output
and LSE packed in one FP32 buffer when the output is FP32, as upstream's two
callers pass it), so rank ``j`` holds ``[c, R, H/c, D]`` partials and
``[c, R, H/c]`` LSEs for its heads, merged by
``sgl_hybrid_kernel.dcp.dispatch.merge_partial_attention`` (Triton on CUDA /
ROCm, torch on CPU; natural-log LSE; an empty shard ``(0, -inf)`` has weight 0
and gives no NaN).

Bytes per rank: the all-to-all sends ``(c - 1) / c`` of the ``[R, H, D]`` tensor
(plus one LSE column); a ring all-reduce moves ``2 (c - 1) / c`` of it, and
upstream also all-gathers the LSEs first — about half the traffic, in one
collective instead of two.

Calls outside the contract go to upstream's function, the choice logged once
through ``record_choice("dcp_merge_hook", ...)``: not made under our backend,
group of one rank, ``H`` not divisible by ``c``, or shapes other than
``o [R, H, D]`` with ``lse [R, H]``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from typing import Iterator, Tuple, Union

import torch

from sgl_hybrid_kernel.dcp.dispatch import merge_partial_attention
from sgl_hybrid_kernel.dispatch import record_choice

logger = logging.getLogger(__name__)


CALLS: Counter = Counter()  # "sgl_hybrid" / "upstream" calls through the hook (tests, diagnostics)
_STATE = threading.local()


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """Mark the calls made in this block (this thread) as made by our MLA backend."""
    depth = getattr(_STATE, "depth", 0)
    _STATE.depth = depth + 1
    try:
        yield
    finally:
        _STATE.depth = depth


def active() -> bool:
    """True inside :func:`serving`."""
    return getattr(_STATE, "depth", 0) > 0


def _all_to_all(cp_group, output: torch.Tensor, input: torch.Tensor) -> None:
    # GroupCoordinator.all_to_all_single goes through a torch custom op registered for the GPU dispatch key
    # only; CPU tensors (gloo groups: tests, CPU serving) take the method that op runs, on the same group.
    if input.device.type == "cpu":
        cp_group._all_to_all_single(output, input)
    else:
        cp_group.all_to_all_single(output, input)


def a2a_merge(cp_attn_out: torch.Tensor, cp_attn_lse: torch.Tensor, cp_group,
              return_lse: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Merge DCP partials with one all-to-all and our merge kernel (upstream's ``cp_lse_ag_out_rs_mha`` contract).

    Args:
        cp_attn_out: ``[R, H, D]`` this rank's partial output for all ``H`` heads (any float dtype).
        cp_attn_lse: ``[R, H]`` its natural-log LSE; ``-inf`` where this rank saw no position.
        cp_group: upstream's DCP ``GroupCoordinator`` (``c = world_size`` ranks).
        return_lse: also return the merged LSE.

    Returns:
        ``o [R, H/c, D]`` (heads ``rank*H/c .. (rank+1)*H/c``, dtype of ``cp_attn_out``), and with
        ``return_lse`` also ``lse [R, H/c]`` (dtype of ``cp_attn_lse``); rows no rank saw give ``(0, -inf)``.
        ``cp_attn_out`` is not modified (upstream scales it in place).

    Raises:
        ValueError: ``cp_attn_out`` not 3-D, ``cp_attn_lse`` not ``[R, H]``, or ``H`` not divisible by ``c``.
    """
    if cp_attn_out.dim() != 3:
        raise ValueError(f"cp_attn_out must be [R, H, D], got shape {tuple(cp_attn_out.shape)}")
    if tuple(cp_attn_lse.shape) != tuple(cp_attn_out.shape[:2]):
        raise ValueError(f"cp_attn_lse shape {tuple(cp_attn_lse.shape)} != cp_attn_out.shape[:2] "
                         f"{tuple(cp_attn_out.shape[:2])}")
    c = cp_group.world_size
    R, H, D = cp_attn_out.shape
    if H % c:
        raise ValueError(f"cp_attn_out has H={H} heads, not divisible by the DCP group size {c}")
    h = H // c
    lse32 = cp_attn_lse.to(torch.float32)
    if cp_attn_out.dtype == torch.float32:  # one exchange: LSE rides as column D
        packed = torch.cat([cp_attn_out, lse32.unsqueeze(-1)], dim=-1)
        send = packed.view(R, c, h, D + 1).transpose(0, 1).contiguous()  # [c, R, h, D+1]: chunk j -> rank j
        recv = torch.empty_like(send)
        _all_to_all(cp_group, recv, send)
        o_parts, lse_parts = recv[..., :D], recv[..., D].contiguous()
    else:  # keep the output's own dtype on the wire (packing in FP32 would double its bytes)
        send = cp_attn_out.reshape(R, c, h, D).transpose(0, 1).contiguous()
        o_parts = torch.empty_like(send)
        _all_to_all(cp_group, o_parts, send)
        send_lse = lse32.reshape(R, c, h).transpose(0, 1).contiguous()
        lse_parts = torch.empty_like(send_lse)
        _all_to_all(cp_group, lse_parts, send_lse)
    out, lse = merge_partial_attention(o_parts, lse_parts)
    out = out.to(cp_attn_out.dtype)
    if return_lse:
        return out, lse.to(cp_attn_lse.dtype)
    return out


def _why_not(cp_attn_out, cp_attn_lse, cp_group) -> str:
    if not active():
        return "not called under --attention-backend sgl_hybrid_mla"
    c = getattr(cp_group, "world_size", 1)
    if c <= 1:
        return "DCP group of one rank"
    if not isinstance(cp_attn_out, torch.Tensor) or cp_attn_out.dim() != 3 \
            or tuple(cp_attn_lse.shape) != tuple(cp_attn_out.shape[:2]):
        return "shapes other than o [R, H, D], lse [R, H]"
    if cp_attn_out.shape[1] % c:
        return f"H={cp_attn_out.shape[1]} heads not divisible by DCP size {c}"
    return ""


def _around_cp_lse_ag_out_rs_mha(original, cp_attn_out, cp_attn_lse, cp_group, return_lse=False, **kwargs):
    why = "unexpected keywords " + ", ".join(sorted(kwargs)) if kwargs else _why_not(cp_attn_out, cp_attn_lse, cp_group)
    if why:
        CALLS["upstream"] += 1
        record_choice("dcp_merge_hook", "upstream", f"cp_lse_ag_out_rs_mha (all-reduce merge): {why}", log=logger)
        return original(cp_attn_out, cp_attn_lse, cp_group, return_lse=return_lse, **kwargs)
    CALLS["sgl_hybrid"] += 1
    record_choice("dcp_merge_hook", "sgl_hybrid", "sgl_hybrid_mla DCP merge: all_to_all_single of head groups + "
                  "sgl_hybrid_kernel.dcp merge", log=logger)
    return a2a_merge(cp_attn_out, cp_attn_lse, cp_group, return_lse=return_lse)


def install() -> None:
    """AROUND hook on ``triton_backend.cp_lse_ag_out_rs_mha`` (acts only under :func:`serving`)."""
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)
