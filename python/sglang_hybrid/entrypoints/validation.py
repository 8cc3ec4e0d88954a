"""Reject prompts the scheduler cannot run before they reach it.

Upstream SGLang 0.5.23 checks the prompt *length* against the context in
``TokenizerManager._validate_one_request`` but lets two inputs through that
kill the scheduler process (and with it the server):

* an empty prompt (``input_ids: []``, or ``text: ""`` with a tokenizer that adds
  no BOS): ``LogitsProcessor`` indexes the last row of an empty batch;
* a token id outside ``[0, vocab_size)``: the embedding lookup goes out of
  range (``IndexError`` on CPU, a device-side assert on GPU).

This BEFORE hook raises ``ValueError`` there; upstream answers it with HTTP 400
and the server keeps serving.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def check_input_ids_in_vocab(self, obj, input_ids, *args, **kwargs):
    """BEFORE hook: ``ValueError`` for an empty prompt or an id outside the vocabulary."""
    if input_ids is not None and len(input_ids) == 0 and getattr(obj, "input_embeds", None) is None:
        raise ValueError("the prompt is empty: it must contain at least one token.")
    if input_ids:
        vocab_size = self.model_config.vocab_size
        lo, hi = min(input_ids), max(input_ids)
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"input_ids contains token id {bad} outside the vocabulary [0, {vocab_size}).")
    return None


def install() -> None:
    HookRegistry.register(TARGET, check_input_ids_in_vocab, HookType.BEFORE)
