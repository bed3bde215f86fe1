#!/usr/bin/env bash
# Creates ./.venv (or reuses it) with torch, fairseq, the plugin and the test extras.
# torch is installed first and pinned: an unpinned torch pulls GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
pip install -q "torch==${TORCH_VERSION}" 2>&1 | grep -v "^WARNING: Location" || true
pip install -q -e ".[hf,tensorboard,plots,test]" 2>&1 | grep -v "^WARNING: Location" || true
# fairseq declares torchaudio, whose wheel here is a CUDA build that breaks
# `import transformers`; no text code path of fairseq or this plugin uses it.
pip uninstall -q -y torchaudio 2>/dev/null || true
python -c "import torch, fairseq, electra_plugin, transformers; print(f'environment ready: torch {torch.__version__}, fairseq {fairseq.__version__}, transformers {transformers.__version__}')"
