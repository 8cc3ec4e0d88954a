"""Import graph of the two packages (issue 43): no import circles, function-local imports included
(a lazy import that closes a circle only hides it), and the kernel package never imports SGLang (it
runs on a GPU machine without SGLang). Imports under ``if TYPE_CHECKING:`` do not run and are left out.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Set

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = (("sgl-kernel/python", "sgl_hybrid_kernel"), ("python", "sglang_hybrid"))


def _modules(root: str, pkg: str) -> Dict[str, str]:
    out = {}
    for d, _, files in os.walk(os.path.join(ROOT, root, pkg)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, os.path.join(ROOT, root))[:-3].replace(os.sep, ".")
                out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def _imports(path: str, name: str) -> Set[str]:
    """Every module name imported anywhere in the file, but under ``if TYPE_CHECKING:``."""
    names: Set[str] = set()

    def visit(node):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                keep = len(parts) - node.level + (1 if path.endswith("__init__.py") else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    with open(path) as f:
        visit(ast.parse(f.read()))
    return names


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_lazy_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    for root, pkg in PACKAGES:
        mods = _modules(root, pkg)
        # a package's __init__ is imported by every submodule: only edges between modules count
        graph = {m: {d for d in _imports(p, m) if d in mods and d != m and not m.startswith(d + ".")}
                 for m, p in mods.items()}
        assert _cycles(graph) == [], f"{pkg}: import circles"


def test_kernel_package_never_imports_sglang():
    for name, path in _modules("sgl-kernel/python", "sgl_hybrid_kernel").items():
        bad = sorted(d for d in _imports(path, name) if d == "sglang" or d.startswith(("sglang.", "sglang_hybrid")))
        assert not bad, f"{name} imports {bad}"
