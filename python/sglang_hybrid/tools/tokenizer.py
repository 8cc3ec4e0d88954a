"""Offline byte-level BPE tokenizer for the tiny test models.

Trained with the ``tokenizers`` library on ``corpus/tiny_corpus.txt`` (shipped
in this repository), so building a tiny model needs no download and the same
inputs always give the same ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Dict, List

SPECIAL_TOKENS: List[str] = ["<|endoftext|>", "<|bos|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN, BOS_TOKEN = "<|endoftext|>", "<|bos|>"

# ChatML-style template (the text is ours); the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus_text() -> str:
    return resources.files("sglang_hybrid.tools").joinpath("corpus/tiny_corpus.txt").read_text(encoding="utf-8")


def train_tokenizer(vocab_size: int = 1024):
    """Train the byte-level BPE; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # One "document" per line keeps the training input independent of chunking.
    tok.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    return tok


def write_tokenizer(out_dir: str, vocab_size: int = 1024) -> Dict[str, int]:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``.

    Returns:
        ``{"vocab_size": n, "<special>": id, ...}`` for the model config.
    """
    tok = train_tokenizer(vocab_size)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
            for t in SPECIAL_TOKENS
        },
    }
    _dump(os.path.join(out_dir, "tokenizer_config.json"), config)
    _dump(
        os.path.join(out_dir, "special_tokens_map.json"),
        {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN},
    )
    return {"vocab_size": tok.get_vocab_size(), **ids}


def _dump(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
