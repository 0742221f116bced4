# The two commands a new user runs: `make demo` and `make test`.
# torch==2.13.0 is installed first so that pip never pulls a CUDA build of torch;
# pyproject declares torch>=2.6, so users keep their own build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-all bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m modwire.demo

test: install
	$(BIN)/python -m pytest -q -m "not slow"

test-all: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/bench_nac.py
	$(BIN)/python benchmarks/bench_sparsify.py
	$(BIN)/python benchmarks/bench_block_sparse.py
	$(BIN)/python benchmarks/bench_graph.py
	$(BIN)/python benchmarks/bench_startup.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
