# Source on the GPU machine: make the repo importable without installing it (the image's
# python3 has torch, triton and JAX; nothing can be fetched there).
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p /tmp/kvlayout_pp
ln -sfn "$_root/backends/cuda" /tmp/kvlayout_pp/kvlayout_cuda
ln -sfn "$_root/backends/pallas" /tmp/kvlayout_pp/kvlayout_pallas
export PYTHONPATH="$_root:/tmp/kvlayout_pp${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
