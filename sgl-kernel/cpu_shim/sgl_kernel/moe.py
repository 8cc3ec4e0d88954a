"""MoE bookkeeping ops of ``sgl_kernel``.

``moe_align_block_size`` follows the calling convention of upstream SGLang
0.5.23 (``sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size``
calls it through the kernel registry's AOT entry ``sgl_kernel:moe_align_block_size``):

    moe_align_block_size(topk_ids, num_buckets, block_size, sorted_token_ids,
                         expert_ids, num_tokens_post_pad, cumsum_buffer,
                         pad_sorted_token_ids[, ignore_invalid_expert])

where ``num_buckets = num_experts + 1`` and expert id ``e`` lands in bucket
``e + 1`` (id ``-1``, an expert filtered out by expert parallelism, in bucket 0).
Each bucket's tokens are padded to a multiple of ``block_size``; buckets are laid
out back to back in ``sorted_token_ids`` (flat indices into ``topk_ids``, padding
slots hold ``topk_ids.numel()`` when ``pad_sorted_token_ids``), ``expert_ids[b]``
is the expert id (``bucket - 1``) of block ``b`` and ``num_tokens_post_pad[0]``
the padded total.

On CUDA tensors it runs upstream's own JIT kernel
(``sglang.kernels.ops.moe.moe_align``, compiled with nvcc through tvm-ffi on first
use, imported lazily); elsewhere a plain-torch version with the same layout
(tokens of one bucket in index order, the CUDA kernel's order within a bucket is
unspecified). ``ignore_invalid_expert=True`` (LoRA MoE, humming runner) has other
semantics and raises ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel._unprovided import define


def _align_torch(topk_ids, num_buckets, block_size, sorted_token_ids, expert_ids, num_tokens_post_pad,
                 cumsum_buffer, pad_sorted_token_ids) -> None:
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    bucket = flat + 1
    if numel and (int(bucket.min()) < 0 or int(bucket.max()) >= num_buckets):
        raise ValueError(f"moe_align_block_size: expert ids must lie in [-1, {num_buckets - 2}]")
    counts = torch.bincount(bucket, minlength=num_buckets)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    total = int(ends[-1]) if num_buckets else 0
    if pad_sorted_token_ids:
        sorted_token_ids.fill_(numel)
    if numel:
        order = torch.argsort(bucket, stable=True)
        in_bucket = torch.arange(numel, device=device) - (torch.cumsum(counts, 0) - counts)[bucket[order]]
        sorted_token_ids[starts[bucket[order]] + in_bucket] = order.to(sorted_token_ids.dtype)
    blocks = torch.repeat_interleave(torch.arange(num_buckets, device=device), padded // block_size)
    expert_ids[: blocks.numel()] = (blocks - 1).to(expert_ids.dtype)
    num_tokens_post_pad[0] = total
    if cumsum_buffer is not None:
        cumsum_buffer[0] = 0
        cumsum_buffer[1 : num_buckets + 1] = ends.to(cumsum_buffer.dtype)


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    cumsum_buffer: Optional[torch.Tensor] = None,
    pad_sorted_token_ids: bool = False,
    ignore_invalid_expert: bool = False,
) -> None:
    """Sort token slots by expert into ``block_size``-padded buckets (see the module docstring)."""
    if ignore_invalid_expert:
        raise NotImplementedError(
            "sgl_kernel.moe_align_block_size(ignore_invalid_expert=True) is not implemented by the "
            "sglang-hybrid sgl_kernel stand-in"
        )
    if topk_ids.is_cuda and torch.version.hip is None:
        from sglang.kernels.ops.moe.moe_align import moe_align_block_size as jit_align

        if cumsum_buffer is None:
            cumsum_buffer = torch.empty(num_experts + 1, dtype=torch.int32, device=topk_ids.device)
        jit_align(
            topk_ids,
            num_experts,
            block_size,
            sorted_token_ids,
            experts_ids,
            num_tokens_post_pad,
            cumsum_buffer,
            pad_sorted_token_ids,
        )
        return
    _align_torch(
        topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
        cumsum_buffer, pad_sorted_token_ids,
    )


def moe_sum_reduce(input: torch.Tensor, output: torch.Tensor, routed_scaling_factor: float = 1.0) -> None:
    """``output[t] = routed_scaling_factor * sum_k input[t, k]`` (float32 sum), written in place.

    ``input``: ``[tokens, topk, hidden]``; ``output``: ``[tokens, hidden]``.
    """
    output.copy_(input.float().sum(dim=1) * routed_scaling_factor)


def moe_sum(input: torch.Tensor, output: torch.Tensor) -> None:
    """``output[t] = sum_k input[t, k]``, written in place (``moe_sum_reduce`` with factor 1)."""
    output.copy_(input.float().sum(dim=1))


define(
    globals(),
    "sgl_kernel",
    (
        "topk_softmax",
        "topk_sigmoid",
        "moe_fused_gate",
        "biased_topk",
        "hash_topk",
        "fused_experts",
        "shuffle_rows",
        "cutlass_w4a8_moe_mm",
        "get_cutlass_w4a8_moe_mm_data",
        "fp8_blockwise_scaled_grouped_mm",
        "es_fp8_blockwise_scaled_grouped_mm",
        "es_sm100_mxfp8_blockscaled_grouped_mm",
        "es_sm100_mxfp8_blockscaled_grouped_quant",
    ),
    "MoE kernel",
)
