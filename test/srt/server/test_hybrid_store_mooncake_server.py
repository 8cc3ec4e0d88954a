"""The store tier on a real Mooncake Store (issue 45): ``mooncake_master`` (HTTP metadata server, TCP
transport) and a store node (a client that contributes memory) started here on localhost, two server
instances one after the other on the tiny Kimi K3.

A serves a prompt and floods it out of its device (its resume point is published in the store), then
stops; B, a new instance, serves it from the store with A's cold tokens; the master is then killed and
B keeps serving (requests recompute; failures counted).

Needs ``mooncake-transfer-engine-non-cuda`` (or the CUDA build) importable, whose client library
links the system's ``libibverbs``; where it is not, the test is reported as skipped with that reason
(the CI machine has neither; the file-store test covers the same tier there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from sglang.test.test_utils import CustomTestCase
from sglang_hybrid.bench.server import LaunchedServer, free_port
from test_hybrid_store_server import ARGS, FLOODS, SENTINEL, failures, gen, ids
from tiny_model import tiny_kimi_k3

try:
    import mooncake
    from mooncake.store import MooncakeDistributedStore  # noqa: F401

    WHY_NOT = None
except Exception as exc:  # ImportError, or OSError from a missing libibverbs
    WHY_NOT = f"Mooncake Store client not importable here ({type(exc).__name__}: {exc})"

NODE = """
import sys, time
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", sys.argv[1], 256 << 20, 16 << 20, "tcp", "", sys.argv[2])
print("store node setup", rc, flush=True)
while rc == 0:
    time.sleep(1)
"""


@unittest.skipIf(WHY_NOT is not None, WHY_NOT or "")
class TestHybridStoreMooncake(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        cls.tmp = tempfile.mkdtemp(prefix="sglang-hybrid-mooncake-")
        rpc, http = free_port(), free_port()
        master_bin = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
        cls.master = subprocess.Popen([master_bin, f"-rpc_port={rpc}", "-enable_http_metadata_server=true",
                                       f"-http_metadata_server_port={http}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metadata, master = f"http://127.0.0.1:{http}/metadata", f"127.0.0.1:{rpc}"
        time.sleep(2)
        cls.node = subprocess.Popen([sys.executable, "-c", NODE, metadata, master],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert "store node setup 0" in cls.node.stdout.readline()
        cfg = os.path.join(cls.tmp, "mooncake.json")
        with open(cfg, "w") as f:
            json.dump({"master_server_address": master, "metadata_server": metadata, "global_segment_size": 0}, f)
        args = ARGS + ["--hybrid-store", "mooncake", "--hybrid-store-config", cfg]
        try:
            with LaunchedServer(cls.model, args) as a:
                cls.cold = gen(a.base_url, SENTINEL)
                for p in FLOODS:
                    gen(a.base_url, p, n=2)
                with open(a.log_path, errors="replace") as f:
                    cls.log_a = f.read()
            with LaunchedServer(cls.model, args) as b:
                cls.from_store = gen(b.base_url, SENTINEL)
                cls.master.kill()  # the store goes away mid-run
                cls.master.wait()
                cls.after = [gen(b.base_url, p, n=2) for p in FLOODS[:3]] + [gen(b.base_url, ids(78, 330))]
                cls.failures = failures(b.base_url)
        finally:
            cls.node.kill()
            if cls.master.poll() is None:
                cls.master.kill()

    def test_second_instance_resumes_from_mooncake(self):
        self.assertIn("hybrid cache: store tier mooncake", self.log_a)
        out, cached, details = self.from_store
        self.assertEqual(out, self.cold[0])
        self.assertGreater(int(details.get("storage", 0)), 0, f"no storage hit: {details}")

    def test_master_gone_mid_run_only_recomputes(self):
        self.assertEqual(len(self.after), 4)
        self.assertGreater(self.failures, 0)


if __name__ == "__main__":
    unittest.main()
