#!/usr/bin/env bash
# Offline Python bundle for a CUDA machine without network (an air-gapped GPU cluster, or the
# project's lent H200): everything `python -m sglang.launch_server` + this plugin + `make test-gpu`
# need beside the machine's own torch / triton / numpy, as ONE xz tarball of an installed target
# folder (docs/install.md#cuda-without-network).
#
#   scripts/offline_bundle.sh pack [--python-version 3.12] [--out DIR]     (on a machine with network)
#       downloads the wheels of python/requirements/cuda-offline.txt for CPython X.Y on
#       manylinux x86_64, builds our three wheels (sgl-hybrid-kernel, sglang-hybrid and the
#       sgl_kernel stand-in), installs them all with --no-deps into a staging folder, drops parts
#       no serving path imports, and writes DIR/sglang-hybrid-offline-pyXY.tar.xz (default DIR:
#       .offline/, which .git/info/exclude may ignore; about 30 MB).
#   scripts/offline_bundle.sh install BUNDLE [--target DIR]               (on the CUDA machine)
#       unpacks into DIR (default /tmp/sglang-hybrid-site) and prints the PYTHONPATH line to use.
#       The folder holds the packages' dist-info, so sglang finds the plugin's entry point.
#
# Pins come from python/requirements/cuda-offline.txt; edit it for another image.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "scripts/offline_bundle.sh: $*" >&2; exit 2; }
usage() { sed -n '2,18p' "$0" >&2; exit 2; }

cmd="${1:-}"; [ -n "$cmd" ] || usage; shift
PYV=3.12 OUT=.offline TARGET=/tmp/sglang-hybrid-site BUNDLE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYV="${2:?}"; shift 2 ;;
    --out) OUT="${2:?}"; shift 2 ;;
    --target) TARGET="${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    -*) die "unknown option '$1'" ;;
    *) BUNDLE="$1"; shift ;;
  esac
done
PYTAG="${PYV/./}"
NAME="sglang-hybrid-offline-py${PYTAG}.tar.xz"

# Parts of the installed tree that no serving or test path imports (measured on the H200 image):
# the diffusion server, the Rust bench/server extensions, mistral_common's tokenizer data and
# pycountry's translations. Also the Rust TreeCore of upstream's UnifiedRadixCache: it is built
# against torch 2.14 and segfaults in its first insert on the image's torch 2.11 (H100, 2026-12-07);
# without it upstream falls back to its Python TreeCore by itself.
TRIM=(sglang/multimodal_gen "sglang/srt/rust_extensions/_bench*" "sglang/srt/rust_extensions/_server*"
      mistral_common/data pycountry/locales "sglang/srt/mem_cache/rust_tree_core/mem_cache*.so")

pack() {
  local py="${PYTHON:-python3}"
  WHEELS="$(mktemp -d)"; STAGE="$(mktemp -d)"
  trap 'rm -rf "$WHEELS" "$STAGE"' EXIT
  local wheels="$WHEELS" stage="$STAGE"
  local plat=()
  for n in 2_34 2_28 2_27 2_24 2_17 2_5; do plat+=(--platform "manylinux_${n}_x86_64"); done
  plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
  echo ">> downloading wheels for cp${PYTAG} (python/requirements/cuda-offline.txt)"
  grep -vE '^\s*(#|$)' python/requirements/cuda-offline.txt > "$wheels/reqs.txt"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${plat[@]}" -d "$wheels" -r "$wheels/reqs.txt"
  echo ">> building our wheels"
  rm -rf python/build sgl-kernel/build sgl-kernel/cpu_shim/build  # setuptools would reuse stale files
  "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$wheels" ./sgl-kernel ./python ./sgl-kernel/cpu_shim
  rm -rf python/build sgl-kernel/build sgl-kernel/cpu_shim/build
  echo ">> installing into a staging folder"
  "$py" -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${plat[@]}" --target "$stage" "$wheels"/*.whl
  for t in "${TRIM[@]}"; do
    # shellcheck disable=SC2086
    rm -rf "$stage"/$t
  done
  rm -rf "$stage/bin"
  mkdir -p "$OUT"
  tar -C "$stage" -cJf "$OUT/$NAME" .
  echo ">> wrote $OUT/$NAME ($(du -h "$OUT/$NAME" | cut -f1))"
}

install() {
  [ -n "$BUNDLE" ] || die "install needs the bundle file (from: scripts/offline_bundle.sh pack)"
  [ -f "$BUNDLE" ] || die "no bundle at '$BUNDLE'"
  mkdir -p "$TARGET"
  tar -C "$TARGET" -xJf "$BUNDLE"
  echo "export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH} SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1"
}

case "$cmd" in
  pack) pack ;;
  install) install ;;
  *) usage ;;
esac
