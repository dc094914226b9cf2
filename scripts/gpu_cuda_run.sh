#!/usr/bin/env bash
# The whole CUDA-backend GPU session in one command (device tool): correctness at scale,
# compute-sanitizer memcheck on a representative run, then the benchmark.
#   bash scripts/gpu_cuda_run.sh [--designs]
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia_smi.txt"
python3 scripts/gpu_cuda.py --out "$OUT" 2>&1 | tail -n 60 > "$OUT/gpu_cuda.log"; rc1=${PIPESTATUS[0]}
tail -n 3 "$OUT/gpu_cuda.log"
compute-sanitizer --tool memcheck --leak-check no python3 scripts/gpu_cuda.py --small --out "$OUT" > "$OUT/memcheck.log" 2>&1; rc2=$?
grep -E "ERROR SUMMARY|ALL OK|FAILURES" "$OUT/memcheck.log"
python3 bench/bench_zero_gpu.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -n 80; rc3=${PIPESTATUS[0]}
echo "rc: correctness=$rc1 memcheck=$rc2 bench=$rc3"
