#!/usr/bin/env bash
# Context-parallel Mamba-2 on 2 GPUs over NCCL (issue 26), one device call (<= BUDGET s, 540 by default):
# versions and topology; build (as scripts/gpu.sh does); NCCL correctness tests; the CP example under torchrun; the scaling
# benchmark (1 GPU vs CP on 2 vs all-to-all head sharding on 2). Full logs and the JSON under $OUT; a summary last.
#   OUT=$OUT bash scripts/gpu_nccl.sh            (BUILD=0 skips the build when the in-place extension is current)
cd "$(dirname "$0")/.."
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-32} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p $OUT; S=$OUT/summary.txt; T0=$(date +%s); BUDGET=${BUDGET:-540}
el() { echo $(( $(date +%s) - T0 )); }
# cap WANT [RESERVE]: WANT seconds, or what is left of the budget after RESERVE seconds, whichever is less (>= 10)
cap() { local l=$(( BUDGET - $(el) - ${2:-0} )); (( l > $1 )) && l=$1; (( l < 10 )) && l=10; echo $l; }

nvidia-smi > $OUT/nvidia-smi.txt 2>&1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee $S
nvidia-smi topo -m 2>&1 | tee $OUT/topo.txt | tee -a $S
python3 -c 'import torch, torch.distributed; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count(), "nccl available", torch.distributed.is_nccl_available())' 2>&1 | tee -a $S
env | grep -E "^(NCCL_|TORCH_SYMM|NVSHMEM_)" | sort | tee -a $S

if [ "${BUILD:-1}" = 1 ]; then
  timeout $(cap 240 240) python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { echo "BUILD FAILED rc=$? at $(el) s" | tee -a $S; grep -m20 -E "error" $OUT/build.log | tee -a $S; exit 1; }
  echo "build done at $(el) s" | tee -a $S
fi
python3 -c 'import baracuda_torch, torch; print("baracuda_torch", baracuda_torch.__file__)' 2>&1 | tail -1 | tee -a $S

# NCCL correctness: every case of tests/test_distributed.py on cuda:0/cuda:1 (world 4 skips on 2 GPUs)
timeout $(cap 150 200) python3 -m pytest tests/test_distributed_nccl.py -x -q -rs > $OUT/nccl_tests.log 2>&1
echo "nccl tests rc=$?: $(tail -1 $OUT/nccl_tests.log) at $(el) s" | tee -a $S
grep -E "^(FAILED|ERROR|SKIPPED)" $OUT/nccl_tests.log | head -20 | tee -a $S

# the example: torchrun (python3 -m torch.distributed.run), 2 ranks, NCCL; its step-0 check against one process
timeout $(cap 90 150) python3 -m torch.distributed.run --standalone --nproc-per-node 2 examples/context_parallel_mamba2.py > $OUT/example.log 2>&1
echo "example rc=$? at $(el) s" | tee -a $S
grep -E "step-0 check|^median|Error|error" $OUT/example.log | head -8 | tee -a $S

# the scaling benchmark: its own timeout a little under what is left, the phases stop starting 60 s before that
T=$(( BUDGET - $(el) - 15 )); (( T < 60 )) && T=60
timeout $(( T + 10 )) python3 benchmarks/bench_context_parallel.py --out $OUT/cp_bench --timeout $T --budget-s $(( T - 60 )) > $OUT/cp_bench.log 2>&1
echo "benchmark rc=$? at $(el) s (json: $OUT/cp_bench/bench_context_parallel.json)" | tee -a $S
grep -E "^\||^\*\*" $OUT/cp_bench.log | tee -a $S
echo "done at $(el) s" | tee -a $S
ls $OUT
