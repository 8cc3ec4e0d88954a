"""DCP merge in the start-up table and the boot gates (``sgl_hybrid_kernel.dispatch`` registry).

| op | implementations | oracle |
|---|---|---|
| ``dcp_merge`` | ``triton`` (``merge_partial_attention_triton``), ``torch`` (``merge_partial_attention_reference``) | FP64 attention over *all* keys (not a merge formula) |

The gate builds real partial results: each of ``c`` ranks attends over the
positions it owns round-robin (position ``p`` on rank ``p mod c``, seeds digest
item 3) and returns its FP32 output and LSE; the merge must give the attention
over the whole history. Ranks owning no position return LSE ``-inf`` and NaN
outputs (garbage that must not leak in); a row with no position at all must give
``(0, -inf)``. Cases: 3 ranks at ``Dv = 16``; Kimi K3 at DCP8 (8 ranks, 12 heads,
``Dv = 512``, a 5-position row leaving 3 ranks empty).

The plan runs ``dcp.dispatch.merge_partial_attention`` once on one row of the
Kimi K3 DCP8 shape (FP32 LSE, BF16 outputs): the dispatcher has no public
function that only names its choice.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from sgl_hybrid_kernel import dispatch as _dispatch

OP = "dcp_merge"
PLAN_PARTS, PLAN_HEADS, PLAN_DV = 8, 12, 512  # Kimi K3 at DCP8: latent rank 512
# FP32 partials vs FP64 on O(1) values: ~1e-7 observed; a dropped part, a wrong
# LSE weight or a NaN leaking from an empty part is off by >= ~1e-1 (or NaN).
TOLERANCE = 1e-4
# (name, ranks c, heads, key dim, Dv, history length per row)
CASES = [
    ("3 ranks", 3, 2, 8, 16, [7, 2, 0]),
    ("kimi-k3 DCP8", PLAN_PARTS, PLAN_HEADS, 16, PLAN_DV, [37, 5]),
]


def _describe() -> str:
    return "; ".join(f"{n} c={c} H={H} Dv={dv} lens={lens}" for n, c, H, _, dv, lens in CASES)


def _problem(seed: int, c: int, H: int, d: int, dv: int, lens: Sequence[int]):
    """``q [R, H, d]``, ``k [R, L, d]``, ``v [R, L, Dv]`` (FP64) and the visibility mask ``[R, L]``."""
    gen = torch.Generator().manual_seed(seed)
    R, L = len(lens), max(max(lens), 1)
    q = torch.randn(R, H, d, generator=gen, dtype=torch.float64)
    k = torch.randn(R, L, d, generator=gen, dtype=torch.float64)
    v = torch.randn(R, L, dv, generator=gen, dtype=torch.float64)
    visible = torch.arange(L).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
    return q, k, v, visible


def _attend(q, k, v, mask) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``q`` over the masked keys: ``(o [R, H, Dv], lse [R, H])``; NaN / -inf where none."""
    s = torch.einsum("rhd,rld->rhl", q, k) * q.shape[-1] ** -0.5
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    return torch.einsum("rhl,rlv->rhv", torch.softmax(s, -1), v), torch.logsumexp(s, -1)


def _parts(q, k, v, visible, c: int):
    """Each rank's FP32 partial result over the positions it owns (round-robin)."""
    owner = torch.arange(k.shape[1]) % c
    outs, lses = zip(*(_attend(q, k, v, visible & (owner == i).unsqueeze(0)) for i in range(c)))
    return torch.stack(outs).float(), torch.stack(lses).float()


def _impl(impl: str):
    if impl == "torch":
        from sgl_hybrid_kernel.dcp.reference import merge_partial_attention_reference

        return merge_partial_attention_reference
    if impl == "triton":
        from sgl_hybrid_kernel.dcp.merge import merge_partial_attention_triton

        return merge_partial_attention_triton
    raise ValueError(f"impl: no {OP} implementation named {impl!r}")


def gate_dcp_merge(impl: str, device) -> _dispatch.GateResult:
    """Boot gate of ``dcp_merge``: merged rank partials vs FP64 attention over the whole history.

    Raises:
        ValueError: unknown ``impl``.
    """
    fn = _impl(impl)
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for n, (_, c, H, d, dv, lens) in enumerate(CASES):
        q, k, v, visible = _problem(600 + n, c, H, d, dv, lens)
        o_parts, lse_parts = _parts(q, k, v, visible, c)
        o, lse = fn(o_parts.to(device), lse_parts.to(device))
        want_o, want_lse = _attend(q, k, v, visible)
        empty = torch.tensor([L == 0 for L in lens]).unsqueeze(1).expand_as(want_lse)
        want_o = want_o.masked_fill(empty.unsqueeze(-1), 0.0)  # an all-empty row merges to (0, -inf)
        got_lse = lse.double().cpu()
        pairs += [(o, want_o), (torch.isneginf(got_lse).double(), empty.double()),
                  (got_lse.masked_fill(empty, 0.0), want_lse.masked_fill(empty, 0.0))]
    return _dispatch.GateResult(OP, impl, _dispatch.max_abs_error(pairs), TOLERANCE, _describe())


def plan_dcp_merge(device) -> _dispatch.KernelChoice:
    """What ``dcp.dispatch.merge_partial_attention`` picks on ``device`` for Kimi K3 DCP8 (recorded and returned)."""
    from sgl_hybrid_kernel.dcp.dispatch import merge_partial_attention

    o_parts = torch.zeros(PLAN_PARTS, 1, PLAN_HEADS, PLAN_DV, dtype=torch.bfloat16, device=device)
    merge_partial_attention(o_parts, torch.zeros(PLAN_PARTS, 1, PLAN_HEADS, dtype=torch.float32, device=device))
    return next(c for c in _dispatch.chosen_paths() if c.op == OP)


_dispatch.register_op(OP, plan_dcp_merge, gate_dcp_merge, "DCP / split-KV merge of partial attention by LSE")
