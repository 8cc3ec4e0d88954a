"""Speculative-decoding ops of the CPU ``sgl_kernel`` build, in plain torch (issue 6).

Upstream SGLang 0.5.23's EAGLE/MTP worker calls these names on CPU
(``kernels/ops/speculative/{cache_locs,eagle,spec_tree}.py``); the semantics
follow upstream's Triton versions of the same ops (one program per request).
All tensors are CPU tensors and every op writes its outputs in place.
Index conventions: a draft tree per request has ``D = num_draft_tokens`` nodes,
node 0 being the last verified token; flat node ids are ``b * D + i``.
"""

from __future__ import annotations

import torch


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """Copy each request's ``topk * steps`` KV slots starting at ``seq_lens[b]``.

    ``out_cache_loc[b * topk * steps + j] = req_to_token[req_pool_indices[b], seq_lens[b] + j]``.
    ``req_to_token`` ``[rows, pool_len]`` int32; ``out_cache_loc`` ``[B * topk * steps]``.
    """
    del pool_len
    n = topk * speculative_num_steps
    for b, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[b * n : (b + 1) * n] = req_to_token[row, start : start + n].to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather ``req_to_token[row_b, start_b:end_b]`` for every request, packed back to back
    into ``out_cache_loc`` (request ``b`` begins after the lengths of requests ``< b``)."""
    del pool_len
    pos = 0
    for row, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = max(e - s, 0)
        out_cache_loc[pos : pos + n] = req_to_token[row, s:e].to(out_cache_loc.dtype)
        pos += n


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Compact the KV slots of accepted nodes: for the entries of ``accept_index``
    (flattened, ``-1`` = none) in order, ``accept_out_cache_loc[k] = out_cache_loc[index_k]``."""
    idx = accept_index.reshape(-1)
    kept = idx[idx != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[b * accept_stride + accept_lens[b] - 1]``
    (the last committed token of request ``b``; ``accept_lens`` counts the bonus token)."""
    flat = accept_tokens.reshape(-1)
    B = accept_lens.shape[0]
    pos = torch.arange(B, dtype=torch.long) * accept_stride + accept_lens.long() - 1
    bonus_tokens[:B] = flat[pos].to(bonus_tokens.dtype)


def _parent_slot(selected: list, parents: list, node: int, topk: int):
    """Tree slot (0 = root, ``p + 1`` = ``selected[p]``) of the parent of draft ``node`` (1-based),
    or ``None`` if the parent is not among the selected tokens."""
    parent_tb = selected[node - 1] // topk
    if parent_tb == 0:
        return 0
    token = parents[parent_tb]
    for p, s in enumerate(selected):
        if s == token:
            return p + 1
    return None


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the EAGLE draft tree of each request (EAGLE-2 dynamic tree, upstream SGLang).

    Inputs: ``parent_list`` ``[B, P]`` (tree-slot id of each step's parents),
    ``selected_index`` ``[B, D-1]`` (chosen draft ids, ``id // topk`` = parent slot),
    ``verified_seq_len`` ``[B]``. Outputs (in place): ``positions`` ``[B*D]``
    (``seq_len`` + depth of the node), ``retrieve_index`` ``[B, D]`` (flat node
    ids), ``retrieve_next_token`` / ``retrieve_next_sibling`` ``[B, D]`` (first
    child / next sibling, ``-1`` none; must be initialised to ``-1``), and the
    visibility mask ``tree_mask`` (bool): mode 0 (FULL_MASK) one row of
    ``seq_len + D`` per node, packed over requests (prefix columns are left as
    the caller initialised them); mode 1 (QLEN_ONLY) one row of ``D`` per node.
    A node sees the root, itself and its ancestors.

    Raises:
        ValueError: ``tree_mask_mode`` is not 0 or 1.
    """
    if int(tree_mask_mode) not in (0, 1):
        raise ValueError(f"tree_mask_mode={int(tree_mask_mode)}: only FULL_MASK (0) and QLEN_ONLY (1) are supported")
    D = draft_token_num
    seq_lens = verified_seq_len.tolist()
    mask = tree_mask.reshape(-1)
    prefix = 0
    for b, seq_len in enumerate(seq_lens):
        selected = selected_index[b].tolist()
        parents = parent_list[b].reshape(-1).tolist()
        retrieve_index[b] = torch.arange(b * D, (b + 1) * D, dtype=retrieve_index.dtype)
        positions[b * D] = seq_len
        for i in range(D - 1, 0, -1):
            slot = _parent_slot(selected, parents, i, topk)
            if slot is None:
                continue
            previous = int(retrieve_next_token[b, slot])
            retrieve_next_token[b, slot] = i
            if previous != -1:
                retrieve_next_sibling[b, i] = previous
        for x in range(D):
            if int(tree_mask_mode) == 0:
                row = D * D * b + prefix * D + (seq_len + D) * x + seq_len  # column of the root
            else:
                row = D * D * b + D * x
            mask[row] = True
            mask[row + 1 : row + D] = False
            if x == 0:
                continue
            node, depth_of_x = x, 0
            for _ in range(depth):
                depth_of_x += 1
                mask[row + node] = True  # draft node `node` (1-based) sits at column root + node
                slot = _parent_slot(selected, parents, node, topk)
                if slot is None or slot == 0:
                    break
                node = slot
            positions[b * D + x] = seq_len + depth_of_x
        prefix += seq_len


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy acceptance over each request's draft tree (EAGLE / MTP verify).

    From the root, repeatedly take the child (walking the sibling list) whose
    draft token equals the target model's argmax at the last accepted node;
    stop when none matches or ``S = accept_index.shape[1]`` tokens are accepted.
    ``candidates``, ``retrive_*``, ``target_predict``: ``[B, D]``. Outputs (in
    place): ``accept_index`` ``[B, S]`` flat node ids of the accepted path
    (root first; untouched entries keep the caller's ``-1``),
    ``accept_token_num`` ``[B]`` accepted drafts (bonus not counted), and
    ``predicts`` ``[B*D]``: at each accepted node, the token committed after it
    (the target's argmax there, so the last one is the bonus token).
    """
    B, D = candidates.shape
    S = accept_index.shape[1]
    target = target_predict.reshape(-1)
    for b in range(B):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, S):
            want = int(target[last])
            cur = int(retrive_next_token[b, cur])
            while cur != -1 and int(candidates[b, cur]) != want:
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            last = int(retrive_index[b, cur])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[last]


# Imported by upstream's tree reconstruction (kernels/ops/speculative/reconstruct_tree.py)
# on devices other than CUDA/ROCm/XPU; CUDA uses upstream's own Triton version.
from sgl_kernel._unprovided import define as _define  # noqa: E402

_define(globals(), "sgl_kernel.speculative", ("reconstruct_indices_from_tree_mask",), "tree-mask speculative decoding")
