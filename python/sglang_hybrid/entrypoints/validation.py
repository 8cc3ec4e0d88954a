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

One more never completes: a request the KV pool can never admit. When the pool holds fewer tokens
than the context length, upstream accepts any prompt up to the pool size minus 6 tokens, but its
scheduler admits a prefill only when prompt + new tokens (at most ``CLIP_MAX_NEW_TOKENS``) + one
page of allocation rounding fit the pool; a larger request then waits in the queue forever, the
client gets no answer and the queue behind it stalls (a 1,549-token prompt to a 1,600-token pool at
page 64, found by the GPU suite's warm-up). It is refused with the pool's size in the message.

It also rejects an empty stop string (``stop: ""`` or ``[""]``): upstream
accepts it and it matches at once, so the request stops after one token with
empty text — never what the caller meant.

This BEFORE hook raises ``ValueError`` there; upstream answers it with HTTP 400
and the server keeps serving.
"""

from __future__ import annotations

from sglang_hybrid.patches import register_patches


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
    _check_fits_pool(self, obj, input_ids)
    return None


def pool_tokens(context_len: int, max_req_input_len) -> int:
    """The KV pool's size in tokens when it, not the context length, bounds a request (upstream's
    ``max_req_input_len = min(context_len - 1, pool - 1) - 5``), else 0 (no pool bound to check)."""
    if not max_req_input_len:
        return 0
    pool = int(max_req_input_len) + 6
    return pool if pool < int(context_len) else 0


def _page_size(tm) -> int:
    """The served page size: the tokenizer process's ``ServerArgs.page_size`` stays unset when a model
    rule picks it (compressed QSA: 64), so the resolved value is read once and kept."""
    page = getattr(tm, "_sglang_hybrid_page_size", None)
    if page is None:
        sa = getattr(tm, "server_args", None)
        page = getattr(sa, "page_size", None)
        if page is None and hasattr(sa, "resolved_dict"):
            try:
                page = sa.resolved_dict().get("page_size")
            except Exception:  # noqa: BLE001 - no resolution here: page 1 (the check only gets weaker)
                page = None
        page = int(page or 1)
        try:
            tm._sglang_hybrid_page_size = page
        except AttributeError:
            pass
    return page


def _check_fits_pool(tm, obj, input_ids) -> None:
    """``ValueError`` for a request the pool can never admit (module docstring)."""
    pool = pool_tokens(getattr(tm, "context_len", 0), getattr(tm, "max_req_input_len", None))
    if not pool or not input_ids:
        return
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    sp = getattr(obj, "sampling_params", None)
    new = sp.get("max_new_tokens") if isinstance(sp, dict) else None
    new = 128 if new is None else new  # upstream's SamplingParams default
    if not isinstance(new, int):
        return  # a malformed value: upstream's SamplingParams check answers it by name
    page = _page_size(tm)
    need = len(input_ids) + min(max(new, 0), CLIP_MAX_NEW_TOKENS) + page
    if need > pool:
        raise ValueError(
            f"this request can never be scheduled: the KV pool holds {pool} tokens and the request needs "
            f"{len(input_ids)} prompt + {min(max(new, 0), CLIP_MAX_NEW_TOKENS)} new tokens + one page of {page}. "
            "Shorten the prompt or max_new_tokens, or start the server with a larger --max-total-tokens / "
            "--mem-fraction-static."
        )


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
    """Register the BEFORE hook on ``_validate_one_request`` declared in ``patches.py``."""
    register_patches(__name__)
