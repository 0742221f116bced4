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
	$(BIN)/pip install -q -e ".[test,hub,lightning]"
	touch $(STAMP)

install: $(STAMP)

# The demo reads Fashion-MNIST from Debian's dataset-fashion-mnist; installed here when it is
# missing and apt-get is usable (root). Otherwise the demo falls back to scikit-learn's digits
# and says so.
FASHION_MNIST := /usr/share/datasets/fashion-mnist

demo: install
	@if [ ! -d $(FASHION_MNIST) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's dataset-fashion-mnist (into $(FASHION_MNIST)) for the demo"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; } || \
	  echo "could not install dataset-fashion-mnist: the demo uses scikit-learn's digits instead"; \
	fi
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
	$(BIN)/python benchmarks/bench_input_checks.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_vit.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_ni.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_ait.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_compile.py --out benchmarks/results/compile_cpu.json
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/bench_attention.py --batch 8 --iters 7 --out benchmarks/results/attention_cpu.json
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_flex.py --batch 8 --iters 7 --out benchmarks/results/flex_cpu.json
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/bench_nfm.py --out benchmarks/results/nfm_cpu.json
	$(BIN)/python benchmarks/bench_train_loop.py --out benchmarks/results/train_loop_cpu.json

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
