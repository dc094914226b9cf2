# %% [markdown]
# # Bring your own layout
# Write a spec in JSON or Python, plan it, prove it, draw it, zero it.

# %%
# %matplotlib inline
import json
import kvlayout as K
from kvlayout.viz import byte_map, table_view
spec = K.KVCacheSpec.from_json(json.dumps({'version': 1, 'num_blocks': 32, 'layout': 'packed', 'groups': [
  {'name': 'attn', 'layers': [
    {'name': 'L0', 'kind': 'full', 'block_size': 16, 'num_kv_heads': 2, 'head_size': 64, 'dtype': 'bfloat16',
     'alignment': 4096},
    {'name': 'mamba0', 'kind': 'mamba', 'state_bytes': 6000, 'alignment': 512}]},
  {'name': 'mla', 'layers': [
    {'name': 'M0', 'kind': 'mla', 'block_size': 16, 'head_size': 576, 'dtype': 'bfloat16'}]}]}))
table = K.plan(spec)
print(table_view(table))
assert K.verify(table).ok
byte_map(spec);

# %%
from kvlayout.conformance import run_case
res = run_case(K.ReferenceBackend, table, [0, 7, 31])
print(res.check.describe(), res.check.zeroed_bytes)
assert res.ok and res.check.zeroed_bytes == 3 * table.bytes_per_block
