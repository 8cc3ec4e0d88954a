#!/usr/bin/env bash
# Pack the Triton that sglang 0.5.23's torch pins (3.8.0) for the H200 device tool, whose image runs
# Triton 3.6 under python 3.12 (issue 4, eighteenth round: every kernel figure before 2026-12-02 was 3.6's).
# Writes .whl/t38/{lt.so.xz,rest.tar.xz,setup.sh} (~48 MB; .whl/ is git-ignored: carry it with the run tool's
# `carry: [".whl"]`, 64 MiB per call with the tree). On the device: `source .whl/t38/setup.sh` installs the
# carried wheels of .whl/*.whl (fla-core) into /tmp/site and puts Triton 3.8 ahead of the image's on PYTHONPATH.
# The wheel is stripped of what a kernel benchmark does not load (CUPTI, Proton, the Blackwell ptxas,
# nvdisasm, the instrumentation library) and libtriton.so of its debug sections, to fit the carry limit.
set -euo pipefail
VERSION=${TRITON_VERSION:-3.8.0}
ROOT=$(git rev-parse --show-toplevel)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$WORK" "triton==$VERSION"
(cd "$WORK" && mkdir x && cd x && unzip -q ../triton-*.whl)
T="$WORK/x/triton"
rm -rf "$T/backends/nvidia/lib/cupti" "$T/backends/nvidia/lib/cupti-blackwell" "$T/backends/nvidia/bin/ptxas-blackwell" \
  "$T/backends/nvidia/bin/nvdisasm" "$T/_C/libproton.so" "$T/instrumentation"
strip --strip-unneeded "$T/_C/libtriton.so"
mkdir -p "$ROOT/.whl/t38"
xz -9 -T2 -c "$T/_C/libtriton.so" > "$ROOT/.whl/t38/lt.so.xz"
rm "$T/_C/libtriton.so"
(cd "$WORK/x" && tar -cf - triton triton-*.dist-info | xz -9 -T2 > "$ROOT/.whl/t38/rest.tar.xz")
cat > "$ROOT/.whl/t38/setup.sh" <<'SETUP'
# source from the repository root on the device machine
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/t38
python3 - <<'PY'
import lzma, os, shutil, tarfile
with lzma.open(".whl/t38/rest.tar.xz") as f:
    tarfile.open(fileobj=f, mode="r|").extractall("/tmp/t38")
so = "/tmp/t38/triton/_C/libtriton.so"
if not os.path.exists(so):
    with lzma.open(".whl/t38/lt.so.xz") as f, open(so, "wb") as o:
        shutil.copyfileobj(f, o, 1 << 24)
PY
chmod +x /tmp/t38/triton/_C/libtriton.so /tmp/t38/triton/backends/nvidia/bin/*
export PYTHONPATH=/tmp/t38:/tmp/site:sgl-kernel/python
export PYTHONUNBUFFERED=1
set +e
SETUP
ls -la "$ROOT/.whl/t38"
