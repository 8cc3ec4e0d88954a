"""Synthetic request traces in the Mooncake FAST'25 JSONL format, by workload shape.

Each line is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}`` with one id per 512-token block of the input; equal ids mean
identical block content *and* identical prefix before it (ids are chained, as in the
Mooncake release), and a partial last block gets its own id.

A workload is a set of **sessions** (conversations or agent runs). A session's prompt
is: one of ``system_prompts`` shared system prompts, then its turns. Turn 1 adds a
first user message; each later turn adds the previous answer plus a new message
(``growth``, e.g. a tool result), so prompts grow turn by turn. With probability
``branch_prob`` a turn instead forks from an earlier turn of the same session and
sends ``branch_factor`` sibling requests from there (retries, tree search, parallel
tool calls), which share the prefix up to the fork. Sessions start by a Poisson
process (``arrival="poisson"``) or in bursts (``"burst"``: ``burst_size`` sessions at
once); turns of one session are ``think_ms`` apart (exponential), so sessions
interleave and the reuse distance grows with the number of live sessions.

Lengths are lognormal with the given median and ``sigma`` (``(median, sigma)``
pairs; sigma 0 gives the median exactly); the prompt is capped at ``max_input``.

Used by ``benchmark/cache/replay_cache.py --matrix`` (issue 42: a cache must not be
tuned on one trace) and its test; the committed matrix is ``benchmark/cache/shapes.json``.

    python -m sglang_hybrid.bench.trace_gen --shape benchmark/cache/shapes.json:agentic-long --out t.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, fields
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

BLOCK = 512


@dataclass(frozen=True)
class TraceShape:
    """Parameters of one generated workload (lengths in tokens, times in ms).

    Raises:
        ValueError (from :meth:`validate`): a count < 1, a probability outside [0, 1],
        a non-positive median, a negative sigma or an unknown arrival pattern.
    """

    name: str
    sessions: int = 200
    turns: Tuple[int, int] = (1, 4)  # inclusive range of turns per session, uniform
    system_prompts: int = 1  # distinct shared system prompts (0 = none)
    system_len: Tuple[float, float] = (2000, 0.0)  # median, sigma
    first_len: Tuple[float, float] = (800, 0.8)  # first user message
    growth: Tuple[float, float] = (600, 0.8)  # tokens added per later turn (answer + message)
    output_len: Tuple[float, float] = (300, 0.7)
    branch_prob: float = 0.0
    branch_factor: int = 2
    arrival: str = "poisson"  # "poisson" | "burst"
    session_rate_per_s: float = 2.0  # session starts per second (mean)
    burst_size: int = 20
    think_ms: float = 30_000.0  # mean gap between turns of one session
    max_input: int = 131_072
    seed: int = 0

    def validate(self) -> "TraceShape":
        if self.sessions < 1 or self.branch_factor < 1 or self.burst_size < 1:
            raise ValueError(f"{self.name}: sessions, branch_factor and burst_size must be >= 1")
        if not (1 <= self.turns[0] <= self.turns[1]):
            raise ValueError(f"{self.name}: turns must be 1 <= lo <= hi, got {self.turns}")
        if self.system_prompts < 0:
            raise ValueError(f"{self.name}: system_prompts must be >= 0, got {self.system_prompts}")
        for f in ("system_len", "first_len", "growth", "output_len"):
            med, sig = getattr(self, f)
            if med <= 0 or sig < 0:
                raise ValueError(f"{self.name}: {f} needs median > 0 and sigma >= 0, got {(med, sig)}")
        if not 0.0 <= self.branch_prob <= 1.0:
            raise ValueError(f"{self.name}: branch_prob must be in [0, 1], got {self.branch_prob}")
        if self.arrival not in ("poisson", "burst"):
            raise ValueError(f"{self.name}: arrival must be 'poisson' or 'burst', got {self.arrival!r}")
        if self.session_rate_per_s <= 0 or self.think_ms < 0 or self.max_input < 1:
            raise ValueError(f"{self.name}: session_rate_per_s > 0, think_ms >= 0 and max_input >= 1 required")
        return self

    @classmethod
    def from_dict(cls, d: Dict) -> "TraceShape":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"comment"}
        if unknown:
            raise ValueError(f"unknown trace-shape field(s) {sorted(unknown)} in {d.get('name')!r}")
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
        return cls(**kw).validate()


def load_shapes(path: str) -> List[TraceShape]:
    """The shapes of a matrix file: ``{"shapes": [{...TraceShape fields...}, ...]}``."""
    with open(path) as f:
        data = json.load(f)
    return [TraceShape.from_dict(d) for d in data["shapes"]]


class _BlockIds:
    """Chained block ids: a block's id is fixed by its parent id and its content."""

    def __init__(self):
        self._ids: Dict[tuple, int] = {}

    def ids(self, pieces: List[Tuple[int, int]]) -> List[int]:
        """Block ids of a prompt given as ``(segment_id, length)`` pieces (segments are unique content)."""
        out, parent = [], -1
        block: List[Tuple[int, int, int]] = []  # (segment, start, end) inside the block
        fill = 0
        for seg, length in pieces:
            s = 0
            while s < length:
                take = min(length - s, BLOCK - fill)
                block.append((seg, s, s + take))
                s += take
                fill += take
                if fill == BLOCK:
                    parent = self._id(parent, block)
                    out.append(parent)
                    block, fill = [], 0
        if block:
            out.append(self._id(parent, block))
        return out

    def _id(self, parent: int, block) -> int:
        key = (parent, tuple(block))
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids)
        return got


def _lognormal(rng: np.random.Generator, p: Tuple[float, float]) -> int:
    med, sig = p
    return max(1, int(round(med * float(np.exp(rng.normal(0.0, sig))) if sig > 0 else med)))


def generate(shape: TraceShape) -> List[dict]:
    """The trace of ``shape`` (deterministic in ``shape.seed``), sorted by timestamp."""
    shape.validate()
    rng = np.random.default_rng(shape.seed)
    blocks = _BlockIds()
    next_seg = [0]

    def seg(length: int) -> Tuple[int, int]:
        next_seg[0] += 1
        return (next_seg[0], length)

    systems = [seg(_lognormal(rng, shape.system_len)) for _ in range(shape.system_prompts)]
    # session start times
    starts = []
    t = 0.0
    while len(starts) < shape.sessions:
        t += rng.exponential(1000.0 / shape.session_rate_per_s) * (shape.burst_size if shape.arrival == "burst" else 1)
        n = shape.burst_size if shape.arrival == "burst" else 1
        starts.extend([t] * min(n, shape.sessions - len(starts)))
    events: List[Tuple[float, int, List[Tuple[int, int]], int]] = []
    order = 0
    for s in range(shape.sessions):
        prefix = [systems[int(rng.integers(len(systems)))]] if systems else []
        history = [list(prefix)]  # prompt contents after each turn (index 0 = before turn 1)
        turns = int(rng.integers(shape.turns[0], shape.turns[1] + 1))
        now = starts[s]
        for k in range(turns):
            fork = shape.branch_prob > 0 and k > 0 and rng.random() < shape.branch_prob
            if fork:
                base = history[int(rng.integers(1, len(history)))]
                kids = shape.branch_factor
            else:
                base = history[-1]
                kids = 1
            add = shape.first_len if k == 0 else shape.growth
            for _ in range(kids):
                pieces = base + [seg(_lognormal(rng, add))]
                events.append((now, order, pieces, _lognormal(rng, shape.output_len)))
                order += 1
            history.append(pieces)  # the session goes on from the last sibling
            now += rng.exponential(shape.think_ms) if shape.think_ms > 0 else 0.0
    events.sort(key=lambda e: (e[0], e[1]))
    out = []
    for ts, _, pieces, olen in events:
        n = sum(p[1] for p in pieces)
        if n > shape.max_input:  # keep the tail of the conversation's growth out, not its shared head
            cut, acc = [], 0
            for sid, ln in pieces:
                take = min(ln, shape.max_input - acc)
                if take <= 0:
                    break
                cut.append((sid, take))
                acc += take
            pieces, n = cut, acc
        out.append({"timestamp": int(ts), "input_length": n, "output_length": olen, "hash_ids": blocks.ids(pieces)})
    return out


def write_jsonl(records: List[dict], path: str) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def describe(records: List[dict]) -> Dict[str, float]:
    """Request count, input tokens (M), mean input / output length and perfect-cache reuse %."""
    from sglang_hybrid.mem_cache.trace_replay import perfect_reuse_tokens

    reuse, total = perfect_reuse_tokens(records)
    return {
        "requests": len(records),
        "input_mtokens": round(total / 1e6, 3),
        "mean_input": round(total / max(1, len(records))),
        "mean_output": round(sum(r["output_length"] for r in records) / max(1, len(records))),
        "perfect_reuse_pct": round(100.0 * reuse / max(1, total), 2),
    }


def _select(spec: str) -> List[TraceShape]:
    path, _, name = spec.partition(":")
    shapes = load_shapes(path)
    if name:
        shapes = [s for s in shapes if s.name == name]
        if not shapes:
            raise ValueError(f"--shape: no shape named {name!r} in {path}")
    return shapes


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="MATRIX.json[:NAME]")
    ap.add_argument("--out", help="JSONL to write (one shape only)")
    args = ap.parse_args(argv)
    shapes = _select(args.shape)
    if args.out and len(shapes) != 1:
        raise SystemExit("--out needs exactly one shape (MATRIX.json:NAME)")
    for s in shapes:
        recs = generate(s)
        print(json.dumps({"shape": s.name, **describe(recs)}))
        if args.out:
            write_jsonl(recs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
