"""What the GPU suite serves and sends, shared by ``make_fixtures.py`` (CPU) and the tests (CUDA).

The CPU reference models (``sglang_hybrid.models``) serve every prompt below with the radix
cache off; their greedy tokens are the fixtures (``fixtures/<model>.json``) the GPU servers,
running upstream's model classes with our kernels, must reproduce. ``taps`` fixtures hold the
reference's per-layer inputs / outputs of :data:`TAP_PROMPT` in FP32
(``sglang_hybrid.tools.layer_taps``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Dict, List, Optional

import requests
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
NEW_TOKENS = 8


def ids(seed: int, n: int, lo: int = 10, hi: int = 900) -> List[int]:
    rng = random.Random(seed)
    return [rng.randrange(lo, hi) for _ in range(n)]


# name -> prompt; the order is the fixture's sending order (cache off, one request at a time)
PROMPTS: Dict[str, List[int]] = {
    "tap": ids(7, 48),
    "short": ids(1, 12),
    "medium": ids(2, 150),
    "long": ids(3, 700),
    "base": ids(4, 300),
}
PROMPTS["base+40"] = PROMPTS["base"] + ids(5, 40)
PROMPTS["sentinel"] = ids(6, 330)
FLOODS = [ids(40 + i, 300) for i in range(6)]  # evict the sentinel to the host tier (not in the fixtures)
TAP_PROMPT = "tap"
BATCH = ("short", "medium", "long")


def sharpened(base: str, embed_name: str, seed: int = 0) -> str:
    """``base`` made decisive (built once beside it), so that greedy tokens are a sound oracle
    across precisions and kernels:

    * ``lm_head[perm[v]] = embed[v]``: the next token leans on the current one (wider margins);
    * every ``e_score_correction_bias`` (the biased top-k router's choice-only bias) set to
      ``1.01 * expert index``: a spacing above the sigmoid scores' range, so the chosen experts
      (and groups) no longer depend on the token; the routing weights still do.

    On the plain random tiny checkpoints the CPU reference's own BF16 and FP32 runs part on the
    first token of some prompts: a BF16 rounding moves one token's score past another expert's
    and the MoE output jumps (layer taps: layer 1's MoE output 80 % off while its input agrees to
    2 %), so no GPU run could match them token for token. The per-layer taps
    (``tools/layer_taps.py``) keep the comparison sensitive to every layer."""
    import torch

    import tiny_model

    def edit(w):
        tiny_model.permute_embedding_into_lm_head(w, embed_name, seed)
        for name, t in w.items():
            if name.endswith("e_score_correction_bias"):
                w[name] = 1.01 * torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape)

    return tiny_model.derived_checkpoint(base, base.rstrip(os.sep) + "-sharp", edit)


def model_paths() -> Dict[str, str]:
    """Fixture name -> checkpoint directory (built on first use by ``test/srt/server/tiny_model.py``)."""
    import tiny_model

    return {
        "kimi-k3-tiny": sharpened(tiny_model.tiny_kimi_k3(), "model.embed_tokens.weight"),
        "kimi-k3-shaped": sharpened(tiny_model.tiny_kimi_k3_shaped(), "model.embed_tokens.weight"),
        # the MTP-agreeing checkpoint (lm_head already a permuted embedding): plain and MTP serving
        "qwen38-tiny": tiny_model.tiny_qwen38_agreeing_mtp(),
    }


def checkpoint_digest(model_dir: str) -> str:
    """sha256 of the checkpoint's safetensors files and config.json (fixtures hold it: a GPU run
    against a checkpoint built differently fails with that message, not with wrong tokens)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors") or name == "config.json":
            with open(os.path.join(model_dir, name), "rb") as f:
                h.update(name.encode())
                h.update(f.read())
    return h.hexdigest()


def tensor_digest(model_dir: str) -> str:
    """sha256 of the checkpoint's tensor values (name, dtype, shape, bytes), independent of how the
    safetensors files were written: tells a different file encoding from different weights."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            tensors = load_file(os.path.join(model_dir, name))
            for key in sorted(tensors):
                t = tensors[key].contiguous()
                h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.view(-1).view(torch_uint8()).numpy().tobytes())
    return h.hexdigest()


def torch_uint8():
    import torch

    return torch.uint8


# every request asks for the chosen token's log-prob and the top two per position
LOGPROBS = {"return_logprob": True, "top_logprobs_num": 2}
# The comparison rule's defaults (see compare_continuations; serving_checks.TOLERANCES per dtype)
NEAR_TIE_NATS = 1.0
LOGPROB_TOL_NATS = 0.6


def continuation(result: dict) -> dict:
    """``{"ids": [...], "lp": [...], "top2": [[(lp, id), (lp, id)], ...]}`` of one /generate result
    that was asked for :data:`LOGPROBS`."""
    meta = result["meta_info"]
    return {
        "ids": list(result["output_ids"]),
        "lp": [float(x[0]) for x in meta["output_token_logprobs"]],
        "top2": [[(float(a[0]), int(a[1])) for a in row[:2]] for row in meta["output_top_logprobs"]],
    }


@dataclass
class Verdict:
    ok: bool
    equal: int  # leading tokens equal
    total: int
    why: str

    def describe(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'}: {self.equal}/{self.total} tokens equal; {self.why}"


def compare_continuations(got: dict, want: dict, near_tie: float = NEAR_TIE_NATS,
                          lp_tol: float = LOGPROB_TOL_NATS) -> Verdict:
    """Greedy continuation ``got`` against ``want`` (each from :func:`continuation`).

    Equal tokens must carry log-probs within ``lp_tol`` nats. The first different token is
    accepted only at a near-tie of ``want``: ``got``'s token is ``want``'s runner-up there and the
    two lay within ``near_tie`` nats; both runs then continue from different prefixes and the
    rest is not compared. Any other difference fails. (Greedy decoding of a random tiny model
    meets near-ties often: the CPU reference's own BF16 and FP32 runs part at them.)
    """
    n = len(want["ids"])
    for j, (a, b) in enumerate(zip(got["ids"], want["ids"])):
        if a == b:
            d = abs(got["lp"][j] - want["lp"][j])
            if not d <= lp_tol:
                return Verdict(False, j, n, f"token {j} ({a}): log-prob {got['lp'][j]:.4f} vs {want['lp'][j]:.4f}")
            continue
        (lp1, id1), (lp2, id2) = want["top2"][j]
        gap = lp1 - lp2
        if a == id2 and gap <= near_tie:
            return Verdict(True, j, n, f"parted at token {j} on a near-tie ({id1} vs {id2}, {gap:.4f} nats)")
        return Verdict(False, j, n, f"token {j}: {a} vs {b} (want's top two {id1}:{lp1:.4f}, {id2}:{lp2:.4f})")
    if len(got["ids"]) != n:
        return Verdict(False, min(len(got["ids"]), n), n, f"{len(got['ids'])} tokens vs {n}")
    return Verdict(True, n, n, "identical")


def load_fixture(name: str) -> dict:
    with open(os.path.join(FIXTURES, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def generate(url: str, prompts, n: int = NEW_TOKENS, timeout: float = 600, **extra) -> list:
    """POST /generate, greedy, ``ignore_eos``; one prompt -> ``[result]``, several -> results in order."""
    payload = {"input_ids": prompts, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
               **extra}
    r = requests.post(url + "/generate", json=payload, timeout=timeout)
    r.raise_for_status()
    j = r.json()
    return j if isinstance(j, list) else [j]


def plugin_state(url: str) -> dict:
    """``internal_states[0]["sglang_hybrid"]`` of ``/get_server_info`` (entrypoints/server_info.py)."""
    r = requests.get(url + "/get_server_info", timeout=60)
    r.raise_for_status()
    states = r.json().get("internal_states") or [{}]
    return states[0].get("sglang_hybrid", {})


def calls(state: dict, prefix: str) -> Dict[str, int]:
    """``kernel_calls`` entries whose ``op=impl`` key starts with ``prefix``."""
    return {k: v for k, v in state.get("kernel_calls", {}).items() if k.startswith(prefix)}


