"""Serving wiring of :class:`HybridRadixCache` (issue #3).

* ``register_radix_cache_backend("hybrid", factory)``: ``--radix-cache-backend hybrid``;
  ``"upstream"``: upstream's own chain for our models too (A/B control).
* AROUND ``registry.default_radix_cache_factory``: with no ``--radix-cache-backend``
  our hybrid architectures get the ``hybrid`` backend (upstream's chain for
  everything else, and for ours when HiCache / LMCache / a disabled cache is asked for).
* AROUND ``PrefillAdder._select_prefill_admission``: split a prefill chunk at the
  branch point so both the branch point and the prompt end get checkpoints.
* AFTER ``ScheduleBatch.prepare_for_extend``: tokens restored from the host tier are
  reported as ``host`` in ``meta_info.cached_tokens_details`` (upstream counted them as
  ``device``: its tier split reads HiCache's fields, which this cache does not set).
* ``--hybrid-host-cache-gb G`` and ``--hybrid-device-cache-gb G`` (AFTER
  ``ServerArgs.add_cli_args``; BEFORE ``ServerArgs.from_cli_args`` exports them as
  ``SGLANG_HYBRID_HOST_CACHE_GB`` / ``SGLANG_HYBRID_DEVICE_CACHE_GB`` to the
  scheduler processes, since ``ServerArgs`` has no field for them).

| component | ours | upstream 0.5.23 |
|---|---|---|
| tree, locks, allocators | upstream's ``UnifiedRadixCache`` (python tree core) | same |
| checkpoint eviction order | lowest value per freed byte first (GDSF) | LRU |
| branch point and prompt end in one chunk | both stored (the chunk is split at the branch point) | branch point only |
| device budget | ``--hybrid-device-cache-gb``: one byte budget for KV + checkpoints in use, value-aware eviction between them | two pools split by ``--mamba-full-memory-ratio`` |
| host tier | ``--hybrid-host-cache-gb``: KV pages + checkpoints, restored together | HiCache (GPU only) |
| metrics | device / host / recomputed / KV matches discarded, per request in the log | cached_tokens |
"""

from __future__ import annotations

from sglang_hybrid.flags import add_plugin_argument

import contextvars
import importlib
import logging
import os

logger = logging.getLogger(__name__)

BACKEND_NAME = "hybrid"
# A/B control: upstream's own selection chain, also for our models.
UPSTREAM_BACKEND_NAME = "upstream"
_UPSTREAM_CHAIN = contextvars.ContextVar("sglang_hybrid_upstream_cache_chain", default=False)
HOST_FLAG = "--hybrid-host-cache-gb"
HOST_ENV = "SGLANG_HYBRID_HOST_CACHE_GB"
DEVICE_FLAG = "--hybrid-device-cache-gb"
DEVICE_ENV = "SGLANG_HYBRID_DEVICE_CACHE_GB"
STORE_FLAG, STORE_ENV = "--hybrid-store", "SGLANG_HYBRID_STORE"
STORE_CONFIG_FLAG, STORE_CONFIG_ENV = "--hybrid-store-config", "SGLANG_HYBRID_STORE_CONFIG"
# Per-path checkpoint cap on the server (issue #3, placement: "a per-path budget caps
# checkpoints"); upstream's --mamba-max-states-per-path, when given, takes precedence.
MAX_CHECKPOINTS_PER_PATH = 8


def _gb_env(env: str, flag: str):
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return None
    try:
        gb = float(raw)
    except ValueError as exc:
        raise ValueError(f"{env} must be a number of GB, got {raw!r}") from exc
    if gb < 0:
        raise ValueError(f"{flag} must be >= 0, got {gb}")
    return int(gb * 1_000_000_000)


def _host_budget_bytes() -> int:
    return _gb_env(HOST_ENV, HOST_FLAG) or 0


def _device_budget_bytes():
    """Joint device budget in bytes, or None (upstream's two separately sized pools)."""
    b = _gb_env(DEVICE_ENV, DEVICE_FLAG)
    if b is not None and b <= 0:
        raise ValueError(f"{DEVICE_FLAG} must be > 0 (omit it to keep upstream's separate pools)")
    return b


def _dcp_size() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return max(1, int(get_parallel().attn_dcp_size))
    except Exception:  # config not published (unit tests with fake pools)
        return 1


def _pool_bytes(params) -> tuple:
    """(KV bytes per token over all full-attention layers on this rank, bytes of one state slot).

    Under DCP (``--dcp-size c``) a KV token is a *widened* location and a rank
    stores one row per ``c`` of them (upstream's owner rule), so a token costs
    this rank ``row / c`` bytes (rounded up).
    """
    kv_b = st_b = 1
    try:
        kv = params.token_to_kv_pool_allocator.get_kvcache()
        full = getattr(kv, "full_kv_pool", kv)
        # MLA pools hold one latent buffer per layer (kv_buffer); MHA pools (QSA) K and V.
        bufs = [b for a in ("kv_buffer", "k_buffer", "v_buffer") for b in (getattr(full, a, None) or [])]
        row = sum(b[0].numel() * b.element_size() for b in bufs if b.dim() and b.shape[0])
        if row:
            kv_b = -(-row // _dcp_size())
        else:
            logger.warning("hybrid cache: no KV buffers found on %s; metrics count tokens", type(full).__name__)
    except Exception as exc:  # byte sizes only feed metrics on the serving path
        logger.warning("hybrid cache: KV bytes per token unknown (%s); metrics count tokens", exc)
    try:
        mc = params.req_to_token_pool.mamba_pool.mamba_cache
        tensors = list(mc.conv) + [mc.temporal]
        st_b = max(1, sum(t[:, 0].numel() * t.element_size() for t in tensors))
    except Exception as exc:
        logger.warning("hybrid cache: state bytes unknown (%s); metrics count slots", exc)
    return kv_b, st_b


def _log_kv_per_rank(params) -> None:
    """Start-up line: this rank's KV pool rows and bytes against the tokens it serves (issue 8, DCP)."""
    try:
        alloc = params.token_to_kv_pool_allocator
        kv = alloc.get_kvcache()
        full = getattr(kv, "full_kv_pool", kv)
        bufs = [b for a in ("kv_buffer", "k_buffer", "v_buffer") for b in (getattr(full, a, None) or [])]
        rows = int(full.size)
        row = sum(b[0].numel() * b.element_size() for b in bufs if b.dim() and b.shape[0])
        tokens = int(alloc.size)
    except Exception as exc:  # report only
        logger.warning("hybrid cache: KV pool size per rank unknown (%s)", exc)
        return
    logger.info(
        "hybrid cache: KV pool per rank: %d rows x %d B = %d B for %d tokens (DCP %d, tree page %d)",
        rows, row, rows * row, tokens, _dcp_size(), params.page_size,
    )


def hybrid_cache_factory(ctx):
    """Registered factory: ``HybridRadixCache`` for hybrid (KDA/GDN) models."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache

    if not ctx.is_hybrid_ssm:
        logger.info("hybrid cache: model has no recurrent layers; using upstream's UnifiedRadixCache")
        return create_unified_radix_cache(ctx)
    if ctx.enable_hierarchical_cache:
        raise ValueError(
            f"--radix-cache-backend {BACKEND_NAME} has its own host tier: use {HOST_FLAG} instead of "
            "--enable-hierarchical-cache"
        )
    host = _host_budget_bytes()
    device = _device_budget_bytes()
    kv_b, st_b = _pool_bytes(ctx.params)
    chunk = getattr(ctx.server_args, "chunked_prefill_size", None)

    store = _open_store_tier(ctx, kv_b, st_b, host)

    def build(params):
        return HybridRadixCache(
            params,
            kv_bytes_per_token=kv_b,
            state_bytes=st_b,
            device_budget_bytes=device,
            host_budget_bytes=host,
            host_payload=True,
            serving=True,
            chunked_prefill_size=chunk if chunk and chunk > 0 else None,
            max_checkpoints_per_path=MAX_CHECKPOINTS_PER_PATH,
            store=store,
        )

    cache = create_unified_radix_cache(ctx, cache_class=build)
    _log_kv_per_rank(ctx.params)
    logger.info(
        "hybrid cache: HybridRadixCache (KV %d B/token, checkpoint %d B, joint device budget %s, host tier %.3f GB, "
        "checkpoints per path <= %d)",
        kv_b, st_b, "off" if device is None else f"{device} B", host / 1e9,
        cache._mamba_component().mamba_max_states_per_path if hasattr(cache, "_mamba_component") else -1,
    )
    return cache


def _store_namespace(ctx, kv_b: int, st_b: int) -> str:
    """Model and layout identity of this rank's store entries: checkpoint config, KV / state bytes,
    page size, TP rank, KV dtype (instances agree on it exactly when their entries are interchangeable)."""
    import hashlib

    sa = ctx.server_args
    cfg = os.path.join(getattr(sa, "model_path", "") or "", "config.json")
    h = hashlib.sha256()
    try:
        with open(cfg, "rb") as f:
            h.update(f.read())
    except OSError:
        h.update(str(getattr(sa, "model_path", "")).encode())
    try:
        from sglang.srt.distributed import get_tensor_model_parallel_rank

        rank = get_tensor_model_parallel_rank()
    except Exception:
        rank = 0
    page = getattr(ctx.params, "page_size", None) or getattr(sa, "page_size", 1)
    h.update(f"{kv_b}/{st_b}/{page}/{getattr(sa, 'kv_cache_dtype', '')}/{getattr(sa, 'dtype', '')}".encode())
    return f"sglang-hybrid/{h.hexdigest()[:24]}/tp{rank}"


def _open_store_tier(ctx, kv_b: int, st_b: int, host_bytes: int):
    """The store tier of ``--hybrid-store``, or None (not asked; or unreachable at start: a warning,
    the server runs without it and ``sglang:hybrid_cache_store_failures_total`` counts it).

    Raises:
        ValueError: ``--hybrid-store`` without a host tier, or an unreadable config.
    """
    kind = os.environ.get(STORE_ENV)
    if not kind:
        return None
    if host_bytes <= 0:
        raise ValueError(f"{STORE_FLAG} needs the host tier: give {HOST_FLAG} > 0")
    from sglang_hybrid.mem_cache.store import StoreError, StoreTier, open_store

    ns = _store_namespace(ctx, kv_b, st_b)
    try:
        tier = StoreTier(open_store(kind, os.environ.get(STORE_CONFIG_ENV)), ns)
    except StoreError as exc:
        logger.warning("hybrid cache: %s %s unreachable at start (%s); serving without it (requests recompute)",
                       STORE_FLAG, kind, exc)
        global STORE_START_FAILURES
        STORE_START_FAILURES += 1
        return None
    logger.info("hybrid cache: store tier %s (%s), namespace %s", kind, os.environ.get(STORE_CONFIG_ENV), ns)
    return tier


STORE_START_FAILURES = 0


def _ours(ctx) -> bool:
    from sglang_hybrid.models.kimi_k3 import ARCHITECTURE as KIMI_K3

    archs = set(getattr(ctx.model_config.hf_config, "architectures", None) or [])
    try:
        from sglang_hybrid.models.qwen38 import ARCHITECTURE as QWEN38

        ours = {KIMI_K3, QWEN38}
    except ImportError:
        ours = {KIMI_K3}
    return bool(archs & ours)


def upstream_cache_factory(ctx):
    """Registered factory ``--radix-cache-backend upstream``: upstream 0.5.23's own cache
    selection (``UnifiedRadixCache`` with its MAMBA component for our models), without the
    hybrid cache that is otherwise their default. For A/B runs against upstream; our
    branch-point split and joint budget act only on ``HybridRadixCache`` and stay off."""
    from sglang.srt.mem_cache import registry

    token = _UPSTREAM_CHAIN.set(True)
    try:
        cache = registry.default_radix_cache_factory(ctx)
    finally:
        _UPSTREAM_CHAIN.reset(token)
    logger.info("radix cache: upstream's %s (--radix-cache-backend %s)", type(cache).__name__, UPSTREAM_BACKEND_NAME)
    return cache


def _default_factory(original, ctx, *args, **kwargs):
    from sglang.srt.runtime_context import get_memory

    mem = get_memory()
    if (
        not _UPSTREAM_CHAIN.get()
        and ctx.is_hybrid_ssm
        and not ctx.disable_radix_cache
        and not ctx.enable_hierarchical_cache
        and not getattr(mem, "enable_lmcache", False)
        and _ours(ctx)
    ):
        return hybrid_cache_factory(ctx)
    return original(ctx, *args, **kwargs)


def _add_flag(result, parser, *args, **kwargs):
    have = {o for a in parser._actions for o in a.option_strings}
    if HOST_FLAG not in have:
        add_plugin_argument(
            parser, HOST_FLAG,
            type=float,
            default=None,
            help="sglang-hybrid: host-memory (CPU DRAM) tier of the hybrid radix cache in GB: KV pages and "
            f"recurrent checkpoints evicted from the device are kept there and restored together (default 0 = off; "
            f"same as {HOST_ENV}).",
        )
    if DEVICE_FLAG not in have:
        add_plugin_argument(
            parser, DEVICE_FLAG,
            type=float,
            default=None,
            help="sglang-hybrid: one device byte budget (GB) for attention KV and recurrent checkpoints together; "
            "the hybrid radix cache evicts the lowest value per freed byte first whenever the "
            "bytes in use exceed it, instead of a fixed KV/state split (default: off, upstream's two pools; "
            f"same as {DEVICE_ENV}).",
        )
    add_plugin_argument(
        parser, STORE_FLAG, choices=["file", "mooncake"], default=None,
        help="sglang-hybrid: a third tier of the hybrid radix cache in a store shared by server instances "
        "(resume points: KV pages + recurrent checkpoint, published together; needs "
        f"{HOST_FLAG} > 0): 'file' (a directory) or 'mooncake' (Mooncake Store). Same as {STORE_ENV}.",
    )
    add_plugin_argument(
        parser, STORE_CONFIG_FLAG, default=None, metavar="FILE",
        help=f"sglang-hybrid: JSON config of {STORE_FLAG}: file {{\"path\": DIR}}; mooncake "
        "{\"master_server_address\": \"HOST:PORT\", ...} (docs/hybrid-cache.md). Same as "
        f"{STORE_CONFIG_ENV}.",
    )
    for action in parser._actions:
        if "--radix-cache-backend" in action.option_strings and BACKEND_NAME not in (action.help or ""):
            action.help = (f"{action.help} sglang-hybrid registers '{BACKEND_NAME}' (its hybrid radix cache: aligned "
                           f"KV + recurrent-state resume points, host tier; the default for hybrid recurrent models "
                           f"when this flag is omitted) and '{UPSTREAM_BACKEND_NAME}' (upstream's own cache, for A/B runs).")
    return result


def _export_flag(cls, args, *rest, **kwargs):
    """BEFORE ``ServerArgs.from_cli_args``: the cache-size flags -> the environment the scheduler inherits.

    Raises:
        ValueError: ``--hybrid-host-cache-gb`` below 0, ``--hybrid-device-cache-gb`` not above 0, or a
            ``--radix-cache-backend`` name no plugin registered (at parse time, not after the model loads).
    """
    for attr, flag, env, positive in (
        ("hybrid_host_cache_gb", HOST_FLAG, HOST_ENV, False),
        ("hybrid_device_cache_gb", DEVICE_FLAG, DEVICE_ENV, True),
    ):
        val = getattr(args, attr, None)
        if val is None:
            continue
        if val < 0 or (positive and val == 0):
            raise ValueError(f"{flag} must be {'> 0' if positive else '>= 0'}, got {val}")
        os.environ[env] = repr(float(val))
    store, store_config = getattr(args, "hybrid_store", None), getattr(args, "hybrid_store_config", None)
    if store:
        if not store_config:
            raise ValueError(f"{STORE_FLAG} {store} needs {STORE_CONFIG_FLAG} FILE")
        if not os.path.isfile(store_config):
            raise ValueError(f"{STORE_CONFIG_FLAG} {store_config}: no such file")
        os.environ[STORE_ENV] = store
        os.environ[STORE_CONFIG_ENV] = os.path.abspath(store_config)
    backend = getattr(args, "radix_cache_backend", None)
    if backend is not None:
        from sglang.srt.mem_cache.registry import registered_radix_cache_backends

        if backend not in registered_radix_cache_backends():  # e.g. upstream's flexkv registers on import
            try:
                importlib.import_module(f"sglang.srt.mem_cache.storage.{backend}")
            except ImportError:
                pass
        names = registered_radix_cache_backends()
        if backend not in names:  # upstream finds out only when the scheduler builds its cache
            raise ValueError(f"--radix-cache-backend {backend!r} is not registered; registered: {', '.join(names)}")


def _split_at_branch_point(original, self, req, *args, **kwargs):
    """End a prefill chunk at the branch point when the prompt end lies beyond it.

    Upstream tracks one recurrent state per prefill chunk and, when the branch
    point (``mamba_branching_seqlen``) falls inside the chunk, tracks the branch
    point instead of the prompt end, so the next turn resumes one turn behind.
    Ending the chunk at the branch point stores the branch checkpoint (a chunked
    request's state is donated at the chunk end) and the next chunk reaches the
    prompt end, which is stored at the end of the request: both resume points
    exist. Only with our cache, with chunked prefill on, and when no other
    request is mid-chunk (the scheduler tracks one chunked request). For the same
    reason, once a split request is the batch's chunked request, a later request
    that would be chunked is refused for this batch (``AddReqResult.OTHER``) and
    admitted with the next one; before this, it replaced the split request as the
    tracked chunk and the split request decoded from its branch point without the
    rest of its prompt (found by upstream's radix_cache_server_kit; test:
    test_hybrid_cache_server.py, case "split + chunked neighbour").
    """
    adm = original(self, req, *args, **kwargs)
    if getattr(adm, "is_chunked", False):
        pending = getattr(self, "new_chunked_req", None)
        if pending is not None and pending is not req:
            # A branch split earlier in this batch is already the batch's chunked
            # request and upstream tracks only one: a second chunked admission would
            # replace it, and the split request would start decoding from its
            # branch point with the rest of its prompt never computed. Close the
            # batch instead; this request is admitted with the next one.
            from sglang.srt.managers.schedule_policy import AddReqResult

            logger.info(
                "hybrid cache: rid=%s would be a second chunked request in this batch (rid=%s is split at its "
                "branch point); admitted with the next batch", req.rid, pending.rid,
            )
            return AddReqResult.OTHER
        return adm
    b = getattr(req, "mamba_branching_seqlen", None)
    if b is None or not hasattr(adm, "extend_len"):
        return adm
    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache

    if not isinstance(self.tree_cache, HybridRadixCache) or self.rem_chunk_tokens is None:
        return adm
    if kwargs.get("has_chunked_req") or getattr(self, "new_chunked_req", None) is not None:
        return adm
    grid = self.tree_cache._mamba_component().mamba_checkpoint_grid
    start, end = adm.prefix_len, adm.prefix_len + adm.extend_len
    if not (start < b < end) or (b - start) % grid or (end // grid) * grid <= b:
        return adm
    return type(adm)(adm.prefix_len, b - start, 0, True, adm.replay_len)


def _report_host_hits(result, batch, *args, **kwargs):
    """AFTER ``ScheduleBatch.prepare_for_extend``: the host tier's share of each new request's cached prefix.

    Upstream splits a request's cached prefix into device / host / storage tokens once, on its first
    extend (``req.cached_tokens_device`` / ``cached_tokens_host``, reported as the response's
    ``meta_info.cached_tokens_details``), from its own HiCache fields. The hybrid cache restores host pages
    during ``match_prefix`` and leaves those fields at 0, so it notes the restored tokens on the request
    (``_sglang_hybrid_host_hit_tokens``); here they move from the device share to the host share, once.
    """
    for req in getattr(batch, "reqs", ()):
        host = req.__dict__.pop("_sglang_hybrid_host_hit_tokens", 0)
        store = req.__dict__.pop("_sglang_hybrid_store_hit_tokens", 0)
        if host > 0 and getattr(req, "_cache_breakdown_computed", False):
            moved = min(host, req.cached_tokens_device)
            req.cached_tokens_device -= moved
            req.cached_tokens_host += moved
        if store > 0 and getattr(req, "_cache_breakdown_computed", False):
            moved = min(store, req.cached_tokens_device)
            req.cached_tokens_device -= moved
            req.cached_tokens_storage += moved
    return result


def install() -> None:
    """Register the backend, the default-selection hook and the flag (called by ``plugin.register``)."""
    from sglang.srt.mem_cache.registry import register_radix_cache_backend, registered_radix_cache_backends

    from sglang_hybrid.patches import register_patches

    if BACKEND_NAME not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND_NAME, hybrid_cache_factory)
    if UPSTREAM_BACKEND_NAME not in registered_radix_cache_backends():
        register_radix_cache_backend(UPSTREAM_BACKEND_NAME, upstream_cache_factory)
    register_patches(__name__)  # the five hooks declared in patches.py
