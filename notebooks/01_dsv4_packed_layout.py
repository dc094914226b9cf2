# %% [markdown]
# # Explore the DeepSeek-V4 packed layout
# Page arithmetic, why the block stride is not the zero span, and the pre-fix bug of vLLM #50276
# drawn and caught by the verifier.

# %%
# %matplotlib inline
import kvlayout as K
from kvlayout.viz import byte_map, table_map, table_view
spec = K.preset('dsv4-test')
layer = spec.groups[0].layers[0]
print(layer.stored_tokens, layer.real_page, layer.page, layer.gap)
assert (layer.stored_tokens, layer.real_page, layer.page, layer.gap) == (64, 37376, 37440, 64)

# %% [markdown]
# Four such layers share one row per block: the **block stride** is 4 padded pages, 149,760 B;
# the **zero span** of each layer is its real page, 37,376 B.

# %%
table = K.plan(spec)
view = table_view(table)
print(view)
assert all(s.stride == 149760 and s.span == 37376 for s in table.segments)
byte_map(spec);

# %% [markdown]
# ## The pre-fix table: the page size used as stride *and* span

# %%
rows = tuple(K.Segment(s.base, 149760, 149760, s.group, s.layer) for s in table.segments)
bad = K.SegmentTable(table.total_bytes, 100, rows)
rep = K.verify(bad)
print(rep.format())
assert not rep.ok
assert {v.rows[0] for v in rep.by_invariant(3)} == {1, 2, 3}
assert any('112320 B past' in v.message for v in rep.by_invariant(2))
fig = table_map(bad)
