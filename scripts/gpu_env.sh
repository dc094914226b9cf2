# Source on the GPU machine: install the project's wheel (built here by
# scripts/build_wheel.sh and carried as .whl/) without dependencies: the machine's python3
# already has torch, triton and JAX, and nothing can be fetched there. PYTHONSAFEPATH keeps
# the checkout's source folder kvlayout/ from shadowing the installed package.
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python3 -m pip install -q --no-deps --no-index --force-reinstall --target /tmp/kvlayout_site "$_root"/.whl/kvlayout-*.whl
export PYTHONSAFEPATH=1
export PYTHONPATH="/tmp/kvlayout_site:$_root/bench${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/kvlayout_site/bin:$PATH"
export PYTHONUNBUFFERED=1
