"""GDN deferred commit on the MTP verify path (``layers/attention/gdn_deferred.py``, issue 41 item 1).

Pools laid out as upstream's ``MambaPool.SpeculativeState`` (state ``[L, slots, HV, V, K]`` FP32, verify
scratch ``[L, rows + 1, T, HV, V, K]``, one ``[slots, ...]`` / ``[rows + 1, T, ...]`` view per layer), a chain
verify of every layer through ``SglHybridGDNKernel.target_verify`` and the commit through the AROUND hook of
upstream's ``scatter_mamba_states_after_mtp_verify``. Oracle: the same verify with upstream's snapshot protocol
(``SGLANG_HYBRID_GDN_VERIFY_COMMIT=snapshots``) committed by the torch twin of upstream's scatter: the slots and
the prefix-cache track slots must end equal to FP32 rounding (1e-6 on the torch path, whose operations are the
snapshot path's; 1e-5 with the Triton kernels under the interpreter), the outputs too, and a rejected draft must
never reach a stored state.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sgl_hybrid_kernel.delta_rule.recurrent.wrapper import replay_commit
from sglang_hybrid.layers.attention import gdn_deferred
from sglang_hybrid.layers.attention.gdn_kernel import SglHybridGDNKernel
from sglang_hybrid.platforms.cpu_spec import scatter_states_after_verify_torch

L, SLOTS, ROWS, T = 2, 7, 4, 4
H, HV, K, V = 2, 4, 16, 16


def _pools(gen):
    states = torch.randn(L, SLOTS, HV, V, K, generator=gen)
    scratch = torch.full((L, ROWS + 1, T, HV, V, K), float("nan"))
    conv = torch.randn(L, SLOTS, 8, 3, generator=gen)
    conv_window = torch.randn(L, ROWS + 1, T, 8, 3, generator=gen)
    return SimpleNamespace(temporal=states, intermediate_ssm=scratch, conv=[conv], intermediate_conv_window=[conv_window])


def _clone(c):
    return SimpleNamespace(temporal=c.temporal.clone(), intermediate_ssm=c.intermediate_ssm.clone(),
                           conv=[c.conv[0].clone()], intermediate_conv_window=[c.intermediate_conv_window[0].clone()])


def _verify_all_layers(caches, slots, rows, inputs, force_triton):
    kernel = SglHybridGDNKernel(force_triton)
    B = slots.shape[0]
    outs = []
    for layer, (q, k, v, a, b, A_log, dt_bias) in enumerate(inputs):
        outs.append(kernel.target_verify(
            A_log, dt_bias, q, k, v, a, b, ssm_states=caches.temporal[layer], cache_indices=slots,
            query_start_loc=torch.arange(0, B * T + 1, T, dtype=torch.int32),
            intermediate_states_buffer=caches.intermediate_ssm[layer], intermediate_state_indices=rows,
            cache_steps=T, retrieve_parent_token=None))
    return outs


def _inputs(gen, B):
    N = B * T
    out = []
    for _ in range(L):
        out.append((torch.randn(1, N, H, K, generator=gen), torch.randn(1, N, H, K, generator=gen),
                    torch.randn(1, N, HV, V, generator=gen), torch.randn(N, HV, generator=gen),
                    torch.randn(N, HV, generator=gen), torch.rand(HV, generator=gen), torch.randn(HV, generator=gen)))
    return out


def _never_called(*args, **kwargs):
    raise AssertionError("upstream's CUDA scatter reached with CPU tensors")


@pytest.mark.parametrize("force_triton", [False, True])
def test_deferred_commit_equals_snapshot_commit_with_track_slots(force_triton, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    slots = torch.tensor([3, 0, -1, 5], dtype=torch.int32)  # -1: CUDA-graph padding row
    rows = torch.tensor([1, 0, 4, 2], dtype=torch.int32)
    B = slots.shape[0]
    inputs = _inputs(gen, B)
    deferred = _pools(gen)
    snap, before = _clone(deferred), deferred.temporal.clone()

    monkeypatch.setenv(gdn_deferred.ENV, "snapshots")
    out_snap = _verify_all_layers(snap, slots, rows, inputs, force_triton)
    monkeypatch.setenv(gdn_deferred.ENV, "deferred")
    out_def = _verify_all_layers(deferred, slots, rows, inputs, force_triton)
    assert gdn_deferred.window_of(snap.temporal) is None
    window = gdn_deferred.window_of(deferred.temporal)
    assert window is not None and window.tokens == T and window.layers == L and window.slots == SLOTS
    for o_s, o_d in zip(out_snap, out_def):  # the verify's outputs do not depend on the protocol
        torch.testing.assert_close(o_d, o_s, rtol=1e-5 if force_triton else 1e-6, atol=1e-6 if force_triton else 1e-7)

    # accepted tokens 4, 1, -, 2 (index of the last accepted); requests 0 and 3 cross the checkpoint grid:
    # track slots 6 and 1 want the states after 2 and 1 tokens (window indices 1 and 0)
    last = torch.tensor([3, 0, -1, 1])
    track = torch.tensor([6, 4, -1, 1])
    steps = torch.tensor([1, -1, -1, 0])
    scatter_states_after_verify_torch(snap, slots, last, track, steps, rows)
    gdn_deferred.scatter_after_verify(_never_called, deferred, slots, last, track, steps, rows)

    tol = dict(rtol=1e-5, atol=1e-5) if force_triton else dict(rtol=1e-6, atol=1e-6)
    for s in (3, 0, 5, 6, 1):
        torch.testing.assert_close(deferred.temporal[:, s], snap.temporal[:, s], **tol)
    assert torch.equal(deferred.temporal[:, 4], snap.temporal[:, 4])  # no track step: untouched
    assert torch.equal(deferred.conv[0], snap.conv[0])  # conv windows: upstream's scatter either way
    for s in (3, 0, 5, 6, 1):  # every committed slot moved off its state before the verify
        assert not torch.equal(deferred.temporal[:, s], before[:, s])


def test_rejected_drafts_never_reach_the_slot():
    """One request, one accepted token: the slot must hold the state after token 0, whatever the drafts were."""
    gen = torch.Generator().manual_seed(1)
    slots, rows = torch.tensor([2], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    inputs = _inputs(gen, 1)
    caches_a, caches_b = _pools(gen), None
    caches_b = _clone(caches_a)
    changed = [tuple(t.clone() for t in layer) for layer in inputs]
    for layer in changed:  # other drafts (tokens 1..T-1): q, k, v, a, b of those rows
        for t in layer[:3]:
            t[0, 1:] = torch.randn(t[0, 1:].shape, generator=gen)
        for t in layer[3:5]:
            t[1:] = torch.randn(t[1:].shape, generator=gen)
    _verify_all_layers(caches_a, slots, rows, inputs, False)
    _verify_all_layers(caches_b, slots, rows, changed, False)
    for c in (caches_a, caches_b):
        gdn_deferred.scatter_after_verify(_never_called, c, slots, torch.tensor([0]), None, None)
    assert torch.equal(caches_a.temporal, caches_b.temporal)


def test_triton_replay_from_the_scratch_records(monkeypatch):
    """The GPU branch of the commit (``replay_commit``, interpreter) over the records view of the scratch."""
    gen = torch.Generator().manual_seed(2)
    slots, rows = torch.tensor([1, 4], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    inputs = _inputs(gen, 2)
    deferred = _pools(gen)
    snap = _clone(deferred)
    monkeypatch.setenv(gdn_deferred.ENV, "snapshots")
    _verify_all_layers(snap, slots, rows, inputs, True)
    monkeypatch.setenv(gdn_deferred.ENV, "deferred")
    _verify_all_layers(deferred, slots, rows, inputs, True)

    def triton_replay(states, records, idx, accept, window):
        replay_commit(states, idx, accept, records, window.head_k_dim, "gdn", "vk",
                      num_k_heads=window.num_k_heads, activation_dtype=window.activation_dtype)

    monkeypatch.setattr(gdn_deferred, "_replay", triton_replay)
    last = torch.tensor([2, 3])
    scatter_states_after_verify_torch(snap, slots, last, None, None, rows)
    gdn_deferred.scatter_after_verify(_never_called, deferred, slots, last, None, None, rows)
    torch.testing.assert_close(deferred.temporal, snap.temporal, rtol=1e-5, atol=1e-5)


def test_scratch_too_small_keeps_snapshots_and_says_why(caplog):
    gen = torch.Generator().manual_seed(3)
    states = torch.randn(1, 64, HV, V, K, generator=gen)  # 64 slots of records need more than 2 scratch rows
    scratch = torch.full((1, 1, 2, HV, V, K), float("nan"))
    with caplog.at_level(logging.INFO):
        records, why = gdn_deferred.records_for_layer(states[0], scratch[0], 2, H, torch.float32)
    assert records is None and "MiB per layer" in why
    assert gdn_deferred.window_of(states) is None


def test_pools_that_are_not_upstreams_layer_views_keep_snapshots():
    records, why = gdn_deferred.records_for_layer(torch.zeros(5, HV, V, K), torch.zeros(3, T, HV, V, K), T, H,
                                                  torch.float32)
    assert records is None and "contiguous [layers, slots" in why


def test_bad_mode_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(gdn_deferred.ENV, "lazy")
    with pytest.raises(ValueError, match=f"^{gdn_deferred.ENV}='lazy'"):
        gdn_deferred.commit_mode()


def test_draft_count_is_fixed_per_pool():
    c = _pools(torch.Generator().manual_seed(4))
    gdn_deferred.records_for_layer(c.temporal[0], c.intermediate_ssm[0], T, H, torch.float32)
    with pytest.raises(ValueError, match="draft count is fixed"):
        gdn_deferred.records_for_layer(c.temporal[1], c.intermediate_ssm[1], T - 1, H, torch.float32)


def test_auto_is_deferred_on_cpu_and_snapshots_on_a_gpu(monkeypatch):
    monkeypatch.delenv(gdn_deferred.ENV, raising=False)
    assert gdn_deferred.commit_mode(torch.device("cpu")) == "deferred"
    assert gdn_deferred.commit_mode(torch.device("cuda", 0)) == "snapshots"
    monkeypatch.setenv(gdn_deferred.ENV, "deferred")
    assert gdn_deferred.commit_mode(torch.device("cuda", 0)) == "deferred"


def test_pool_that_is_itself_a_view_is_committed_by_replay():
    """Upstream's ``temporal`` may be a view of a larger allocation (its layer views' root is then that
    allocation): the verify registers under the root and the commit must find it from ``temporal``, else
    upstream's scatter would copy snapshots that were never written."""
    gen = torch.Generator().manual_seed(5)
    slots, rows = torch.tensor([2, 6], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    inputs = _inputs(gen, 2)
    deferred = _pools(gen)
    snap = _clone(deferred)
    deferred.temporal = deferred.temporal.view(L, SLOTS, HV, V, K)  # a view: its root is the allocation
    assert deferred.temporal._base is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gdn_deferred.ENV, "snapshots")
        _verify_all_layers(snap, slots, rows, inputs, False)
    _verify_all_layers(deferred, slots, rows, inputs, False)
    assert gdn_deferred.window_of(deferred.temporal) is not None
    last = torch.tensor([3, 2])
    scatter_states_after_verify_torch(snap, slots, last, None, None, rows)
    gdn_deferred.scatter_after_verify(_never_called, deferred, slots, last, None, None, rows)
    torch.testing.assert_close(deferred.temporal, snap.temporal, rtol=1e-6, atol=1e-6)
