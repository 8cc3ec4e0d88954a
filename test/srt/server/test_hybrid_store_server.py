"""The store tier (issue 45) through real servers sharing one local-file store (``--hybrid-store file``).

Server A serves a prompt, a flood pushes it to the host tier (and so to the store: pages, checkpoint,
then the publication marker); A stops. Server B, a new process on the same store (a second instance,
or A restarted), serves the prompt from the store: ``cached_tokens_details`` says ``storage``, the
tokens equal A's cold ones. Then the failure cases: KV pages and a marker whose checkpoint the store
lost are never used (test_store.py covers the unpublished and corrupt entries); a store that breaks mid-run or cannot be opened at start
only makes requests recompute, with a warning and ``sglang:hybrid_cache_store_failures_total``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import unittest

import requests

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_kimi_k3

ARGS = cpu_server_args(max_total_tokens=1600, max_mamba_cache_size=16) + [
    "--page-size", "16", "--chunked-prefill-size", "256", "--hybrid-host-cache-gb", "0.05", "--enable-metrics"]


def ids(seed: int, n: int):
    rng = random.Random(seed)
    return [rng.randrange(10, 960) for _ in range(n)]


SENTINEL = ids(6, 330)
FLOODS = [ids(40 + i, 300) for i in range(6)]


def gen(url, prompt, n=6):
    r = requests.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": n}}, timeout=300)
    r.raise_for_status()
    meta = r.json()["meta_info"]
    return r.json()["output_ids"], meta["cached_tokens"], meta.get("cached_tokens_details") or {}


def failures(url) -> float:
    text = requests.get(url + "/metrics", timeout=30).text
    m = re.search(r"^sglang:hybrid_cache_store_failures_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def store_args(tmp, path, **extra):
    cfg = os.path.join(tmp, f"store-{abs(hash(path))}-{len(extra)}.json")
    with open(cfg, "w") as f:
        json.dump({"path": path, **extra}, f)
    return ["--hybrid-store", "file", "--hybrid-store-config", cfg]


class TestHybridStoreServers(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        cls.tmp = tempfile.mkdtemp(prefix="sglang-hybrid-store-")
        store = os.path.join(cls.tmp, "store")
        with LaunchedServer(cls.model, ARGS + store_args(cls.tmp, store)) as a:
            cls.cold = gen(a.base_url, SENTINEL)
            for p in FLOODS:
                gen(a.base_url, p, n=2)
            with open(a.log_path, errors="replace") as f:
                cls.log_a = f.read()
        cls.markers = sorted(os.listdir(os.path.join(store, *cls._ns_dirs(store), "rp")))
        # a copy of the store whose checkpoints are gone but markers and KV pages are not: what a store
        # that evicts objects on its own (Mooncake's master) can leave
        stateless = os.path.join(cls.tmp, "stateless")
        shutil.copytree(store, stateless)
        shutil.rmtree(os.path.join(stateless, *cls._ns_dirs(store), "st"))
        with LaunchedServer(cls.model, ARGS + store_args(cls.tmp, store)) as b:
            cls.from_store = gen(b.base_url, SENTINEL)
            cls.again = gen(b.base_url, SENTINEL)
            # the store breaks mid-run: its directory becomes a file
            shutil.rmtree(store)
            open(store, "w").close()
            cls.after_break = [gen(b.base_url, p, n=2) for p in FLOODS] + [gen(b.base_url, ids(77, 330))]
            cls.broken_failures = failures(b.base_url)
            with open(b.log_path, errors="replace") as f:
                cls.log_b = f.read()
        with LaunchedServer(cls.model, ARGS + store_args(cls.tmp, stateless)) as c:
            cls.stateless = gen(c.base_url, SENTINEL)
        # unreachable at start: the configured directory lies under a regular file
        with LaunchedServer(cls.model, ARGS + store_args(cls.tmp, os.path.join(store, "sub"))) as d:
            cls.start_down = gen(d.base_url, SENTINEL)
            cls.start_down_failures = failures(d.base_url)
            with open(d.log_path, errors="replace") as f:
                cls.log_d = f.read()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @staticmethod
    def _ns_dirs(store):
        """``sglang-hybrid/<model hash>/tp0``: the namespace directories of the only model written."""
        top = os.path.join(store, "sglang-hybrid")
        (model,) = os.listdir(top)
        return ["sglang-hybrid", model, "tp0"]

    def test_writer_published_resume_points(self):
        self.assertIn("hybrid cache: store tier file", self.log_a)
        self.assertGreater(len(self.markers), 0, "server A published no resume point")

    def test_second_instance_resumes_from_the_store_with_cold_tokens(self):
        out, cached, details = self.from_store
        self.assertEqual(out, self.cold[0])
        self.assertEqual(self.cold[1], 0)
        self.assertGreater(int(details.get("storage", 0)), 0, f"no storage hit: {details}")
        self.assertEqual(cached, int(details.get("storage", 0)) + int(details.get("device", 0))
                         + int(details.get("host", 0)))
        self.assertEqual(self.again[0], self.cold[0])
        self.assertGreaterEqual(self.again[1], cached)  # now on the device

    def test_store_broken_mid_run_only_recomputes(self):
        self.assertEqual(len(self.after_break), 7)  # every request answered (gen raises on an HTTP error)
        self.assertGreater(self.broken_failures, 0)
        self.assertIn("hybrid cache store: lookup failed", self.log_b)

    def test_kv_without_its_state_is_never_used(self):
        out, cached, details = self.stateless
        self.assertEqual(out, self.cold[0])
        self.assertEqual((cached, int(details.get("storage", 0))), (0, 0))

    def test_store_down_at_start_serves_without_it(self):
        self.assertIn("unreachable at start", self.log_d)
        self.assertEqual(self.start_down[0], self.cold[0])
        self.assertEqual(self.start_down[1], 0)
        self.assertGreaterEqual(self.start_down_failures, 1)


class TestHybridStoreWriteThrough(CustomTestCase):
    """``"write_policy": "write_through"`` in the store config: a checkpoint is published when it is
    made, so a second instance running at the same time resumes a prefix the first one still holds on
    its device (with write-back the entry would wait for that instance's eviction)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sglang-hybrid-store-wt-")
        store = os.path.join(cls.tmp, "store")
        flags = ARGS + store_args(cls.tmp, store, write_policy="write_through")
        with LaunchedServer(tiny_kimi_k3(), flags) as a, LaunchedServer(tiny_kimi_k3(), flags) as b:
            cls.cold = gen(a.base_url, SENTINEL)
            cls.on_b = gen(b.base_url, SENTINEL)
            cls.again_a = gen(a.base_url, SENTINEL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_other_instance_resumes_at_once_with_cold_tokens(self):
        out, cached, details = self.on_b
        self.assertGreater(int(details.get("storage", 0)), 0, f"B did not resume from the store: {details}")
        self.assertEqual(out, self.cold[0])
        self.assertGreater(self.again_a[1], 0)  # A still serves it from its own device
        self.assertEqual(self.again_a[0], self.cold[0])


if __name__ == "__main__":
    unittest.main()
