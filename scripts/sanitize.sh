#!/usr/bin/env bash
# Builds the CPU-only extension with AddressSanitizer and UndefinedBehaviorSanitizer
# into a separate folder (never over the normal in-place build), then runs the CPU test
# suite against it and fails on any sanitizer report.
#
#   scripts/sanitize.sh                          # whole CPU suite
#   scripts/sanitize.sh tests/test_lerp.py -k x  # pytest arguments select a subset
#   PYTHON=/path/to/python SANITIZE_DIR=/tmp/bt-asan scripts/sanitize.sh
#
# Only the extension is instrumented: python and libtorch are not, so libasan is
# preloaded (its interceptors must come first) and leak detection is off (CPython's
# own allocations at exit would be reported as leaks). UBSan halts on the first report.
# ASan writes its reports to files under $SANITIZE_DIR/reports, UBSan to the test log;
# any report, or a non-zero pytest status, fails the script.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DIR=${SANITIZE_DIR:-$ROOT/build-sanitize}
CXX_BIN=${CXX:-c++}
MAX_JOBS=${MAX_JOBS:-1}

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
rm -rf "$DIR/pkg" "$DIR/reports"
mkdir -p "$DIR/reports"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
echo "== building the sanitized CPU extension in $DIR (MAX_JOBS=$MAX_JOBS)"
start=$(date +%s)
# distutils puts CFLAGS on every compile line and LDFLAGS on the link line; setup.py's
# own -O3 comes after, which keeps the build's optimization (ASan works at any level).
(cd "$ROOT" && BARACUDA_FORCE_CPU=1 MAX_JOBS=$MAX_JOBS CFLAGS="$SAN" LDFLAGS="$SAN" \
  "$PY" setup.py -q build_ext -t "$DIR/temp" -b "$DIR/lib")
echo "== build: $(( $(date +%s) - start )) s"

# A package folder of its own: the Python sources plus the sanitized _C, so that the
# worktree's in-place _C (if any) can never be the one imported.
mkdir -p "$DIR/pkg/baracuda_torch"
# the package's Python files, subpackages included, without the in-place build's _C
(cd "$ROOT" && find baracuda_torch -name "*.py" -o -name py.typed) | while read -r f; do
  mkdir -p "$DIR/pkg/$(dirname "$f")" && cp "$ROOT/$f" "$DIR/pkg/$f"
done
cp "$DIR"/lib/baracuda_torch/_C*.so "$DIR/pkg/baracuda_torch/"

LIBASAN=$("$CXX_BIN" -print-file-name=libasan.so)
LIBUBSAN=$("$CXX_BIN" -print-file-name=libubsan.so)
[ -f "$LIBASAN" ] || { echo "sanitize.sh: libasan.so not found ($LIBASAN)" >&2; exit 2; }

export LD_PRELOAD="$LIBASAN${LIBUBSAN:+:$LIBUBSAN}"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:log_path=$DIR/reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87:log_path=$DIR/reports/ubsan"
export PYTHONPATH="$DIR/pkg${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_VISIBLE_DEVICES=""

# Test paths are relative to the repository root.
args=()
for a in "$@"; do
  if [[ $a != -* && $a != /* && -e "$ROOT/${a%%::*}" ]]; then args+=("$ROOT/$a"); else args+=("$a"); fi
done
[ ${#args[@]} -gt 0 ] || args=("$ROOT/tests")

cd "$DIR"   # not the worktree: `python -m` puts the current folder first on sys.path
"$PY" -c "import baracuda_torch, sys; f = baracuda_torch._C.__file__; print('== testing', f); sys.exit(0 if f.startswith('$DIR/pkg/') else 3)"
start=$(date +%s)
set +e
# --capture=sys: a sanitizer writes to file descriptor 2 and may end the process; with
# pytest's default fd capture its report would vanish with the process.
"$PY" -m pytest -p no:cacheprovider --capture=sys --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -q -x \
  "${args[@]}" \
  2>&1 | tee "$DIR/pytest.log"
status=${PIPESTATUS[0]}
set -e
echo "== tests: $(( $(date +%s) - start )) s, pytest status $status"

# ASan writes its reports to log_path; UBSan (linked with ASan) writes to stderr.
if compgen -G "$DIR/reports/*" >/dev/null || grep -q -E "runtime error:|ERROR: AddressSanitizer" "$DIR/pytest.log"; then
  echo "sanitize.sh: sanitizer reports:" >&2
  for f in "$DIR"/reports/*; do [ -f "$f" ] && { echo "---- $f" >&2; cat "$f" >&2; }; done
  grep -E -A 30 "runtime error:|ERROR: AddressSanitizer" "$DIR/pytest.log" >&2 || true
  exit 1
fi
exit $status
