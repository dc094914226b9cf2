#!/usr/bin/env bash
# One device-tool call for both backends: CUDA correctness + memcheck, Pallas correctness
# (DLPack hand-off, in place), then the shared benchmark with every method.
#   bash scripts/gpu_final_run.sh
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 scripts/gpu_cuda.py --out "$OUT" > "$OUT/gpu_cuda.log" 2>&1; rc1=$?; tail -n 2 "$OUT/gpu_cuda.log"
compute-sanitizer --tool memcheck --leak-check no python3 scripts/gpu_cuda.py --small --out "$OUT" > "$OUT/memcheck.log" 2>&1; rc2=$?
grep -E "ERROR SUMMARY|ALL OK|FAILURES" "$OUT/memcheck.log"
python3 scripts/gpu_pallas.py --out "$OUT" > "$OUT/gpu_pallas.log" 2>&1; rc3=$?; tail -n 40 "$OUT/gpu_pallas.log"
python3 bench/bench_zero_gpu.py --out "$OUT" > "$OUT/bench.log" 2>&1; rc4=$?; tail -n 14 "$OUT/bench.log"
echo "rc: cuda=$rc1 memcheck=$rc2 pallas=$rc3 bench=$rc4"
