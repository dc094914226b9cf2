#!/usr/bin/env bash
# The main job on the embedded default: plan the DeepSeek-V4 preset, prove its table safe
# for every block id, zero some blocks with the default backend (auto) on a poisoned
# buffer and report byte-exact agreement with the contract. Needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVLAYOUT_MAIN_VENV:-.venv-main}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e . 2>&1 | grep -v '^WARNING: Location' || true
"$VENV/bin/kvlayout" plan --preset dsv4 | head -n 8
echo "..."
"$VENV/bin/kvlayout" check --preset dsv4
"$VENV/bin/kvlayout" zero --preset dsv4 --blocks 0,1,42,99 -v
