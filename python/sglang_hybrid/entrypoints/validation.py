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
* ``token_ids_logprob`` ids outside the vocabulary (the same gather, out of range);
* ``logprob_start_len`` below -1 with ``return_logprob`` (an ``AssertionError`` in upstream's
  ``logprob_result_processor.py``, issue 42; -1 means "no prompt logprobs", >= 0 a prompt position).

One request is refused because the server would silently answer something else (issue 42):
``n > 1`` with sampling (temperature > 0, ``top_k`` not 1) while the server runs speculative
decoding on CPU. Upstream's EAGLE / MTP verify commits the argmax on CPU
(``speculative/eagle_utils._verify_uses_greedy``: no CPU sampling-verify kernel), so the ``n``
completions would be the same greedy one. (A single sampled request is decoded greedily too;
that is upstream's CPU behaviour and is not refused: with ``n = 1`` the answer is
still one valid completion.)

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
    """BEFORE hook: ``ValueError`` for a request the scheduler cannot run or would silently answer otherwise
    (module docstring)."""
    if input_ids is not None and len(input_ids) == 0 and getattr(obj, "input_embeds", None) is None:
        raise ValueError("the prompt is empty: it must contain at least one token.")
    if input_ids:
        vocab_size = self.model_config.vocab_size
        lo, hi = min(input_ids), max(input_ids)
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"input_ids contains token id {bad} outside the vocabulary [0, {vocab_size}).")
    _check_logprob_and_stop_args(obj, self.model_config.vocab_size)
    _check_parallel_sampling(obj, getattr(self, "server_args", None))
    return None


def _check_logprob_and_stop_args(obj, vocab_size: int) -> None:
    if getattr(obj, "return_logprob", False):
        start = getattr(obj, "logprob_start_len", None)
        if isinstance(start, int) and start < -1:
            raise ValueError(f"logprob_start_len must be -1 (no prompt logprobs) or a prompt position >= 0, got {start}.")
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


SAMPLING_EPS = 1e-6  # upstream's SamplingParams: a temperature below it is greedy


def _check_parallel_sampling(obj, server_args) -> None:
    """``ValueError`` for ``n > 1`` with sampling while the server runs speculative decoding on CPU
    (module docstring). ``server_args``: the tokenizer manager's ``ServerArgs`` (``None``: no check)."""
    if server_args is None or getattr(server_args, "device", None) != "cpu":
        return
    if not getattr(server_args, "speculative_algorithm", None):
        return
    sp = getattr(obj, "sampling_params", None)
    if not isinstance(sp, dict):
        return
    n, temperature, top_k = sp.get("n") or 1, sp.get("temperature"), sp.get("top_k")
    temperature = 1.0 if temperature is None else temperature  # upstream's default
    if not isinstance(n, int) or not isinstance(temperature, (int, float)):
        return  # a malformed value: upstream's SamplingParams check answers it by name
    if n > 1 and temperature >= SAMPLING_EPS and top_k != 1:
        raise ValueError(
            f"n={n} with temperature={temperature}: this server runs speculative decoding "
            f"({server_args.speculative_algorithm}) on CPU, whose verify is greedy, so all {n} completions would be "
            "the same greedy one. Use n=1, temperature=0, or a server without --speculative-algorithm."
        )


def install() -> None:
    HookRegistry.register(TARGET, check_input_ids_in_vocab, HookType.BEFORE)
