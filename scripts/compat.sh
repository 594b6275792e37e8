#!/usr/bin/env bash
# Builds and tests baracuda_torch against one torch release, as a new user with that
# torch would: a fresh virtual environment, exactly that torch from PyPI, the extension
# built from a copy of this working tree (CPU-only when nvcc's CUDA major version differs
# from that torch's), then the CPU tests.
#   scripts/compat.sh 2.8.0        scripts/compat.sh 2.15.0
#   PYTEST_ARGS="-x tests/test_lerp.py" scripts/compat.sh 2.8.0
set -euo pipefail
VERSION=${1:?usage: scripts/compat.sh TORCH_VERSION}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/baracuda-compat-$VERSION.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

python3 -m venv "$WORK/venv"
PY=$WORK/venv/bin/python
# The tracked and untracked-but-not-ignored files: no build outputs of this tree.
(cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | (mkdir -p "$WORK/src" && tar -xf - -C "$WORK/src")

$PY -m pip install --quiet --upgrade pip
$PY -m pip install --quiet "torch==$VERSION"
torch_cuda=$($PY -c "import torch; print(torch.version.cuda or '')")
nvcc_cuda=$( (nvcc --version 2>/dev/null || true) | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
if [[ -z "$torch_cuda" || -z "$nvcc_cuda" || "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]]; then
  export BARACUDA_FORCE_CPU=1
  echo "compat: torch $VERSION (CUDA ${torch_cuda:-none}), nvcc ${nvcc_cuda:-none}: CPU-only build"
else
  echo "compat: torch $VERSION (CUDA $torch_cuda), nvcc $nvcc_cuda: CUDA build"
fi

cd "$WORK/src"
PYTHON=$PY TORCH_SPEC="torch==$VERSION" bash scripts/install.sh
$PY -m baracuda_torch
$PY -m pytest tests -q -k "not cuda" ${PYTEST_ARGS:-}
echo "compat: torch $VERSION passed in $(( $(date +%s) - start )) s"
