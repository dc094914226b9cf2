#!/usr/bin/env bash
# One device-tool call for sharded zeroing: the single-GPU cuda checks (the kernel's skip id
# is new) and scripts/gpu_sharded.py (torch and JAX paths, both modes, every GPU here).
#   bash scripts/gpu_sharded_run.sh
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT/bench"
nvidia-smi -L
python3 scripts/gpu_cuda.py --small --out "$OUT" > "$OUT/gpu_cuda_small.log" 2>&1; rc1=$?; tail -n 2 "$OUT/gpu_cuda_small.log"
python3 scripts/gpu_sharded.py --out "$OUT" > "$OUT/gpu_sharded.log" 2>&1; rc2=$?; tail -n 40 "$OUT/gpu_sharded.log"
# the cuda kernel gained in-kernel routing (id_lo/id_limit): re-measure the single-device kernel
python3 bench/bench_zero_gpu.py --methods kvlayout-cuda --out "$OUT/bench" > "$OUT/bench/bench.log" 2>&1; rc3=$?; tail -n 12 "$OUT/bench/bench.log"
python3 bench/bench_sharded_foreign.py --out "$OUT/bench" > "$OUT/bench/foreign.log" 2>&1; rc4=$?; tail -n 8 "$OUT/bench/foreign.log"
echo "rc: cuda_small=$rc1 sharded=$rc2 bench=$rc3 foreign=$rc4"
