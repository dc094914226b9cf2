#!/usr/bin/env bash
# The whole test suite on a CPU machine: installs the pinned test environment into .venv
# (CPU torch 2.13.0, Triton's interpreter, JAX on CPU, libtpu for Mosaic compilation),
# then runs ruff, mypy and pytest. Extra pytest arguments are passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVLAYOUT_TEST_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-test.txt 2>&1 | grep -v '^WARNING: Location' || true
# vLLM 0.33.0 for the ground-truth tests: the package without its CUDA dependencies, then the
# pinned packages its KV-cache code imports (requirements-vllm.txt says why).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps vllm==0.33.0 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-vllm.txt 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/ruff" check kvlayout backends tests bench scripts notebooks
"$VENV/bin/mypy" kvlayout backends
export JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 PYTHONUNBUFFERED=1
# The suite's time (the pytest runs; the install and the linters above are not counted) and its
# ten slowest tests, so a run shows where CI's time goes.
start=$SECONDS
"$VENV/bin/python" -m pytest --durations=10 "$@"
main_s=$((SECONDS - start))
# The 8-device mesh cases need their host devices fixed before JAX starts: a pytest run of their own.
XLA_FLAGS="--xla_force_host_platform_device_count=9" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    --durations=10 tests/mesh_cases.py tests/native_mesh_cases.py
mesh_s=$((SECONDS - start - main_s))
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
echo "test suite: $(mmss $((main_s + mesh_s))) (pytest $(mmss "$main_s"), mesh cases $(mmss "$mesh_s"));" \
    "whole script with install and lint: $(mmss "$SECONDS"); $(nproc) CPU cores"
