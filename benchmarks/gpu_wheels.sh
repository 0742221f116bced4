#!/usr/bin/env bash
# Wheels of the Python packages that benchmarks/gpu_checks.sh needs and the GPU machine's image lacks, into
# .whl/ (git-ignored), at the versions installed here (.venv, `make install`). Run once here, where PyPI is
# reachable; carry .whl to the GPU machine, where gpu_checks.sh installs them (nothing can be fetched there).
#
#   bash benchmarks/gpu_wheels.sh            # then: bash benchmarks/gpu_checks.sh OUT_DIR (with .whl carried)
#
# The image (its package list, read 2026-11-17) has torch, numpy, scipy, safetensors, timm, pytest,
# pytest-timeout, pyyaml, tqdm, pillow, matplotlib, networkx, scikit-learn and huggingface-hub; it lacks
# omegaconf, which modwire.training reads configs with (omegaconf 2.4 needs only PyYAML).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
PACKAGES=${PACKAGES:-omegaconf}
mkdir -p .whl
for name in $PACKAGES; do
  version=$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  rm -f .whl/"$name"-*.whl                      # one version of each: two would stop the install
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl "$name==$version"
done
ls -l .whl
