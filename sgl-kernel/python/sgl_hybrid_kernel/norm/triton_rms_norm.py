"""Triton RMSNorm, optionally after a residual add: one program per row (host wrapper: ``rms_norm_launch.py``).

Row ``r``: ``s = x[r] (+ residual[r])`` in FP32, ``residual_out[r] = s`` (rounded to
its dtype), ``out[r] = s * rsqrt(mean(s^2) + eps) * w`` rounded once: the
rounding of ``norm.reference.rms_norm`` / ``fused_add_rms_norm``. The whole row
sits in registers (``BLOCK_D >= D``), so ``D`` is bounded by the wrapper's contract.
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    x_stride, res_stride, D, eps,
    BLOCK_D: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    s = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        s += tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_out_ptr + row * D + cols, s.to(res_out_ptr.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + cols, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
