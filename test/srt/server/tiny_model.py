"""The tiny checkpoints shared by the server and model tests (built once per session)."""

from __future__ import annotations

import os
import tempfile

from filelock import FileLock

from sglang_hybrid.tools.make_tiny_model import build

_CACHE_DIR = os.environ.get("SGLANG_HYBRID_TEST_MODEL_DIR") or os.path.join(
    tempfile.gettempdir(), "sglang-hybrid-test-models"
)


def build_lock(out: str) -> FileLock:
    """An inter-process lock for building checkpoint ``out`` in the shared cache directory: ``make
    test`` runs test files in two pytest-xdist workers, which may ask for the same model at once.
    Take it around the "built yet?" check and the build."""
    os.makedirs(_CACHE_DIR, exist_ok=True)
    return FileLock(out.rstrip(os.sep) + ".lock")


def tiny_kimi_k3(seed: int = 0) -> str:
    """Path of a tiny Kimi K3 checkpoint (built on first use; same seed -> same files)."""
    out = os.path.join(_CACHE_DIR, f"kimi-k3-tiny-seed{seed}")
    with build_lock(out):
        if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
            build("kimi-k3", out, seed=seed)
    return out


def tiny_qwen38(seed: int = 0) -> str:
    """Path of a tiny Qwen3.8-Flash-Next checkpoint (built on first use; same seed -> same files)."""
    out = os.path.join(_CACHE_DIR, f"qwen3.8-flash-next-tiny-seed{seed}")
    with build_lock(out):
        if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
            build("qwen3.8-flash-next", out, seed=seed)
    return out


def tiny_kimi_k3_padded(vocab_size: int = 32000, seed: int = 0) -> str:
    """Path of a tiny Kimi K3 checkpoint whose vocabulary is padded to ``vocab_size`` (embedding
    and LM-head rows; the 965-token tokenizer unchanged), for upstream kits that send token ids
    up to 31,999 (built on first use; same arguments -> same files)."""
    out = os.path.join(_CACHE_DIR, f"kimi-k3-tiny-vocab{vocab_size}-seed{seed}")
    with build_lock(out):
        if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
            build("kimi-k3", out, seed=seed, vocab_size=vocab_size)
    return out


def tiny_kimi_k3_with_words(words, vocab_size: int = 32000, seed: int = 0) -> str:
    """The padded tiny Kimi K3 (:func:`tiny_kimi_k3_padded`) whose tokenizer also has ``words`` as
    added tokens (ids 965, 966, ... in order, inside the padded vocabulary; weights shared by a
    hard link), so that e.g. ``"hi" * 257`` is 257 tokens, as upstream's
    ``prefix_cache_branching_kit`` assumes of a real tokenizer (our byte-level BPE splits "hi" in two).
    """
    base = tiny_kimi_k3_padded(vocab_size, seed)
    out = os.path.join(_CACHE_DIR, f"kimi-k3-tiny-vocab{vocab_size}-seed{seed}-words-{'-'.join(words)}")
    with build_lock(out):
        if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
            _add_words(base, out, words, vocab_size)
    return out


def _add_words(base: str, out: str, words, vocab_size: int) -> None:
    import shutil

    from tokenizers import AddedToken, Tokenizer

    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(base)):
        if name == "config.json":
            continue
        src, dst = os.path.join(base, name), os.path.join(out, name)
        if os.path.exists(dst):
            os.remove(dst)
        if name.endswith(".safetensors"):
            try:
                os.link(src, dst)
                continue
            except OSError:  # another file system
                pass
        shutil.copy(src, dst)
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    first = tok.get_vocab_size()
    tok.add_tokens([AddedToken(w, normalized=False) for w in words])
    if tok.get_vocab_size() != first + len(words) or first + len(words) > vocab_size:
        raise ValueError(f"words {words!r} must be new to the tokenizer and fit the vocabulary of {vocab_size}")
    tok.save(os.path.join(out, "tokenizer.json"))
    shutil.copy(os.path.join(base, "config.json"), os.path.join(out, "config.json"))


def tiny_kimi_k3_shaped(seed: int = 0) -> str:
    """Path of the tiny Kimi K3 with K3's attention geometry (``make_tiny_model --arch kimi-k3-shaped``:
    MLA ``kv_lora_rank`` 512 + rope 64, nope / value 128, 12 heads; KDA 12 heads of 128; 4 layers,
    hidden 128, 8 experts), for upstream's GPU kernels (built on first use; same seed -> same files).
    Stored in BF16 (FP32 for the parameters upstream keeps in FP32): the GPU suite carries the checkpoint
    to the device machine beside the offline bundle, and the FP32 file (32 MB) did not fit."""
    out = os.path.join(_CACHE_DIR, f"kimi-k3-shaped-tiny-bf16-seed{seed}")
    with build_lock(out):
        if not os.path.exists(os.path.join(out, "config.json")):  # config.json is written last
            build("kimi-k3-shaped", out, seed=seed, dtype="bfloat16")
    return out


def derived_checkpoint(base: str, out: str, edit) -> str:
    """``out``: a copy of checkpoint ``base`` whose ``model.safetensors`` tensors ``edit(weights)`` changed
    in place (built once under an inter-process lock; a ``done`` file marks it complete)."""
    import shutil

    from safetensors.torch import load_file, save_file

    with build_lock(out):
        if not os.path.exists(os.path.join(out, "done")):
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(base, out)
            path = os.path.join(out, "model.safetensors")
            weights = load_file(path)
            edit(weights)
            save_file(weights, path, metadata={"format": "pt"})
            open(os.path.join(out, "done"), "w").close()
    return out


def permute_embedding_into_lm_head(weights, embed_name: str, seed: int = 0) -> None:
    """``lm_head[perm[v]] = embed[v]`` (``perm`` seeded): the next token leans on the current token's embedding."""
    import torch

    emb = weights[embed_name]
    perm = torch.randperm(emb.shape[0], generator=torch.Generator().manual_seed(seed))
    weights["lm_head.weight"] = torch.empty_like(emb)
    weights["lm_head.weight"][perm] = emb


def tiny_qwen38_agreeing_mtp(seed: int = 0) -> str:
    """The tiny Qwen3.8 with ``lm_head[perm[v]] = embed[v]`` and ``mtp.fc_embedding = I``: the target's
    next token and the MTP draft both lean on the current token's embedding, so drafts are often (not
    always) right. Built once per cache dir."""
    import torch

    def edit(w):
        permute_embedding_into_lm_head(w, "model.language_model.embed_tokens.weight", seed)
        w["mtp.fc_embedding.weight"] = torch.eye(w["lm_head.weight"].shape[1], dtype=w["lm_head.weight"].dtype)

    out = os.path.join(_CACHE_DIR, f"qwen3.8-flash-next-tiny-agreeing-mtp-seed{seed}")
    return derived_checkpoint(tiny_qwen38(seed), out, edit)
