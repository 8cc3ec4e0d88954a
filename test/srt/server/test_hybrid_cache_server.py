"""The hybrid radix cache through the real server: cases K1, K2, K3, K5, K6, K7, K12 (issue #3).

One server with our cache (the default for the tiny Kimi K3 model; page 16,
chunked prefill 256, small pools and a host tier so eviction and host restores
happen), then one with ``--disable-radix-cache`` for the reference outputs; they
run one after the other; a third server runs the same prompts under one joint device byte
budget for KV + checkpoints (``--hybrid-device-cache-gb``) small enough to force evictions. Upstream's idle invariant checker runs in strict mode
(``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1``): a pool whose free + evictable
+ locked != capacity raises in the scheduler and kills the server, so "still
healthy after idle" is the leak oracle for K12.

Expected ``cached_tokens`` (grid = lcm(chunk 64, page 16) = 64): a prompt resumes
at the deepest checkpoint strictly before its last token; checkpoints sit at
prompt ends aligned down to 64 and at branch points (aligned KV match).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import re
import time
import unittest

import requests

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from tiny_model import tiny_kimi_k3

GRID = 64
# tiny Kimi K3: 640 B of KV per token, 125,952 B per checkpoint: 1.2 MB holds ~1,900 tokens of KV
# or ~9 checkpoints; the pools below are 1,600 tokens (1.0 MB) + 16 slots (2.0 MB).
JOINT_BUDGET_GB = 0.0012
STRICT = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
# --log-level debug: the per-request "hybrid-cache match" / "checkpoint" / "joint budget" lines are DEBUG
COMMON = ["--page-size", "16", "--chunked-prefill-size", "256", "--log-level", "debug"]


def ids(seed: int, n: int):
    rng = random.Random(seed)
    return [rng.randrange(10, 960) for _ in range(n)]


def _post(url, input_ids, n, timeout):
    """One /generate call: greedy, ``n`` new tokens; ``input_ids`` one prompt or a list of them."""
    r = requests.post(
        url + "/generate",
        json={"input_ids": input_ids, "sampling_params": {"temperature": 0, "max_new_tokens": n}},
        timeout=timeout,
    )
    r.raise_for_status()
    return r.json()


def _result(j):
    return j["output_ids"], j["meta_info"]["cached_tokens"]


def generate_batch(url, prompts, n=6, timeout=300):
    """One /generate call with several prompts (they reach the scheduler together)."""
    return [_result(j) for j in _post(url, prompts, n, timeout)]


def generate(url, prompt, n=6, timeout=300, details=None):
    """``(output_ids, cached_tokens)``; ``details``: a list that receives ``meta_info.cached_tokens_details``."""
    j = _post(url, prompt, n, timeout)
    if details is not None:
        details.append(j["meta_info"].get("cached_tokens_details"))
    return _result(j)


# (name, prompt) in sending order; built once so both servers see the same prompts
P400 = ids(1, 400)
SYS = ids(2, 150)
SENTINEL = ids(3, 330)
CASES = []
CASES += [("K1 cold", P400), ("K1 warm", P400), ("K1 shared 384", P400[:384] + ids(4, 36))]
for k, extra in enumerate((0, 1, 2, 63)):
    p = ids(10 + k, 128 + extra)
    CASES += [(f"K2 {len(p)} cold", p), (f"K2 {len(p)} warm", p)]
for i in range(4):
    CASES.append((f"K5 L=150 #{i}", SYS + ids(20 + i, 100)))
P128 = ids(30, 128)
CASES += [("K6 P", P128), ("K6 P+2", P128 + ids(31, 2)), ("K6 P+50", P128 + ids(32, 50))]
CASES += [("K7 sentinel cold", SENTINEL)]
CASES += [(f"K7 flood {i}", ids(40 + i, 300)) for i in range(6)]
CASES += [("K7 sentinel again", SENTINEL), ("K7 sentinel again 2", SENTINEL)]
# Split + chunked neighbour: W caches SYS2's KV without a checkpoint inside it; then A (branch
# point 128 inside its extend, prompt end 260 beyond) and B (400 tokens, longer than the chunk)
# arrive in one batch. A's prefill is cut at its branch point, so B must not also be chunked in
# that batch (upstream tracks one chunked request; B replacing A made A decode from 128).
SYS2 = ids(80, 150)
SPLIT_W, SPLIT_A, SPLIT_B = SYS2 + ids(81, 110), SYS2 + ids(82, 110), ids(83, 400)

EXPECTED_CACHED = {
    "K1 cold": 0,
    "K1 warm": 384,  # 400 -> checkpoint at 384
    "K1 shared 384": 384,
    "K2 128 warm": 0,  # the last token must be computed and the only checkpoint is at 128
    "K2 129 warm": 128,  # a 1-token recompute tail
    "K2 130 warm": 128,
    "K2 191 warm": 128,
    "K5 L=150 #0": 0,  # stores its prompt end, 192
    "K5 L=150 #1": 0,  # KV matches 144 but no checkpoint there yet (counted as discarded); branch point stored
    "K5 L=150 #2": 128,  # floor(150/64)*64
    "K5 L=150 #3": 128,
    "K6 P": 0,
    "K6 P+2": 128,
    "K6 P+50": 128,  # the state at P was not modified by the 2-token extend
    "K7 sentinel cold": 0,
}


class TestHybridCacheServerCases(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        cls.on, cls.off, cls.on_details = {}, {}, {}
        args = cpu_server_args(max_total_tokens=1600, max_mamba_cache_size=16) + COMMON
        with LaunchedServer(cls.model, args + ["--hybrid-host-cache-gb", "0.05", "--enable-metrics"], env=STRICT) as s:
            for name, p in CASES:
                d = []
                cls.on[name] = generate(s.base_url, p, details=d)
                cls.on_details[name] = d[0]
            generate(s.base_url, SPLIT_W)
            cls.split = generate_batch(s.base_url, [SPLIT_A, SPLIT_B])
            cls.metrics = requests.get(s.base_url + "/metrics", timeout=30).text
            cls.info = requests.get(s.base_url + "/server_info", timeout=30).json()
            cls.k3 = cls._abort_then_retry(s.base_url)
            cls.k12_healthy = cls._abort_storm(s.base_url)
            requests.post(s.base_url + "/flush_cache", timeout=60).raise_for_status()
            cls.metrics_flushed = requests.get(s.base_url + "/metrics", timeout=30).text
            with open(s.log_path, errors="replace") as f:
                cls.log = f.read()
        with LaunchedServer(cls.model, args + ["--hybrid-device-cache-gb", str(JOINT_BUDGET_GB)], env=STRICT) as s:
            cls.joint = {name: generate(s.base_url, p) for name, p in CASES}
            with open(s.log_path, errors="replace") as f:
                cls.joint_log = f.read()
        with LaunchedServer(cls.model, args + ["--disable-radix-cache"], env=STRICT) as s:
            seen = {}
            for name, p in CASES:  # each distinct prompt once
                key = tuple(p)
                if key not in seen:
                    seen[key] = generate(s.base_url, p)
                cls.off[name] = seen[key]
            cls.k3_off = generate(s.base_url, cls.k3["prompt"])[0]
            cls.split_off = [generate(s.base_url, SPLIT_A)[0], generate(s.base_url, SPLIT_B)[0]]
            cls.k3_same_prefix_off = generate(s.base_url, cls.k3["same_prefix_prompt"])[0]

    @staticmethod
    def _abort_then_retry(url):
        """K3: a long chunked prefill aborted (client timeout) after its first chunks, resent at once,
        plus a same-prefix request sent while the first one's chunks are running."""
        prompt = ids(50, 800)
        try:
            requests.post(
                url + "/generate",
                json={"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 6}},
                timeout=1.0,
            )
        except requests.exceptions.Timeout:
            pass
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            a = ex.submit(generate, url, prompt)
            time.sleep(0.5)
            b = ex.submit(generate, url, prompt[:600] + ids(51, 20))
            return {"prompt": prompt, "retry": a.result(), "same_prefix": b.result(),
                    "same_prefix_prompt": prompt[:600] + ids(51, 20)}

    @staticmethod
    def _abort_storm(url):
        """K12: many prefix-sharing requests at concurrency, most cut off by the client mid-way."""
        system = ids(60, 200)

        def one(i):
            try:
                requests.post(
                    url + "/generate",
                    json={"input_ids": system + ids(600 + i, 30 + i % 50),
                          "sampling_params": {"temperature": 0, "max_new_tokens": 40}},
                    timeout=0.2 + (i % 7) * 0.3,
                )
            except requests.exceptions.RequestException:
                pass

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(one, range(24)))
        time.sleep(6)  # drain, then the scheduler goes idle and runs its strict leak check
        generate(url, ids(70, 20))
        time.sleep(3)
        return requests.get(url + "/health", timeout=30).status_code == 200

    def test_outputs_equal_cache_off(self):
        for name, _ in CASES:
            self.assertEqual(self.on[name][0], self.off[name][0], name)
            self.assertEqual(self.off[name][1], 0, name)

    def test_cached_tokens(self):
        got = {k: self.on[k][1] for k in EXPECTED_CACHED}
        self.assertEqual(got, EXPECTED_CACHED)

    def test_k2_warm_first_token_equals_cold(self):
        for name, _ in CASES:
            if name.startswith("K2") and name.endswith("warm"):
                self.assertEqual(self.on[name][0], self.on[name.replace("warm", "cold")][0], name)

    def test_k5_discarded_kv_match_is_counted(self):
        lines = re.findall(r"hybrid-cache match rid=\S+ len=250 device=(\d+) host=(\d+) recomputed=\d+ kv_match_discarded=(\d+)", self.log)
        self.assertEqual([int(x[2]) for x in lines][:2], [0, 144])

    def test_k7_sentinel_restored_from_host(self):
        self.assertEqual(self.on["K7 sentinel again"][0], self.on["K7 sentinel cold"][0])
        self.assertEqual(self.on["K7 sentinel again 2"][0], self.on["K7 sentinel cold"][0])
        # the second resend found the sentinel on the host (the flood pushed it out of the device)
        lines = [(int(d), int(h)) for d, h in re.findall(r"hybrid-cache match rid=\S+ len=330 device=(\d+) host=(\d+)", self.log)]
        self.assertEqual(len(lines), 3)
        # cold: nothing; again: 320 resumed, part of it restored from the host (eviction by value per
        # byte may keep the inner checkpoint of the sentinel's path on the device and send only its
        # tail leaf to the host); again 2: all of it on the device
        self.assertEqual(lines[0], (0, 0))
        self.assertEqual(sum(lines[1]), 320)
        self.assertGreater(lines[1][1], 0)
        self.assertEqual(lines[2], (320, 0))
        self.assertEqual(self.on["K7 sentinel again"][1], 320)
        self.assertEqual(self.on["K7 sentinel again 2"][1], 320)
        # the response's tier split says where the cached tokens came from (upstream's split alone
        # reported the host restore as a device hit)
        self.assertEqual(self.on_details["K7 sentinel again"], {"device": lines[1][0], "host": lines[1][1]})
        self.assertEqual(self.on_details["K7 sentinel again 2"], {"device": 320, "host": 0})
        self.assertEqual(self.on_details["K1 warm"], {"device": EXPECTED_CACHED["K1 warm"], "host": 0})

    def test_server_info_carries_plugin_flags(self):
        """``/server_info`` -> ``internal_states[0].sglang_hybrid.flags``: every plugin flag, the given
        one with its value as the scheduler sees it, the others None."""
        flags = self.info["internal_states"][0]["sglang_hybrid"]["flags"]
        self.assertEqual(float(flags["--hybrid-host-cache-gb"]), 0.05)
        self.assertIsNone(flags["--hybrid-device-cache-gb"])
        self.assertIn("--skip-boot-gates", flags)
        self.assertIn("--speculative-depth-controller", flags)

    def test_metrics_exported(self):
        """Our series under upstream's ``sglang:`` namespace with its rank labels plus tier/kind; hits per
        tier come from upstream's own ``cached_tokens_total`` (our host restores counted as host); the
        gauges read the cache's contents and drop to 0 after ``/flush_cache``."""
        def value(text, name, **labels):
            for m in re.finditer(r"^" + re.escape(name) + r"\{([^}]*)\} ([0-9.e+-]+)$", text, re.M):
                have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                if all(have.get(k) == v for k, v in labels.items()):
                    if name.startswith("sglang:hybrid_cache_"):  # upstream's radix-cache labels
                        self.assertEqual(have.get("cache_type"), "HybridRadixCache")
                        self.assertIn("tp_rank", have)
                    return float(m.group(2))
            self.fail(f"{name}{labels} not in /metrics")

        m = self.metrics
        self.assertGreaterEqual(value(m, "sglang:cached_tokens_total", cache_source="host"), 64)  # K7: one page at least
        self.assertGreater(value(m, "sglang:cached_tokens_total", cache_source="device"), 0)
        self.assertGreaterEqual(value(m, "sglang:hybrid_cache_kv_match_discarded_tokens_total"), 144)
        dev = value(m, "sglang:hybrid_cache_checkpoints", tier="device")
        self.assertGreater(dev, 0)
        self.assertEqual(value(m, "sglang:hybrid_cache_bytes", tier="device", kind="state"), dev * 125952)
        self.assertGreater(value(m, "sglang:hybrid_cache_checkpoints", tier="host"), 0)
        self.assertGreater(value(m, "sglang:hybrid_cache_bytes", tier="host", kind="kv"), 0)
        self.assertNotIn("sglang_hybrid_cache_", m)  # the former unlabelled series are gone
        f = self.metrics_flushed
        for tier in ("device", "host"):
            self.assertEqual(value(f, "sglang:hybrid_cache_checkpoints", tier=tier), 0)
            for kind in ("kv", "state"):
                self.assertEqual(value(f, "sglang:hybrid_cache_bytes", tier=tier, kind=kind), 0)

    def test_split_with_chunked_neighbour_equals_cache_off(self):
        self.assertEqual([out for out, _ in self.split], self.split_off)
        # A's prefill really was cut at its branch point (the case this guards): no resume point,
        # 144 tokens of KV matched, and a checkpoint stored at the chunk end 128
        rid = re.search(r"hybrid-cache match rid=(\S+) len=260 device=0 host=0 recomputed=260 kv_match_discarded=144", self.log)
        self.assertIsNotNone(rid)
        self.assertIn(f"hybrid-cache checkpoint rid={rid.group(1)} state_pos=128 node_depth=128", self.log)

    def test_k3_abort_then_retry_equals_cache_off(self):
        self.assertEqual(self.k3["retry"][0], self.k3_off)
        self.assertEqual(self.k3["same_prefix"][0], self.k3_same_prefix_off)

    def test_joint_budget_evicts_and_outputs_equal_cache_off(self):
        for name, _ in CASES:
            self.assertEqual(self.joint[name][0], self.off[name][0], name)
        self.assertEqual(self.joint["K1 warm"][1], 384)  # the budget still caches
        self.assertIn(f"joint device budget {int(JOINT_BUDGET_GB * 1e9)} B", self.joint_log)
        evictions = re.findall(r"joint budget: used (\d+) -> (\d+) B \(budget (\d+) B\), checkpoints (\d+) -> (\d+)(.*)", self.joint_log)
        self.assertGreater(len(evictions), 0, "the flood never exceeded the joint budget")
        for before, after, budget, _, _, rest in evictions:
            self.assertGreater(int(before), int(budget))
            if "locked" not in rest:
                self.assertLessEqual(int(after), int(budget))
        # value-aware: some budget evictions dropped checkpoints (not only KV)
        self.assertTrue(any(int(c1) < int(c0) for *_, c0, c1, _ in evictions))
        self.assertNotIn("memory leak detected", self.joint_log)

    def test_k12_no_leak_after_abort_storm(self):
        self.assertTrue(self.k12_healthy)
        self.assertNotIn("memory leak detected", self.log)


if __name__ == "__main__":
    unittest.main()
