#!/usr/bin/env bash
# The GPU checks in one go (issue 25's GPU goals), each step under its own time limit so that one slow
# step cannot eat the others. About 8 minutes on one H100/H200.
#
#   PYTHONPATH=src bash benchmarks/gpu_checks.sh OUT_DIR
#
# Writes OUT_DIR/<step>.txt (the step's whole output and its exit status) and the JSON of the scripts
# that write one. Steps: ViT vs timm's blocks (fp32, bf16, bf16 compiled); compiled/eager
# and bf16/fp32 per family; fused attention; NAC vs Perceiver IO at Table 4 sizes (bf16, compiled); the CUDA
# tests; whether CUDA runs are bit-identical (check_run_determinism.py); NFM over its base (fp32, bf16);
# issue 39's FlexAttention backend (its CUDA tests, then attention_backend flex vs sdpa, eager and compiled);
# gradient checkpointing's cost and memory.
# The step limits add up to about 20 minutes, more than one 10-minute call: choose steps with STEPS, e.g.
#   STEPS="vit_timm compile attention nac cuda_tests" PYTHONPATH=src bash benchmarks/gpu_checks.sh OUT_DIR
#   STEPS="determinism nfm flex_tests flex flex_compiled checkpointing" PYTHONPATH=src bash benchmarks/gpu_checks.sh OUT_DIR
# The packages the machine's image lacks (omegaconf, for the training steps and tests) travel as wheels: run
# `bash benchmarks/gpu_wheels.sh` here first and carry `.whl`; they are installed into /tmp/site below.
set -u
out=${1:?usage: gpu_checks.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then                 # carried wheels (benchmarks/gpu_wheels.sh)
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$py -c "import omegaconf" 2>/dev/null || echo "warning: no omegaconf here: the training steps and tests will fail" \
    "(run benchmarks/gpu_wheels.sh and carry .whl)"

step() {    # step NAME SECONDS COMMAND...: run it, keep its output, go on whatever it returns
    local name=$1 limit=$2; shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return 0; fi   # not chosen
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$out/$name.txt" 2>&1   # -k: training code catches SIGTERM to stop cleanly
    local rc=$?
    echo "exit $rc after $((SECONDS - t0)) s" >>"$out/$name.txt"
    tail -n 25 "$out/$name.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
step vit_timm 150 bash -c "$py benchmarks/bench_vit.py --device cuda --peer timm && \
    $py benchmarks/bench_vit.py --device cuda --peer timm --precision bf16 && \
    $py benchmarks/bench_vit.py --device cuda --peer timm --precision bf16 --compile"
step compile 150 $py benchmarks/bench_compile.py --device cuda --batch 64 --out "$out/compile_cuda.json"
step attention 45 $py benchmarks/bench_attention.py --device cuda --batch 32 --out "$out/attention_cuda.json"
step nac 90 $py benchmarks/bench_nac.py --device cuda --precision bf16 --compile --train-batch 0
# (not the CPU compile-mode tests: minutes of compiling on the CPU, nothing CUDA)
step cuda_tests 150 $py -m pytest -q -rf -p no:cacheprovider --timeout 60 -k "not on_the_cpu" \
    tests/training/test_precision_and_compile.py tests/nn/test_fused_attention.py tests/training/test_loader_defaults.py
# issue 39: are two CUDA runs of the same data bit-identical (default kernels, then deterministic ones), and do
# loader workers change a CUDA run beyond that?
step determinism 120 bash -c "$py benchmarks/check_run_determinism.py --device cuda --out $out/determinism_cuda.json && \
    $py benchmarks/check_run_determinism.py --device cuda --deterministic --out $out/determinism_cuda_deterministic.json"
# issue 39: NFM over its base on the GPU, fp32 and bf16 (goal: NFM <= 2.5x its base in bf16)
step nfm 150 bash -c "$py benchmarks/bench_nfm.py --device cuda --batch 64 --soc-batch 64 --repeats 5 \
    --out $out/nfm_cuda_fp32.json && \
    $py benchmarks/bench_nfm.py --device cuda --batch 64 --soc-batch 64 --repeats 5 --precision bf16 \
    --out $out/nfm_cuda_bf16.json"
step flex_tests 90 $py -m pytest -q -rf -p no:cacheprovider tests/nn/test_flex_attention.py -k cuda
step flex 120 $py benchmarks/bench_flex.py --device cuda --batch 32 --out "$out/flex_cuda.json"
step flex_compiled 150 $py benchmarks/bench_flex.py --device cuda --batch 32 --compile --out "$out/flex_cuda_compiled.json"
# gradient checkpointing: step time and memory (kept for the backward, and the step's peak) with and without it
step checkpointing 90 $py benchmarks/bench_checkpointing.py --device cuda --batch 64 --out "$out/checkpointing_cuda.json"
