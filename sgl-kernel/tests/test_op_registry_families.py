"""The op families that joined the start-up table and the boot gates after KDA / norm / experts:
MLA decode / extend, DCP merge, QSA dense / sparse, MoE routing, AttnRes + RMSNorm.

Each op: registered, planned ``torch`` on CPU by its real dispatcher; its gate passes for
the torch path and the Triton path (interpreter, tiny FP32 shapes); and a deliberately
wrong implementation (monkeypatched) fails its gate. The MLA aiter row: with aiter
mocked at its boundary (``mla_decode_fwd``) on a "rocm" device, the plan records
``aiter`` with the head padding, the table lists it and the aiter gate passes / fails.
"""

import math

import pytest
import torch

import sgl_hybrid_kernel.attn_res.fused_reference as attn_res_ref
import sgl_hybrid_kernel.dcp.merge as dcp_merge
import sgl_hybrid_kernel.dcp.reference as dcp_ref
import sgl_hybrid_kernel.mla.dispatch as mla_dispatch
import sgl_hybrid_kernel.mla.reference as mla_ref
import sgl_hybrid_kernel.moe.routing_reference as routing_ref
import sgl_hybrid_kernel.qsa.reference as qsa_ref
from sgl_hybrid_kernel import dispatch
from test_mla_aiter_adapter_mocked import FakeAiter as FakeMlaDecode

CPU = torch.device("cpu")
NEW_OPS = ["attn_res_rmsnorm", "dcp_merge", "mla_decode", "mla_extend", "moe_routing", "qsa_dense", "qsa_sparse"]

# The interpreter evaluates kernels with numpy, which warns on the -inf / NaN the gates feed on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ops():
    return {e.op: e for e in dispatch.registered_ops()}


def test_every_family_is_registered_and_plans_torch_on_cpu():
    ops = _ops()
    assert set(NEW_OPS) <= set(ops)
    for name in NEW_OPS:
        choice = ops[name].plan(CPU)
        assert (choice.op, choice.impl) == (name, "torch") and "CPU tensors" in choice.reason
    recorded = {c.op: c for c in dispatch.chosen_paths()}
    assert all(recorded[name].impl == "torch" for name in NEW_OPS)
    assert "exact dense walk" in recorded["qsa_dense"].reason  # the plan hit the walk its op names
    assert "> budget 2048" in recorded["qsa_sparse"].reason


ROCM_ROWS = {  # docs/rocm.md, "On an MI355X the dispatch code gives" (aiter absent)
    "mla_decode": "rocm: mla_split_kv_kernel rows=16 block_n=16 score_chunk=64 value_cols=128"
                  " (spill-free rocm tile, not tuned per CU count; KV splits sized for the device's CU count)",
    "mla_extend": "rocm: mla_split_kv_kernel rows=64 block_n=16 score_chunk=64 value_cols=128"
                  " (spill-free rocm tile, not tuned per CU count; KV splits sized for the device's CU count)",
    "dcp_merge": "rocm: merge_partials_kernel",
    "moe_routing": "rocm: moe_gating_topk_kernel + moe_sorted_layout_kernel (2 launches)",
    "attn_res_rmsnorm": "rocm: attn_res_rmsnorm_kernel (one launch per read)",
}


def test_plans_on_a_rocm_device_take_triton_at_the_served_shapes(monkeypatch):
    """The plans' tiny calls run the dispatchers' Triton paths (interpreter) at Kimi K3's shapes in BF16.
    (QSA is left out: its served-shape plans cost ~10 s each in the interpreter.)"""
    import sgl_hybrid_kernel.attn_res.dispatch as attn_res_dispatch
    import sgl_hybrid_kernel.dcp.dispatch as dcp_dispatch
    import sgl_hybrid_kernel.moe.dispatch as moe_dispatch

    for module in (mla_dispatch, dcp_dispatch, moe_dispatch, attn_res_dispatch):
        monkeypatch.setattr(module, "device_kind", lambda t: "rocm")
    monkeypatch.setattr(mla_dispatch, "aiter_mla_decode_fn", lambda: None)
    ops = _ops()
    for name, reason in ROCM_ROWS.items():
        assert ops[name].plan(CPU) == dispatch.KernelChoice(name, "triton", reason)
    monkeypatch.undo()
    for name in ROCM_ROWS:  # leave the process-wide record as the CPU has it
        assert ops[name].plan(CPU).impl == "torch"


@pytest.mark.parametrize("op", NEW_OPS)
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_each_implementation_passes_its_gate(op, impl):
    result = _ops()[op].gate(impl, CPU)
    assert result.ok and result.error is None, result
    assert 0.0 < result.max_abs_err < 1e-5 < result.tolerance  # FP32 paths vs FP64 oracles


@pytest.mark.parametrize("op", NEW_OPS)
def test_unknown_implementation_raises(op):
    with pytest.raises(ValueError, match="impl"):
        _ops()[op].gate("cutlass", CPU)


# ------------------------------------------------------- broken paths fail their gates
def _mla_wrong_pages(original):
    def broken(q, kv_cache, page_table, *args, **kwargs):  # the bug: each request reads another's page-table row
        return original(q, kv_cache, page_table.flip(0), *args, **kwargs)

    return broken


def _mla_off_by_one(original):
    def broken(q, kv_cache, page_table, kv_lens, *args, **kwargs):  # the bug: each row misses its own position
        return original(q, kv_cache, page_table, kv_lens - 1, *args, **kwargs)

    return broken


def _naive_merge(o_parts, lse_parts):  # the bug: empty parts not masked (NaN * 0 = NaN leaks in)
    w = torch.softmax(lse_parts.float(), 0)
    return (w.unsqueeze(-1) * o_parts.float()).sum(0), torch.logsumexp(lse_parts.float(), 0)


def _qsa_dense_off_by_one(original):
    def broken(q, k, v, table, kv_lens, qo, *args, **kwargs):  # the bug: each row misses its own position
        return original(q, k, v, table, kv_lens - 1, qo, *args, **kwargs)

    return broken


def _qsa_ignores_selection(original):
    def broken(q, k, v, table, kv, qo, scale, page_size=1, block_indices=None, ratio=4):  # the bug: dense walk
        return original(q, k, v, table, kv, qo, scale, page_size, None, ratio)

    return broken


def _routing_no_renorm(original):
    def broken(logits, top_k, scoring_func, bias, groups, topk_group, renormalize, *rest):  # the bug: no renormalise
        return original(logits, top_k, scoring_func, bias, groups, topk_group, False, *rest)

    return broken


def _attn_res_drops_bank(original):
    def broken(prefix, addend, bank, num_banked, *rest):  # the bug: banked rows ignored by the mix
        return original(prefix, addend, bank, 0, *rest)

    return broken


BROKEN = {
    "mla_decode": (mla_ref, "mla_attention_paged_reference", _mla_wrong_pages),
    "mla_extend": (mla_ref, "mla_attention_paged_reference", _mla_off_by_one),
    "dcp_merge": (dcp_ref, "merge_partial_attention_reference", lambda original: _naive_merge),
    "qsa_dense": (qsa_ref, "qsa_attention_reference", _qsa_dense_off_by_one),
    "qsa_sparse": (qsa_ref, "qsa_attention_reference", _qsa_ignores_selection),
    "moe_routing": (routing_ref, "route_tokens_reference", _routing_no_renorm),
    "attn_res_rmsnorm": (attn_res_ref, "attn_res_rmsnorm_reference", _attn_res_drops_bank),
}


@pytest.mark.parametrize("op", NEW_OPS)
def test_a_wrong_torch_path_fails_its_gate(op, monkeypatch):
    module, name, breaker = BROKEN[op]
    monkeypatch.setattr(module, name, breaker(getattr(module, name)))
    result = _ops()[op].gate("torch", CPU)
    assert not result.ok and result.error is None
    if op == "dcp_merge":
        assert math.isnan(result.max_abs_err)  # NaN from an empty rank's garbage: fails, never passes
    else:
        assert result.max_abs_err > 1e-2 > result.tolerance


def test_a_wrong_triton_merge_fails_its_gate(monkeypatch):
    original = dcp_merge.merge_partial_attention_triton

    def one_rank_lost(o_parts, lse_parts, *args):  # the bug: the last DCP rank's partial is dropped
        return original(o_parts[:-1], lse_parts[:-1], *args)

    monkeypatch.setattr(dcp_merge, "merge_partial_attention_triton", one_rank_lost)
    result = _ops()["dcp_merge"].gate("triton", CPU)
    assert not result.ok and result.max_abs_err > 1e-2


def test_a_crashing_path_raises_out_of_the_gate(monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("illegal memory access")

    monkeypatch.setattr(attn_res_ref, "attn_res_rmsnorm_reference", crash)
    with pytest.raises(RuntimeError, match="illegal memory access"):  # run_gates turns this into a failed gate
        _ops()["attn_res_rmsnorm"].gate("torch", CPU)


# ------------------------------------------------------- the MLA aiter row, aiter mocked at its boundary
@pytest.fixture
def rocm_with_fake_aiter(monkeypatch):
    fake = FakeMlaDecode(real_heads=12)  # Kimi K3 TP8: 12 query heads per rank
    monkeypatch.setattr(mla_dispatch, "device_kind", lambda t: "rocm")
    monkeypatch.setattr(mla_dispatch, "aiter_mla_decode_fn", lambda: fake)
    yield fake
    monkeypatch.undo()
    _ops()["mla_decode"].plan(CPU)  # leave the process-wide record as the CPU has it


def test_mla_decode_plans_aiter_with_head_padding_and_gates_it_boundary_mocked(rocm_with_fake_aiter):
    from sglang_hybrid.boot.gates import op_table
    from sglang_hybrid.platforms import Platform

    op = _ops()["mla_decode"]
    choice = op.plan(CPU)
    assert choice.impl == "aiter" and "query heads 12 padded to 16" in choice.reason
    assert rocm_with_fake_aiter.calls == [16]  # the plan asked the real dispatcher, which called "aiter"
    table = op_table(Platform("rocm", "gfx950", 256, "mocked", "MI355X"), [choice])
    assert any(line.split()[:2] == ["mla_decode", "aiter"] for line in table.splitlines()), table
    result = op.gate("aiter", CPU)
    assert result.ok and 0.0 < result.max_abs_err < result.tolerance, result
    assert "kimi-k3 TP8 heads H=12 R=512 P=64" in result.cases and "shuffled pages" not in result.cases


def test_mla_aiter_gate_fails_when_the_lse_base_is_misread_boundary_mocked(rocm_with_fake_aiter, monkeypatch):
    original = type(rocm_with_fake_aiter).__call__

    def lse_in_log2(self, *args, **kwargs):  # the bug: aiter's LSE taken as natural log when it is base 2
        logits, lse = original(self, *args, **kwargs)
        return logits, lse / math.log(2)

    monkeypatch.setattr(type(rocm_with_fake_aiter), "__call__", lse_in_log2)
    result = _ops()["mla_decode"].gate("aiter", CPU)
    assert not result.ok and result.max_abs_err > 1e-1


def test_mla_aiter_gate_without_aiter_raises():
    with pytest.raises(ValueError, match="aiter does not import"):
        _ops()["mla_decode"].gate("aiter", CPU)
