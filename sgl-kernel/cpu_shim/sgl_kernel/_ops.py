"""``torch.ops.sgl_kernel`` names that upstream SGLang looks up at import time.

Each is registered with a permissive schema and a CPU kernel that raises
``NotImplementedError`` naming the op. Upstream only *calls* them on paths our
models do not take (Qwen3-Next-style GDN fusions, Grok routing); a lookup at
import must succeed, a call must fail loudly.
"""

from __future__ import annotations

import torch

_LIB = torch.library.Library("sgl_kernel", "DEF")

# Every ``torch.ops.sgl_kernel.*_cpu`` name referenced in sglang 0.5.23, except
# those upstream probes with ``hasattr`` to choose a path (``fused_qk_norm_cpu``,
# ``fused_qk_norm_rope_cpu``, ``convert_weight_packed``): registering those would
# switch upstream onto kernels we do not have.
_LOOKED_UP_AT_IMPORT = (
    "apply_multidimensional_rope_cpu",
    "apply_rotary_pos_emb_cpu",
    "biased_grouped_topk_cpu",
    "bmm_cpu",
    "conv3d_embed_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fp8_per_tensor_scaled_mm_cpu",
    "fp8_scaled_mm_cpu",
    "fused_add_rmsnorm_cpu",
    "fused_dual_residual_rmsnorm_cpu",
    "fused_experts_cpu",
    "fused_gdn_gating_cpu",
    "fused_input_proj_cpu",
    "fused_moe_router_cpu",
    "fused_norm_scale_shift_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qk_rmsnorm_apply_from_stats_cpu",
    "fused_qk_rmsnorm_cpu",
    "fused_qk_rmsnorm_sumsq_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_qkvzba_split_reshape_cat_cpu",
    "fused_rmsnorm_gated_cpu",
    "fused_scale_residual_norm_scale_shift_cpu",
    "fused_scale_shift_cpu",
    "fused_sigmoid_gating_delta_rule_update_cpu",
    "fused_sigmoid_mul_cpu",
    "gelu_and_mul_cpu",
    "gelu_tanh_and_mul_cpu",
    "gemma3_rmsnorm_cpu",
    "gemma4_rmsnorm_cpu",
    "gemma_fused_add_rmsnorm_cpu",
    "gemma_rmsnorm_cpu",
    "grouped_topk_cpu",
    "image_preprocess_cpu",
    "int4_scaled_mm_cpu",
    "l2norm_cpu",
    "layernorm_cpu",
    "multimodal_rotary_embedding_cpu",
    "murmur_hash32_cpu",
    "rmsnorm_cpu",
    "rotary_embedding_cpu",
    "shared_expert_cpu",
    "silu_and_mul_cpu",
    "store_cache_cpu",
    "topk_sigmoid_cpu",
    "topk_softmax_cpu",
)


def _make_raiser(name: str):
    def _raise(args):
        raise NotImplementedError(
            f"torch.ops.sgl_kernel.{name} is not implemented by the sglang-hybrid CPU shim; "
            "this upstream code path needs the real sgl-kernel CPU build."
        )

    return _raise


for _name in _LOOKED_UP_AT_IMPORT:
    _LIB.define(f"{_name}(Tensor[] args) -> Tensor")
    _LIB.impl(_name, _make_raiser(_name), "CPU")
