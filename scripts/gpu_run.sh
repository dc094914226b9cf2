#!/usr/bin/env bash
# Everything kvlayout runs on the GPU machine, in one device-tool call (carry .whl/, built here by
# scripts/build_wheel.sh). Logs and JSON go to $OUT (at most 8 files come back: logs are few).
#   BUDGET=560 bash scripts/gpu_run.sh [PARTS]      PARTS: comma list, default tests,memcheck,step
#   tests       pytest -m gpu (tests/test_gpu_cuda.py, tests/test_gpu_pallas.py: correctness at
#               scale, guard bands, DLPack in place) + the cuda/custom-op test files natively
#               + the cuda zeroer's hostile-pass tests (tests/test_hostile_s28.py to s34) natively
#   memcheck    compute-sanitizer memcheck over tests/test_gpu_cuda.py -k small
#   conformance python -m kvlayout conformance (every backend natively)
#   step        bench/bench_step.py (per step vs vLLM 0.33, kernel by graph replay, Pallas in jit)
#   sweep       bench/pallas_gpu_sweep.py (Pallas-Triton kernel options against the cuda kernel)
#   host        bench/bench_host_path.py --replay (a graph-replay step's host time, piece by piece)
#   zero        bench/bench_zero_gpu.py (both backends, XLA scatter, memset)
#   native      bench/bench_native_gpu.py (typed per-layer arrays)
#   sharded     scripts/gpu_sharded.py + bench/bench_sharded_foreign.py (every GPU here)
#   plugin      bench/bench_step.py --plugin (the vLLM plugin's verify and replace modes per step)
#   jaxstep     bench/bench_jax_step.py (CacheZeroer standalone and in jit against XLA's scatter)
#   listpaths   bench/bench_jax_step.py --list-paths (host ids: each host-to-device route, transfer waits)
#   ceiling     bench/bench_write_ceiling.py (the write ceiling of the step bytes, both kernels against it)
#   ceilsweep   the same with --sweep (kvlayout's kernel under launch options, byte-checked)
#               (both also time kvlayout's kernel on the ids sorted and on consecutive blocks: --orders)
#   ncu         bench/bench_ncu_write.py (Nsight Compute counters: kvlayout's write against the contiguous one)
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false HYPOTHESIS_PROFILE=dev JAX_PLATFORMS=cuda,cpu
OUT=${OUT:-out}; mkdir -p "$OUT"
LOG="$OUT/run.log"; : > "$LOG"
PARTS=",${1:-tests,memcheck,step},"
has() { [[ $PARTS == *",$1,"* ]]; }
left() { echo $(( ${BUDGET:-570} - SECONDS )); }  # seconds left in this call
cap() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }  # at most $1 seconds, within the budget
declare -A rc
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$LOG"
python3 -c "import kvlayout, kvlayout.backends.cuda as kc; print('kvlayout from', kvlayout.__file__, kc.MODE)" \
  2>&1 | tee -a "$LOG"
# a copy of tests/ outside the checkout, so the source folder kvlayout/ cannot shadow the wheel
rm -rf /tmp/kvt && mkdir -p /tmp/kvt && cp -r tests pyproject.toml /tmp/kvt/
in_tests() { (cd /tmp/kvt && "$@"); }
if has tests; then
  in_tests timeout "$(cap 300)" python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_gpu_cuda.py tests/test_gpu_pallas.py > "$OUT/tests.log" 2>&1; rc[gpu_tests]=$?
  in_tests timeout "$(cap 120)" python3 -m pytest -q -p no:cacheprovider tests/test_cuda_op.py \
    tests/test_cuda_fast_path.py tests/test_cuda_backend.py tests/test_backend_hardening.py tests/test_cuda_kernel_paths.py \
    -k "cuda or Cuda or op or fast" >> "$OUT/tests.log" 2>&1; rc[cuda_tests]=$?
  # every cuda test of these on the GPU (buffers and ids on DEVICE_TYPE: tests/hostile_cases.py); their
  # Inkling model tests are CPU-only (the vLLM one in a CPU driver process) and run by scripts/test.sh
  in_tests timeout "$(cap 120)" python3 -m pytest -q -p no:cacheprovider tests/test_hostile_s28.py \
    tests/test_hostile_s29.py tests/test_hostile_s30.py tests/test_hostile_s31.py tests/test_hostile_s32.py \
    tests/test_hostile_s33.py tests/test_hostile_s34.py \
    -k "not inkling" >> "$OUT/tests.log" 2>&1; rc[hostile_tests]=$?
  grep -E "passed|failed|error" "$OUT/tests.log" | tee -a "$LOG"
fi
if has memcheck; then
  in_tests timeout "$(cap 150)" compute-sanitizer --tool memcheck --leak-check no \
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_cuda.py -k small > /tmp/memcheck.log 2>&1
  rc[memcheck]=$?
  { echo "== memcheck"; grep -E "ERROR SUMMARY|passed|failed" /tmp/memcheck.log; } | tee -a "$LOG"
fi
if has conformance; then
  timeout "$(cap 200)" python3 -m kvlayout conformance > "$OUT/conformance.log" 2>&1; rc[conformance]=$?
  tail -n 5 "$OUT/conformance.log" | tee -a "$LOG"
fi
if has step; then
  timeout "$(cap 240)" python3 bench/bench_step.py --out "$OUT" > "$OUT/step.log" 2>&1; rc[step]=$?
fi
if has ceiling || has ceilsweep; then
  sweep=""; has ceilsweep && sweep="--sweep"
  timeout "$(cap 400)" python3 bench/bench_write_ceiling.py $sweep --orders --out "$OUT" > "$OUT/ceiling.log" 2>&1
  rc[ceiling]=$?
fi
if has ncu; then
  timeout "$(cap 300)" python3 bench/bench_ncu_write.py --out "$OUT" > "$OUT/ncu.log" 2>&1; rc[ncu]=$?
fi
if has listpaths; then
  timeout "$(cap 200)" python3 bench/bench_jax_step.py --list-paths --out "$OUT" > "$OUT/list_paths.log" 2>&1
  rc[listpaths]=$?
fi
if has sweep; then
  timeout "$(cap 240)" python3 bench/pallas_gpu_sweep.py --out "$OUT" > "$OUT/sweep.log" 2>&1; rc[sweep]=$?
fi
if has host; then
  timeout "$(cap 120)" python3 bench/bench_host_path.py --replay --out "$OUT" > "$OUT/host.log" 2>&1; rc[host]=$?
fi
if has plugin; then
  timeout "$(cap 240)" python3 bench/bench_step.py --plugin --out "$OUT" > "$OUT/plugin.log" 2>&1; rc[plugin]=$?
fi
if has jaxstep; then
  timeout "$(cap 300)" python3 bench/bench_jax_step.py --out "$OUT" > "$OUT/jax_step.log" 2>&1; rc[jaxstep]=$?
fi
if has zero; then
  timeout "$(cap 240)" python3 bench/bench_zero_gpu.py --out "$OUT" > "$OUT/zero.log" 2>&1; rc[zero]=$?
fi
if has native; then
  timeout "$(left)" python3 bench/bench_native_gpu.py --out "$OUT" --pages 4096 > "$OUT/native.log" 2>&1
  rc[native]=$?
fi
if has sharded; then
  timeout "$(cap 300)" python3 scripts/gpu_sharded.py --out "$OUT" > "$OUT/sharded.log" 2>&1; rc[sharded]=$?
  timeout "$(cap 120)" python3 bench/bench_sharded_foreign.py --out "$OUT" >> "$OUT/sharded.log" 2>&1
  rc[foreign]=$?
fi
for f in native sharded zero host sweep step plugin jax_step list_paths ceiling ncu; do  # tables are printed last by each script
  [ -f "$OUT/$f.log" ] && { echo "== $f"; tail -n 32 "$OUT/$f.log"; }
done
summary="rc:"; for k in "${!rc[@]}"; do summary+=" $k=${rc[$k]}"; done
echo "$summary (${SECONDS}s)" | tee -a "$LOG"
