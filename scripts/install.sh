#!/usr/bin/env bash
# The install steps of sglang-hybrid, shared by `make install` (Makefile) and the
# Docker images (docker/Dockerfile.*), so both run the same commands.
#
#   scripts/install.sh --device cpu|cuda|rocm --venv DIR       full install into a venv (make install)
#   scripts/install.sh --device cuda|rocm --python PY --packages-only
#                                         only our two packages, --no-deps, into an interpreter that
#                                         already has torch and sglang (upstream's images)
#   add --dry-run to print the commands instead of running them.
#
# Full install (docs/install.md): torch, then on cpu the CPU-feasible subset of sglang's
# requirements + sglang --no-deps + our packages + the CPU sgl_kernel shim; on cuda sglang
# with its dependencies + our packages; then the test requirements and an import check.
# Pins come from the environment (the Makefile passes its own) with these defaults.
set -euo pipefail

SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
TORCH_VERSION="${TORCH_VERSION:-2.14.1}"
TORCHVISION_VERSION="${TORCHVISION_VERSION:-0.29.1}"
BASE_PYTHON="${PYTHON:-python3}"

usage() { sed -n '2,15p' "$0" >&2; exit 2; }
die() { echo "scripts/install.sh: $*" >&2; exit 2; }

device="" venv="" py="" packages_only=0 dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:-}"; shift 2 ;;
    --venv) venv="${2:-}"; shift 2 ;;
    --python) py="${2:-}"; shift 2 ;;
    --packages-only) packages_only=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$device" in cpu|cuda|rocm) ;; *) die "--device must be cpu, cuda or rocm (got '${device}')" ;; esac
if [ -n "$venv" ] && [ -n "$py" ]; then die "give --venv or --python, not both"; fi
if [ -z "$venv" ] && [ -z "$py" ]; then die "give --venv DIR (make install) or --python PY (images)"; fi
[ -n "$venv" ] && py="$venv/bin/python"

run() {  # echo each command (as make did), run it unless --dry-run
  echo "$*"
  if [ "$dry_run" = 0 ]; then "$@"; fi
}
pip_install() { run "$py" -m pip --disable-pip-version-check -q install "$@"; }

cd "$(dirname "$0")/.."

if [ "$packages_only" = 1 ]; then
  [ "$device" != cpu ] || die "--packages-only is for images that already have sglang (cuda, rocm); on cpu run the full install"
  # Upstream's image brings torch, sglang and the real sglang-kernel; --no-deps so pip
  # cannot replace its ROCm/CUDA torch with a PyPI wheel.
  run "$py" -c "import importlib.metadata as m, sys; v = m.version('sglang'); sys.exit(0 if v == '$SGLANG_VERSION' else 'the base image has sglang ' + v + '; sglang-hybrid is pinned to $SGLANG_VERSION: pick the image of that version')"
  # Real (non-editable) installs: the image holds the packages (and the packaged trace), not the
  # build context's sources.
  pip_install --no-deps ./sgl-kernel ./python
  run "$py" -c "import sglang, sglang_hybrid, sgl_hybrid_kernel; print('sglang', sglang.__version__, 'OK')"
  exit 0
fi

if [ "$device" = rocm ]; then
  die "a full install on ROCm would pull PyPI's torch, a CUDA build that cannot use AMD GPUs: build the image (make docker PLATFORM=rocm), or install ROCm torch + sglang==$SGLANG_VERSION yourself and run: scripts/install.sh --device rocm --python PY --packages-only (docs/rocm.md)"
fi

if [ -n "$venv" ] && [ ! -x "$py" ]; then
  run "$BASE_PYTHON" -m venv "$venv"
fi
pip_install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
if [ "$device" = cpu ]; then
  pip_install -r python/requirements/cpu.txt
  pip_install --no-deps "sglang==$SGLANG_VERSION"
  pip_install --no-deps -e sgl-kernel -e python -e sgl-kernel/cpu_shim
else
  pip_install "sglang==$SGLANG_VERSION"
  pip_install --no-deps -e sgl-kernel -e python
fi
pip_install -r python/requirements/test.txt
run "$py" -c "import sglang, sglang_hybrid, sgl_hybrid_kernel; print('sglang', sglang.__version__, 'OK')"
