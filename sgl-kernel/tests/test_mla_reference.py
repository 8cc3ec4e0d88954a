"""Absorbed MLA attention equals the ordinary (per-head up-projected) attention."""

import torch

from sgl_hybrid_kernel.mla import mla_attention_absorbed


def test_absorbed_equals_mha_with_prefix():
    torch.manual_seed(0)
    H, R, P, dn, dv, prefix, T = 3, 16, 4, 8, 6, 5, 7
    S = prefix + T
    latent, k_pe = torch.randn(S, R, dtype=torch.float64), torch.randn(S, P, dtype=torch.float64)
    w_kc, w_vc = torch.randn(H, dn, R, dtype=torch.float64), torch.randn(H, dv, R, dtype=torch.float64)
    q_nope, q_pe = torch.randn(T, H, dn, dtype=torch.float64), torch.randn(T, H, P, dtype=torch.float64)
    scale = (dn + P) ** -0.5
    q_lat = torch.einsum("thd,hdr->thr", q_nope, w_kc)
    o_lat, lse = mla_attention_absorbed(q_lat, q_pe, latent, k_pe, scale, prefix)
    out = torch.einsum("thr,hvr->thv", o_lat, w_vc)
    # Reference: explicit keys/values per head, causal over the whole history.
    k = torch.cat([torch.einsum("sr,hdr->shd", latent, w_kc), k_pe[:, None].expand(S, H, P)], -1)
    v = torch.einsum("sr,hvr->shv", latent, w_vc)
    q = torch.cat([q_nope, q_pe], -1)
    s = torch.einsum("thd,shd->hts", q, k) * scale
    mask = torch.arange(S)[None, :] > (torch.arange(T)[:, None] + prefix)
    s = s.masked_fill(mask[None], float("-inf"))
    ref = torch.einsum("hts,shv->thv", s.softmax(-1), v)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1).t(), rtol=1e-10, atol=1e-10)
