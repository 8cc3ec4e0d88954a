"""End-to-end: ``python -m sglang.launch_server --tp 2 --dcp-size 2 --device cpu``, tiny Kimi K3 (issue 8, case K8).

Two scheduler processes on gloo groups; upstream's DCP group (``--dcp-size 2``)
and its widened KV locations (allocator page = page 64 x DCP 2 = 128); each rank
stores the MLA latent rows of the positions ``p mod 2 == rank`` and the MLA
layer merges (output, LSE) over the DCP group; the hybrid radix cache on, with
tree page 128 and prefill chunks of 192 tokens (on the 64-grid, off the 128-page).

Oracle: the single-process (TP = 1, no DCP) model-level run of the same
checkpoint with no cache (``test_tp_server._single_process_run``). Checked:

* every greedy token equals the oracle's and every log-prob is within ``1e-4``
  (``test_tp_server.LOGPROB_TOL``; the DCP merge only reorders the softmax
  sums; a missing shard or a wrong merge is off by O(1)) — for cold requests
  and for requests resumed from the cache, so cache-on equals cache-off;
* case K8 scaled to 2 processes: prompts of 330 and 450 tokens (not multiples
  of 128; their 64-grid ends 320 and 448 are off the widened page) sent cold,
  then resent with a continuation, resume at 256 and 384 (``cached_tokens``);
  every stored checkpoint's state position equals the depth of the tree node
  holding it and lies on the 128 grid (the cache's ``hybrid-cache checkpoint``
  log lines);
* KV memory per rank: the pool's rows per rank are half the tokens the server
  holds (``get_server_info``'s ``max_total_num_tokens``), i.e. KV bytes per
  token per rank fall by 2 against ``--tp 2`` alone (start-up log lines).
"""

from __future__ import annotations

import json
import os
import re
import unittest

import requests
import torch

from sglang_hybrid.bench.server import LaunchedServer, cpu_server_args
from test_tp_server import LOGPROB_TOL, NEW_TOKENS, _generate, _ids, _single_process_run, _thread_bind
from tiny_model import tiny_kimi_k3

PAGE, DCP, CHUNK = 64, 2, 192
TREE_PAGE = PAGE * DCP
MAX_TOTAL_TOKENS = 4096  # rows of each rank's MLA pool


class TestKimiK3DCP2Server(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tiny_kimi_k3()
        args = cpu_server_args(max_total_tokens=MAX_TOTAL_TOKENS, max_mamba_cache_size=32) + [
            "--tp", "2", "--dcp-size", str(DCP), "--page-size", str(PAGE), "--chunked-prefill-size", str(CHUNK),
            "--log-level", "debug",  # the cache's per-request "hybrid-cache checkpoint" lines are DEBUG
        ]
        server = LaunchedServer(cls.model, args, env={"SGLANG_CPU_OMP_THREADS_BIND": _thread_bind()}, timeout=600)
        cls.log_path = server.log_path
        with server:  # LaunchedServer.stop kills the launcher's process group (both schedulers)
            cls.info = requests.get(server.base_url + "/get_server_info", timeout=60).json()
            a, b = _ids(330, 51), _ids(450, 53)
            out_a = _generate(server.base_url, a)
            a2 = a + out_a["ids"] + _ids(40, 52)
            out_b = _generate(server.base_url, b)
            b2 = b + out_b["ids"] + _ids(30, 54)
            cls.prompts = {"a": a, "a2": a2, "b": b, "b2": b2}
            cls.outputs = {"a": out_a, "b": out_b}
            for k in ("a2", "b2"):
                cls.outputs[k] = _generate(server.base_url, cls.prompts[k])
        with open(cls.log_path, encoding="utf-8", errors="replace") as f:
            cls.log = f.read()

    def test_dcp_group_is_up(self):
        self.assertIn("DCP enabled, dcp_size=2, tp_size=2", self.log)
        ranks = set(re.findall(r"Kimi K3 reference: TP rank (\d)/2, DCP rank (\d)/2", self.log))
        self.assertEqual(ranks, {("0", "0"), ("1", "1")})

    def test_greedy_tokens_and_logprobs_equal_single_process_cache_off(self):
        for name, prompt in self.prompts.items():
            out = self.outputs[name]
            tokens, logp = _single_process_run(self.model, prompt)
            self.assertEqual(out["ids"], tokens, f"request {name} ({len(prompt)} tokens)")
            want = logp[torch.arange(NEW_TOKENS), torch.tensor(tokens)]
            torch.testing.assert_close(torch.tensor(out["logprobs"], dtype=torch.float64), want.double(),
                                       atol=LOGPROB_TOL, rtol=0, msg=f"request {name}")

    def test_resends_resume_on_the_widened_page(self):
        self.assertEqual(self.outputs["a"]["cached"], 0)
        self.assertEqual(self.outputs["b"]["cached"], 0)
        # prompt ends 330 and 450 aligned down to the 128 tree page (not to the 64 grid: 320, 448)
        self.assertEqual(self.outputs["a2"]["cached"], 256)
        self.assertEqual(self.outputs["b2"]["cached"], 384)

    def test_checkpoint_depth_equals_node_depth(self):
        found = [(int(s), int(d), int(p)) for s, d, p in re.findall(
            r"hybrid-cache checkpoint rid=\S+ state_pos=(\d+) node_depth=(\d+) tree_page=(\d+)", self.log)]
        self.assertTrue(found)
        for state_pos, node_depth, page in found:
            self.assertEqual(page, TREE_PAGE)
            self.assertEqual(state_pos, node_depth)
            self.assertEqual(state_pos % TREE_PAGE, 0)
        # chunk ends 192 (off the page) -> 128, prompt ends 330 -> 256, 450 -> 384 (chunk end 384)
        self.assertLessEqual({128, 256, 384}, {s for s, _, _ in found})

    def test_kv_memory_per_rank_falls_by_dcp(self):
        with open(os.path.join(self.model, "config.json")) as f:
            cfg = json.load(f)
        mla_layers = len(cfg["linear_attn_config"]["full_attn_layers"])
        row = mla_layers * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4  # FP32 latent rows, 640 B
        pools = {tuple(int(x) for x in m) for m in re.findall(
            r"KV pool per rank: (\d+) rows x (\d+) B = \d+ B for (\d+) tokens \(DCP (\d+), tree page (\d+)\)", self.log)}
        self.assertEqual(pools, {(MAX_TOTAL_TOKENS, row, DCP * MAX_TOTAL_TOKENS, DCP, TREE_PAGE)})
        self.assertEqual(self.info["max_total_num_tokens"], DCP * MAX_TOTAL_TOKENS)
        per_token = {int(b) for b in re.findall(r"hybrid cache: HybridRadixCache \(KV (\d+) B/token", self.log)}
        self.assertEqual(per_token, {row // DCP})  # --tp 2 alone: 640 B/token (test_tp_server)


if __name__ == "__main__":
    unittest.main()
