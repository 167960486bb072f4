#!/usr/bin/env bash
# Create .venv-ct2: CTranslate2 (the CPU inference engine behind faster-whisper and many local LLM tools)
# next to provmark, kept apart from .venv like .venv-vllm. It holds only what benchmarks/ctranslate2_throughput.py
# needs: ctranslate2, and torch and transformers for its converter. Idempotent (stamp file).
# Usage: bash scripts/setup_ct2_venv.sh   (PYTHON=python3.11 picks the interpreter, CT2_VENV=path another folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${CT2_VENV:-.venv-ct2}
BIN=$VENV/bin
STAMP=$VENV/.installed
CT2_SPEC="ctranslate2==4.8.5"
TORCH_SPEC="torch==2.13.0"        # the CPU build on local disk (an unpinned torch is a CUDA build)
TRANSFORMERS_SPEC="transformers==5.23.0"

if [ -f "$STAMP" ] && [ "$STAMP" -nt "$0" ]; then
  echo "setup_ct2_venv: $VENV is up to date"
  exit 0
fi
start=$(date +%s)
test -x "$BIN/python" || "$PYTHON" -m venv "$VENV"
"$BIN/pip" install --quiet "$TORCH_SPEC"
"$BIN/pip" install --quiet "$CT2_SPEC" "$TRANSFORMERS_SPEC" "$TORCH_SPEC"
"$BIN/python" -c "import ctranslate2; print('ctranslate2', ctranslate2.__version__)"
touch "$STAMP"
echo "setup_ct2_venv: done in $(( $(date +%s) - start )) s"
