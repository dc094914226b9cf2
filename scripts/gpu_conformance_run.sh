#!/usr/bin/env bash
# Device-tool call: the conformance battery natively (cuda: Triton on the GPU; pallas: the
# Pallas-Triton kernel through JAX's GPU), then the shared benchmark again.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -c "import kvlayout.backends.cuda, kvlayout.backends.pallas; print('modes:', kvlayout.backends.cuda.MODE, kvlayout.backends.pallas.PallasZeroer(__import__('kvlayout').plan(__import__('kvlayout').preset('dsv4-test'))).mode)"
python3 -m kvlayout conformance > "$OUT/conformance.log" 2>&1; rc1=$?; tail -n 5 "$OUT/conformance.log"
python3 bench/bench_zero_gpu.py --out "$OUT" > "$OUT/bench.log" 2>&1; rc2=$?; tail -n 12 "$OUT/bench.log"
echo "rc: conformance=$rc1 bench=$rc2"
