#!/usr/bin/env bash
# Builds and tests baracuda_torch against one torch release (and optionally one
# transformers release), as a new user with them would: a fresh virtual environment,
# exactly that torch from PyPI, the extension built from a copy of this working tree
# (CPU-only when nvcc's CUDA major version differs from that torch's), then the CPU tests.
#   scripts/compat.sh 2.8.0        scripts/compat.sh 2.15.0
#   scripts/compat.sh 2.15.0 5.0.0                       # and exactly transformers 5.0.0
#   TRANSFORMERS_VERSION=5.17.0 scripts/compat.sh 2.15.0 # the same, by environment
#   PYTEST_ARGS="-x tests/test_lerp.py" scripts/compat.sh 2.8.0
#   BARACUDA_FORCE_CPU=1 scripts/compat.sh 2.15.0   # CPU-only build even where nvcc matches
#   COMPAT_SITE_PACKAGES=/path/to/venv/lib/python3.11/site-packages scripts/compat.sh 2.15.0 5.17.0
#       # a site-packages that already holds that torch: the fresh environment sees it
#       # (a .pth file) instead of downloading it again; its torch must be that version.
# Without a transformers version, install.sh's range picks PyPI's newest in range (or keeps
# an installed one inside it).
set -euo pipefail
VERSION=${1:?usage: scripts/compat.sh TORCH_VERSION [TRANSFORMERS_VERSION]}
TF_VERSION=${2:-${TRANSFORMERS_VERSION:-}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/baracuda-compat-$VERSION${TF_VERSION:+-tf$TF_VERSION}.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

python3 -m venv "$WORK/venv"
PY=$WORK/venv/bin/python
if [[ -n "${COMPAT_SITE_PACKAGES:-}" ]]; then
  site=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$COMPAT_SITE_PACKAGES" > "$site/compat-shared.pth"
  have=$($PY -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true)
  if [[ "${have%%+*}" != "$VERSION" ]]; then
    echo "compat: COMPAT_SITE_PACKAGES has torch ${have:-none}, not $VERSION" >&2
    exit 2
  fi
fi
# The tracked and untracked-but-not-ignored files: no build outputs of this tree.
(cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | (mkdir -p "$WORK/src" && tar -xf - -C "$WORK/src")

if [[ -z "${COMPAT_SITE_PACKAGES:-}" ]]; then
  $PY -m pip install --quiet --upgrade pip
  $PY -m pip install --quiet "torch==$VERSION"
fi
if [[ -n "$TF_VERSION" ]]; then
  # into the fresh environment, ahead of any shared site-packages
  $PY -m pip install --quiet "transformers==$TF_VERSION"
fi
torch_cuda=$($PY -c "import torch; print(torch.version.cuda or '')")
nvcc_cuda=$( (nvcc --version 2>/dev/null || true) | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
if [[ "${BARACUDA_FORCE_CPU:-0}" == 1 ]]; then
  echo "compat: torch $VERSION (CUDA ${torch_cuda:-none}), nvcc ${nvcc_cuda:-none}: CPU-only build (BARACUDA_FORCE_CPU=1)"
elif [[ -z "$torch_cuda" || -z "$nvcc_cuda" || "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]]; then
  export BARACUDA_FORCE_CPU=1
  echo "compat: torch $VERSION (CUDA ${torch_cuda:-none}), nvcc ${nvcc_cuda:-none}: CPU-only build"
else
  echo "compat: torch $VERSION (CUDA $torch_cuda), nvcc $nvcc_cuda: CUDA build"
fi

cd "$WORK/src"
if [[ -n "$TF_VERSION" ]]; then export TRANSFORMERS_SPEC="transformers==$TF_VERSION"; fi
PYTHON=$PY TORCH_SPEC="torch==$VERSION" bash scripts/install.sh
got_tf=$($PY -c "import transformers; print(transformers.__version__)")
if [[ -n "$TF_VERSION" && "$got_tf" != "$TF_VERSION" ]]; then
  echo "compat: wanted transformers $TF_VERSION, the environment has $got_tf" >&2
  exit 2
fi
$PY -m baracuda_torch
$PY -m pytest tests -q -k "not cuda" ${PYTEST_ARGS:-}
echo "compat: torch $VERSION, transformers $got_tf passed in $(( $(date +%s) - start )) s"
