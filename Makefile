# sglang-hybrid: one-command install, tests and the demo.
#   make install   venv in .venv with pinned sglang==0.5.23 + our packages (idempotent)
#   make test      the test suite (what .ci/run calls)
#   make demo      tiny Kimi K3 model -> server -> Mooncake trace replay -> summary
#   make docker    image for PLATFORM=rocm|cuda (default: the detected device); docs/rocm.md
#
# DEVICE=cpu|cuda|rocm overrides the detection below. On cpu the CPU-feasible
# subset of sglang's requirements is installed from python/requirements/cpu.txt,
# then sglang itself with --no-deps, then our packages and the CPU sgl_kernel shim
# (the steps live in scripts/install.sh, which the Docker images run too).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SGLANG_VERSION := 0.5.23
TORCH_VERSION := 2.14.1
TORCHVISION_VERSION := 0.29.1
DEVICE ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo cuda; \
                  elif [ -e /dev/kfd ]; then echo rocm; else echo cpu; fi)
STAMP := $(VENV)/.installed-$(DEVICE)
INSTALL_INPUTS := Makefile scripts/install.sh python/pyproject.toml python/setup.py sgl-kernel/pyproject.toml sgl-kernel/cpu_shim/pyproject.toml \
                  python/requirements/cpu.txt python/requirements/test.txt

TINY_MODEL ?= models/kimi-k3-tiny
PYTEST_ARGS ?=
# test files run in this many pytest-xdist worker processes, each file whole in one worker (its
# classes' servers and its test order unchanged); 0 runs everything in the pytest process
TEST_WORKERS ?= 2
TESTS ?= sgl-kernel/tests test

export SGLANG_USE_CPU_ENGINE := $(if $(filter cpu,$(DEVICE)),1,0)

.PHONY: install test test-gpu demo tiny-model clean help

help:
	@sed -n '2,11p' Makefile

install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	@echo ">> installing into $(VENV) for DEVICE=$(DEVICE)"
	PYTHON=$(PYTHON) SGLANG_VERSION=$(SGLANG_VERSION) TORCH_VERSION=$(TORCH_VERSION) TORCHVISION_VERSION=$(TORCHVISION_VERSION) \
	  bash scripts/install.sh --device $(DEVICE) --venv $(VENV)
	@rm -f $(VENV)/.installed-*
	@touch $@

tiny-model: install
	@test -f $(TINY_MODEL)/config.json || $(PY) -m sglang_hybrid.tools.make_tiny_model --arch kimi-k3 --out $(TINY_MODEL)

test: install
	@set +e; $(PY) -m pytest $(TESTS) --ignore=test/gpu -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests from '$(TESTS)': treating as a failure"; exit 1; fi; \
	exit $$rc

# make test-gpu: the GPU suite (test/gpu, docs/gpu.md) on one CUDA GPU, each server class in its own
# worker. GPU_PYTHON: an interpreter that has torch + sglang + our packages (default: the venv's; on a
# machine without network: scripts/offline_bundle.sh install, then GPU_PYTHON=python3).
GPU_PYTHON ?= $(PY)
GPU_WORKERS ?= 4
test-gpu:
	@set +e; SGLANG_HYBRID_TEST_DEVICE=cuda SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
	  $(GPU_PYTHON) -m pytest test/gpu -v -n $(GPU_WORKERS) --dist loadscope $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests from test/gpu: treating as a failure"; exit 1; fi; \
	exit $$rc

demo: tiny-model
	$(PY) -m sglang_hybrid.bench.demo --model-path $(TINY_MODEL)

clean:
	rm -rf $(VENV) models runs .pytest_cache

# make bench: abbench + replay concurrency sweep + AIPerf cross-check against the
# tiny model on a server it starts (CPU: short windows), then the Markdown report
# with plots in $(BENCH_OUT). AIPerf lives in its own venv: installing it into
# .venv would downgrade packages sglang uses (docs/bench-suite.md); if it cannot
# be installed the cross-check records why and the rest runs.
BENCH_OUT ?= runs/bench
AIPERF_VENV ?= runs/aiperf-venv
AIPERF ?= $(AIPERF_VENV)/bin/aiperf
AIPERF_VERSION ?= 0.13.0
BENCH_ARGS ?=

.PHONY: bench
bench: tiny-model
	@test -x $(AIPERF) || { echo ">> installing aiperf into $(AIPERF_VENV)"; \
	  $(PYTHON) -m venv $(AIPERF_VENV) && $(AIPERF_VENV)/bin/pip --disable-pip-version-check -q install aiperf==$(AIPERF_VERSION); } \
	  || echo ">> aiperf could not be installed; the cross-check will say so"
	$(PY) -m sglang_hybrid.bench.suite --model-path $(TINY_MODEL) --device $(DEVICE) --out-dir $(BENCH_OUT) \
	  --aiperf-bin $(AIPERF) $(BENCH_ARGS)

# make docker [PLATFORM=rocm|cuda] [GPU_FAMILY=mi35x|mi30x] [DOCKER_TAG=...] [DOCKER_BUILD_ARGS=...]
# Builds docker/Dockerfile.$(PLATFORM) on upstream's image of sglang $(SGLANG_VERSION); the
# image runs scripts/install.sh --packages-only. GPU_FAMILY picks the ROCm base:
# mi35x = MI355X / MI350X / MI350P (gfx950), mi30x = MI300X / MI325X (gfx942).
DOCKER ?= docker
PLATFORM ?= $(DEVICE)
GPU_FAMILY ?= mi35x
DOCKER_TAG ?= sglang-hybrid:$(SGLANG_VERSION)-$(PLATFORM)$(if $(filter rocm,$(PLATFORM)),-$(GPU_FAMILY))
DOCKER_BUILD_ARGS ?=

.PHONY: docker
docker:
	@case "$(PLATFORM)" in rocm|cuda) ;; \
	  *) echo "make docker: no image for PLATFORM=$(PLATFORM) (detected device: $(DEVICE)); use PLATFORM=rocm or PLATFORM=cuda" >&2; exit 2;; esac
	@command -v $(DOCKER) >/dev/null 2>&1 || { echo "make docker: '$(DOCKER)' not found: install a Docker engine (docs/rocm.md), or set DOCKER=podman" >&2; exit 2; }
	@$(DOCKER) info >/dev/null 2>&1 || { echo "make docker: '$(DOCKER) info' failed: no Docker engine is reachable (daemon not running, or no permission on its socket)" >&2; exit 2; }
	DOCKER_BUILDKIT=1 $(DOCKER) build -f docker/Dockerfile.$(PLATFORM) --build-arg SGLANG_VERSION=$(SGLANG_VERSION) \
	  $(if $(filter rocm,$(PLATFORM)),--build-arg GPU_FAMILY=$(GPU_FAMILY)) $(DOCKER_BUILD_ARGS) -t $(DOCKER_TAG) .
