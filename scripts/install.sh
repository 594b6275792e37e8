#!/usr/bin/env bash
# Installs what baracuda_torch needs (torch from PyPI if it is missing, build and test
# tools) and builds the extension in place. Safe to run again.
#   PYTHON=python3.12 scripts/install.sh     # another interpreter
#   BARACUDA_FORCE_CPU=1 scripts/install.sh  # CPU-only build even where nvcc exists
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

$PY -m pip install --quiet --upgrade pip "setuptools>=64" wheel ninja
if ! $PY -c "import torch" >/dev/null 2>&1; then
  # PyPI's default Linux wheel is a CUDA 13 build; nvcc's major version must match it.
  $PY -m pip install --quiet "torch>=2.4"
fi
$PY -m pip install --quiet pytest numpy expecttest hypothesis
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| GPU:', torch.cuda.is_available())"

export MAX_JOBS=${MAX_JOBS:-$(nproc)}
$PY -m pip install --no-build-isolation --no-deps -e .
