"""Kimi K3 on a CUDA GPU: upstream's ``KimiK3LinearForCausalLM`` with our MLA (``sgl_hybrid_mla``) and
KDA (``--linear-attn-backend sgl_hybrid``) kernels, the hybrid radix cache + host tier and CUDA graphs,
against the CPU reference model's fixtures (issue 40). Two checkpoints: the tiny one (latent rank 64,
rope 16) and the K3-shaped tiny one (latent rank 512, rope 64, head dim 128: Kimi K3's MLA geometry)."""

import unittest

from serving_checks import GpuServingChecks
from sglang.test.test_utils import CustomTestCase

K3_ARGS = ["--attention-backend", "sgl_hybrid_mla", "--linear-attn-backend", "sgl_hybrid"]
# Decode runs a one-launch fused KDA step (layers/attention/kda_fused_decode.py): ours ("kda_decode=fused"),
# or upstream's CUDA kernel where it covers the step ("kda_decode=upstream_cuda_fused").
K3_CALLS = ("mla_decode_backend=sgl_hybrid", "mla_extend_backend=sgl_hybrid", "kda_decode=fused",
            "kda_extend=triton", "moe_routing_hook=sgl_hybrid", "attn_res_hook=sgl_hybrid")


class TestKimiK3TinyGPU(GpuServingChecks, CustomTestCase):
    """FP32: the tiny Kimi K3's own BF16 CPU run strays too far from FP32 for a token oracle."""

    fixture = "kimi-k3-tiny"
    dtype = "float32"
    server_args = K3_ARGS
    our_calls = K3_CALLS


class TestKimiK3ShapedGPU(GpuServingChecks, CustomTestCase):
    """Our fused KDA decode also where upstream's CUDA one covers the step (12 heads of 128)."""

    fixture = "kimi-k3-shaped"
    server_args = K3_ARGS
    our_calls = K3_CALLS
    env = {"SGLANG_HYBRID_KDA_FUSED_DECODE": "ours"}


class TestKimiK3ShapedUpstreamFusedDecodeGPU(GpuServingChecks, CustomTestCase):
    """The default: steps upstream's CUDA fused KDA decode covers go to it (the faster on NVIDIA),
    our kernels elsewhere. Both this and the class above must match the same fixtures."""

    fixture = "kimi-k3-shaped"
    server_args = K3_ARGS
    our_calls = tuple(c for c in K3_CALLS if c != "kda_decode=fused") + ("kda_decode=upstream_cuda_fused",)
    check_taps = False  # taps record extend passes only, which this class shares with the one above


class TestKimiK3ShapedUpstreamKernelsGPU(GpuServingChecks, CustomTestCase):
    """The control: upstream's class with upstream's attention (Triton), KDA kernels and routing.
    Agreement here and disagreement above puts a fault in our kernels or hooks; disagreement here
    puts it in the reference model or the checkpoint. The AttnRes hook stays: upstream's own GPU
    aggregation returns unwritten memory at hidden sizes that are not a multiple of 1024 (the tiny
    checkpoints' 128; see layers/attn_res_hook.py), and the hook's fallback there is upstream's
    torch aggregation."""

    fixture = "kimi-k3-shaped"
    server_args = ["--attention-backend", "triton"]
    env = {"SGLANG_HYBRID_UPSTREAM_OPS": "moe_routing,kda_fused_decode"}


if __name__ == "__main__":
    unittest.main()
