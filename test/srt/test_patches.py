"""One declaration per patch (issue 43): ``sglang_hybrid.patches.PATCHES`` gives both the hook
registrations and their anchor checks; docs/patches.md is generated from it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import unittest
from collections import defaultdict
from unittest import mock

import sglang_hybrid.plugin as plugin
from sglang_hybrid import patches
from sglang_hybrid.anchors import ANCHORS, AnchorError, UpstreamImportError, all_anchors, verify_anchors
from sglang_hybrid.patches import PATCHES, Anchor, Patch, find_patch, register_patches, render_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "python", "sglang_hybrid")
PROBE_HOOK = "sglang_hybrid.boot.hooks:_add_skip_flag"  # any declared hook function will do for probes


def _probe(**kw) -> Patch:
    args = dict(target="sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode", hook_type="before",
                hook=PROBE_HOOK, why="probe", remove_when="never")
    args.update(kw)
    return Patch(**args)


def _source_files():
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


class TestDeclarations(unittest.TestCase):
    def test_committed_page_matches_the_declarations(self):
        with open(os.path.join(ROOT, "docs", "patches.md")) as f:
            committed = f.read()
        self.assertEqual(committed, render_markdown(),
                         "docs/patches.md is stale: python -m sglang_hybrid.patches > docs/patches.md")
        self.assertIn(f"{len(PATCHES)} patches", committed)
        for p in PATCHES:
            self.assertIn(p.remove_when.replace("|", "\\|"), committed)

    def test_every_patch_anchors_its_own_target_and_no_hook_target_is_written_twice(self):
        checked = {(a.target, a.snippet) for a in all_anchors()}
        for p in PATCHES:
            own = p.anchors()[0]
            self.assertEqual((own.target, own.snippet), (p.target, p.snippet))
            self.assertIn(p.hook, own.why)
            self.assertTrue(set((a.target, a.snippet) for a in p.anchors()) <= checked, p.hook)
        # a hook target is not listed again among the other anchors ...
        self.assertEqual(sorted({a.target for a in ANCHORS} & {p.target for p in PATCHES}), [])
        # ... nor written as a string anywhere in the package but patches.py
        targets = {p.target for p in PATCHES}
        found = []
        for path in _source_files():
            if path == os.path.join(PKG, "patches.py"):
                continue
            with open(path) as f:
                tree = ast.parse(f.read())
            found += [(os.path.relpath(path, PKG), n.lineno, n.value) for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and n.value in targets]
        self.assertEqual(found, [])

    def test_no_hook_is_registered_outside_the_declarations(self):
        """``HookRegistry.register``, ``plugin_hook`` and ``register_resolution_hook`` are called only by
        ``patches.register_patches``."""
        calls = defaultdict(list)
        for path in _source_files():
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                owner = getattr(fn.value, "id", None) if isinstance(fn, ast.Attribute) else None
                if (name == "register" and owner == "HookRegistry") or name in ("plugin_hook",
                                                                              "register_resolution_hook"):
                    calls[os.path.relpath(path, PKG)].append(node.lineno)
        self.assertEqual(sorted(calls), ["patches.py"])
        self.assertEqual(len(calls["patches.py"]), 2)  # HookRegistry.register + register_resolution_hook

    def test_every_hook_resolves_to_what_its_type_needs(self):
        from sglang_hybrid.anchors import _resolve

        self.assertEqual(len({p.hook for p in PATCHES}), len(PATCHES))  # one declaration per hook
        for p in PATCHES:
            obj = p.resolve_hook()
            self.assertTrue(callable(obj), p.hook)
            if isinstance(obj, type):  # a class only replaces a class, and subclasses it
                self.assertEqual(p.hook_type, "replace", p.hook)
                self.assertTrue(issubclass(obj, _resolve(p.target)), p.hook)
        self.assertEqual(find_patch(PROBE_HOOK).target, "sglang.srt.server_args.ServerArgs.add_cli_args")
        with self.assertRaisesRegex(ValueError, "^hook: no patch declares 'x:y'"):
            find_patch("x:y")

    def test_bad_declarations_raise_value_error_naming_the_argument(self):
        cases = [
            (dict(target="nodots"), "target"),
            (dict(target=""), "target"),
            (dict(hook_type="wrap"), "hook_type"),
            (dict(hook="sglang_hybrid.boot.hooks._add_skip_flag"), "hook"),
            (dict(hook="sglang_hybrid.boot.hooks:"), "hook"),
            (dict(hook=None), "hook"),
            (dict(target=None), "target"),
            (dict(why="  "), "why"),
            (dict(remove_when=""), "remove_when"),
            (dict(snippet=""), "snippet"),
            (dict(also=[Anchor("a.b", "x")]), "also"),
            (dict(also=("a.b",)), "also"),
        ]
        for kw, arg in cases:
            with self.subTest(arg=arg, kw=kw):
                with self.assertRaisesRegex(ValueError, f"^{arg}:"):
                    _probe(**kw)
        with self.assertRaisesRegex(ValueError, "^hook: sglang_hybrid.boot.hooks has no attribute 'nope'"):
            _probe(hook="sglang_hybrid.boot.hooks:nope").resolve_hook()


class TestAnchorsOfDeclarations(unittest.TestCase):
    def test_declaration_whose_snippet_is_missing_fails_loudly(self):
        broken = _probe(snippet="text that is not there",
                        also=(Anchor("sglang.srt.managers.schedule_batch.NoSuchThing", "probe also"),))
        with self.assertRaises(AnchorError) as ctx:
            verify_anchors(broken.anchors())
        msg = str(ctx.exception)
        self.assertNotIsInstance(ctx.exception, UpstreamImportError)
        self.assertIn("2 upstream anchor(s) changed", msg)
        self.assertIn("ScheduleBatch.prepare_for_decode: expected text 'text that is not there' not found — "
                      f"needed for: BEFORE hook {PROBE_HOOK}: probe", msg)
        self.assertIn("schedule_batch.NoSuchThing: not found", msg)

    def test_register_stops_before_any_hook_when_a_declared_anchor_is_missing(self):
        from sglang.srt.plugins.hook_registry import HookRegistry

        broken = _probe(snippet="text that is not there")
        fresh = defaultdict(list)
        with mock.patch.object(patches, "PATCHES", PATCHES + (broken,)), \
                mock.patch.object(plugin, "_REGISTERED", False), mock.patch.object(HookRegistry, "_hooks", fresh):
            with self.assertRaises(SystemExit) as ctx:
                plugin.register()
        self.assertIn("text that is not there", str(ctx.exception))
        self.assertIn("1 upstream anchor(s) changed", str(ctx.exception))
        self.assertEqual(dict(fresh), {})  # nothing registered

    def test_missing_dependency_of_a_patch_target_is_reported_as_an_import_error(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "patch_probe_mod.py"), "w") as f:
                f.write("import patch_probe_missing_dep\nclass Target:\n    def method(self):\n        pass\n")
            sys.path.insert(0, d)
            try:
                with self.assertRaises(UpstreamImportError) as ctx:
                    verify_anchors(_probe(target="patch_probe_mod.Target.method", snippet="def method").anchors())
            finally:
                sys.path.remove(d)
                sys.modules.pop("patch_probe_mod", None)
        self.assertEqual(ctx.exception.missing, ["patch_probe_missing_dep"])
        self.assertIn("No module named 'patch_probe_missing_dep' (while resolving patch_probe_mod.Target.method)",
                      str(ctx.exception))


class TestRegistration(unittest.TestCase):
    def test_register_patches_registers_the_declarations_in_order(self):
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from sglang_hybrid.mem_cache import serving

        fresh = defaultdict(list)
        with mock.patch.object(HookRegistry, "_hooks", fresh):
            got = register_patches(serving.__name__)
            registered = [(t, ht, h) for t, hooks in fresh.items() for ht, h, _ in hooks]
        declared = [p for p in PATCHES if p.module == serving.__name__]
        self.assertEqual(got, declared)
        self.assertEqual(len(got), 5)
        self.assertEqual(sorted(registered, key=lambda r: (r[0], r[2].__name__)),
                         sorted([(p.target, HookType(p.hook_type), getattr(serving, p.attribute)) for p in declared],
                                key=lambda r: (r[0], r[2].__name__)))

    def test_register_patches_only_and_bad_arguments(self):
        from sglang.srt.plugins.hook_registry import HookRegistry

        from sglang_hybrid.platforms import cpu

        fresh = defaultdict(list)
        with mock.patch.object(HookRegistry, "_hooks", fresh):
            got = register_patches(cpu.__name__, only=("_pin_memory_without_gpu",))
        self.assertEqual([p.target for p in got], ["torch.Tensor.pin_memory"])
        self.assertEqual(list(fresh), ["torch.Tensor.pin_memory"])
        with self.assertRaisesRegex(ValueError, "^module: no patch declares a hook in 'sglang_hybrid.nothing'"):
            register_patches("sglang_hybrid.nothing")
        with self.assertRaisesRegex(ValueError, r"^only: sglang_hybrid.platforms.cpu declares no hook named \['nope'\]"):
            register_patches(cpu.__name__, only=("nope",))

    def test_resolution_hook_is_registered_once(self):
        from sglang.srt.arg_groups import resolution_hooks

        from sglang_hybrid.platforms import cpu_spec

        fresh = defaultdict(list)
        from sglang.srt.plugins.hook_registry import HookRegistry

        with mock.patch.object(patches, "_RESOLUTION_REGISTERED", set()), \
                mock.patch.dict(resolution_hooks._HOOKS, clear=True), mock.patch.object(HookRegistry, "_hooks", fresh):
            register_patches(cpu_spec.__name__)
            register_patches(cpu_spec.__name__)
            self.assertEqual(resolution_hooks._HOOKS, {"handle_speculative_decoding":
                                                       [cpu_spec.refuse_unsupported_cpu_speculation]})
            self.assertEqual(len(fresh[find_patch(f"{cpu_spec.__name__}:require_chain_speculation_cpu").target]), 2)

    def test_plugin_registers_exactly_the_declared_hooks(self):
        """A fresh process with every switch on (CPU platform, idle audit, layer taps): the hooks in upstream's
        registries are exactly the declarations, per target in declaration order."""
        script = (
            "import json\n"
            "from sglang_hybrid import plugin\n"
            "plugin.register()\n"
            "from sglang.srt.plugins.hook_registry import HookRegistry\n"
            "from sglang.srt.arg_groups import resolution_hooks\n"
            "rows = [[t, ht.value, h.__module__ + ':' + h.__qualname__] for t, hs in HookRegistry._hooks.items()"
            " for ht, h, _ in hs]\n"
            "rows += [[k, 'resolution', f.__module__ + ':' + f.__qualname__] for k, fs in"
            " resolution_hooks._HOOKS.items() for f in fs]\n"
            "print('ROWS=' + json.dumps(rows))\n"
        )
        env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", SGLANG_HYBRID_IDLE_AUDIT="1",
                   SGLANG_HYBRID_LAYER_TAPS=tempfile.mkdtemp(prefix="taps_"), SGLANG_HYBRID_UPSTREAM_OPS="")
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        rows = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("ROWS="))[5:])
        step = lambda t: t.rsplit(".", 1)[1]  # noqa: E731 (a resolution hook is keyed by its step's name)
        expected = [[step(p.target) if p.hook_type == "resolution" else p.target, p.hook_type, p.hook]
                    for p in PATCHES]
        self.assertEqual(len(rows), len(PATCHES))
        by_target = lambda rs: {t: [r for r in rs if r[0] == t] for t in {r[0] for r in rs}}  # noqa: E731
        self.assertEqual(by_target(rows), by_target(expected))


if __name__ == "__main__":
    unittest.main()
