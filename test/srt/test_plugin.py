"""Plugin registration and the fail-loudly anchor checks."""

from __future__ import annotations

import importlib.metadata
import unittest
from unittest import mock

import sglang_hybrid.plugin as plugin
from sglang_hybrid.anchors import ANCHORS, Anchor, AnchorError, verify_anchors
from sglang_hybrid.platforms import current_platform


class TestAnchors(unittest.TestCase):
    def test_pinned_sglang_satisfies_every_anchor(self):
        self.assertEqual(importlib.metadata.version("sglang"), "0.5.23")
        verify_anchors()  # raises AnchorError otherwise
        self.assertGreaterEqual(len(ANCHORS), 5)

    def test_broken_anchors_are_all_reported(self):
        broken = [
            Anchor("sglang.srt.managers.schedule_batch.NoSuchClass", "gone"),
            Anchor("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode", "changed",
                   snippet="text that is not there"),
        ]
        with self.assertRaises(AnchorError) as ctx:
            verify_anchors(broken)
        msg = str(ctx.exception)
        self.assertIn("NoSuchClass", msg)
        self.assertIn("text that is not there", msg)
        self.assertIn("2 upstream anchor(s) changed", msg)

    def test_register_stops_the_process_on_a_broken_anchor(self):
        with mock.patch.object(plugin, "_REGISTERED", False), mock.patch(
            "sglang_hybrid.anchors.verify_anchors", side_effect=AnchorError("anchor X changed")
        ):
            with self.assertRaises(SystemExit) as ctx:
                plugin.register()
        self.assertIn("anchor X changed", str(ctx.exception))


class TestRegistration(unittest.TestCase):
    def test_upstream_ops_switch(self):
        """``SGLANG_HYBRID_UPSTREAM_OPS`` names the GPU hooks left out; an unknown name is refused."""
        with mock.patch.dict("os.environ", {plugin.UPSTREAM_OPS_ENV: "moe_routing, attn_res"}):
            self.assertEqual(plugin._upstream_ops(), {"moe_routing", "attn_res"})
        with mock.patch.dict("os.environ", {plugin.UPSTREAM_OPS_ENV: ""}):
            self.assertEqual(plugin._upstream_ops(), frozenset())
        with mock.patch.dict("os.environ", {plugin.UPSTREAM_OPS_ENV: "moe_routing,mla"}):
            with self.assertRaisesRegex(ValueError, r"unknown op\(s\) \['mla'\]"):
                plugin._upstream_ops()

    def test_entry_point_is_declared(self):
        eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")}
        self.assertEqual(eps.get("sglang_hybrid"), "sglang_hybrid.plugin:register")

    def test_cpu_platform_detected(self):
        p = current_platform()
        self.assertEqual(p.device, "cpu")
        self.assertTrue(p.is_cpu and not p.is_cuda and not p.is_rocm)
        self.assertTrue(p.reason)


if __name__ == "__main__":
    unittest.main()
