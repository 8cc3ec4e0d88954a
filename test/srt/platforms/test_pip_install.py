"""``pip install ./python`` into an existing SGLang environment (issue 44).

A fresh venv is given an existing SGLang environment's packages (this checkout's ``.venv``:
torch, sglang 0.5.23 and its CPU-installable dependencies), minus our own packages, through a
``.pth`` file. CI's venv has sglang installed with ``--no-deps`` (its full dependency set
needs CUDA wheels), so a dist-info of ``sglang 0.5.23`` with no requirements stands in the fresh
venv for "an environment whose sglang dependencies are complete"; the sglang code imported is the
real one. Then, offline (``--no-index``), from a copy of the checkout:

* ``pip install "./python[cpu]"`` alone resolves our kernel package by path and the ``[cpu]``
  extra's ``sgl_kernel`` stand-in, installs all three as real (non-editable) packages, and
  ``python -m sglang.launch_server --help`` from that venv lists the plugin's flags;
* without ``[cpu]``, start-up names the missing ``sgl_kernel`` and the stand-in to install;
* with ``sglang 0.5.22`` there instead, pip refuses, naming ``sglang==0.5.23``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
OURS = ("sglang_hybrid", "sgl_hybrid", "sgl_kernel", "__editable__", "sglang-")  # + sglang's own dist-info


def _stub_sglang(site: str, version: str) -> None:
    d = os.path.join(site, f"sglang-{version}.dist-info")
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    with open(os.path.join(d, "INSTALLER"), "w") as f:
        f.write("test\n")
    with open(os.path.join(d, "RECORD"), "w") as f:
        f.write("")


def _venv(root: str, sglang_version: str) -> tuple:
    """(python, site-packages) of a fresh venv seeing the outer environment minus our packages."""
    base = getattr(sys, "_base_executable", sys.executable)
    env_dir = os.path.join(root, "venv")
    subprocess.run([base, "-m", "venv", "--without-pip", env_dir], check=True)
    py = os.path.join(env_dir, "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    outer = sysconfig.get_paths()["purelib"]
    view = os.path.join(root, "outer-site")
    os.makedirs(view)
    for name in os.listdir(outer):
        low = name.lower()
        if low.startswith(OURS) or low.endswith(".pth"):
            continue
        os.symlink(os.path.join(outer, name), os.path.join(view, name))
    # the real sglang package code, without its (CI: --no-deps) dist-info
    with open(os.path.join(site, "_outer_env.pth"), "w") as f:
        f.write(view + "\n")
    _stub_sglang(site, sglang_version)
    return py, site


def _checkout_copy(root: str) -> str:
    dst = os.path.join(root, "checkout")
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests", ".pytest_cache")
    shutil.copytree(os.path.join(REPO, "python"), os.path.join(dst, "python"), ignore=ignore)
    shutil.copytree(os.path.join(REPO, "sgl-kernel"), os.path.join(dst, "sgl-kernel"), ignore=ignore)
    return dst


def _pip(py: str, cwd: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONPATH="")
    return subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-compile", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


ENV = dict({k: v for k, v in os.environ.items() if k != "SGLANG_HYBRID_TRACE"}, PYTHONPATH="", SGLANG_USE_CPU_ENGINE="1")


def _installed(root: str, requirement: str) -> tuple:
    """(python, site-packages, pip result) of a fresh venv after ``pip install requirement``."""
    py, site = _venv(root, "0.5.23")
    return py, site, _pip(py, _checkout_copy(root), requirement)


def _launch_help(py: str) -> subprocess.CompletedProcess:
    return subprocess.run([py, "-m", "sglang.launch_server", "--help"], env=ENV, capture_output=True, text=True,
                          timeout=600)


class TestPipInstallIntoExistingSGLang(unittest.TestCase):
    def test_install_and_launch_help(self):
        with tempfile.TemporaryDirectory() as root:
            py, site, r = _installed(root, "./python[cpu]")
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            where = subprocess.run(
                [py, "-c", "import importlib.metadata as m, sglang_hybrid, sgl_hybrid_kernel, sgl_kernel; "
                 "print(sglang_hybrid.__file__); print(sgl_hybrid_kernel.__file__); print(sgl_kernel.__file__); "
                 "print(m.version('sglang-hybrid'), m.version('sgl-hybrid-kernel'), m.version('sgl-hybrid-cpu-shim')); "
                 "print([r for r in m.requires('sglang-hybrid') if r.startswith(('sglang', 'sgl-hybrid'))]); "
                 "from sglang_hybrid.bench.trace import DEFAULT_TRACE_PATH, load_trace; "
                 "print(DEFAULT_TRACE_PATH); print(len(load_trace(DEFAULT_TRACE_PATH)))"],
                env=ENV, capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(where.returncode, 0, where.stderr[-3000:])
            lines = where.stdout.strip().splitlines()
            for path in lines[:3]:  # real installs in the fresh venv, not the checkout's editable ones
                self.assertTrue(path.startswith(site), (path, site))
            self.assertEqual(lines[3], "0.1.0 0.1.0 0.1.0")
            self.assertIn("'sglang==0.5.23'", lines[4])
            self.assertIn("sgl-hybrid-kernel @ file://", lines[4])
            # the Mooncake trace is package data: the installed package replays it without a checkout
            self.assertTrue(lines[5].startswith(site), (lines[5], site))
            self.assertEqual(int(lines[6]), 12031)
            helped = _launch_help(py)
            self.assertEqual(helped.returncode, 0, helped.stderr[-3000:])
            self.assertIn("--hybrid-host-cache-gb", helped.stdout)
            self.assertIn("--hybrid-device-cache-gb", helped.stdout)
            self.assertIn("sglang-hybrid plugin:", helped.stdout)  # the plugin's own --help heading

    def test_without_the_cpu_extra_the_missing_sgl_kernel_is_named(self):
        """Without ``[cpu]`` on a machine where upstream's sglang-kernel cannot load, start-up names the
        missing module and the stand-in (before: "47 upstream anchor(s) changed")."""
        with tempfile.TemporaryDirectory() as root:
            py, _, r = _installed(root, "./python")
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            helped = _launch_help(py)
            self.assertNotEqual(helped.returncode, 0)
            out = helped.stdout + helped.stderr
            self.assertIn("an installation problem, not a changed anchor", out)
            self.assertIn("No module named 'sgl_kernel'", out)
            self.assertIn('pip install "./python[cpu]"', out)
            self.assertNotIn("anchor(s) changed", out)

    def test_other_sglang_version_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            py, _ = _venv(root, "0.5.22")
            src = _checkout_copy(root)
            r = _pip(py, src, "./python")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("sglang==0.5.23", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
