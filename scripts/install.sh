#!/usr/bin/env bash
# Installs what baracuda_torch needs into the current Python environment (torch from PyPI
# within the supported range, build and test tools, transformers for the Hugging Face
# tests) and builds the extension in place. Safe to run again, and quick when nothing
# changed: pip runs only when a requirement is missing or outside its range, and the
# build is skipped when the stamp next to the built extension (baracuda_torch/_C.stamp)
# matches the inputs of the build (scripts/build_stamp.py says which).
#   PYTHON=python3.12 scripts/install.sh     # another interpreter (or activate a venv first)
#   BARACUDA_FORCE_CPU=1 scripts/install.sh  # CPU-only build even where nvcc exists
#   TORCH_SPEC="torch==2.8.0" scripts/install.sh   # a given torch of the range
#   TRANSFORMERS_SPEC="transformers==5.17.0" scripts/install.sh   # a given transformers
#   BARACUDA_REBUILD=1 scripts/install.sh    # build even when the stamp says it is current
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The tested ranges; keep in step with pyproject.toml and README.md.
TORCH_SPEC=${TORCH_SPEC:-"torch>=2.8,<2.16"}
TRANSFORMERS_SPEC=${TRANSFORMERS_SPEC:-"transformers>=5.0,<5.26"}
REQUIREMENTS=("setuptools>=77" wheel ninja "$TORCH_SPEC" pytest numpy expecttest hypothesis
              "$TRANSFORMERS_SPEC")

# Prints the requirements that are missing or outside their range (none: all satisfied).
unmet() {
  "$PY" - "$@" <<'EOF'
import importlib.metadata as md, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        print(spec)
        continue
    if not req.specifier.contains(version, prereleases=True):
        print(spec)
EOF
}

missing=$(unmet "${REQUIREMENTS[@]}")
if [[ -n "$missing" ]]; then
  echo "install: to install or bring into range: $(echo $missing)"
  "$PY" -m pip install --quiet --upgrade pip "setuptools>=77" wheel ninja
  # Keeps an installed torch that is inside the range; otherwise installs PyPI's newest of
  # it (the default Linux wheel is a CUDA build; a CUDA build of the extension needs nvcc of
  # the same CUDA major version, setup.py says so if they differ).
  "$PY" -m pip install --quiet "$TORCH_SPEC"
  "$PY" -m pip install --quiet pytest numpy expecttest hypothesis "$TRANSFORMERS_SPEC"
else
  echo "install: every requirement is installed and in range; pip skipped"
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| GPU:', torch.cuda.is_available())"

# A hash of everything the built extension depends on (scripts/build_stamp.py says what:
# the sources under csrc/ and setup.py, this torch, this Python, the compiler and nvcc,
# the build settings; MAX_JOBS only changes the build's speed).
build_inputs() { "$PY" scripts/build_stamp.py inputs .; }

# The built extension, its stamp, and whether this interpreter has this tree installed.
so_file() { compgen -G "baracuda_torch/_C*.so" | head -n 1 || true; }
STAMP=baracuda_torch/_C.stamp
stamp_line() {  # the inputs' hash and the built file's size and modification time
  local so; so=$(so_file)
  [[ -n "$so" ]] || return 0
  echo "$1 $so $(stat -c '%s %Y' "$so")"
}
installed_here() { "$PY" scripts/build_stamp.py installed .; }

inputs=$(build_inputs)
if [[ "${BARACUDA_REBUILD:-0}" != 1 && -f "$STAMP" && -n "$(so_file)" \
      && "$(cat "$STAMP")" == "$(stamp_line "$inputs")" ]] && installed_here; then
  echo "install: $(so_file) is current for these sources, this torch and these build settings; build skipped"
else
  rm -f "$STAMP"
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  "$PY" -m pip install --no-build-isolation --no-deps -e .
  line=$(stamp_line "$inputs")
  if [[ -n "$line" ]]; then echo "$line" > "$STAMP"; fi
fi
