"""CPU stand-in for ``sgl_kernel`` (SGLang's compiled kernel package).

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a handful of names
from the *CPU build* of ``sgl_kernel``, which no PyPI package provides. This
package supplies them so upstream SGLang 0.5.23 serves on a machine without a
GPU. It is installed by ``make install`` only when no GPU is present and must
never be installed beside the real ``sglang-kernel`` wheel (both provide the
top-level module ``sgl_kernel``).

What it provides (see docs/install.md for the table):
  * plain-torch implementations of the ops the CPU engine calls on our path
    (request-to-token table writes, KV row copies, conv1d for hybrid models,
    the EAGLE/MTP speculative ops in ``speculative.py``);
  * the ``torch.ops.sgl_kernel.*_cpu`` names that upstream looks up at import
    time; those we do not implement raise ``NotImplementedError`` naming the op
    when *called*, so a lookup never breaks start-up and a call never fails
    silently.

It deliberately does **not** register ``convert_weight_packed``: SGLang enables
its Intel-AMX paths only when that op exists.
"""

from __future__ import annotations

import ctypes

import torch

from sgl_kernel import _ops  # noqa: F401  (registers torch.ops.sgl_kernel.*)
from sgl_kernel import distributed  # noqa: F401  (shm_allreduce / shm_allgather over torch.distributed, issue 8)

__version__ = "0.0.0+sglang-hybrid-cpu-shim"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Row ``req_pool_indices[i]`` gets ``out_cache_loc`` entries (packed back to back
    over the batch) at columns ``[start_offset[i], end_offset[i])``.
    """
    del pool_len
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    pos = 0
    for row, s, e in zip(rows, starts, ends):
        n = e - s
        if n > 0:
            req_to_token[row, s:e] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy KV rows ``src_loc[i] -> tgt_loc[i]`` in every buffer of a KV pool.

    ``data_ptrs[b]`` is the base address of buffer ``b`` and ``strides[b]`` its
    row size in bytes (what SGLang's Triton kernel receives on GPU).
    """
    ptrs = data_ptrs.tolist()
    row_bytes = strides.tolist()
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for base, nbytes in zip(ptrs, row_bytes):
        for tgt, src in pairs:
            if tgt != src:
                ctypes.memmove(base + tgt * nbytes, base + src * nbytes, nbytes)


def _not_provided(name: str):
    def _raise(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the sglang-hybrid CPU shim "
            "(multi-layer EAGLE is not supported on CPU). "
            "Install the real sglang-kernel on a GPU machine."
        )

    _raise.__name__ = name
    return _raise


# Speculative decoding (EAGLE / MTP worker on CPU): plain-torch versions (issue 6).
from sgl_kernel.speculative import (  # noqa: E402
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

# Imported at module level by upstream's multi-layer EAGLE code on CPU; not
# called by the single-layer EAGLE/MTP worker.
for _name in (
    "rotate_input_ids_cpu",
    "build_draft_decode_metadata_cpu",
):
    globals()[_name] = _not_provided(_name)
del _name
