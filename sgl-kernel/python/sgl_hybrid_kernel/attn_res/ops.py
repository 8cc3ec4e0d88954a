"""AttnRes + RMSNorm in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

| op | implementations | oracle |
|---|---|---|
| ``attn_res_rmsnorm`` | ``triton`` (``attn_res_rmsnorm_triton``, one launch per read), ``torch`` (``attn_res_rmsnorm_reference``, the unfused sequence) | FP64 formulas of seeds digest item 6 |

The oracle, in FP64: ``head = prefix + addend``; over the rows
``[bank_0 .. bank_{n-1}, head]`` the scores ``proj . rms_norm(row) * score_norm``
give softmax weights; ``normed = rms_norm(sum_r w_r row_r) * out_norm``. Compared:
``normed``, ``head``, the bank after the read (only row ``n`` may change, and only
when writing) and the inputs (unchanged). Cases: 2 banked rows + a prefix + a bank
write at hidden 96; Kimi K3's hidden 7168 with 8 banked rows, no prefix; nothing
banked (a plain RMSNorm of the head). The scoring vector is scaled by ``D**-0.5`` so
the softmax weights stay spread (a one-hot mix would hide a wrong weighting).

The plan runs ``attn_res.dispatch.attn_res_rmsnorm`` once on one BF16 row of
Kimi K3's shape (hidden 7168, a 9-row bank): the dispatcher has no public
function that only names its choice.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch

OP = "attn_res_rmsnorm"
PLAN_HIDDEN, PLAN_BANK = 7168, 9  # Kimi K3 hidden size; snapshot bank rows
EPS = 1e-6
# FP32 vs FP64: ~1e-6 observed; a wrong softmax weight, dropped bank row or norm is off by >= ~1e-2.
TOLERANCE = 1e-4
# (name, T, D, bank rows NB, banked n, prefix?, write the head into the bank?)
CASES = [
    ("2 banked + prefix + bank write", 3, 96, 4, 2, True, True),
    ("kimi-k3 hidden, 8 banked", 2, PLAN_HIDDEN, PLAN_BANK, 8, False, False),
    ("nothing banked", 2, 64, 2, 0, True, False),
]


def _describe() -> str:
    return "; ".join(f"{n} T={T} D={D} banked={nvb}/{NB}" for n, T, D, NB, nvb, _, _ in CASES)


def _inputs(seed: int, T: int, D: int, NB: int, with_prefix: bool, device):
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randn(T, D, generator=gen) if with_prefix else None
    addend = torch.randn(T, D, generator=gen)
    bank = torch.randn(T, NB, D, generator=gen)
    score_norm = 1.0 + 0.5 * torch.randn(D, generator=gen)
    proj = torch.randn(1, D, generator=gen) * D ** -0.5
    out_norm = 1.0 + 0.5 * torch.randn(D, generator=gen)
    return [None if t is None else t.to(device) for t in (prefix, addend, bank, score_norm, proj, out_norm)]


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _oracle(prefix, addend, bank, nvb: int, score_norm, proj, out_norm):
    """FP64 ``(normed [T, D], head [T, D])``."""
    d = lambda t: t.detach().double().cpu()  # noqa: E731
    head = d(addend) + (d(prefix) if prefix is not None else 0.0)
    rows = torch.cat([d(bank)[:, :nvb], head.unsqueeze(1)], 1)  # [T, n + 1, D]
    scores = _rms(rows, d(score_norm)) @ d(proj).reshape(-1)  # [T, n + 1]
    mixed = (torch.softmax(scores, -1).unsqueeze(-1) * rows).sum(1)
    return _rms(mixed, d(out_norm)), head


def _impl(impl: str):
    if impl == "torch":
        from sgl_hybrid_kernel.attn_res.fused_reference import attn_res_rmsnorm_reference

        return attn_res_rmsnorm_reference
    if impl == "triton":
        from sgl_hybrid_kernel.attn_res.fused import attn_res_rmsnorm_triton

        return attn_res_rmsnorm_triton
    raise ValueError(f"impl: no {OP} implementation named {impl!r}")


def gate_attn_res_rmsnorm(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``attn_res_rmsnorm``: ``normed``, ``head`` and the bank of ``impl`` vs FP64 formulas.

    Raises:
        ValueError: unknown ``impl``.
    """
    fn = _impl(impl)
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, T, D, NB, nvb, with_prefix, write) in enumerate(CASES):
        prefix, addend, bank, score_norm, proj, out_norm = _inputs(900 + n, T, D, NB, with_prefix, device)
        before = [None if t is None else t.clone() for t in (prefix, addend, bank)]
        normed, head = fn(prefix, addend, bank, nvb, score_norm, proj, out_norm, EPS, write)
        want_normed, want_head = _oracle(before[0], before[1], before[2], nvb, score_norm, proj, out_norm)
        want_bank = before[2].double().cpu()
        if write:
            want_bank[:, nvb] = want_head
        pairs += [(normed, want_normed), (head, want_head), (bank, want_bank), (addend, before[1])]
        if prefix is not None:
            pairs.append((prefix, before[0]))
    return _dispatch.GateResult(OP, impl, _dispatch.max_abs_error(pairs), TOLERANCE, _describe())


def plan_attn_res_rmsnorm(device) -> _dispatch.KernelChoice:
    """What ``attn_res.dispatch.attn_res_rmsnorm`` picks on ``device`` for Kimi K3 (BF16, hidden 7168; recorded)."""
    from sgl_hybrid_kernel.attn_res.dispatch import attn_res_rmsnorm

    row = torch.zeros(1, PLAN_HIDDEN, dtype=torch.bfloat16, device=device)
    bank = torch.zeros(1, PLAN_BANK, PLAN_HIDDEN, dtype=torch.bfloat16, device=device)
    w = torch.ones(PLAN_HIDDEN, dtype=torch.bfloat16, device=device)
    attn_res_rmsnorm(row, row, bank, PLAN_BANK - 1, w, w, w, EPS)
    return next(c for c in _dispatch.chosen_paths() if c.op == OP)


_dispatch.register_op(OP, plan_attn_res_rmsnorm, gate_attn_res_rmsnorm, "attention-residual read + RMSNorm (fused)")
