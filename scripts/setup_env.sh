#!/usr/bin/env bash
# Creates ./.venv (or reuses it) with torch, fairseq, the plugin and the test extras.
# torch is installed first, pinned to the version the suite is measured with. The pin
# chooses the version only: pip picks the wheel for this platform from its indexes (on Linux
# x86_64, PyPI's wheel is a CUDA build with its nvidia packages, GBs, on a GPU machine and a
# CPU-only one alike). To keep another build (a GPU machine's own CUDA version, or PyTorch's
# CPU-only wheel), install it into .venv first and set TORCH_VERSION to its version: pip
# then keeps it.
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
