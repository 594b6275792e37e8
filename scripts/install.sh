#!/usr/bin/env bash
# Installs what baracuda_torch needs into the current Python environment (torch from PyPI
# within the supported range, build and test tools, transformers for the Hugging Face
# tests) and builds the extension in place. Safe to run again, and quick when nothing
# changed: pip runs only when a requirement is missing or outside its range, and the
# build is skipped when the stamp next to the built extension (baracuda_torch/_C.stamp)
# matches the inputs of the build (see build_inputs below).
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
TRANSFORMERS_SPEC=${TRANSFORMERS_SPEC:-"transformers>=5.0,<5.25"}
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

# A hash of everything the built extension depends on: the sources (every file under
# csrc/, setup.py), this torch (version file and location), this Python, the compiler
# and nvcc that setup.py would use, and the build settings (BARACUDA_*, TORCH_CUDA_ARCH_LIST,
# CUDA_HOME/CUDA_PATH, CC/CXX and their flags). MAX_JOBS only changes the build's speed.
build_inputs() {
  (cd / && "$PY" - "$OLDPWD" <<'EOF'
import hashlib, importlib.util, os, shutil, subprocess, sys
root = sys.argv[1]
h = hashlib.sha256()
def add(*parts):
    for p in parts:
        h.update(repr(p).encode() + b"\0")
files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "csrc")) for f in fs]
for path in sorted(files) + [os.path.join(root, "setup.py")]:
    with open(path, "rb") as f:
        add(os.path.relpath(path, root), hashlib.sha256(f.read()).hexdigest())
spec = importlib.util.find_spec("torch")
torch_dir = os.path.dirname(os.path.realpath(spec.origin)) if spec else None
add("torch", torch_dir)
if torch_dir:
    with open(os.path.join(torch_dir, "version.py"), "rb") as f:
        add(f.read())
add("python", os.path.realpath(sys.executable), sys.version)
env = {k: v for k, v in os.environ.items()
       if k.startswith("BARACUDA_") and k != "BARACUDA_REBUILD"
       or k in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CUDA_PATH", "CC", "CXX", "CFLAGS",
                "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "NVCC_FLAGS", "NVCC_APPEND_FLAGS")}
add(sorted(env.items()))
for tool in ("nvcc", os.environ.get("CXX", "c++")):
    cands = [os.path.join(os.environ[k], "bin", tool) for k in ("CUDA_HOME", "CUDA_PATH")
             if tool == "nvcc" and k in os.environ] + [shutil.which(tool),
             "/usr/local/cuda/bin/nvcc" if tool == "nvcc" else None]
    exe = next((c for c in cands if c and os.path.exists(c)), None)
    out = ""
    if exe:
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
        except Exception as e:
            out = repr(e)
    add(tool, exe and os.path.realpath(exe), out)
print(h.hexdigest())
EOF
  )
}

# The built extension, its stamp, and whether this interpreter has this tree installed.
so_file() { compgen -G "baracuda_torch/_C*.so" | head -n 1 || true; }
STAMP=baracuda_torch/_C.stamp
stamp_line() {  # the inputs' hash and the built file's size and modification time
  local so; so=$(so_file)
  [[ -n "$so" ]] || return 0
  echo "$1 $so $(stat -c '%s %Y' "$so")"
}
installed_here() {
  (cd / && "$PY" - "$OLDPWD" <<'EOF'
import importlib.util, os, sys
spec = importlib.util.find_spec("baracuda_torch")
ok = spec is not None and spec.origin is not None and \
    os.path.realpath(os.path.dirname(spec.origin)) == os.path.realpath(os.path.join(sys.argv[1], "baracuda_torch"))
sys.exit(0 if ok else 1)
EOF
  )
}

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
