"""Replay a Mooncake trace through real radix-cache classes with fake pools.

Drives upstream's ``UnifiedRadixCache`` (FULL + MAMBA, extra_buffer) and our
:class:`~sglang_hybrid.mem_cache.hybrid_radix_cache.HybridRadixCache` request
by request (one at a time, as in issue #3's measured starting point) with the
byte sizes of a model on one rank, and counts what each reuses.

Token ids: hash id ``h`` stands for a 512-token block ``[h*512+1, ..., h*512+512]``
and a prompt is its blocks truncated to the input length (so equal ids give
equal tokens and a partial last block is a prefix of the full one); output
tokens are unique per request. Under this scheme the trace's perfect-cache
reuse is 37.4% of input tokens, the figure the issue quotes.

Per request (both policies): match -> lock -> allocate KV for the tokens to
recompute and the output (evicting as the pools require) -> store checkpoints
where the policy places them -> unlock -> free what the tree did not adopt.

* ``upstream``: the scheduler's placement (sglang 0.5.23
  ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` and
  ``MambaComponent.prepare_for_caching_req``, reimplemented from their
  behaviour): chunked prefill of ``chunk`` tokens, one checkpoint per chunk at
  its last ``grid`` point — or at ``mamba_branching_seqlen`` when that falls in
  the chunk — stored for every chunk but the last; at the end the last tracked
  state (decode tracks every ``track_interval`` tokens) is stored with the KV up
  to it; separate pools, states get ``ratio/(1+ratio)`` of the budget
  (``--mamba-full-memory-ratio``, default 0.9).
* ``hybrid``: :func:`checkpoint_positions` (branch point + prompt end) plus the
  last ``coarse`` boundary of the prompt, only KV that reaches a checkpoint is
  kept, one joint budget with value-aware eviction, optional host tier.
"""

from __future__ import annotations

import json
import time
from array import array
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

TRACE_BLOCK = 512


@dataclass(frozen=True)
class ModelBytes:
    """Per-rank cache sizes. Defaults: Kimi K3 at TP8 (issue #3)."""

    kv_bytes_per_token: int = 13_824  # 24 MLA layers x 576 B
    state_bytes: int = 54_263_808  # 69 KDA layers x 12 heads x 128 x 128 x 4 B
    page_size: int = 64

    def dcp(self, c: int) -> "ModelBytes":
        """DCP over ``c`` ranks: each rank keeps 1/c of the KV; states unchanged."""
        if c <= 0:
            raise ValueError(f"dcp size must be > 0, got {c}")
        return ModelBytes(max(1, self.kv_bytes_per_token // c), self.state_bytes, self.page_size)


@dataclass
class ReplayConfig:
    policy: str  # "upstream" | "hybrid"
    device_budget_bytes: Optional[int]  # None = unbounded
    host_budget_bytes: int = 0
    model: ModelBytes = field(default_factory=ModelBytes)
    grid: int = 64
    coarse: int = 512
    stride: int = 0
    chunk: int = 8192
    track_interval: int = 256
    mamba_full_memory_ratio: float = 0.9
    limit: Optional[int] = None


@dataclass
class ReplayResult:
    policy: str
    device_budget_gb: Optional[float]
    host_budget_gb: float
    requests: int = 0
    input_tokens: int = 0
    reused_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    recomputed_tokens: int = 0
    kv_match_discarded_tokens: int = 0
    cut_back_requests: int = 0
    host_to_device_bytes: int = 0
    store_hit_tokens: int = 0  # part of host_hit_tokens read from the shared store first
    store_to_host_bytes: int = 0
    checkpoints_stored: int = 0
    max_checkpoints_on_device: int = 0
    mean_checkpoint_memory_share: float = 0.0
    requests_not_cached: int = 0
    seconds: float = 0.0

    @property
    def reuse_pct(self) -> float:
        return 100.0 * self.reused_tokens / max(1, self.input_tokens)

    def as_dict(self) -> Dict:
        d = dict(self.__dict__)
        d["reuse_pct"] = round(self.reuse_pct, 3)
        d["host_to_device_bytes_per_reused_token"] = round(self.host_to_device_bytes / max(1, self.reused_tokens), 1)
        return d


def load_trace(path: str, limit: Optional[int] = None) -> List[dict]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit is not None and len(out) >= limit:
                    break
    return out


def prompt_tokens(rec: dict) -> array:
    """Synthetic prompt token ids of one trace record (see module docstring)."""
    n = int(rec["input_length"])
    toks = array("q")
    for i, h in enumerate(rec["hash_ids"]):
        take = min(TRACE_BLOCK, n - i * TRACE_BLOCK)
        if take <= 0:
            break
        base = int(h) * TRACE_BLOCK + 1
        toks.extend(range(base, base + take))
    return toks


def perfect_reuse_tokens(records: Iterable[dict]) -> (int, int):
    """(reusable, total) input tokens for an unbounded cache with every prefix resumable."""
    seen: Dict[tuple, int] = {}
    reuse = total = 0
    for r in records:
        n = int(r["input_length"])
        total += n
        key: tuple = ()
        m = 0
        for i, h in enumerate(r["hash_ids"]):
            key = (key, h)
            if key not in seen:
                break
            m = min(i * TRACE_BLOCK + seen[key], n)
            if seen[key] < TRACE_BLOCK:
                break
        reuse += m
        key = ()
        for i, h in enumerate(r["hash_ids"]):
            key = (key, h)
            seen[key] = max(seen.get(key, 0), min(TRACE_BLOCK, n - i * TRACE_BLOCK))
    return reuse, total


def _build_cache(cfg: ReplayConfig, total_tokens_hint: int):
    from sglang_hybrid.mem_cache.fake_pools import build_cache

    m = cfg.model
    B = cfg.device_budget_bytes
    if B is None:
        kv_tokens, slots = total_tokens_hint + 1, 200_000
    elif cfg.policy == "upstream":
        r = cfg.mamba_full_memory_ratio
        kv_tokens = int(B / (1 + r) / m.kv_bytes_per_token)
        slots = max(1, int(B * r / (1 + r) / m.state_bytes))
    else:  # joint budget: either pool may take all of it; the cache enforces the sum
        kv_tokens = int(B / m.kv_bytes_per_token)
        slots = max(1, int(B / m.state_bytes))
    kwargs = {}
    if cfg.policy == "hybrid":
        kwargs = dict(
            kv_bytes_per_token=m.kv_bytes_per_token,
            state_bytes=m.state_bytes,
            device_budget_bytes=B,
            host_budget_bytes=cfg.host_budget_bytes,
        )
    return build_cache(cfg.policy, kv_tokens, slots, page_size=m.page_size, grid=cfg.grid, **kwargs)


def upstream_positions(P: int, O: int, resume: int, branching: Optional[int], grid: int, chunk: int, interval: int):
    """(unfinished-chunk checkpoint positions, finished insert length) of upstream's scheduler."""
    out = []
    s = resume
    tracked = None
    while s < P:
        e = min(P, s + chunk)
        ext = e - s
        t = None
        if ext >= grid:
            t = s + (ext // grid) * grid
            if branching is not None and s < branching < t and (branching - s) % grid == 0:
                t = branching
        if e < P and t is not None:
            out.append(t)
        if t is not None:
            tracked = t
        s = e
    # decode: tracked every `interval` tokens of the sequence
    L = P + O - 1
    dec = (L // interval) * interval
    if O > 1 and dec > P and (tracked is None or dec > tracked):
        tracked = dec
    return out, tracked


def _instance(cfg: ReplayConfig, total_hint: int, store=None):
    """One cache and its pools: ``(step(record), result, finish())``; ``store``: a shared
    :class:`~sglang_hybrid.mem_cache.store.StoreTier` (hybrid policy with a host tier only)."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache
    from sglang_hybrid.mem_cache.placement import checkpoint_positions

    cache, alloc, pool = _build_cache(cfg, total_hint)
    if store is not None:
        cache.store = store  # accounting only: the fake pools have no payload
    ma = pool.mamba_allocator
    m = cfg.model
    page = m.page_size
    hybrid = isinstance(cache, HybridRadixCache)
    res = ReplayResult(
        cfg.policy,
        None if cfg.device_budget_bytes is None else cfg.device_budget_bytes / 1e9,
        cfg.host_budget_bytes / 1e9,
    )
    share_acc = 0.0
    next_out = 1 << 40
    t0 = time.time()

    def make_room(kv_tokens: int, slots: int) -> bool:
        if hybrid:
            return cache._make_room(kv_tokens, slots)
        if alloc.available_size() < kv_tokens:
            cache.evict(EvictParams(num_tokens=kv_tokens - alloc.available_size()))
        if ma.available_size() < slots:
            cache.evict(EvictParams(num_tokens=0, mamba_num=slots - ma.available_size()))
        return alloc.available_size() >= kv_tokens and ma.available_size() >= slots

    def step(rec) -> None:
        nonlocal share_acc, next_out
        P, O = int(rec["input_length"]), max(1, int(rec["output_length"]))
        toks = prompt_tokens(rec)
        out_toks = array("q", range(next_out, next_out + O))
        next_out += O
        full = toks + out_toks
        if hybrid:
            hm = cache.match_with_host(toks)
            resume, dev_resume, kv_hit, node = hm.resume_len, hm.device_resume_len, hm.kv_hit_len, hm.last_node
            res.host_hit_tokens += hm.host_hit_len
            res.host_to_device_bytes += hm.loaded_bytes
            res.store_hit_tokens += hm.store_hit_len
            branching = None
        else:
            mr = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
            resume = dev_resume = mr.device_prefix_len
            kv_hit, node, branching = mr.full_kv_hit_length, mr.last_device_node, mr.mamba_branching_seqlen
        res.requests += 1
        res.input_tokens += P
        res.reused_tokens += resume
        res.device_hit_tokens += dev_resume
        res.recomputed_tokens += P - resume
        if kv_hit > resume:
            res.kv_match_discarded_tokens += kv_hit - resume
            res.cut_back_requests += 1
        lock = cache.inc_lock_ref(node)
        need = P + O - resume
        if not make_room(need, 1):
            res.requests_not_cached += 1
            cache.dec_lock_ref(node, lock.to_dec_params())
            return
        req_kv = alloc.alloc(need)
        work_slot = ma.alloc(1)  # the request's own running state
        adopted = resume  # tree holds [0, adopted) of this request
        base = None  # one value tensor per request: tree nodes keep views of what is inserted

        def store(L: int, with_state: bool, kind: str = "") -> None:
            nonlocal adopted, base
            slot = None
            if with_state:
                if not make_room(0, 1):
                    return
                slot = ma.alloc(1)
            if base is None or L > len(base):
                base = torch.cat([torch.full((resume,), -1, dtype=torch.int64), req_kv[: L - resume]])
            # prev_prefix_len: the tree already holds [0, adopted) of ours; it
            # frees our duplicates of what it holds beyond that itself.
            ins = cache.insert(
                InsertParams(key=RadixKey(full[:L]), value=base[:L], mamba_value=slot, prev_prefix_len=min(adopted, L))
            )
            if ins.prefix_len < min(resume, L):
                raise AssertionError(f"tree lost part of a locked prefix: {ins.prefix_len} < {resume}")
            adopted = max(adopted, L)
            if slot is not None:
                if ins.mamba_exist:
                    ma.free(slot)
                else:
                    res.checkpoints_stored += 1
                    if hybrid:
                        cache.note_checkpoint(ins.last_device_node, kind)

        if hybrid:
            if resume > 0:
                cache.note_resume(node)
            # deepest first: shorter inserts then only split nodes and attach states
            for pos, kind in sorted(cache.placement(P, resume, kv_hit, cfg.grid, cfg.coarse, cfg.stride, cfg.chunk), reverse=True):
                store(pos, True, kind)
        else:
            unfinished, final_len = upstream_positions(P, O, resume, branching, cfg.grid, cfg.chunk, cfg.track_interval)
            for pos in unfinished:
                store(pos, True)
            if final_len is not None and (final_len // page) * page > adopted:
                store((final_len // page) * page, True)
        if adopted - resume < need:
            alloc.free(req_kv[adopted - resume :])
        ma.free(work_slot)
        cache.dec_lock_ref(node, lock.to_dec_params())
        if hybrid:
            cache.enforce_budget()
        if cfg.device_budget_bytes:
            nck = len(cache.tree_core.lru_lists[_mamba_type()].cache)
            res.max_checkpoints_on_device = max(res.max_checkpoints_on_device, nck)
            share_acc += nck * m.state_bytes / cfg.device_budget_bytes
    step.cache = cache

    def finish() -> ReplayResult:
        if hybrid:
            res.store_to_host_bytes = cache.metrics.store_to_host_bytes
        res.mean_checkpoint_memory_share = share_acc / max(1, res.requests)
        res.seconds = time.time() - t0
        return res

    return step, res, finish


def replay(cfg: ReplayConfig, records: List[dict], progress: bool = False) -> ReplayResult:
    """Replay ``records`` (trace dicts) through one cache; see the module docstring."""
    total_hint = sum(int(r["input_length"]) + int(r["output_length"]) for r in records)
    step, res, finish = _instance(cfg, total_hint)
    t0 = time.time()
    for n, rec in enumerate(records):
        step(rec)
        if progress and (n + 1) % 1000 == 0:
            print(f"  [{cfg.policy} {res.device_budget_gb} GB host {res.host_budget_gb} GB] {n+1} req, reuse {res.reuse_pct:.2f}%, {time.time()-t0:.0f}s", flush=True)
    return finish()


class MemoryStore:
    """An in-process :class:`~sglang_hybrid.mem_cache.store.HybridStore` for the multi-instance replay
    (keys only matter there: the fake pools carry no payload). Unbounded."""

    def __init__(self):
        self.objects: Dict[str, bytes] = {}

    def exists(self, keys):
        return [k in self.objects for k in keys]

    def put(self, key, value):
        self.objects[key] = value

    def get(self, key):
        return self.objects.get(key)

    def close(self):
        pass


ROUTINGS = ("round-robin", "prefix")


def replay_instances(cfg: ReplayConfig, records: List[dict], instances: int, routing: str,
                     shared_store: bool) -> Dict:
    """Replay ``records`` over ``instances`` caches, each with ``cfg`` (its own device and host tiers);
    with ``shared_store`` all write to and read from one store tier (issue 45).

    Routing: ``round-robin``; or ``prefix``, a cache-aware router: the instance whose device + host
    tiers hold the longest resume point for the prompt, the least loaded one (fewest requests so far)
    when none holds any or when the best one already has 1.5x its fair share.

    Returns the summed :class:`ReplayResult` token and byte fields, reuse, store bytes per reused token,
    and per instance the reuse and the request count.

    Raises:
        ValueError: unknown ``routing``, ``instances`` below 1, or a shared store without a host tier.
    """
    from sglang_hybrid.mem_cache.store import StoreTier

    if instances < 1 or routing not in ROUTINGS:
        raise ValueError(f"instances must be >= 1 and routing one of {ROUTINGS}, got {instances}, {routing!r}")
    if shared_store and (cfg.policy != "hybrid" or cfg.host_budget_bytes <= 0):
        raise ValueError("a shared store needs the hybrid policy with a host tier (host_budget_bytes > 0)")
    tier = StoreTier(MemoryStore(), "replay") if shared_store else None
    total_hint = sum(int(r["input_length"]) + int(r["output_length"]) for r in records)
    insts = [_instance(cfg, total_hint, tier) for _ in range(instances)]
    load = [0] * instances
    for i, rec in enumerate(records):
        if routing == "round-robin":
            k = i % instances
        else:
            toks = prompt_tokens(rec)
            fair = 1.5 * (i + 1) / instances
            hits = [s.cache.match_with_host(toks, load=False).resume_len if load[j] < fair else -1
                    for j, (s, _, _) in enumerate(insts)]
            best = max(hits)
            k = hits.index(best) if best > 0 else min(range(instances), key=lambda j: load[j])
        load[k] += 1
        insts[k][0](rec)
    results = [finish() for _, _, finish in insts]
    total = {k: sum(getattr(r, k) for r in results) for k in (
        "requests", "input_tokens", "reused_tokens", "device_hit_tokens", "host_hit_tokens", "store_hit_tokens",
        "recomputed_tokens", "host_to_device_bytes", "store_to_host_bytes")}
    total["reuse_pct"] = round(100.0 * total["reused_tokens"] / max(1, total["input_tokens"]), 3)
    total["store_bytes_per_reused_token"] = round(total["store_to_host_bytes"] / max(1, total["reused_tokens"]), 1)
    total["per_instance_reuse_pct"] = [round(r.reuse_pct, 3) for r in results]
    total["per_instance_requests"] = load
    total.update(instances=instances, routing=routing, shared_store=shared_store,
                 store_published=tier.published if tier else 0)
    return total


def _mamba_type():
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    return ComponentType.MAMBA
