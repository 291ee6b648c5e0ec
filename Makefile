# One entry point for people and CI. `make demo` and `make test` set everything up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pip's `torch==2.13.0` is a CPU build; the package metadata keeps torch>=2.5 so GPU users get CUDA builds.
TORCH_CPU ?= torch==2.13.0

.PHONY: setup demo test test-fast lint types contracts check bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install --quiet 'torch>=2.5'; \
	else $(BIN)/pip install --quiet '$(TORCH_CPU)'; fi
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/ppscope demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)   # the tests without the `slow` mark, for the edit-test loop: under 3 minutes on 2 cores
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)   # the boundaries between the parts, from [tool.importlinter] in pyproject.toml
	$(BIN)/lint-imports

check: lint types contracts test

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'   # adds HTA, the reference the analyzer is timed against
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
