#!/usr/bin/env bash
# Issue 15 (and 16) on the GPU machine in one device-tool call: bench/bench_step.py, the cuda
# tests natively (incl. the custom op), correctness at scale + compute-sanitizer memcheck,
# issue 16's bench/bench_native_gpu.py. At most 8 files come back: logs go into few files.
#   bash scripts/gpu_step_run.sh [PARTS]   (PARTS: comma list of step,tests,cuda,memcheck,native)
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false HYPOTHESIS_PROFILE=dev
OUT=${OUT:-out}; mkdir -p "$OUT"
LOG="$OUT/run.log"; : > "$LOG"
PARTS=",${1:-step,tests,cuda,memcheck},"
has() { [[ $PARTS == *",$1,"* ]]; }
left() { echo $(( ${BUDGET:-570} - SECONDS )); }  # seconds left in this call
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$LOG"
python3 -c "import kvlayout, kvlayout.backends.cuda as kc; print('kvlayout from', kvlayout.__file__, kc.MODE)" 2>&1 | tee -a "$LOG"
rc_s=skip; rc_t=skip; rc_c=skip; rc_m=skip; rc_n=skip
if has step; then
  timeout 240 python3 bench/bench_step.py --out "$OUT" > "$OUT/step.log" 2>&1; rc_s=$?
  echo "step done at ${SECONDS}s" | tee -a "$LOG"
fi
if has tests; then
  # a copy of tests/ outside the checkout, so the source folder kvlayout/ cannot shadow the wheel
  rm -rf /tmp/kvt && mkdir -p /tmp/kvt && cp -r tests /tmp/kvt/
  (cd /tmp/kvt && timeout $(( $(left) < 120 ? $(left) : 120 )) python3 -m pytest -q -p no:cacheprovider \
     tests/test_cuda_op.py tests/test_cuda_fast_path.py tests/test_cuda_backend.py tests/test_backend_hardening.py -k "cuda or Cuda or op or fast" 2>&1) \
     > "$OUT/tests.log"; rc_t=$?
  tail -n 12 "$OUT/tests.log"
fi
if has cuda; then
  timeout $(( $(left) < 100 ? $(left) : 100 )) python3 scripts/gpu_cuda.py --out "$OUT" > "$OUT/cuda.log" 2>&1; rc_c=$?
  tail -n 2 "$OUT/cuda.log"; { echo "== cuda.log"; tail -n 30 "$OUT/cuda.log"; } >> "$LOG"; rm -f "$OUT/cuda.log"
fi
if has memcheck; then
  timeout $(( $(left) < 120 ? $(left) : 120 )) compute-sanitizer --tool memcheck --leak-check no \
    python3 scripts/gpu_cuda.py --small --out /tmp/ms > /tmp/memcheck.log 2>&1; rc_m=$?
  grep -E "ERROR SUMMARY|ALL OK|FAILURES" /tmp/memcheck.log
  { echo "== memcheck.log"; tail -n 40 /tmp/memcheck.log; } >> "$LOG"
fi
if has native; then
  timeout $(left) python3 bench/bench_native_gpu.py --out "$OUT" --pages 4096 > "$OUT/native.log" 2>&1; rc_n=$?
  tail -n 16 "$OUT/native.log"
fi
[ -f "$OUT/step.log" ] && tail -n 32 "$OUT/step.log"
echo "rc: step=$rc_s tests=$rc_t cuda=$rc_c memcheck=$rc_m native=$rc_n (${SECONDS}s)" | tee -a "$LOG"
