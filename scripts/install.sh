#!/usr/bin/env bash
# Installs what baracuda_torch needs into the current Python environment (torch from PyPI
# within the supported range, build and test tools, transformers for the Hugging Face
# tests) and builds the extension in place. Safe to run again.
#   PYTHON=python3.12 scripts/install.sh     # another interpreter (or activate a venv first)
#   BARACUDA_FORCE_CPU=1 scripts/install.sh  # CPU-only build even where nvcc exists
#   TORCH_SPEC="torch==2.8.0" scripts/install.sh   # a given torch of the range
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The tested range; keep in step with pyproject.toml and README.md.
TORCH_SPEC=${TORCH_SPEC:-"torch>=2.8,<2.16"}

$PY -m pip install --quiet --upgrade pip "setuptools>=77" wheel ninja
# Keeps an installed torch that is inside the range; otherwise installs PyPI's newest of
# it (the default Linux wheel is a CUDA build; a CUDA build of the extension needs nvcc of
# the same CUDA major version, setup.py says so if they differ).
$PY -m pip install --quiet "$TORCH_SPEC"
$PY -m pip install --quiet pytest numpy expecttest hypothesis "transformers>=5"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| GPU:', torch.cuda.is_available())"

export MAX_JOBS=${MAX_JOBS:-$(nproc)}
$PY -m pip install --no-build-isolation --no-deps -e .
