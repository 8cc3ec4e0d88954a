"""``--warmups sglang_hybrid``: compile the hybrid serving paths before the server reports healthy.

Upstream's own start-up warm-up sends one 3-token prompt, which reaches none of the kernels a
long prompt needs: the chunked-prefill kernels of the linear-attention layers (KDA / GDN chunk
scan), the extend path that starts from a cached recurrent state, and batched decode. Their
Triton kernels then compile when the first real request arrives (issue 40, item 6: 4-7 s on an
H200). This warm-up, registered in upstream's custom warm-up registry
(``sglang.srt.entrypoints.warmup``, run in the HTTP server's start-up before it serves), sends:

1. one prompt of two chunks plus a tail (``2 * --chunked-prefill-size + 37`` tokens, capped by
   the context length): chunked prefill and the chunk-to-chunk state hand-over;
2. the same prompt plus 29 tokens: an extend resumed from a cached checkpoint;
3. four short prompts at once: batched prefill and batched decode;

then flushes the cache, so no warm-up token is ever reported as a prefix hit.

Prompt lengths stay within half of the server's admissible prompt length (``max_req_input_len``,
the smaller of the context length and the KV pool): upstream 0.5.23 accepts any prompt up to
the pool size minus 6 tokens, but admits a prefill only when prompt + new tokens + one page of
rounding + the state slots' reserve fit, so a prompt near the limit waits in the queue forever
(seen with a 1,600-token pool at page 64: a 1,549-token prompt never ran). Each warm-up request
is also bounded in time (``SGLANG_HYBRID_WARMUP_TIMEOUT_S``, default 600 s): one that does not
finish is aborted with a warning and the server starts anyway.

It is added to ``--warmups`` automatically when one of our GPU kernel backends is selected
(``--linear-attn-backend`` / ``--linear-attn-decode-backend`` / ``--linear-attn-prefill-backend``
``sgl_hybrid``, ``--attention-backend sgl_hybrid_mla`` / ``sgl_hybrid_qsa``), unless
``--skip-server-warmup`` is given or ``--warmups`` already names it; any server can ask for it
with ``--warmups sglang_hybrid``.
"""

from __future__ import annotations

import logging
import random
import time
from typing import List

logger = logging.getLogger("sglang_hybrid.warmup")

NAME = "sglang_hybrid"
OUR_BACKENDS = {
    "linear_attn_backend": ("sgl_hybrid",),
    "linear_attn_decode_backend": ("sgl_hybrid",),
    "linear_attn_prefill_backend": ("sgl_hybrid",),
    "attention_backend": ("sgl_hybrid_mla", "sgl_hybrid_qsa"),
    "decode_attention_backend": ("sgl_hybrid_mla", "sgl_hybrid_qsa"),
    "prefill_attention_backend": ("sgl_hybrid_mla", "sgl_hybrid_qsa"),
}
DEFAULT_CHUNK = 2048
BATCH = 4
TIMEOUT_ENV = "SGLANG_HYBRID_WARMUP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0


def wants_warmup(args) -> bool:
    """True when the parsed launch arguments select one of our GPU kernel backends."""
    return any(getattr(args, field, None) in names for field, names in OUR_BACKENDS.items())


def add_to_args(args) -> bool:
    """Append :data:`NAME` to ``args.warmups`` when :func:`wants_warmup` and the user did not opt
    out (``--skip-server-warmup``); returns whether it was added."""
    if not wants_warmup(args) or getattr(args, "skip_server_warmup", False):
        return False
    names = [n for n in (getattr(args, "warmups", None) or "").split(",") if n]
    if NAME in names:
        return False
    args.warmups = ",".join(names + [NAME])
    return True


def warmup_lengths(chunk: int, max_input_len: int) -> List[int]:
    """Prompt lengths of steps 1 and 2 (tokens): two chunks plus a tail, then 29 more, the longer
    one at most half of ``max_input_len`` (the server's largest admissible prompt: the smaller of
    the context length and the KV pool, minus upstream's margin). Half, because admission also
    needs the new tokens, a page of rounding and the state slots' reserve (module docstring).

    Raises:
        ValueError: ``chunk`` or ``max_input_len`` below 1.
    """
    if chunk < 1 or max_input_len < 1:
        raise ValueError(f"chunk and max_input_len must be >= 1, got {chunk}, {max_input_len}")
    first = max(1, min(2 * chunk + 37, max_input_len // 2 - 29))
    return [first, first + 29]


def warmup_timeout_s() -> float:
    """Seconds one warm-up request may take (``SGLANG_HYBRID_WARMUP_TIMEOUT_S``, default 600).

    Raises:
        ValueError: the variable is set to something other than a positive number.
    """
    import os

    raw = os.environ.get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


async def _generate(tokenizer_manager, input_ids, max_new_tokens: int, timeout_s: float) -> bool:
    """One greedy request through the tokenizer manager; False (request aborted, warning logged)
    when it has not finished within ``timeout_s`` seconds."""
    import asyncio
    import uuid

    from sglang.srt.managers.io_struct import GenerateReqInput

    rid = f"sglang-hybrid-warmup-{uuid.uuid4().hex}"
    req = GenerateReqInput(rid=rid, input_ids=input_ids,
                           sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0})

    async def drain():
        async for _ in tokenizer_manager.generate_request(req, None):
            pass

    try:
        await asyncio.wait_for(drain(), timeout_s)
        return True
    except asyncio.TimeoutError:
        tokenizer_manager.abort_request(rid)
        logger.warning("sglang-hybrid warm-up: a %d-token request did not finish in %.0f s; aborted, the server "
                       "starts anyway (its kernels compile on the first request like it). %s sets the limit.",
                       len(input_ids), timeout_s, TIMEOUT_ENV)
        return False


def warmup_prompts(chunk: int, max_input_len: int, vocab_size: int) -> List[List[int]]:
    """The token ids the warm-up sends, in order: the long prompt, the same prompt extended, then
    :data:`BATCH` short prompts sent together (fixed seed: the same every start)."""
    rng = random.Random(20261207)
    hi = max(11, min(vocab_size - 1, 30000))
    long_len, resumed_len = warmup_lengths(chunk, max_input_len)
    prompt = [rng.randrange(10, hi) for _ in range(resumed_len)]
    short = [[rng.randrange(10, hi) for _ in range(24 + 8 * i)] for i in range(BATCH)]
    return [prompt[:long_len], prompt] + short


async def hybrid_warmup(disaggregation_mode: str, tokenizer_manager) -> None:
    """The warm-up of the module docstring (``disaggregation_mode`` other than ``null``: skipped,
    a prefill or decode server alone cannot complete a request)."""
    import asyncio

    if disaggregation_mode not in (None, "null"):
        logger.info("sglang-hybrid warm-up skipped (disaggregation mode %s)", disaggregation_mode)
        return
    t0 = time.perf_counter()
    chunk = getattr(tokenizer_manager.server_args, "chunked_prefill_size", None) or DEFAULT_CHUNK
    if chunk < 0:  # chunked prefill off
        chunk = DEFAULT_CHUNK
    vocab = int(getattr(tokenizer_manager.model_config, "vocab_size", 1000) or 1000)
    limit = int(tokenizer_manager.context_len)
    if getattr(tokenizer_manager, "max_req_input_len", None):
        limit = min(limit, int(tokenizer_manager.max_req_input_len))
    prompts = warmup_prompts(int(chunk), limit, vocab)
    timeout_s = warmup_timeout_s()
    done = await _generate(tokenizer_manager, prompts[0], 4, timeout_s)
    done = done and await _generate(tokenizer_manager, prompts[1], 4, timeout_s)
    if done:
        done = all(await asyncio.gather(*(_generate(tokenizer_manager, p, 8, timeout_s) for p in prompts[2:])))
    flushed = await tokenizer_manager.flush_cache()
    logger.info(
        "sglang-hybrid warm-up: prompts of %d (chunk %d) and %d tokens, a batch of %d, in %.2f s; cache flushed: %s%s",
        len(prompts[0]), chunk, len(prompts[1]), BATCH, time.perf_counter() - t0, getattr(flushed, "success", flushed),
        "" if done else " (incomplete: a request timed out)",
    )


def _add_warmup(cls, args, *rest, **kwargs):
    """BEFORE ``ServerArgs.from_cli_args``: :func:`add_to_args`."""
    if add_to_args(args):
        logger.info("sglang-hybrid: --warmups %s (our GPU kernel backends are selected; --skip-server-warmup "
                    "turns it off)", args.warmups)
    return None


def install() -> None:
    """Register :func:`hybrid_warmup` as upstream's custom warm-up :data:`NAME` and the hook that
    selects it for our kernel backends."""
    from sglang.srt.entrypoints.warmup import warmup

    from sglang_hybrid.patches import register_patches

    warmup(NAME)(hybrid_warmup)
    register_patches(__name__)
