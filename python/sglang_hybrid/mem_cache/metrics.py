"""Metrics of the hybrid radix cache: :class:`CacheMetrics` (counters the cache keeps, tokens and
bytes) and :class:`HybridCacheMetrics` (their Prometheus series under upstream's ``sglang:``
namespace, scraped with ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List

if TYPE_CHECKING:
    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache


@dataclass
class CacheMetrics:
    """Counters in tokens / bytes since start (issue #3, "Honest metrics")."""

    requests: int = 0
    input_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    recomputed_tokens: int = 0
    kv_match_discarded_tokens: int = 0  # KV matched beyond the resume point, no checkpoint there
    cut_back_requests: int = 0
    host_to_device_bytes: int = 0
    checkpoints_stored: int = 0
    budget_evictions: int = 0  # inserts after which the joint device budget made the cache evict
    decode_end_skipped: int = 0  # decode-time states not donated (the policy predicted no reuse)
    host_restore_replans: int = 0  # host restores planned again: making room evicted device KV the plan kept
    store_hit_tokens: int = 0  # prompt tokens resumed from resume points read from the store tier
    store_pages_written: int = 0
    store_states_written: int = 0
    store_to_host_bytes: int = 0  # KV pages + checkpoints read from the store tier
    per_request: List[Dict[str, int]] = field(default_factory=list, repr=False)

    def as_dict(self) -> Dict[str, int]:
        d = {k: v for k, v in self.__dict__.items() if k != "per_request"}
        return d




class HybridCacheMetrics:
    """Prometheus series of the hybrid cache, beside upstream's radix-cache series.

    Scraped with upstream's ``/metrics`` when the server runs with ``--enable-metrics``
    (upstream's multiprocess collector reads series created in the scheduler process).
    Labels are upstream's radix-cache labels (``cache_type``, ``tp_rank``, ``pp_rank``,
    ``dp_rank`` and any ``--extra-metric-labels``) plus:

    * ``sglang:hybrid_cache_checkpoints{tier}``: recurrent-state checkpoints held, tier
      ``device`` or ``host``;
    * ``sglang:hybrid_cache_bytes{tier, kind}``: bytes held, kind ``kv`` (attention KV of
      cached tokens) or ``state`` (checkpoints);
    * ``sglang:hybrid_cache_kv_match_discarded_tokens_total``: prompt tokens whose KV was
      matched beyond the deepest checkpoint and recomputed anyway (a hybrid resume point
      needs both; issue #3, "Honest metrics").

    Hit tokens per tier are upstream's ``sglang:cached_tokens_total{cache_source}`` (our
    host restores are reported there as ``host``); recomputed tokens are upstream's
    ``sglang:uncached_prompt_tokens_histogram``. Gauges are refreshed on every prefix
    match, every insert and on ``/flush_cache``.
    """

    def __init__(self, labels: Dict[str, object]):
        from prometheus_client import Counter, Gauge

        self.labels = {k: str(v) for k, v in labels.items()}
        names = list(self.labels)
        self.checkpoints = Gauge("sglang:hybrid_cache_checkpoints", "Recurrent-state checkpoints held by the "
                                 "hybrid radix cache, by tier (device, host).", labelnames=names + ["tier"],
                                 multiprocess_mode="mostrecent")
        self.bytes = Gauge("sglang:hybrid_cache_bytes", "Bytes held by the hybrid radix cache, by tier (device, "
                           "host) and kind (kv: attention KV of cached tokens, state: checkpoints).",
                           labelnames=names + ["tier", "kind"], multiprocess_mode="mostrecent")
        self.discarded = Counter("sglang:hybrid_cache_kv_match_discarded_tokens", "Prompt tokens whose KV matched "
                                 "beyond the deepest checkpoint and were recomputed (no resume point there).",
                                 labelnames=names)
        self.store_failures = Counter("sglang:hybrid_cache_store_failures", "Store-tier operations that failed "
                                      "(unreachable at start, lookup, write, read): those requests recomputed.",
                                      labelnames=names)
        self._failures_seen = 0

    def count_discarded(self, tokens: int) -> None:
        if tokens > 0:
            self.discarded.labels(**self.labels).inc(tokens)

    def refresh(self, cache: "HybridRadixCache") -> None:
        """Set the gauges from the cache's current contents."""
        dev_ckpts = cache.device_checkpoint_count()
        dev_tokens = cache.full_evictable_size() + cache.full_protected_size()
        host = cache.host
        values = {
            ("device", "kv"): dev_tokens * cache.kv_bytes_per_token,
            ("device", "state"): dev_ckpts * cache.state_bytes,
            ("host", "kv"): host.num_pages * host.page_bytes,
            ("host", "state"): host.num_checkpoints * host.state_bytes,
        }
        import sys

        serving = sys.modules.get("sglang_hybrid.mem_cache.serving")
        failures = (cache.store.failures if getattr(cache, "store", None) is not None else 0) + (
            getattr(serving, "STORE_START_FAILURES", 0) if serving is not None else 0)
        if failures > self._failures_seen:
            self.store_failures.labels(**self.labels).inc(failures - self._failures_seen)
            self._failures_seen = failures
        self.checkpoints.labels(**self.labels, tier="device").set(dev_ckpts)

        self.checkpoints.labels(**self.labels, tier="host").set(host.num_checkpoints)
        for (tier, kind), v in values.items():
            self.bytes.labels(**self.labels, tier=tier, kind=kind).set(v)
