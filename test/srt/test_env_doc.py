"""docs/env.md lists every environment variable the project reads (issue 43: variables documented
nowhere). The scan covers the two packages, the tests, setup.py and the Makefile; a name that
appears there and not in the doc fails, and so does a documented name nothing reads any more."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = re.compile(r"\b((?:SGLANG_HYBRID|SGL_HYBRID)_[A-Z0-9_]*[A-Z0-9])\b")
ROOTS = ("python/sglang_hybrid", "python/setup.py", "sgl-kernel/python", "sgl-kernel/cpu_shim", "test", "Makefile",
         "scripts")
SKIP_DIRS = {"build", "__pycache__", ".pytest_cache"}


def _names_in_code():
    found = {}
    for root in ROOTS:
        path = os.path.join(REPO, root)
        files = [path] if os.path.isfile(path) else [
            os.path.join(d, f) for d, dirs, fs in os.walk(path) if not dirs.__setitem__(slice(None), [
                x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")]) for f in fs
            if f.endswith((".py", ".sh")) or f == "Makefile"]
        for f in files:
            if os.path.abspath(f) == os.path.abspath(__file__):
                continue
            with open(f, errors="replace") as fh:
                for n in NAME.findall(fh.read()):
                    found.setdefault(n, os.path.relpath(f, REPO))
    return found


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    with open(os.path.join(REPO, "docs", "env.md")) as f:
        documented = set(re.findall(r"^\| `((?:SGLANG_HYBRID|SGL_HYBRID)_[A-Z0-9_]+)`", f.read(), re.M))
    code = _names_in_code()
    missing = {n: where for n, where in code.items() if n not in documented}
    assert not missing, f"read in code, missing from docs/env.md: {missing}"
    stale = documented - set(code)
    assert not stale, f"in docs/env.md, read nowhere: {sorted(stale)}"
    assert len(documented) >= 25
