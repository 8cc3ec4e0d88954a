"""Stand-in for ``sgl_kernel`` (SGLang's compiled kernel package, the ``sglang-kernel`` wheel).

Installed as the distribution ``sgl-hybrid-cpu-shim`` (directory
``sgl-kernel/cpu_shim``); it provides the top-level module ``sgl_kernel`` wherever
the real wheel is absent or cannot load, so it must never be installed beside
the real ``sglang-kernel`` (both provide ``sgl_kernel``). Importing it logs one
warning naming the stand-in and the device. See docs/install.md.

CPU (``SGLANG_USE_CPU_ENGINE=1``): upstream SGLang 0.5.23's CPU engine imports
names of the *CPU build* of ``sgl_kernel``, which no PyPI package provides:

  * plain-torch implementations of the ops the CPU engine calls on our path
    (request-to-token table writes, KV row copies, conv1d for hybrid models,
    the EAGLE/MTP speculative ops in ``speculative.py``, the shared-memory
    collectives in ``distributed.py``);
  * the ``torch.ops.sgl_kernel.*_cpu`` names that upstream looks up at import
    time (``_ops.py``); those we do not implement raise ``NotImplementedError``.
    ``convert_weight_packed`` is deliberately absent: SGLang enables its
    Intel-AMX paths only when that op exists.

CUDA, where the ``sglang-kernel`` wheel does not match the installed torch:
every name upstream imports from ``sgl_kernel`` (and its submodules) at module
load is importable. Implemented in plain torch, device-agnostic and without
host synchronisation (so CUDA graphs capture them):

  * ``rmsnorm``, ``fused_add_rmsnorm``, ``gemma_rmsnorm``,
    ``gemma_fused_add_rmsnorm`` (the fused ones update input and residual in
    place), ``silu_and_mul``, ``gelu_and_mul``, ``gelu_tanh_and_mul``,
    ``gelu_quick``, ``rotary_embedding`` (``elementwise.py``);
  * ``top_k_renorm_prob``, ``top_p_renorm_prob`` (``sampling.py``);
  * ``moe_sum_reduce``, ``moe_sum``, and ``moe_align_block_size``, which runs
    upstream's own JIT CUDA kernel (``sglang.kernels.ops.moe.moe_align``) on CUDA
    tensors (``moe.py``);
  * ``merge_state_v2`` (``attention.py``), ``int8_scaled_mm`` (``gemm.py``),
    ``weak_ref_tensor`` (``memory.py``), ``sgl_kernel.utils.is_arch_support_pdl``
    (always False: no PDL), ``sgl_kernel.scalar_type``.

Every other name is a placeholder that raises ``NotImplementedError`` naming the
op when *called*, never at import (``_unprovided.py``). Deliberately absent,
because upstream probes them with ``try: import ... except ImportError`` to pick
a fallback: ``sgl_kernel.allreduce`` (custom all-reduce; NCCL is used instead)
and ``sgl_kernel.metal``.

Upstream's start-up check ``assert_pkg_version("sglang-kernel", "0.4.9")`` reads
the *distribution* ``sglang-kernel``, which is not installed; on CUDA this module
therefore sets ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1`` (unless the variable is
already set), which upstream reads for that check (and the FlashInfer version
check) at launch.
"""

from __future__ import annotations

import ctypes
import logging
import os

import torch

from sgl_kernel import _ops  # noqa: F401  (registers torch.ops.sgl_kernel.*)
from sgl_kernel import distributed  # noqa: F401  (shm_allreduce / shm_allgather over torch.distributed, issue 8)

__version__ = "0.0.0+sglang-hybrid-cpu-shim"
STANDIN = True  # the real package has no such attribute

_logger = logging.getLogger("sgl_kernel")


def _device() -> str:
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip is not None else "cuda"
    return "cpu"


DEVICE = _device()
_FLASH_MLA_STANDIN = False
if DEVICE != "cpu":
    # Upstream asserts the distribution sglang-kernel >= 0.4.9 at launch unless this is set.
    os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
if DEVICE == "cuda":
    from sgl_kernel import flash_mla_standin

    _FLASH_MLA_STANDIN = flash_mla_standin.install()
_logger.warning(
    "sgl_kernel is the sglang-hybrid stand-in (sgl-hybrid-cpu-shim, device %s), not the sglang-kernel "
    "wheel: norms, gated activations, sampling renorm, MoE sum/align and merge_state run in plain torch, "
    "other sgl_kernel ops raise NotImplementedError when called%s",
    DEVICE,
    (""
     if DEVICE == "cpu"
     else "; SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=" + os.environ["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"])
    + ("; flash_mla is an import stand-in (no sgl-flash-mla wheel)" if _FLASH_MLA_STANDIN else ""),
)


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


# Speculative decoding (EAGLE / MTP worker on CPU): plain-torch versions (issue 6).
from sgl_kernel.speculative import (  # noqa: E402
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

# CUDA-side names (see the module docstring): implemented ops, then placeholders.
from sgl_kernel import (  # noqa: E402,F401  (submodules upstream imports by name)
    flash_attn,
    kvcacheio,
    quantization,
    scalar_type,
    spatial,
    top_k,
    utils,
)
from sgl_kernel import attention as _attention  # noqa: E402
from sgl_kernel import gemm as _gemm  # noqa: E402
from sgl_kernel import moe as _moe  # noqa: E402
from sgl_kernel import sampling as _sampling  # noqa: E402
from sgl_kernel._unprovided import define as _define  # noqa: E402
from sgl_kernel._unprovided import is_placeholder as _is_placeholder  # noqa: E402
from sgl_kernel.attention import merge_state, merge_state_v2  # noqa: E402,F401
from sgl_kernel.elementwise import (  # noqa: E402,F401
    fused_add_rmsnorm,
    gelu_and_mul,
    gelu_quick,
    gelu_tanh_and_mul,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
    rotary_embedding,
    silu_and_mul,
)
from sgl_kernel.gemm import int8_scaled_mm  # noqa: E402,F401
from sgl_kernel.memory import weak_ref_tensor  # noqa: E402,F401
from sgl_kernel.moe import moe_align_block_size, moe_sum, moe_sum_reduce  # noqa: E402,F401
from sgl_kernel.sampling import (  # noqa: E402,F401
    top_k_renorm_prob,
    top_k_renorm_probs,
    top_p_renorm_prob,
    top_p_renorm_probs,
)

# The top-level placeholders defined next to their implemented relatives.
for _mod in (_attention, _gemm, _moe, _sampling):
    for _name, _obj in vars(_mod).items():
        if _is_placeholder(_obj):
            globals()[_name] = _obj
del _mod, _name, _obj

# Imported at module level by upstream's multi-layer EAGLE code on CPU; not
# called by the single-layer EAGLE/MTP worker.
_define(globals(), "sgl_kernel", ("rotate_input_ids_cpu", "build_draft_decode_metadata_cpu"), "multi-layer EAGLE")

# Imported by upstream on CUDA/ROCm/MUSA/XPU paths our models do not take
# (DeepSeek-V4/DSA/MLA kernels, XPU fusions, speculative kernels of other backends).
_define(
    globals(),
    "sgl_kernel",
    (
        "apply_token_bitmask_inplace_cuda",
        "build_tree_kernel_efficient",
        "verify_tree_greedy",
        "compress_norm_rope_store",
        "flash_compress4_decode",
        "flash_compress4_prefill",
        "flash_compress128_decode",
        "flash_compress128_prefill",
        "plan_compress_decode",
        "plan_compress_decode_legacy",
        "plan_compress_prefill",
        "plan_compress_prefill_legacy",
        "fused_hc_head",
        "hc_post",
        "hc_split_sinkhorn",
        "mhc_fused_post_pre",
        "mhc_pre",
        "fused_inplace_qknorm_rope",
        "fused_k_norm_rope_flashmla",
        "fused_q_indexer_rope_hadamard_quant",
        "fused_q_norm_rope",
        "fused_qk_rope_with_cos_sin_cache_inplace",
        "multimodal_rotary_embedding",
        "load_cache_to_device_buffer_dsv4_mla",
        "load_cache_to_device_buffer_mla",
        "transfer_cache_dsv4_mla",
        "silu_and_mul_clamp",
        "store_cache_xpu",
    ),
)
