#!/usr/bin/env bash
# The one script for the GPU machine: build for sm_90 with every core, run the whole
# test suite on CUDA, run the benchmarks; full logs and CSV under $OUT, a short summary
# printed last. Files under $OUT: summary.txt, build.log, test.log, bench.log, bench.csv,
# bench.md, bench.png (at most 8 come back from the device machine; the ssd stage adds
# peers.log and ssd_<i>.log: run it without bench).
#   STAGES=build,test,bench (default; also: sanitize, ssd)   PYTEST_TARGETS="tests/test_rope.py"   PYTEST_ARGS="-x"
#   (PYTEST_ARGS="-m cuda": only the tests that need a CUDA device, tests/conftest.py's marker)
#   SANITIZE_TOOLS=memcheck,racecheck,synccheck,initcheck   SANITIZE_FAMILIES=gated,gated_pair,rope,rope_cos_sin,...
#   FAMILIES=gated_activation,rope (benchmarks to run; default all)
#   ssd: the SSD against mamba_ssm kernel by kernel (benchmarks/tune/profile_ssd_chunk_scan.py,
#   peers/ installed first, in the background during the build), one run per ';'-separated
#   argument list of SSD_PROFILES, each logged to ssd_<i>.log (their summary tables printed last)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
STAGES=${STAGES:-build,test,bench}
SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck,racecheck,synccheck,initcheck}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}  # Hopper with its sm_90a-only instructions (wgmma)
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

note "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null)"
note "== torch $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)') | nvcc $(nvcc --version | tail -1)"

status=0
peers_pid=
if [[ ",$STAGES," == *",ssd,"* && -d peers ]]; then
  bash scripts/peers.sh install > "$OUT/peers.log" 2>&1 &
  peers_pid=$!
fi
if [[ ",$STAGES," == *",build,"* ]]; then
  t0=$(date +%s)
  if $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    note "build: ok in $(( $(date +%s) - t0 )) s (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS, $(${CXX:-c++} --version | head -1))"
  else
    note "build: FAILED (see build.log)"; grep -E "error" "$OUT/build.log" | head -20 | tee -a "$summary"; exit 1
  fi
fi

if [[ ",$STAGES," == *",test,"* ]]; then
  t0=$(date +%s)
  $PY -m pytest ${PYTEST_TARGETS:-tests} -q -rfEs ${PYTEST_ARGS:-} > "$OUT/test.log" 2>&1 || status=1
  note "tests ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/test.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/test.log" | head -30 | tee -a "$summary"
fi

if [[ ",$STAGES," == *",sanitize,"* ]]; then
  # compute-sanitizer over every kernel variant at small shapes (scripts/sanitize_cuda.py);
  # all tools' reports in one log, a line each in the summary.
  : > "$OUT/sanitize.log"
  for tool in ${SANITIZE_TOOLS//,/ }; do
    t0=$(date +%s)
    if compute-sanitizer --tool "$tool" --error-exitcode 1 --print-limit 50 \
        $PY scripts/sanitize_cuda.py ${SANITIZE_FAMILIES:+--families $SANITIZE_FAMILIES} \
        >> "$OUT/sanitize.log" 2>&1; then
      note "sanitize $tool: clean ($(( $(date +%s) - t0 )) s, $(grep -c '' "$OUT/sanitize.log") log lines so far)"
    else
      status=1; note "sanitize $tool: ERRORS ($(( $(date +%s) - t0 )) s; see sanitize.log)"
      grep -m5 -E "^========= (Invalid|Race|Barrier|Uninitialized|Error)" "$OUT/sanitize.log" | tee -a "$summary"
    fi
  done
fi

if [[ ",$STAGES," == *",ssd,"* ]]; then
  [ -n "$peers_pid" ] && { wait "$peers_pid" || note "peers: install failed (see peers.log)"; }
  i=0
  IFS=';' read -ra runs <<< "${SSD_PROFILES:---shapes 0,3;--options --shapes 0;--shapes 2,1}"
  for args in "${runs[@]}"; do
    i=$((i + 1)); t0=$(date +%s)
    # (word splitting of $args is meant: each run's arguments)
    # shellcheck disable=SC2086
    $PY benchmarks/tune/profile_ssd_chunk_scan.py $args > "$OUT/ssd_$i.log" 2>&1 || status=1
    note "ssd $i ($args): $(( $(date +%s) - t0 )) s"
    grep -E "^B[0-9].* \| " "$OUT/ssd_$i.log" | tee -a "$summary"
  done
fi

if [[ ",$STAGES," == *",bench,"* ]]; then
  t0=$(date +%s)
  $PY benchmarks/run_all.py --out "$OUT" ${FAMILIES:+--families $FAMILIES} > "$OUT/bench.log" 2>&1 || status=1
  note "bench: $(( $(date +%s) - t0 )) s"
  tail -5 "$OUT/bench.log" | grep -iE "error|Traceback" | tee -a "$summary"
fi

echo
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
echo
cat "$summary"
exit $status
