"""MoE routing hook: our routing kernel behind upstream's ``biased_grouped_topk`` / ``fused_topk`` (CPU).

Oracles are upstream's own plain-torch routers on CPU: ``biased_grouped_topk_impl``
(sigmoid, correction bias, expert groups: Kimi K3) and ``fused_topk_torch_native``
(softmax: Qwen). Our torch path and our Triton kernel (interpreter) must choose
the same experts with the same weights; the hooks must leave CPU calls and
out-of-contract calls on upstream's function, and route in-contract GPU calls
(simulated by declaring the device CUDA) through ours with select_experts' keywords.
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.layers.moe import topk as upstream
from sglang_hybrid.layers.moe import routing_hook
from sglang_hybrid.layers.moe.routing_hook import route

M, E, TOPK = 5, 64, 6


def _by_id(w, ids):
    order = ids.long().argsort(-1)
    return w.gather(-1, order), ids.long().gather(-1, order)


def _logits(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(M, E, generator=gen), torch.randn(E, generator=gen) * 0.1


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_kimi_sigmoid_grouped_matches_upstream(impl):
    x, bias = _logits(0)
    ref_w, ref_i = upstream.biased_grouped_topk_impl(torch.zeros(M, 8), x, bias, TOPK, True, 8, 4,
                                                     routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True)
    w, ids = route(x, TOPK, True, "sigmoid", bias, 8, 4, 2.5, True, impl=impl)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    a, b = _by_id(w, ids), _by_id(ref_w, ref_i)
    assert torch.equal(a[1], b[1])
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_qwen_softmax_matches_upstream(impl):
    x, _ = _logits(1)
    ref_w, ref_i = upstream.fused_topk_torch_native(torch.zeros(M, 8), x, TOPK, True)
    w, ids = route(x, TOPK, True, "softmax", impl=impl)
    a, b = _by_id(w, ids), _by_id(ref_w, ref_i)
    assert torch.equal(a[1], b[1])
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)


def test_hooks_leave_cpu_and_out_of_contract_calls_to_upstream(monkeypatch):
    x, bias = _logits(2)
    calls = []
    orig = lambda *a, **k: calls.append(k) or "upstream"  # noqa: E731
    assert routing_hook._around_biased_grouped_topk(orig, torch.zeros(M, 8), x, bias, TOPK, True, 8, 4) == "upstream"
    assert routing_hook._around_fused_topk(orig, torch.zeros(M, 8), x, TOPK, True) == "upstream"
    monkeypatch.setattr(routing_hook, "device_kind", lambda t: "cuda")
    # fused shared-expert slots, packed output, and M above the contract stay upstream's
    assert routing_hook._around_biased_grouped_topk(orig, None, x, bias, TOPK, True, 8, 4, num_fused_shared_experts=1) == "upstream"
    assert routing_hook._around_fused_topk(orig, None, x, TOPK, True, packed_out=torch.empty(1)) == "upstream"
    assert routing_hook._around_fused_topk(orig, None, torch.randn(161, E), TOPK, True) == "upstream"
    assert len(calls) == 5 and calls[3]["packed_out"] is not None


def test_hook_routes_gpu_calls_with_select_experts_keywords(monkeypatch):
    """select_experts calls biased_grouped_topk with keywords only; on a (declared) GPU the hook answers."""
    x, bias = _logits(3)
    monkeypatch.setattr(routing_hook, "device_kind", lambda t: "cuda")
    monkeypatch.setattr(routing_hook, "fused_moe_routing", lambda *a, **k: routing_hook.fused_moe_routing_triton(*a, **k))
    w, ids = routing_hook._around_biased_grouped_topk(
        lambda *a, **k: pytest.fail("in-contract call reached upstream"), hidden_states=torch.zeros(M, 8),
        gating_output=x, correction_bias=bias, topk=TOPK, renormalize=True, num_expert_group=8, topk_group=4,
        num_fused_shared_experts=0, routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=False)
    ref_w, ref_i = upstream.biased_grouped_topk_impl(torch.zeros(M, 8), x, bias, TOPK, True, 8, 4,
                                                     routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=False)
    a, b = _by_id(w, ids), _by_id(ref_w, ref_i)
    assert torch.equal(a[1], b[1])
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)  # scale not applied: upstream folds it later


def test_hook_routes_without_building_a_layout_nobody_reads(monkeypatch):
    """Upstream's MoE runner builds its own expert-sorted layout: the hook's routing is one launch (the
    layout kernel would have no consumer), with the same experts and weights as the two-launch call."""
    from sgl_hybrid_kernel.moe import routing as routing_mod

    x, bias = _logits(3)
    full = routing_mod.fused_moe_routing_triton(x, TOPK, "sigmoid", bias, 8, 4, True, 2.5)
    assert full.sorted_ids is not None  # the kernel package's default still builds it

    def no_layout(*args, **kwargs):
        raise AssertionError("the layout kernel was launched for upstream's runner")

    monkeypatch.setattr(routing_mod, "moe_sorted_layout_kernel", no_layout)
    w, ids = route(x, TOPK, True, "sigmoid", bias, 8, 4, 2.5, True, impl="triton")
    assert torch.equal(ids, full.ids)
    torch.testing.assert_close(w, full.weights, rtol=0, atol=0)
