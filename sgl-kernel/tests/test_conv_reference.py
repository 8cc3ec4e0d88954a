"""Short causal conv: prefill vs step-by-step decode vs torch's conv1d."""

import torch
import torch.nn.functional as F

from sgl_hybrid_kernel.conv import causal_conv1d, causal_conv1d_step


def test_prefill_matches_torch_conv1d():
    T, D, K = 20, 6, 4
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(T, D, generator=gen), torch.randn(D, K, generator=gen)
    y, state = causal_conv1d(x, w)
    ref = F.silu(F.conv1d(x.t().unsqueeze(0), w.unsqueeze(1), padding=K - 1, groups=D)[0, :, :T].t())
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, x[-(K - 1):])


def test_split_prefill_and_decode_equal_one_prefill():
    T, D, K = 30, 5, 4
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(T, D, generator=gen), torch.randn(D, K, generator=gen)
    y_full, _ = causal_conv1d(x, w)
    y1, s1 = causal_conv1d(x[:11], w)
    y2, s2 = causal_conv1d(x[11:25], w, s1)
    pool = torch.zeros(3, K - 1, D)
    pool[2] = s2
    steps = [causal_conv1d_step(x[t : t + 1], w, pool, torch.tensor([2])) for t in range(25, T)]
    torch.testing.assert_close(torch.cat([y1, y2, *steps]), y_full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pool[2], x[-(K - 1):])
    assert pool[0].abs().sum() == 0 and pool[1].abs().sum() == 0  # other slots untouched
