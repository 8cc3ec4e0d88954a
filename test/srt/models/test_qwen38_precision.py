"""Precision paths of the Qwen3.8 reference model (issue 6): flags, FP8 gated-stream projections,
vocab screening through upstream's LM-head call. The served end-to-end check (flags on the command
line, greedy tokens against the FP64 oracle) is ``test_qwen38_precision_server.py``."""

from __future__ import annotations

import argparse
import logging
import types

import pytest
import torch
from torch import nn

from sgl_hybrid_kernel.dispatch import chosen_paths
from sgl_hybrid_kernel.fp8_linear import quantize_fp8_per_channel
from sgl_hybrid_kernel.vocab_screen import quantize_rows, screen_logits
from sglang_hybrid.models.qwen38 import precision
from sglang_hybrid.models.qwen38.hyper import GatedStreams, grouped_rms_norm
from sglang_hybrid.models.qwen38.precision import (
    Fp8LowRankProjections,
    PrecisionPaths,
    VocabScreeningMethod,
    apply_precision_paths,
)

HC, D, R = 4, 64, 16


def _site(seed: int) -> GatedStreams:
    g = torch.Generator().manual_seed(seed)
    site = GatedStreams(HC, D, R, 1e-6)
    with torch.no_grad():
        for p in site.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.3).bfloat16().float())  # BF16-exact, as the checkpoint
    return site


def _mix64(site: GatedStreams, streams: torch.Tensor, fp8: bool) -> torch.Tensor:
    """FP64 read of a gated-stream site; with ``fp8`` the projections use the dequantised FP8 weights."""

    def w(p):
        if not fp8:
            return p.double()
        codes, scale = quantize_fp8_per_channel(p)
        return codes.double() * scale.double()[:, None]

    xn = grouped_rms_norm(streams.double(), site.hc_norm.double(), D, site.eps)
    gates = torch.sigmoid(torch.nn.functional.silu(xn @ w(site.input_mix_weight_down).t() / HC) @ w(site.input_mix_weight_up).t())
    return (gates * xn).unflatten(-1, (HC, D)).mean(-2)


def test_paths_from_environment():
    assert PrecisionPaths.from_env({}) == PrecisionPaths(False, 0, "fp8")
    env = {precision.FP8_ENV: "1", precision.TOPK_ENV: "64", precision.FORMAT_ENV: "mxfp4"}
    assert PrecisionPaths.from_env(env) == PrecisionPaths(True, 64, "mxfp4")
    for bad, name in (({precision.FP8_ENV: "yes"}, precision.FP8_ENV), ({precision.TOPK_ENV: "-1"}, precision.TOPK_ENV),
                      ({precision.TOPK_ENV: "x"}, precision.TOPK_ENV), ({precision.FORMAT_ENV: "fp4"}, precision.FORMAT_ENV)):
        with pytest.raises(ValueError, match=name):
            PrecisionPaths.from_env(bad)


def test_cli_flags_export_environment(monkeypatch):
    for name in (precision.FP8_ENV, precision.TOPK_ENV, precision.FORMAT_ENV):
        monkeypatch.delenv(name, raising=False)
    parser = argparse.ArgumentParser()
    precision.add_precision_flags(None, parser)
    precision.add_precision_flags(None, parser)  # idempotent (upstream may build the parser twice)
    args = parser.parse_args(["--qwen38-fp8-residual-proj", "--vocab-screening-topk", "64", "--vocab-screening-format", "int8"])
    assert precision.export_precision_flags(object, args) is None  # a BEFORE hook: upstream's call goes on unchanged
    assert PrecisionPaths.from_env() == PrecisionPaths(True, 64, "int8")
    with pytest.raises(SystemExit):
        parser.parse_args(["--vocab-screening-format", "fp4"])
    with pytest.raises(ValueError, match="vocab-screening-topk"):
        precision.export_precision_flags(object, parser.parse_args(["--vocab-screening-topk", "-2"]))


def test_fp8_projection_path_matches_its_fp64_oracle_and_moves_off_full_precision():
    site = _site(0)
    streams = torch.randn(7, HC * D, generator=torch.Generator().manual_seed(1))
    full, _ = site.mix(streams)
    site.fp8_lowrank = Fp8LowRankProjections()
    got, normed = site.mix(streams)
    torch.testing.assert_close(got.double(), _mix64(site, streams, fp8=True), rtol=0, atol=2e-6)
    torch.testing.assert_close(full.double(), _mix64(site, streams, fp8=False), rtol=0, atol=2e-6)
    moved = float((got - full).abs().max())
    # The path switched (FP8 rounding shows), and stays small: the gates move by a few 1e-3.
    assert 1e-5 < moved < 2e-2, moved
    assert torch.equal(normed, grouped_rms_norm(streams, site.hc_norm, D, site.eps))
    # A weight update re-quantises (the cache follows the tensor's version counter).
    with torch.no_grad():
        site.input_mix_weight_up.mul_(-1.0)
    torch.testing.assert_close(site.mix(streams)[0].double(), _mix64(site, streams, fp8=True), rtol=0, atol=2e-6)


class _FakeModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.ModuleList([_site(2), _site(3)])
        self.lm_head = nn.Module()
        self.lm_head.weight = nn.Parameter(torch.randn(96, D, generator=torch.Generator().manual_seed(5)), requires_grad=False)
        self.lm_head.quant_method = None


def test_apply_attaches_paths_and_logs_each_choice_once(caplog):
    model = _FakeModel()
    apply_precision_paths(model, paths=PrecisionPaths())
    assert getattr(model.model[0], "fp8_lowrank", None) is None and model.lm_head.quant_method is None
    caplog.set_level(logging.INFO)
    caplog.clear()
    on = PrecisionPaths(True, 8, "int8")
    for _ in range(2):
        model = _FakeModel()
        assert apply_precision_paths(model, paths=on) == on
    assert isinstance(model.model[1].fp8_lowrank, Fp8LowRankProjections)
    assert model.model[0].fp8_lowrank is model.model[1].fp8_lowrank
    assert isinstance(model.lm_head.quant_method, VocabScreeningMethod) and model.lm_head.quant_method.topk == 8
    lines = [r.getMessage() for r in caplog.records if "kernel path:" in r.getMessage()]
    assert len([l for l in lines if "residual_proj" in l]) == 1 and len([l for l in lines if "lm_head" in l]) == 1, lines
    table = {c.op: c.impl for c in chosen_paths()}
    assert table["residual_proj"] == "fp8-w8a16" and table["lm_head"] == "screen-int8-top8"


def test_vocab_screening_through_upstream_lm_head_call():
    """Upstream's ``LogitsProcessor._compute_lm_head`` takes our ``quant_method`` and returns screened logits."""
    from sglang.srt.layers.logits_processor import LogitsProcessor, should_apply_lm_head_quant_method

    model = _FakeModel()
    apply_precision_paths(model, paths=PrecisionPaths(False, 8, "mxfp4"))
    head = model.lm_head
    assert should_apply_lm_head_quant_method(head, head.quant_method)
    hidden = torch.randn(300, D, generator=torch.Generator().manual_seed(4))
    logits = LogitsProcessor._compute_lm_head(types.SimpleNamespace(), hidden, head)
    want = screen_logits(hidden, head.weight, quantize_rows(head.weight, "mxfp4"), 8)
    torch.testing.assert_close(logits, want.logits, rtol=0, atol=0)
    full = hidden.double() @ head.weight.double().t()
    best = full.argmax(-1)
    assert (want.candidates == best[:, None]).any(-1).all()  # 300 states, 96 rows: no miss with 8 candidates
    # The pick is the FP64 best up to FP32 rounding of near-ties (CPUs' FP32 GEMMs may round differently).
    chosen = logits.argmax(-1)
    gap = full.max(-1).values - full.gather(-1, chosen[:, None]).squeeze(-1)
    assert gap.max().item() <= 1e-4 and (chosen == best).float().mean().item() >= 0.98
    with pytest.raises(NotImplementedError, match="bias"):
        head.quant_method.apply(head, hidden, torch.zeros(96))
