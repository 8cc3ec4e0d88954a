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
        verify_anchors()  # raises AnchorError otherwise (the declared patches' anchors and ANCHORS)
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

    def test_missing_dependency_is_reported_as_an_import_error(self):
        """Issue 44: without ``sgl_kernel`` the check said "47 upstream anchor(s) changed"; an upstream
        module whose own import fails is an installation problem, named as such."""
        import os
        import sys
        import tempfile

        from sglang_hybrid.anchors import UpstreamImportError

        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "anchor_probe_mod.py"), "w") as f:
                f.write("import sgl_kernel_not_installed_probe\nclass Target:\n    pass\n")
            with open(os.path.join(d, "anchor_probe_mod2.py"), "w") as f:
                f.write("from os import no_such_name_probe\nclass Target:\n    pass\n")
            os.makedirs(os.path.join(d, "anchor_probe_pkg"))
            open(os.path.join(d, "anchor_probe_pkg", "__init__.py"), "w").close()
            with open(os.path.join(d, "anchor_probe_pkg", "sub.py"), "w") as f:  # as upstream's modules sit
                f.write("import sgl_kernel_probe_nested\nclass Target:\n    pass\n")
            sys.path.insert(0, d)
            try:
                with self.assertRaises(UpstreamImportError) as ctx:
                    verify_anchors([
                        Anchor("anchor_probe_mod.Target", "probe"),
                        Anchor("anchor_probe_mod2.Target", "probe"),
                        Anchor("anchor_probe_pkg.sub.Target.method", "probe"),
                        Anchor("anchor_probe_pkg.sub.Target", "probe"),
                        Anchor("anchor_probe_gone_entirely.Target", "probe"),  # a changed anchor, not listed
                    ])
            finally:
                sys.path.remove(d)
                sys.modules.pop("anchor_probe_mod", None)
                sys.modules.pop("anchor_probe_mod2", None)
                sys.modules.pop("anchor_probe_pkg", None)
                sys.modules.pop("anchor_probe_pkg.sub", None)
        msg = str(ctx.exception)
        self.assertIn("No module named 'sgl_kernel_not_installed_probe' (while resolving anchor_probe_mod.Target)", msg)
        self.assertIn("cannot import name 'no_such_name_probe'", msg)
        self.assertIn("installation problem, not a changed anchor", msg)
        self.assertNotIn("anchor(s) changed", msg)
        self.assertIn("No module named 'sgl_kernel_probe_nested' (while resolving anchor_probe_pkg.sub.Target.method "
                      "and 1 more anchor(s))", msg)
        self.assertEqual(len(ctx.exception.missing), 3)
        self.assertIsInstance(ctx.exception, AnchorError)  # register() still stops the process on it
        # a module on the anchor's own path that is gone stays a changed anchor
        with self.assertRaises(AnchorError) as ctx:
            verify_anchors([Anchor("anchor_probe_gone_entirely.Target", "probe")])
        self.assertNotIsInstance(ctx.exception, UpstreamImportError)
        self.assertIn("1 upstream anchor(s) changed", str(ctx.exception))

    def test_sgl_kernel_missing_names_the_stand_in(self):
        from sglang_hybrid.anchors import UpstreamImportError

        import sys

        target = "sglang_hybrid_probe_upstream_mod"

        class Finder:  # the module exists, but importing it fails on sgl_kernel (upstream without the wheel)
            def find_spec(self, name, path=None, target_=None):
                if name == target:
                    from importlib.machinery import ModuleSpec

                    class Loader:
                        def create_module(self, spec):
                            return None

                        def exec_module(self, module):
                            raise ModuleNotFoundError("No module named 'sgl_kernel'", name="sgl_kernel")

                    return ModuleSpec(name, Loader())
                return None

        finder = Finder()
        sys.meta_path.insert(0, finder)
        try:
            with self.assertRaises(UpstreamImportError) as ctx:
                verify_anchors([Anchor(f"{target}.X", "probe")])
        finally:
            sys.meta_path.remove(finder)
            sys.modules.pop(target, None)
        self.assertEqual(ctx.exception.missing, ["sgl_kernel"])
        self.assertIn("./sgl-kernel/cpu_shim", str(ctx.exception))

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

    def test_every_upstream_hook_target_has_an_anchor(self):
        """Each ``HookRegistry`` registration on an upstream (``sglang.*``) name is anchor-checked, so a
        changed upstream fails at start-up, not in the hook (``torch.*`` targets are not upstream's)."""
        from sglang.srt.plugins.hook_registry import HookRegistry

        from sglang_hybrid.anchors import all_anchors

        plugin.register()
        targets = {t for t in HookRegistry._hooks if t.startswith("sglang.")}
        self.assertGreater(len(targets), 20)
        self.assertEqual(sorted(targets - {a.target for a in all_anchors()}), [])

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
