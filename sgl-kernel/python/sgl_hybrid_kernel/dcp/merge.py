"""Host wrapper of the LSE merge kernel (``triton_merge.py``), shared by DCP and split-KV MLA."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from sgl_hybrid_kernel.dcp.triton_merge import merge_partials_kernel


def merge_partials_strided(
    part: torch.Tensor,
    part_lse: torch.Tensor,
    out: torch.Tensor,
    lse_out: torch.Tensor,
    split_dim: int,
) -> None:
    """Merge along ``split_dim`` of 4-D ``part`` (``[R, H, S, Dv]`` or ``[S, R, H, Dv]``) into ``out [R, H, Dv]``.

    ``part_lse`` has ``part``'s shape without its last dim; ``lse_out`` is ``[R, H]`` FP32.
    Any strides; the last dim of ``part`` and ``out`` must be contiguous.
    """
    if split_dim == 2:
        R, H, S, DV = part.shape
        spr, sph, sps = part.stride(0), part.stride(1), part.stride(2)
        slr, slh, sls = part_lse.stride(0), part_lse.stride(1), part_lse.stride(2)
    elif split_dim == 0:
        S, R, H, DV = part.shape
        sps, spr, sph = part.stride(0), part.stride(1), part.stride(2)
        sls, slr, slh = part_lse.stride(0), part_lse.stride(1), part_lse.stride(2)
    else:
        raise ValueError(f"split_dim must be 0 or 2, got {split_dim}")
    if part.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("part and out need a contiguous last dimension")
    if R == 0 or H == 0:
        return
    merge_partials_kernel[(R, H)](
        part, part_lse, out, lse_out, S,
        spr, sph, sps, slr, slh, sls,
        out.stride(0), out.stride(1), lse_out.stride(0),
        DV=DV, BLOCK_DV=triton.next_power_of_2(DV), BLOCK_S=min(64, triton.next_power_of_2(max(S, 1))),
        num_warps=4 if DV >= 256 else 1,
    )


def merge_partial_attention_triton(
    o_parts: torch.Tensor,
    lse_parts: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``merge_partial_attention_reference`` for ``o_parts [c, R, H, Dv]``, ``lse_parts [c, R, H]``.

    Returns ``(out [R, H, Dv] in o_parts.dtype, lse [R, H] FP32)``; pass ``out`` /
    ``lse_out`` to write in place (e.g. under CUDA-graph capture).
    """
    c, R, H, DV = o_parts.shape
    if out is None:
        out = torch.empty(R, H, DV, dtype=o_parts.dtype, device=o_parts.device)
    if lse_out is None:
        lse_out = torch.empty(R, H, dtype=torch.float32, device=o_parts.device)
    merge_partials_strided(o_parts, lse_parts, out, lse_out, split_dim=0)
    return out, lse_out
