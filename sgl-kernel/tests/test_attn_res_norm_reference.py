"""AttnRes mixing and the norms, against explicit formulas."""

import torch

from sgl_hybrid_kernel.attn_res import attn_res_mix
from sgl_hybrid_kernel.norm import gated_rms_norm, l2_norm, rms_norm


def test_attn_res_single_row_is_identity_and_mix_is_convex():
    torch.manual_seed(0)
    rows = torch.randn(4, 1, 16)
    torch.testing.assert_close(attn_res_mix(rows, torch.ones(16), torch.randn(1, 16), 1e-6), rows[:, 0])
    rows = torch.randn(4, 3, 16, dtype=torch.float64)
    norm_w, proj = torch.rand(16, dtype=torch.float64) + 0.5, torch.randn(1, 16, dtype=torch.float64)
    out = attn_res_mix(rows, norm_w, proj, 1e-6)
    normed = rows / rows.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * norm_w
    p = (normed @ proj[0]).softmax(-1)
    # Softmax runs in FP32 by design (as upstream's aggregation), hence 1e-6.
    torch.testing.assert_close(out, (p[..., None] * rows).sum(1), rtol=1e-6, atol=1e-6)


def test_norms():
    torch.manual_seed(1)
    x, w, g = torch.randn(3, 8), torch.rand(8), torch.randn(3, 8)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(rms_norm(x, w, 1e-6), ref)
    torch.testing.assert_close(gated_rms_norm(x, g, w, 1e-6, "sigmoid"), ref * torch.sigmoid(g))
    torch.testing.assert_close(gated_rms_norm(x, g, w, 1e-6, "silu"), ref * torch.nn.functional.silu(g))
    torch.testing.assert_close(l2_norm(x).norm(dim=-1), torch.ones(3), rtol=1e-5, atol=1e-5)
