"""Reject prompts the scheduler cannot run before they reach it.

Upstream SGLang 0.5.23 checks the prompt *length* against the context in
``TokenizerManager._validate_one_request`` but lets two inputs through that
kill the scheduler process (and with it the server):

* an empty prompt (``input_ids: []``, or ``text: ""`` with a tokenizer that adds
  no BOS): ``LogitsProcessor`` indexes the last row of an empty batch;
* a token id outside ``[0, vocab_size)``: the embedding lookup goes out of
  range (``IndexError`` on CPU, a device-side assert on GPU);
* ``top_logprobs_num`` larger than the vocabulary: ``torch.topk`` raises
  "selected index k out of range" in the sampler (found by issue 11's tests);
* ``token_ids_logprob`` ids outside the vocabulary (the same gather, out of range).

It also rejects an empty stop string (``stop: ""`` or ``[""]``): upstream
accepts it and it matches at once, so the request stops after one token with
empty text — never what the caller meant.

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
    _check_logprob_and_stop_args(obj, self.model_config.vocab_size)
    return None


def _check_logprob_and_stop_args(obj, vocab_size: int) -> None:
    if getattr(obj, "return_logprob", False):
        k = getattr(obj, "top_logprobs_num", None)
        if isinstance(k, int) and k > vocab_size:
            raise ValueError(f"top_logprobs_num must be at most the vocabulary size {vocab_size}, got {k}.")
        ids = getattr(obj, "token_ids_logprob", None) or []
        flat = [t for t in ids if isinstance(t, int)] + [t for row in ids if isinstance(row, list) for t in row]
        bad = [t for t in flat if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token_ids_logprob contains token id {bad[0]} outside the vocabulary [0, {vocab_size}).")
    sp = getattr(obj, "sampling_params", None)
    stop = sp.get("stop") if isinstance(sp, dict) else None
    if stop == "" or (isinstance(stop, list) and any(s == "" for s in stop)):
        raise ValueError("stop strings must be non-empty (an empty stop string matches at once).")


def install() -> None:
    HookRegistry.register(TARGET, check_input_ids_in_vocab, HookType.BEFORE)
