"""Layer taps: per-layer inputs and outputs of served forward passes, for layer-by-layer parity.

With ``SGLANG_HYBRID_LAYER_TAPS=DIR`` in a server's environment, every scheduler
process records, for each *extend* (prefill) forward pass of its model, the input
and output of every direct child module of a decoder layer
(``model.layers.<i>.self_attn``, ``.mlp``, ``.linear_attn``, ...) and the logits
upstream's logits processor returns, and writes them to
``DIR/pass-r<tp rank>-<n>.pt`` (a ``dict``: ``input_ids`` int64 ``[N]``,
``taps`` ``{"<module>:in" | "<module>:out" | "logits": float32 tensor}``).
``SGLANG_HYBRID_LAYER_TAPS_MAX`` (default 32) bounds the number of passes kept and
``SGLANG_HYBRID_LAYER_TAPS_MAX_TOKENS`` (default 1024) the tokens of a recorded pass: longer
passes (e.g. the start-up warm-up's long prompt) are not recorded and do not count.

The same switch works for our CPU reference models and for upstream's model
classes on CUDA, whose module trees share these names, so one prompt served by
both gives a per-layer error table (:func:`compare_passes`, or
``python -m sglang_hybrid.tools.layer_taps REF_DIR TEST_DIR``): the first layer
whose output departs from the reference while its input still agrees is where a
fault sits (issue 40). Decode passes and CUDA-graph captures are never recorded;
every tap copies to the host and synchronises the device, so this is a
diagnostic switch, not a serving mode. Module hooks do not run inside a replayed CUDA graph:
upstream's prefill graphs (on by default for Qwen3.8 in 0.5.23) therefore decline the passes the
taps still want to record (at most ``..._MAX`` passes of at most ``..._MAX_TOKENS`` tokens), which
run eagerly; every other pass uses its graph as usual.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

logger = logging.getLogger("sglang_hybrid.layer_taps")

TAPS_ENV = "SGLANG_HYBRID_LAYER_TAPS"
TAPS_MAX_ENV = "SGLANG_HYBRID_LAYER_TAPS_MAX"
TAPS_MAX_TOKENS_ENV = "SGLANG_HYBRID_LAYER_TAPS_MAX_TOKENS"
_LAYER_CHILD = re.compile(r"(^|\.)layers\.(\d+)\.([A-Za-z_]+)$")


def _first_tensor(obj) -> Optional[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (tuple, list)) and obj and isinstance(obj[0], torch.Tensor):
        return obj[0]
    return None


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _forward_batch(args, kwargs):
    fb = kwargs.get("forward_batch")
    if fb is None:
        fb = next((a for a in args if hasattr(a, "forward_mode")), None)
    return fb


class LayerTaps:
    """Forward hooks on ``model`` that write each extend pass to ``out_dir`` (see module docstring)."""

    def __init__(self, model: torch.nn.Module, out_dir: str, rank: int = 0, max_passes: int = 32,
                 max_tokens: int = 1024):
        self.out_dir, self.rank, self.max_passes, self.max_tokens = out_dir, rank, max_passes, max_tokens
        os.makedirs(out_dir, exist_ok=True)
        self.passes = 0
        self._taps: Optional[Dict[str, torch.Tensor]] = None
        self._input_ids: Optional[torch.Tensor] = None
        self.modules = [(n, m) for n, m in model.named_modules() if _LAYER_CHILD.search(n)]
        for name, module in self.modules:
            module.register_forward_pre_hook(self._pre(name), with_kwargs=True)
            module.register_forward_hook(self._post(name))
        # upstream's ModelRunner calls ``model.forward(...)`` directly (module hooks on the root do
        # not run then), so the root's forward is wrapped on the instance instead
        original = model.forward

        def forward(*args, **kwargs):
            self._start(model, args, kwargs)
            out = original(*args, **kwargs)
            self._finish(model, args, out)
            return out

        model.forward = forward
        logger.warning("%s=%s: recording %d layer modules of every extend pass (diagnostics; syncs the device)",
                       TAPS_ENV, out_dir, len(self.modules))

    def _start(self, _module, args, kwargs):
        self._taps = None
        if _capturing():
            return None
        fb = _forward_batch(args, kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not self._wanted(getattr(fb, "forward_mode", None), ids):
            return None
        self._input_ids = ids.detach().to("cpu", torch.int64).clone()
        self._taps = {}
        return None

    def _wanted(self, mode, ids) -> bool:
        return (self.passes < self.max_passes and mode is not None and mode.name in ("EXTEND", "MIXED")
                and isinstance(ids, torch.Tensor) and ids.numel() <= self.max_tokens)

    def wants(self, forward_batch) -> bool:
        """Whether the taps would record this forward pass (an extend pass within the limits)."""
        return self._wanted(getattr(forward_batch, "forward_mode", None), getattr(forward_batch, "input_ids", None))

    def _record(self, key: str, t: Optional[torch.Tensor]) -> None:
        if self._taps is not None and t is not None and t.is_floating_point():
            self._taps[key] = t.detach().float().cpu().clone()

    def _pre(self, name: str):
        def hook(_module, args, kwargs):
            t = _first_tensor(args) if args else None
            if t is None:
                t = kwargs.get("hidden_states", kwargs.get("x"))
            self._record(f"{name}:in", t if isinstance(t, torch.Tensor) else None)
            return None

        return hook

    def _post(self, name: str):
        def hook(_module, _args, output):
            self._record(f"{name}:out", _first_tensor(output))
            return None

        return hook

    def _finish(self, _module, _args, output):
        if self._taps is None:
            return None
        logits = getattr(output, "next_token_logits", None)
        self._record("logits", logits if isinstance(logits, torch.Tensor) else None)
        path = os.path.join(self.out_dir, f"pass-r{self.rank}-{self.passes:03d}.pt")
        torch.save({"input_ids": self._input_ids, "taps": self._taps}, path)
        self.passes += 1
        self._taps = None
        return None


def _attach(_result, runner, *args, **kwargs):
    out_dir = os.environ.get(TAPS_ENV)
    if not out_dir or hasattr(runner, "_sglang_hybrid_layer_taps") or getattr(runner, "is_draft_worker", False):
        return None  # the target model only (a speculative draft model has its own runner)
    model = getattr(runner, "model", None)
    if isinstance(model, torch.nn.Module):
        rank = int(getattr(runner, "tp_rank", 0) or 0)
        runner._sglang_hybrid_layer_taps = LayerTaps(model, out_dir, rank, int(os.environ.get(TAPS_MAX_ENV, "32")),
                                                     int(os.environ.get(TAPS_MAX_TOKENS_ENV, "1024")))
        _ACTIVE.append(runner._sglang_hybrid_layer_taps)
    return None


_ACTIVE: List[LayerTaps] = []  # the taps of this process (read by the prefill-graph hook)


def _prefill_graph_unless_tapped(original, self, forward_batch, *args, **kwargs):
    """AROUND ``PrefillCudaGraphRunner.can_run_graph``: False for a pass the taps want (module docstring)."""
    if any(t.wants(forward_batch) for t in _ACTIVE):
        return False
    return original(self, forward_batch, *args, **kwargs)


def install() -> None:
    """AFTER ``ModelRunner.load_model``: attach the taps when :data:`TAPS_ENV` is set; AROUND the prefill
    CUDA-graph runner's ``can_run_graph`` (both declared and anchored in patches.py)."""
    if not os.environ.get(TAPS_ENV):
        return
    from sglang_hybrid.patches import register_patches

    register_patches(__name__)


# ------------------------------------------------------------------ comparison
def load_passes(directory: str, rank: int = 0) -> List[dict]:
    """The passes recorded in ``directory`` by TP rank ``rank``, in order."""
    return [torch.load(p, weights_only=False) for p in sorted(glob.glob(os.path.join(directory, f"pass-r{rank}-*.pt")))]


def find_pass(passes: Sequence[dict], input_ids: Sequence[int]) -> Optional[dict]:
    """The first pass whose ``input_ids`` equal ``input_ids`` (a one-request prefill), else ``None``."""
    want = torch.as_tensor(list(input_ids), dtype=torch.int64)
    for p in passes:
        if p["input_ids"].numel() == want.numel() and torch.equal(p["input_ids"], want):
            return p
    return None


@dataclass(frozen=True)
class TapError:
    """``max |test - ref|`` of one tap and that error relative to ``max |ref|``; ``token_rel``: the same
    relative error per token (row) of a ``[tokens, ...]`` tap."""

    key: str
    max_abs: float
    ref_max: float
    token_rel: tuple = ()

    def tokens_over(self, tol: float) -> int:
        """Tokens whose relative error is above ``tol`` (NaN counts)."""
        return sum(1 for r in self.token_rel if not r <= tol)

    @property
    def rel(self) -> float:
        return self.max_abs / self.ref_max if self.ref_max > 0 else (0.0 if self.max_abs == 0 else float("inf"))


def _tap_order(key: str):
    m = _LAYER_CHILD.search(key.split(":")[0])
    if m is None:
        return (10**9, key)
    return (int(m.group(2)), {"in": 0, "out": 1}.get(key.split(":")[-1], 2), key)


def compare_passes(ref: dict, test: dict) -> List[TapError]:
    """Per-tap errors of ``test`` against ``ref`` over the taps both hold with equal shapes, in layer order.

    A NaN anywhere in a test tap gives ``max_abs = nan``.
    """
    rows = []
    for key in sorted(set(ref["taps"]) & set(test["taps"]), key=_tap_order):
        a, b = ref["taps"][key].double(), test["taps"][key].double()
        if a.shape != b.shape:
            continue
        d = (b - a).abs()
        ref_max = float(a.abs().max())
        per_token = ()
        if d.dim() >= 2 and ref_max > 0:
            per_token = tuple(float(x) / ref_max for x in d.reshape(d.shape[0], -1).amax(-1))
        rows.append(TapError(key, float("nan") if d.isnan().any() else float(d.max()), ref_max, per_token))
    return rows


def format_table(rows: Sequence[TapError]) -> str:
    lines = [f"{'tap':<48} {'max abs err':>12} {'max |ref|':>12} {'rel':>10}"]
    lines += [f"{r.key:<48} {r.max_abs:>12.4e} {r.ref_max:>12.4e} {r.rel:>10.3e}" for r in rows]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Per-layer errors of TEST taps against REF taps (matching prompts).")
    ap.add_argument("ref")
    ap.add_argument("test")
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args(argv)
    ref, test = load_passes(args.ref, args.rank), load_passes(args.test, args.rank)
    found = 0
    for p in ref:
        q = find_pass(test, p["input_ids"].tolist())
        if q is None:
            continue
        found += 1
        print(f"prompt of {p['input_ids'].numel()} tokens:")
        print(format_table(compare_passes(p, q)))
    if not found:
        print("no prompt of REF was found in TEST")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
