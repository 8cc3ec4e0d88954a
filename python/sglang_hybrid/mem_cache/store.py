"""Third tier of the hybrid radix cache: resume points in a store shared by server instances (issue 45).

A resume point at position ``p`` is the attention KV of every page of ``[0, p)`` plus the recurrent
checkpoint at ``p``; one without the other is useless (KV without the state recomputes everything,
a state without the KV gives wrong tokens). The store keeps three kinds of objects under the hash of
the token prefix they end at (the host tier's page hashes, so equal prefixes meet across instances):

* ``<ns>/kv/<hash>``: one KV page (every layer's rows of its ``page`` tokens);
* ``<ns>/st/<hash>``: one checkpoint (every recurrent layer's conv and temporal state);
* ``<ns>/rp/<hash>``: the publication marker of the resume point at that hash.

Consistency rule: a writer puts the marker **last**, after the state and every page of ``[0, p)``
are in the store; a reader uses a resume point only when the marker exists, and reads every page and
the state into memory **before** touching the device, so a failed or missing read (half-written
entry, store eviction, store unreachable) leaves the request on its device / host match: restored
together or not at all. ``<ns>`` names the model and layout (checkpoint config hash, KV and state
bytes, page size, TP rank, dtype): instances serving another model never read these entries.

Backends behind :class:`HybridStore`: :class:`LocalFileStore` (a directory, e.g. on a shared or
network file system; writes are atomic renames) and :class:`MooncakeStore` (Mooncake Store's
``MooncakeDistributedStore``; needs the ``mooncake-transfer-engine`` package and a running
``mooncake_master``). Selected with ``--hybrid-store file|mooncake`` and
``--hybrid-store-config FILE`` (JSON; docs/hybrid-cache.md, "Store tier").
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from typing import Dict, List, Optional, Sequence

import torch

logger = logging.getLogger("sglang_hybrid.store")

KINDS = ("file", "mooncake")


class StoreError(RuntimeError):
    """A store operation failed (unreachable, refused, corrupt entry)."""


class HybridStore(ABC):
    """Byte objects under string keys. Implementations raise :class:`StoreError` on failure."""

    @abstractmethod
    def exists(self, keys: Sequence[str]) -> List[bool]:
        """Whether each key is stored."""

    @abstractmethod
    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing any value)."""

    @abstractmethod
    def get(self, key: str) -> Optional[bytes]:
        """The value under ``key``, or None when absent."""

    def close(self) -> None:
        """Release connections (default: nothing)."""


class LocalFileStore(HybridStore):
    """Objects as files under ``path`` (created if missing). A write goes to a temporary file in the
    same directory and is renamed into place, so a reader never sees a partial object; a killed
    writer leaves at most a ``.tmp`` file, which no reader opens.

    Raises:
        ValueError: ``path`` is empty.
    """

    def __init__(self, path: str):
        if not path:
            raise ValueError("LocalFileStore: 'path' must name a directory")
        self.path = os.path.abspath(path)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot use {self.path}: {exc}") from exc

    def _file(self, key: str) -> str:
        return os.path.join(self.path, *key.split("/"))

    def exists(self, keys: Sequence[str]) -> List[bool]:
        if not os.path.isdir(self.path):  # removed or replaced under us: the store is gone, not empty
            raise StoreError(f"{self.path} is not a directory any more")
        try:
            return [os.path.isfile(self._file(k)) for k in keys]
        except OSError as exc:
            raise StoreError(str(exc)) from exc

    def put(self, key: str, value: bytes) -> None:
        f = self._file(key)
        try:
            os.makedirs(os.path.dirname(f), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(f), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(value)
            os.replace(tmp, f)
        except OSError as exc:
            raise StoreError(f"write {key}: {exc}") from exc

    def get(self, key: str) -> Optional[bytes]:
        try:
            with open(self._file(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"read {key}: {exc}") from exc


class MooncakeStore(HybridStore):
    """Mooncake Store (``mooncake.store.MooncakeDistributedStore``), TCP transport by default.

    Config keys: ``master_server_address`` (``host:port`` of ``mooncake_master``, required),
    ``metadata_server`` (e.g. ``http://host:port/metadata`` of the master's HTTP metadata server,
    default ``P2PHANDSHAKE``), ``local_hostname`` (default ``127.0.0.1``), ``protocol`` (default
    ``tcp``), ``device_name`` (RDMA devices, default none), ``global_segment_size`` (bytes this
    instance contributes to the store, default 64 MiB; 0 to only use other nodes' memory) and
    ``local_buffer_size`` (default 16 MiB). Objects live in the segments of the clients that
    contribute memory: for entries that outlive an instance, run a store node (a long-lived
    client that mounts memory, e.g. Mooncake's ``mooncake_store_service``).

    Raises:
        StoreError: the package cannot be imported or the client cannot set up.
    """

    def __init__(self, config: Dict):
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:  # the package, or its system libraries (libibverbs)
            raise StoreError(f"mooncake-transfer-engine not importable: {exc}") from exc
        if not config.get("master_server_address"):
            raise StoreError("mooncake store config needs 'master_server_address'")
        self._store = MooncakeDistributedStore()
        rc = self._store.setup(
            config.get("local_hostname", "127.0.0.1"),
            config.get("metadata_server", "P2PHANDSHAKE"),
            int(config.get("global_segment_size", 64 << 20)),
            int(config.get("local_buffer_size", 16 << 20)),
            config.get("protocol", "tcp"),
            config.get("device_name", ""),
            config["master_server_address"],
        )
        if rc != 0:
            raise StoreError(f"MooncakeDistributedStore.setup returned {rc} (master {config['master_server_address']})")

    def exists(self, keys: Sequence[str]) -> List[bool]:
        res = self._store.batch_is_exist(list(keys))
        if any(r < 0 for r in res):
            raise StoreError(f"batch_is_exist returned an error for {sum(r < 0 for r in res)} key(s)")
        return [r == 1 for r in res]

    def put(self, key: str, value: bytes) -> None:
        rc = self._store.put(key, value)
        if rc != 0:
            raise StoreError(f"put({key}) returned {rc}")

    def get(self, key: str) -> Optional[bytes]:
        data = self._store.get(key)
        return bytes(data) if data else None

    def close(self) -> None:
        self._store.close()


def open_store(kind: str, config_path: Optional[str]) -> HybridStore:
    """The backend ``kind`` with the JSON config at ``config_path``.

    Raises:
        ValueError: unknown ``kind``, missing or unreadable config.
        StoreError: the backend could not start (e.g. Mooncake master unreachable).
    """
    if kind not in KINDS:
        raise ValueError(f"--hybrid-store must be one of {', '.join(KINDS)}, got {kind!r}")
    if not config_path:
        raise ValueError("--hybrid-store needs --hybrid-store-config FILE (JSON)")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--hybrid-store-config {config_path}: {exc}") from exc
    policy = config.get("write_policy", WRITE_BACK)
    if policy not in WRITE_POLICIES:
        raise ValueError(f"--hybrid-store-config {config_path}: write_policy must be one of "
                         f"{', '.join(WRITE_POLICIES)}, got {policy!r}")
    store = LocalFileStore(config.get("path", "")) if kind == "file" else MooncakeStore(config)
    store.write_policy = policy
    return store


WRITE_BACK, WRITE_THROUGH = "write_back", "write_through"
WRITE_POLICIES = (WRITE_BACK, WRITE_THROUGH)


def pack(tensors) -> bytes:
    """Serialise a list of CPU tensors (None allowed) with ``torch.save``."""
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


def unpack(data: bytes):
    """Inverse of :func:`pack`.

    Raises:
        StoreError: the bytes are not a saved object (corrupt or foreign entry).
    """
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        raise StoreError(f"corrupt store entry: {exc}") from exc


class StoreTier:
    """The cache's view of a :class:`HybridStore`: keys in a namespace, the publication rule, and
    failures turned into misses (a warning once per kind of failure, a counter always).

    Args:
        store: the backend.
        namespace: model / layout identity (see the module docstring).
    """

    def __init__(self, store: HybridStore, namespace: str):
        self.store = store
        self.ns = namespace
        # write_back: an entry is written when it leaves the device; write_through: also when the
        # checkpoint is made (other instances can resume it at once)
        self.write_policy = getattr(store, "write_policy", WRITE_BACK)
        self.failures = 0
        self.reads = 0
        self.writes = 0
        self.published = 0
        self._warned = set()
        self._lock = threading.Lock()

    def key(self, kind: str, h: bytes) -> str:
        return f"{self.ns}/{kind}/{h.hex()}"

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            first = what not in self._warned
            self._warned.add(what)
        if first:
            logger.warning("hybrid cache store: %s failed (%s); requests recompute instead (further failures "
                           "of this kind are counted, not logged)", what, exc)

    def exists(self, kind: str, hashes: Sequence[bytes]) -> List[bool]:
        """Per hash, whether the object exists; all False when the store fails."""
        if not hashes:
            return []
        try:
            return self.store.exists([self.key(kind, h) for h in hashes])
        except Exception as exc:
            self._failed("lookup", exc)
            return [False] * len(hashes)

    def put_page(self, h: bytes, rows) -> bool:
        return self._put("kv", h, pack(rows))

    def put_state(self, h: bytes, tensors, dim: int) -> bool:
        return self._put("st", h, pack({"dim": dim, "tensors": tensors}))

    def publish(self, h: bytes, page_hashes: Sequence[bytes]) -> bool:
        """Put the marker of the resume point at ``h`` once its state and ``page_hashes`` are all stored."""
        if not all(self.exists("kv", page_hashes)) or not all(self.exists("st", [h])):
            return False
        ok = self._put("rp", h, b"1")
        if ok:
            self.published += 1
        return ok

    def _put(self, kind: str, h: bytes, data: bytes) -> bool:
        try:
            self.store.put(self.key(kind, h), data)
            self.writes += 1
            return True
        except Exception as exc:
            self._failed("write", exc)
            return False

    def read(self, page_hashes: Sequence[bytes], state_hash: bytes):
        """``(pages, state)`` of a published resume point, all read before returning, or None when any
        part is missing, unreadable or corrupt (then nothing of it is used)."""
        try:
            if not self.store.exists([self.key("rp", state_hash)])[0]:
                return None
            pages = []
            for h in page_hashes:
                data = self.store.get(self.key("kv", h))
                if data is None:
                    return None
                pages.append(unpack(data))
            data = self.store.get(self.key("st", state_hash))
            if data is None:
                return None
            state = unpack(data)
            self.reads += 1
            return pages, state
        except Exception as exc:
            self._failed("read", exc)
            return None
