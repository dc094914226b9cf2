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
# tpu-inference 0.32.0 for its ground-truth tests, in .tpu-inference-deps (never the venv: it imports vllm-tpu
# 0.32.0's `vllm`): its wheel and torchax without dependencies, then vllm-tpu's sdist (pinned URL and sha256),
# of which only the pure-Python `vllm/` package is unpacked (requirements-tpu-inference.txt says why).
TPU_DEPS=.tpu-inference-deps
if [ ! -f "$TPU_DEPS/.installed-0.32.0" ]; then
    rm -rf "$TPU_DEPS"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes --target "$TPU_DEPS" \
        -r requirements-tpu-inference.txt 2>&1 | grep -v '^WARNING: Location' || true
    rm -rf "$TPU_DEPS/tests" "$TPU_DEPS/tools"  # the wheel's top-level tests/ would shadow ours
    "$VENV/bin/python" - "$TPU_DEPS" <<'PY'
import hashlib, io, sys, tarfile, urllib.request
url = ("https://files.pythonhosted.org/packages/db/e2/f26f819e13781b7ec8d00b9bef94a1eff868048c69d9babd2b9bb02a5998/"
       "vllm_tpu-0.32.0.tar.gz")
data = urllib.request.urlopen(url, timeout=300).read()
digest = hashlib.sha256(data).hexdigest()
assert digest == "5d43961d4c214f2ff1bc3f6d2bce616fb2483411372b47637588d86cfb03708c", digest
tar, top = tarfile.open(fileobj=io.BytesIO(data)), "vllm_tpu-0.32.0/"
members = [m for m in tar.getmembers() if m.name.startswith(top + "vllm/")]
for m in members:
    m.name = m.name[len(top):]
tar.extractall(sys.argv[1], members=members, filter="data")
PY
    touch "$TPU_DEPS/.installed-0.32.0"
fi
# torchvision 0.28.0 and mistral_common for the vision-language ground truth, in .vl-deps (never the venv:
# requirements-vl.txt says why)
VL_DEPS=.vl-deps
if [ ! -f "$VL_DEPS/.installed-2" ]; then
    rm -rf "$VL_DEPS"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes --target "$VL_DEPS" \
        -r requirements-vl.txt 2>&1 | grep -v '^WARNING: Location' || true
    [ -d "$VL_DEPS/torchvision" ] && [ -d "$VL_DEPS/mistral_common" ] && touch "$VL_DEPS/.installed-2"
fi
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
