"""Group-scan mode of the chunk-64 prefill (issue 4) under the Triton interpreter.

Against three oracles: the plain chunk-64 pass on the same inputs (same kernels
without the split), the token-by-token recurrence in FP64 (outside the chunked
algorithm), and the plain-torch twin of the mode (``group_scan_reference``).
Sequences of 200 / 5 / 130 / 70 tokens in groups of one chunk (4 / 1 / 3 / 2 groups):
checkpoints inside groups, on group boundaries (64, 128) and at ragged ends; a
sequence from a zero state, one with no slot (padding, ``slot = -1``); grouped value
heads; NaN-filled output, checkpoint pool and unnamed pool slots. The raw gates are shifted
down (``f - 6``: per-token decay ~0.99; ``b - 4``: beta ~0.02) so a state outlives several groups: a wrong group
transition ``A_g`` changes every later group (asserted in the torch-twin test).
"""

import pytest
import torch

from sgl_hybrid_kernel.delta_rule.plan import ChunkOverrides
from sgl_hybrid_kernel import dispatch
from sgl_hybrid_kernel.delta_rule.chunk import group_scan as chunk_group_scan
from sgl_hybrid_kernel.delta_rule import dispatch as dr_dispatch
from sgl_hybrid_kernel.delta_rule.chunk.wrapper import gated_delta_chunk_triton
from sgl_hybrid_kernel.delta_rule.naive import (gated_delta_recurrent, gdn_gate, group_scan_sequence, kda_gate, prefill_group_scan_torch)
from sgl_hybrid_kernel.norm import l2_norm
from sgl_hybrid_kernel.platform import DevicePlatform, Target
from test_delta_rule_triton import _batch

NAN = float("nan")
LENS = [200, 5, 130, 70]
SLOTS = [2, 5, 1, -1]  # the last sequence is padding: no slot
INIT = [1, 1, 0, 1]
# (sequence, position, checkpoint slot): inside a group, group boundaries 64 / 128, ragged ends
CKPTS = [(0, 48, 0), (0, 64, 1), (0, 128, 2), (0, 200, 3), (1, 5, 4), (2, 64, 5), (2, 130, 6), (3, 16, 7)]


def _run(gate, lower_bound, layout, **over):
    gen = torch.Generator().manual_seed(21)
    H, HV, K, V = 1, 2, 16, 16
    q, k, v, f, b, A, dtb = _batch(gen, 1, sum(LENS), H, HV, K, V, gate)
    f, b = f - 6.0, b - 4.0  # long memory: the start state of a group matters (see the module docstring)
    cu = torch.tensor([0] + torch.tensor(LENS).cumsum(0).tolist())
    pool_kv = torch.randn(6, HV, K, V, generator=gen)
    pool_kv[0] = NAN  # named by no sequence
    pool_kv[3] = NAN
    pool = pool_kv.clone() if layout == "kv" else pool_kv.transpose(-1, -2).contiguous()
    ck = torch.full((8, HV, K, V), NAN)
    ck = ck if layout == "kv" else ck.transpose(-1, -2).contiguous()
    o = torch.full_like(v, NAN)
    gated_delta_chunk_triton(q, k, v, f, b, A, dtb, cu, pool, torch.tensor(SLOTS), torch.tensor(INIT), gate, lower_bound,
                             state_layout=layout, checkpoints=CKPTS, checkpoint_pool=ck, out=o,
                             plan=ChunkOverrides(value_tile=8, method="parallel", **over))
    as_kv = (lambda t: t) if layout == "kv" else (lambda t: t.transpose(-1, -2))
    return dict(q=q, k=k, v=v, f=f, b=b, A=A, dtb=dtb, cu=cu, pool_kv=pool_kv, o=o, final=as_kv(pool), ck=as_kv(ck), HV=HV, H=H)


@pytest.mark.parametrize("gate,lower_bound,layout", [("kda", -5.0, "kv"), ("kda", None, "vk"), ("gdn", None, "kv")])
def test_group_scan_equals_plain_pass_and_fp64(gate, lower_bound, layout):
    gs = _run(gate, lower_bound, layout, group_scan=True, group_chunks=1)
    plain = _run(gate, lower_bound, layout)
    o, final, ck = gs["o"], gs["final"], gs["ck"]
    assert not o.isnan().any() and not ck.isnan().any()
    assert final[0].isnan().all() and final[3].isnan().all() and final[4].equal(gs["pool_kv"][4])
    # same kernels without the split: equal up to FP32 rounding of the summaries and the scan
    torch.testing.assert_close(o, plain["o"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final[[1, 2, 5]], plain["final"][[1, 2, 5]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ck, plain["ck"], rtol=1e-5, atol=1e-5)
    H, HV, cu = gs["H"], gs["HV"], gs["cu"]
    for i, s in enumerate(SLOTS):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        f = gs["f"][sl]
        g = kda_gate(f, gs["A"], gs["dtb"], lower_bound) if gate == "kda" else gdn_gate(f, gs["A"], gs["dtb"])
        s0 = gs["pool_kv"][s] if s >= 0 and INIT[i] else None
        want = [(p, d) for (seq, p, d) in CKPTS if seq == i]
        ro, rS, saved = gated_delta_recurrent(l2_norm(gs["q"][sl]), l2_norm(gs["k"][sl]), gs["v"][sl], g,
                                              torch.sigmoid(gs["b"][sl]), initial_state=s0, acc_dtype=torch.float64,
                                              save_positions=[p for p, _ in want])
        torch.testing.assert_close(o[sl].double(), ro.double(), rtol=2e-5, atol=2e-5)
        if s >= 0:
            torch.testing.assert_close(final[s].double(), rS, rtol=2e-5, atol=2e-5)
        for (_, d), ref in zip(want, saved):
            torch.testing.assert_close(ck[d].double(), ref, rtol=2e-5, atol=2e-5)


def test_torch_twin_of_the_mode_matches_the_kernels_and_fp64():
    """The plain-torch group scan (summaries by the WY form from 0 and from I) on the same batch:
    equal to the Triton group scan, and its per-group start states equal the FP64 recurrence's
    states at the group boundaries."""
    gate, lb, layout = "kda", -5.0, "vk"
    gs = _run(gate, lb, layout, group_scan=True, group_chunks=1)
    pool = gs["pool_kv"].transpose(-1, -2).contiguous()
    ck = torch.full((8, 2, 16, 16), NAN).transpose(-1, -2).contiguous()
    o = prefill_group_scan_torch(gs["q"], gs["k"], gs["v"], gs["f"], gs["b"], gs["A"], gs["dtb"], gs["cu"], pool,
                                 torch.tensor(SLOTS), torch.tensor(INIT), gate, lb, layout, group_chunks=1,
                                 checkpoints=CKPTS, checkpoint_pool=ck)
    torch.testing.assert_close(o, gs["o"], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(pool.transpose(-1, -2)[[1, 2, 5]], gs["final"][[1, 2, 5]], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(ck.transpose(-1, -2), gs["ck"], rtol=2e-5, atol=2e-5)
    sl = slice(0, 200)
    qn, kn = l2_norm(gs["q"][sl]).repeat_interleave(2, 1), l2_norm(gs["k"][sl]).repeat_interleave(2, 1)
    g = kda_gate(gs["f"][sl], gs["A"], gs["dtb"], lb)
    beta = torch.sigmoid(gs["b"][sl])
    s0 = gs["pool_kv"][2]
    _, _, _, starts = group_scan_sequence(qn, kn, gs["v"][sl], g, beta, 64, initial_state=s0, acc_dtype=torch.float64)
    _, _, ref = gated_delta_recurrent(qn, kn, gs["v"][sl], g, beta, initial_state=s0, acc_dtype=torch.float64,
                                      save_positions=[64, 128, 192])
    assert len(starts) == 4
    for got, want in zip(starts[1:], ref):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # The initial state still weighs on the last group's start (192 tokens later): the group
    # transitions A_g carry it, so the comparisons above would catch a wrong A_g.
    _, _, _, fresh = group_scan_sequence(qn, kn, gs["v"][sl], g, beta, 64, acc_dtype=torch.float64)
    assert (fresh[3] - starts[3]).norm() > 0.5 * starts[3].norm()
    with pytest.raises(ValueError, match="group_tokens"):
        group_scan_sequence(qn, kn, gs["v"][sl], g, beta, 0)


def test_plan_groups_auto_rule_and_dispatch_log(monkeypatch):
    groups, goff = chunk_group_scan.plan_groups([200, 5, 0, 130], 2)
    assert groups == [(0, 0, 2), (0, 2, 2), (1, 0, 1), (2, 0, 0), (3, 0, 2), (3, 2, 1)] and goff == [0, 2, 3, 4, 6]
    # 16-column state tiles on 132 SMs, one replay wave: Kimi K3 TP8 (12 heads x 128 = 96 programs)
    # leaves room for one copy only -> plain; 4 heads (32 programs), B=1 T=4096 (64 chunks) -> 4 groups
    # of 16 chunks; B=8 fills the SMs; T=512 is too short; 2 heads at 64K -> 8 groups of 128 chunks.
    assert chunk_group_scan.auto_group_chunks([4096], 12, 128, 16, 132) is None
    assert chunk_group_scan.auto_group_chunks([4096], 4, 128, 16, 132) == 16
    assert chunk_group_scan.auto_group_chunks([4096] * 8, 4, 128, 16, 132) is None
    assert chunk_group_scan.auto_group_chunks([512], 4, 128, 16, 132) is None
    assert chunk_group_scan.auto_group_chunks([65536], 2, 128, 16, 132) == 128
    # forced without a size where auto finds no split: 2 groups per longest sequence
    assert chunk_group_scan.forced_group_chunks([4096, 100]) == 32 and chunk_group_scan.forced_group_chunks([64]) == 4
    q, v = torch.empty(1, 4, 128), torch.empty(1, 4, 128)
    assert dr_dispatch.choose_group_scan(q, v, [4096]) is None  # CPU: never auto
    assert {c.op: c.impl for c in dispatch.chosen_paths()}[dr_dispatch.GROUP_SCAN_OP] == "plain"
    monkeypatch.setattr(Target, "of", staticmethod(lambda d: Target.from_platform(DevicePlatform("cuda", "sm90", 132, "H200"))))
    # the shape qualifies, but the mode was timed slower than the plain pass on the H200
    assert dr_dispatch.choose_group_scan(q, v, [4096]) is None
    choice = {c.op: c for c in dispatch.chosen_paths()}[dr_dispatch.GROUP_SCAN_OP]
    assert choice.impl == "plain" and "timed slower" in choice.reason
    monkeypatch.setitem(chunk_group_scan.GROUP_SCAN_TIMED, "sm90x132", (True, "timed faster here"))
    assert dr_dispatch.choose_group_scan(q, v, [4096]) == 16
    choice = {c.op: c for c in dispatch.chosen_paths()}[dr_dispatch.GROUP_SCAN_OP]
    assert choice.impl == "group_scan" and "132 compute units" in choice.reason
    assert dr_dispatch.choose_group_scan(q, v, [4096] * 8) is None
    assert dr_dispatch.choose_group_scan(q, v, [4096] * 8, group_chunks=3, forced=True) == 3
    q12 = torch.empty(1, 12, 128)  # Kimi K3 TP8 at B=1: auto stays plain, forced takes 2 groups of 32 chunks
    assert dr_dispatch.choose_group_scan(q12, q12, [4096]) is None
    assert dr_dispatch.choose_group_scan(q12, q12, [4096], forced=True) == 32


def test_group_scan_arguments_are_checked():
    q = torch.randn(4, 1, 16)
    args = (q, q, torch.randn(4, 1, 16), torch.randn(4, 1, 16), torch.randn(4, 1), torch.rand(1), torch.randn(16),
            torch.tensor([0, 4]), torch.zeros(1, 1, 16, 16), torch.tensor([0]))
    with pytest.raises(ValueError, match="group_scan"):
        gated_delta_chunk_triton(*args, plan=ChunkOverrides(group_scan="yes"))
    with pytest.raises(ValueError, match="group_chunks"):
        gated_delta_chunk_triton(*args, plan=ChunkOverrides(group_scan=True, group_chunks=0))
    with pytest.raises(ValueError, match="group_scan"):
        gated_delta_chunk_triton(*args, plan=ChunkOverrides(group_scan=True, method="sequential"))
    with pytest.raises(ValueError, match="group_chunks"):
        chunk_group_scan.plan_groups([10], 0)
