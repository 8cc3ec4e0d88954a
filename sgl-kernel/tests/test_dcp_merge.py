"""DCP merge: c ranks attend the query over their round-robin shards (position p on rank p mod c) and the
LSE merge reproduces full-history attention exactly; empty shards give (0, -inf) and never a NaN."""

import pytest
import torch

from sgl_hybrid_kernel.dcp import dcp_local_length, dcp_local_positions, merge_partial_attention, merge_partial_attention_reference
from sgl_hybrid_kernel.dcp.merge import merge_partial_attention_triton
from sgl_hybrid_kernel.mla import mla_attention_paged_reference
from sgl_hybrid_kernel.mla.attention import mla_attention_paged_triton


def _shard(cache_rows, L, rank, world):
    """Rank-local cache: the rank's positions stored contiguously (page size 1)."""
    pos = dcp_local_positions(L, rank, world)
    return cache_rows[pos]


def _partials(q, rows, lens, world, use_triton, R):
    B = len(lens)
    o_parts, lse_parts = [], []
    for rank in range(world):
        local_lens = dcp_local_length(torch.tensor(lens), rank, world).to(torch.int32)
        max_local = max(1, int(local_lens.max()))
        local = torch.zeros(B * max_local, rows[0].shape[-1], dtype=q.dtype)
        pt = torch.zeros(B, max_local, dtype=torch.int32)
        for b in range(B):
            shard = _shard(rows[b], lens[b], rank, world)
            local[b * max_local : b * max_local + shard.shape[0]] = shard
            pt[b] = torch.arange(b * max_local, (b + 1) * max_local)
        if use_triton:
            o, lse = mla_attention_paged_triton(q, local, pt, local_lens, 0.3, kv_lora_rank=R, num_splits=2, block_n=16)
        else:
            o, lse = mla_attention_paged_reference(q, local, pt, local_lens, 0.3, kv_lora_rank=R)
        o_parts.append(o)
        lse_parts.append(lse)
    return torch.stack(o_parts), torch.stack(lse_parts)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_round_robin_shards_merge_to_full_attention(world):
    gen = torch.Generator().manual_seed(world)
    R, P, H, lens = 16, 8, 5, [5, 1, 13]  # with 8 ranks, lengths 5 and 1 leave ranks empty
    rows = [torch.randn(L, R + P, generator=gen, dtype=torch.float64) for L in lens]
    q = torch.randn(3, H, R + P, generator=gen, dtype=torch.float64)
    full_cache = torch.cat(rows)
    starts = torch.tensor([0, 5, 6])
    pt = torch.zeros(3, 13, dtype=torch.int32)
    for b, L in enumerate(lens):
        pt[b, :L] = starts[b] + torch.arange(L)
    ref_o, ref_lse = mla_attention_paged_reference(q, full_cache, pt, torch.tensor(lens), 0.3, kv_lora_rank=R)
    o_parts, lse_parts = _partials(q, rows, lens, world, False, R)
    if world == 8:
        assert torch.isneginf(lse_parts[7, 1]).all()  # rank 7 owns nothing of request 1 (length 1)
        o_parts[7, 1] = float("nan")  # an empty shard's output is never read
    o, lse = merge_partial_attention_reference(o_parts, lse_parts)
    torch.testing.assert_close(o, ref_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse.double(), ref_lse.double(), rtol=1e-6, atol=1e-6)


def test_triton_merge_of_triton_shards_with_nan_prefilled_empty_parts():
    gen = torch.Generator().manual_seed(11)
    R, P, H, lens, world = 16, 8, 4, [3, 9], 4
    rows = [torch.randn(L, R + P, generator=gen) for L in lens]
    q = torch.randn(2, H, R + P, generator=gen)
    o_parts, lse_parts = _partials(q, rows, lens, world, True, R)
    assert torch.isneginf(lse_parts[3, 0]).all() and torch.equal(o_parts[3, 0], torch.zeros(H, R))
    o_parts[3, 0] = float("nan")
    out, lse_out = torch.full((2, H, R), float("nan")), torch.full((2, H), float("nan"))
    merge_partial_attention_triton(o_parts, lse_parts, out, lse_out)
    full = torch.cat(rows)
    pt = torch.tensor([[0, 1, 2] + [0] * 6, list(range(3, 12))], dtype=torch.int32)
    ref_o, ref_lse = mla_attention_paged_reference(q, full, pt, torch.tensor(lens), 0.3, kv_lora_rank=R)
    torch.testing.assert_close(out, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_out, ref_lse, rtol=1e-5, atol=1e-5)


def test_all_empty_rows_give_zero_and_neg_inf_on_both_paths():
    o_parts = torch.full((3, 2, 2, 8), float("nan"))
    lse_parts = torch.full((3, 2, 2), float("-inf"))
    lse_parts[1, 1, 0] = 0.5
    o_parts[1, 1, 0] = 2.0
    for o, lse in (merge_partial_attention_reference(o_parts, lse_parts), merge_partial_attention_triton(o_parts, lse_parts),
                   merge_partial_attention(o_parts, lse_parts)):
        assert not torch.isnan(o).any() and not torch.isnan(lse).any()
        assert torch.equal(o[0], torch.zeros(2, 8)) and torch.isneginf(lse[0]).all()
        assert torch.equal(o[1, 0], torch.full((8,), 2.0)) and lse[1, 0] == 0.5 and torch.isneginf(lse[1, 1])


def test_ownership_and_shape_errors():
    assert dcp_local_positions(10, 2, 4).tolist() == [2, 6]
    assert dcp_local_length(torch.tensor([0, 1, 2, 9]), 1, 4).tolist() == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="rank"):
        dcp_local_positions(5, 4, 4)
    with pytest.raises(ValueError, match="lse_parts"):
        merge_partial_attention(torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 5))
