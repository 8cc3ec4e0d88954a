"""The tiny Kimi K3 checkpoint shared by the server tests (built once per session)."""

from __future__ import annotations

import os
import tempfile

from sglang_hybrid.tools.make_tiny_model import build

_CACHE_DIR = os.environ.get("SGLANG_HYBRID_TEST_MODEL_DIR") or os.path.join(
    tempfile.gettempdir(), "sglang-hybrid-test-models"
)


def tiny_kimi_k3(seed: int = 0) -> str:
    """Path of a tiny Kimi K3 checkpoint (built on first use; same seed -> same files)."""
    out = os.path.join(_CACHE_DIR, f"kimi-k3-tiny-seed{seed}")
    if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
        build("kimi-k3", out, seed=seed)
    return out


def tiny_qwen38(seed: int = 0) -> str:
    """Path of a tiny Qwen3.8-Flash-Next checkpoint (built on first use; same seed -> same files)."""
    out = os.path.join(_CACHE_DIR, f"qwen3.8-flash-next-tiny-seed{seed}")
    if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
        build("qwen3.8-flash-next", out, seed=seed)
    return out


def tiny_kimi_k3_padded(vocab_size: int = 32000, seed: int = 0) -> str:
    """Path of a tiny Kimi K3 checkpoint whose vocabulary is padded to ``vocab_size`` (embedding
    and LM-head rows; the 965-token tokenizer unchanged), for upstream kits that send token ids
    up to 31,999 (built on first use; same arguments -> same files)."""
    out = os.path.join(_CACHE_DIR, f"kimi-k3-tiny-vocab{vocab_size}-seed{seed}")
    if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
        build("kimi-k3", out, seed=seed, vocab_size=vocab_size)
    return out
