# %% [markdown]
# # Choose a backend
# `KVLAYOUT_BACKEND` (or `--backend`, or an argument) picks the zeroer; `auto` picks from the
# hardware. Here every installed backend zeroes the same blocks and the results are compared
# byte for byte.

# %%
# %matplotlib inline
import os
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
import kvlayout as K
from kvlayout import registry
from kvlayout.cli import installed_backends
os.environ['KVLAYOUT_BACKEND'] = 'reference'
print(registry.resolve())
try:
    os.environ['KVLAYOUT_BACKEND'] = 'tpu'
    registry.resolve()
except K.BackendError as e:
    print(e)
finally:
    del os.environ['KVLAYOUT_BACKEND']
backends = installed_backends()
print(sorted(backends))
assert 'reference' in backends

# %%
from kvlayout.conformance import run_case, GUARD_BYTES
from kvlayout.viz import zero_diff
import numpy as np
table = K.plan(K.preset('dsv4-test'))
ids = [0, 1, 99]
results = {name: run_case(cls, table, ids) for name, cls in backends.items()}
for name, r in results.items():
    print(name, r.mode, r.ok)
    assert r.ok
first = next(iter(results.values())).after
assert all(np.array_equal(first, r.after) for r in results.values())
afters = {n: r.after for n, r in results.items()}
zero_diff(K.poison_pattern(first.size), afters, table, ids, origin=GUARD_BYTES, region=(0, 2 * 149760));
