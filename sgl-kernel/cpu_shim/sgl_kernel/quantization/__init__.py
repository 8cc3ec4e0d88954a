"""``sgl_kernel.quantization`` (GGUF kernels): placeholders only.

Upstream imports these at module load on CUDA (``sglang.srt.layers.quantization.gguf``);
they are called only when serving GGUF-quantised weights.
"""

from sgl_kernel._unprovided import define

define(
    globals(),
    "sgl_kernel.quantization",
    ("ggml_dequantize", "ggml_moe_a8", "ggml_moe_a8_vec", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8"),
    "GGUF kernel",
)
