"""Host (CPU DRAM) tier of the hybrid radix cache.

* :class:`HostTier`: the index, keyed by page-prefix hashes (:func:`page_hash`) and checkpoint
  hashes, with its own byte budget (LRU); what the trace replay and the serving path share;
* :class:`HostPayloadStore`: the host copies of KV rows and checkpoint tensors that the serving
  path moves (docs/hybrid-cache.md says what is wired where);
* :class:`HostMatch`: the result of :meth:`HybridRadixCache.match_with_host`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

if TYPE_CHECKING:
    from sglang_hybrid.mem_cache.hybrid_radix_cache import HybridRadixCache


def page_hash(prev: bytes, tokens) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(memoryview(tokens).cast("B") if hasattr(tokens, "typecode") else bytes(tokens))
    return h.digest()


ROOT_HASH = b"\0" * 16


class UnsupportedHostCopy(RuntimeError):
    """The KV pool's host copy has a layout the host tier cannot page."""


class HostTier:
    """Host-memory (CPU DRAM) tier of KV pages and checkpoints, LRU, byte-budgeted.

    Entries are keyed by the hash of the whole token prefix they end at (a page
    ending at position ``p`` under ``hash(tokens[0:p])``, a checkpoint at ``p``
    under the same hash), so a lookup needs no tree: a chain of page hashes from
    the root finds how far the host copy reaches.

    Args:
        budget_bytes: host capacity in bytes (0 disables the tier).
        page_bytes: bytes of one KV page (page tokens x KV bytes per token).
        state_bytes: bytes of one checkpoint (all recurrent layers).
    """

    def __init__(self, budget_bytes: int, page_bytes: int, state_bytes: int, on_drop=None):
        if budget_bytes < 0 or page_bytes <= 0 or state_bytes <= 0:
            raise ValueError(
                f"budget_bytes must be >= 0 and page/state bytes > 0, got {budget_bytes}, {page_bytes}, {state_bytes}"
            )
        self.budget_bytes = int(budget_bytes)
        self.page_bytes = int(page_bytes)
        self.state_bytes = int(state_bytes)
        self._lru: "OrderedDict[Tuple[str, bytes], int]" = OrderedDict()
        self.used_bytes = 0
        self.num_checkpoints = 0
        self.num_pages = 0
        self._on_drop = on_drop

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def _put(self, kind: str, h: bytes, nbytes: int) -> None:
        k = (kind, h)
        if k in self._lru:
            self._lru.move_to_end(k)
            return
        if nbytes > self.budget_bytes:
            return
        while self.used_bytes + nbytes > self.budget_bytes and self._lru:
            (okind, oh), ob = self._lru.popitem(last=False)
            self.used_bytes -= ob
            if self._on_drop is not None:
                self._on_drop(okind, oh)
            if okind == "s":
                self.num_checkpoints -= 1
            else:
                self.num_pages -= 1
        self._lru[k] = nbytes
        self.used_bytes += nbytes
        if kind == "s":
            self.num_checkpoints += 1
        else:
            self.num_pages += 1

    def put_pages(self, hashes: Sequence[bytes]) -> None:
        if self.enabled:
            for h in hashes:
                self._put("p", h, self.page_bytes)

    def put_checkpoint(self, h: bytes) -> None:
        if self.enabled:
            self._put("s", h, self.state_bytes)

    def has_page(self, h: bytes) -> bool:
        return ("p", h) in self._lru

    def has_checkpoint(self, h: bytes) -> bool:
        return ("s", h) in self._lru

    def clear(self) -> None:
        """Drop every entry (``on_drop`` is called for each, so payloads are freed)."""
        while self._lru:
            (kind, h), _ = self._lru.popitem(last=False)
            if self._on_drop is not None:
                self._on_drop(kind, h)
        self.used_bytes = self.num_checkpoints = self.num_pages = 0

    def touch(self, kind: str, h: bytes) -> None:
        k = (kind, h)
        if k in self._lru:
            self._lru.move_to_end(k)




@dataclass
class HostMatch:
    """Result of :meth:`HybridRadixCache.match_with_host`. Lengths in tokens."""

    resume_len: int  # where the request resumes (device or host resume point)
    device_resume_len: int
    host_hit_len: int  # tokens restored from the host tier (resume_len - device_resume_len)
    kv_hit_len: int  # longest KV match on device or host
    last_node: object
    loaded_bytes: int
    store_hit_len: int = 0  # part of host_hit_len read from the store tier first


class HostPayloadStore:
    """Host copies of KV rows and checkpoint tensors, keyed like :class:`HostTier`.

    KV is copied per evicted tree node (its rows of every full-attention layer)
    and addressed per page; a checkpoint is its slot's conv windows and
    recurrent state. Copies go through :class:`~sglang_hybrid.mem_cache.host_copy.HostCopier`:
    asynchronous write-back on a GPU (side stream, pinned memory, the compute
    stream waits on the device before reusing the freed slots) with an explicit
    synchronisation before a restored entry is used; synchronous on a CPU.

    KV pools copied directly are upstream's plain ones, by exact type (:data:`ROW_POOLS`): MLA
    (``kv_buffer``, one row per token slot), MHA (``k_buffer`` + ``v_buffer``), the hybrid
    linear-attention wrapper around either, and Qwen3.8's QSA pool, whose compressed indexer keys
    (``qsa_compressed_k_buffer_pool``) mirror the token slots 1:``ratio``: a page of ``P`` token
    rows owns compressed rows ``[slot0 / ratio, slot0 / ratio + P / ratio)`` (``P`` a multiple of
    ``ratio``, pages page-aligned), copied with it. QSA's per-request pending ring is not copied:
    resume points are page ends, where no group is pending. Other pools (DCP-interleaved KV,
    quantized variants) use upstream's synchronous ``get_cpu_copy`` / ``load_cpu_copy`` when it
    returns row tensors, else the host tier is turned off (:class:`UnsupportedHostCopy`). State
    pools with side slots likewise use upstream's copies.

    A page's rows, as :meth:`page_rows` returns them and the store tier keeps them, are a flat
    list: every buffer of group 0, then of group 1, ... (``P / divisor`` rows each).
    """

    ROW_POOLS = ("MLATokenToKVPool", "MHATokenToKVPool", "HybridLinearKVPool", "QSATokenToKVPool")

    def __init__(self, cache: "HybridRadixCache"):
        from sglang_hybrid.mem_cache.host_copy import HostCopier

        self.cache = cache
        # seg id -> [[HostCopy per group], live pages]
        self._segments: Dict[int, list] = {}
        self._page_loc: Dict[bytes, Tuple[int, int]] = {}
        self._states: Dict[bytes, object] = {}
        self._next = 0
        self._groups = self._row_groups()
        self._kv_direct = self._groups is not None
        mp, _ = self._mamba_pool()
        self._state_direct = not getattr(mp, "_slot_siblings", None)
        dev = self._groups[0][0][0].device if self._groups else torch_device_cpu()
        self.copier = HostCopier(dev)

    def _kv_pool(self):
        kv = self.cache.token_to_kv_pool_allocator.get_kvcache()
        return getattr(kv, "full_kv_pool", kv)

    def _row_groups(self):
        """``[(buffers, divisor)]`` of the pool's per-slot row buffers (class docstring), or None when the
        pool is not one this class copies directly."""
        outer = self.cache.token_to_kv_pool_allocator.get_kvcache()
        kv = getattr(outer, "full_kv_pool", outer)
        if type(outer).__name__ not in self.ROW_POOLS or type(kv).__name__ not in self.ROW_POOLS:
            return None
        if getattr(kv, "_write_loc_dcp_span", 1) not in (None, 1) or getattr(kv, "use_hnd", False):
            return None
        if getattr(kv, "kv_buffer", None):
            groups = [(list(kv.kv_buffer), 1)]
        elif getattr(kv, "k_buffer", None) and getattr(kv, "v_buffer", None):
            groups = [(list(kv.k_buffer) + list(kv.v_buffer), 1)]
        else:
            return None
        compressed = getattr(outer, "qsa_compressed_k_buffer_pool", None)
        if compressed:
            ratio = int(outer.qsa_compress_ratio)
            if ratio < 1 or self.cache.page_size % ratio:
                return None
            groups.append((list(compressed), ratio))
        return groups

    def _mamba_pool(self):
        pool = self.cache.req_to_token_pool
        return pool.mamba_pool, pool.translate_mamba_indices

    def _state_buffers(self):
        mc = self._mamba_pool()[0].mamba_cache
        return list(mc.conv) + [mc.temporal]

    @staticmethod
    def _group_indices(indices, divisor: int):
        flat = indices.view(-1)
        return flat if divisor == 1 else flat[::divisor] // divisor

    def _save_rows(self, indices) -> list:
        """One HostCopy per group of the rows at token slots ``indices`` (asynchronous on a GPU)."""
        return [self.copier.save(bufs, self._group_indices(indices, d), dim=0) for bufs, d in self._groups]

    def _upstream_rows(self, indices) -> list:
        import torch

        per_layer = self._kv_pool().get_cpu_copy(indices)
        if not all(isinstance(x, torch.Tensor) for c in per_layer for x in c):
            raise UnsupportedHostCopy(
                f"{type(self._kv_pool()).__name__}.get_cpu_copy returns per-layer parts that are not row "
                "tensors, which the host tier cannot split into pages (not supported for this model's KV pool)")
        return [torch.cat(c) if len(c) else None for c in per_layer]

    def _slice(self, rows, i: int) -> list:
        """Page ``i`` (views) of flat per-buffer rows covering a run of whole pages: ``page / divisor``
        rows of each buffer (class docstring)."""
        page = self.cache.page_size
        divisors = [d for bufs, d in self._groups for _ in bufs] if self._kv_direct else [1] * len(rows)
        return [None if t is None else t[i * (page // d) : (i + 1) * (page // d)] for t, d in zip(rows, divisors)]

    def save_kv(self, page_hashes: List[bytes], indices) -> None:
        from sglang_hybrid.mem_cache.host_copy import HostCopy

        todo = [i for i, h in enumerate(page_hashes) if h not in self._page_loc]
        if not todo:
            return
        copies = self._save_rows(indices) if self._kv_direct else [HostCopy(self._upstream_rows(indices), None, 0)]
        sid = self._next
        self._next += 1
        self._segments[sid] = [copies, len(todo)]
        for i in todo:
            self._page_loc[page_hashes[i]] = (sid, i)

    def save_state(self, h: bytes, slot) -> None:
        if h in self._states:
            return
        pool, translate = self._mamba_pool()
        idx = translate(slot.view(-1))
        if self._state_direct:
            self._states[h] = self.copier.save(self._state_buffers(), idx, dim=1)
        else:
            self._states[h] = pool.get_cpu_copy(idx)

    def drop(self, kind: str, h: bytes) -> None:
        if kind == "s":
            self._states.pop(h, None)
            return
        loc = self._page_loc.pop(h, None)
        if loc is None:
            return
        seg = self._segments[loc[0]]
        seg[1] -= 1
        if seg[1] <= 0:
            del self._segments[loc[0]]

    def _page_slices(self, copies, pi: int) -> list:
        for c in copies:
            c.wait()  # explicit synchronisation before first use
        return self._slice([t for c in copies for t in c.tensors], pi)

    def page_rows(self, h: bytes):
        """Every buffer's rows of the page ``h`` (CPU tensors, None for a layer without KV; the flat
        layout of the class docstring), waiting for the device->host copy; None when not held."""
        loc = self._page_loc.get(h)
        if loc is None:
            return None
        return [None if t is None else t.clone() for t in self._page_slices(self._segments[loc[0]][0], loc[1])]

    def device_rows(self, indices):
        """Every buffer's KV rows at the device token slots ``indices`` (CPU tensors, flat layout)."""
        if not self._kv_direct:
            return self._upstream_rows(indices)
        out = []
        for c in self._save_rows(indices):
            c.wait()
            out.extend(c.tensors)
        return out

    def slice_page(self, rows, i: int) -> list:
        """Page ``i`` (copies) of rows returned by :meth:`device_rows` for a run of whole pages."""
        return [None if t is None else t.clone() for t in self._slice(rows, i)]

    def device_state(self, slot):
        """``(tensors, dim)`` of the state slot ``slot`` copied now (not kept), in :meth:`state_tensors`' form."""
        pool, translate = self._mamba_pool()
        idx = translate(slot.view(-1))
        if not self._state_direct:
            return pool.get_cpu_copy(idx), -1
        copy = self.copier.save(self._state_buffers(), idx, dim=1)
        copy.wait()
        return list(copy.tensors), copy.dim

    def state_tensors(self, h: bytes):
        """``(tensors, dim)`` of the checkpoint ``h`` for the store, or None when not held. A state pool
        with side slots (upstream's ``get_cpu_copy`` tuple: conv, temporal, siblings) is stored as that
        tuple with ``dim = -1``."""
        state = self._states.get(h)
        if state is None:
            return None
        if not self._state_direct:
            return state, -1
        state.wait()
        return list(state.tensors), state.dim

    def add_page(self, h: bytes, rows) -> None:
        """Hold a page read from the store (rows as :meth:`page_rows` returns them).

        Raises:
            ValueError: ``rows`` does not have one entry per buffer of this pool.
        """
        from sglang_hybrid.mem_cache.host_copy import HostCopy

        if h in self._page_loc:
            return
        rows = list(rows)
        sizes = [len(bufs) for bufs, _ in self._groups] if self._kv_direct else [len(rows)]
        if sum(sizes) != len(rows):
            raise ValueError(f"page rows: {len(rows)} tensors for a pool of {sum(sizes)} buffers")
        copies, at = [], 0
        for n in sizes:
            copies.append(HostCopy(rows[at : at + n], None, 0))
            at += n
        sid = self._next
        self._next += 1
        self._segments[sid] = [copies, 1]
        self._page_loc[h] = (sid, 0)

    def add_state(self, h: bytes, tensors, dim: int) -> None:
        """Hold a checkpoint read from the store (``dim = -1``: the pool's own host-copy object)."""
        from sglang_hybrid.mem_cache.host_copy import HostCopy

        if h not in self._states:
            self._states[h] = tensors if dim < 0 else HostCopy(list(tensors), None, dim)

    def has(self, page_hashes: List[bytes], state_hash: bytes) -> bool:
        return state_hash in self._states and all(h in self._page_loc for h in page_hashes)

    def load(self, page_hashes: List[bytes], kv_indices, state_hash: bytes, slot) -> None:
        import torch

        from sglang_hybrid.mem_cache.host_copy import HostCopy

        if page_hashes:
            pages = [self._page_slices(self._segments[self._page_loc[h][0]][0], self._page_loc[h][1])
                     for h in page_hashes]
            rows = [None if any(p[b] is None for p in pages) else torch.cat([p[b] for p in pages])
                    for b in range(len(pages[0]))]
            if self._kv_direct:
                at = 0
                for bufs, d in self._groups:
                    self.copier.load(HostCopy(rows[at : at + len(bufs)], None, 0), bufs,
                                     self._group_indices(kv_indices, d))
                    at += len(bufs)
            else:
                pool = self._kv_pool()
                chunk = getattr(pool, "cpu_offloading_chunk_size", None)
                per_layer = []
                for r in rows:
                    if r is None:
                        per_layer.append([])
                        continue
                    c = chunk or len(r)
                    per_layer.append([r[i : i + c] for i in range(0, len(r), c)])
                pool.load_cpu_copy(per_layer, kv_indices)
        mpool, translate = self._mamba_pool()
        idx = translate(slot.view(-1))
        state = self._states[state_hash]
        if self._state_direct:
            self.copier.load(state, self._state_buffers(), idx)
        else:
            mpool.load_cpu_copy(state, idx)


def torch_device_cpu():
    import torch

    return torch.device("cpu")
