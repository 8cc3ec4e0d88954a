"""Benchmark-only controlled acceptance in the server's verify step (issue 7, "Controlled acceptance").

Outside oracle: upstream's own greedy chain verify (``verify_tree_greedy_func``, its CPU
path) run on the rewritten target predictions must accept exactly the forced lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_hybrid.speculative import controlled_acceptance as ca
from sglang_hybrid.speculative.acceptance import BENCHMARK_MODE_ENV


def _chain(B, k):
    idx = torch.arange(B * (k + 1)).reshape(B, k + 1)
    nxt = torch.tensor([list(range(1, k + 1)) + [-1]] * B)
    return idx, nxt, torch.full((B, k + 1), -1)


def _upstream_verify(candidates, target_predict):
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func

    B, width = candidates.shape
    predict = torch.zeros(B * width, dtype=torch.int32)
    accept_index = torch.full((B, width), -1, dtype=torch.int32)
    accepted = torch.empty(B, dtype=torch.int32)
    idx, nxt, sib = _chain(B, width - 1)
    return verify_tree_greedy_func(predicts=predict, accept_index=accept_index, accept_token_num=accepted,
                                   candidates=candidates, retrieve_index=idx, retrieve_next_token=nxt,
                                   retrieve_next_sibling=sib, target_predict=target_predict, topk=1)


def test_forced_lengths_are_what_upstream_verify_accepts():
    rng = torch.Generator().manual_seed(0)
    B, k = 64, 4
    candidates = torch.randint(1, 50, (B, k + 1), generator=rng)
    # the target agrees with the drafts now and then, including where the forced chain must stop
    target = torch.where(torch.rand(B, k + 1, generator=rng) < 0.5,
                         torch.cat([candidates[:, 1:], candidates[:, :1]], dim=1),
                         torch.randint(1, 50, (B, k + 1), generator=rng))
    lengths = torch.randint(0, k + 1, (B,), generator=rng)
    forced = ca.force_accept_lengths(target, candidates, lengths)
    predict, _, accepted = _upstream_verify(candidates, forced)
    assert accepted.tolist() == lengths.tolist()
    bonus = predict.reshape(B, k + 1)[torch.arange(B), lengths]
    assert torch.equal(bonus.long(), forced[torch.arange(B), lengths])  # the bonus is the (moved) target token
    untouched = lengths == k  # all drafts accepted: the bonus is the target's own last prediction
    assert torch.equal(forced[untouched, k], target[untouched, k])
    with pytest.raises(ValueError, match="lengths"):
        ca.force_accept_lengths(target, candidates, torch.full((B,), k + 1))


def test_hook_draws_lengths_with_the_given_rates(monkeypatch):
    monkeypatch.setenv(BENCHMARK_MODE_ENV, "1")
    monkeypatch.setenv(ca.ENV, "0.8,0.66,0.54,0.36")
    monkeypatch.setattr(ca._State, "rng", np.random.default_rng(1))
    B, k, n = 400, 4, 10
    counts = np.zeros(k + 1)
    for _ in range(n):
        candidates = torch.randint(1, 50, (B, k + 1))
        target = torch.randint(50, 99, (B, k + 1))  # the target never agrees
        _, _, accepted = ca.around_verify_tree_greedy(
            lambda **kw: _upstream_verify(kw["candidates"], kw["target_predict"]),
            candidates=candidates, target_predict=target, topk=1)
        counts += np.bincount(accepted.numpy(), minlength=k + 1)
    survival = counts[::-1].cumsum()[::-1][1:] / (B * n)  # P(L >= i), i = 1..k
    assert survival == pytest.approx([0.8, 0.66, 0.54, 0.36], abs=0.02)
    with pytest.raises(ValueError, match="topk"):
        ca.around_verify_tree_greedy(lambda **kw: None, candidates=candidates, target_predict=target, topk=4)
    monkeypatch.delenv(ca.ENV)
    seen = []
    ca.around_verify_tree_greedy(lambda **kw: seen.append(kw["target_predict"]), candidates=candidates,
                                 target_predict=target, topk=1)
    assert seen[0] is target  # off: upstream's call untouched


def test_refused_outside_benchmark_mode(monkeypatch):
    monkeypatch.delenv(BENCHMARK_MODE_ENV, raising=False)
    with pytest.raises(ValueError, match="benchmark-only"):
        ca.parse_rates("0.8,0.5")
    monkeypatch.setenv(BENCHMARK_MODE_ENV, "1")
    assert ca.parse_rates("0.8,0.5").expected_committed(2) == pytest.approx(2.3)
    with pytest.raises(ValueError, match="comma-separated"):
        ca.parse_rates("0.8;0.5")
    with pytest.raises(ValueError, match="non-increasing"):
        ca.parse_rates("0.5,0.8")
