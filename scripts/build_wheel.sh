#!/usr/bin/env bash
# Build kvlayout's pure-Python wheel into .whl/ (carried to the GPU machine, which installs
# it with scripts/gpu_env.sh: nothing can be fetched there).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl build
python3 -m pip wheel -q --disable-pip-version-check --no-deps -w .whl .
ls .whl
