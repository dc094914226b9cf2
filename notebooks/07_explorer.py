# %% [markdown]
# # Explore a layout interactively
# Pick a preset, a spec file (or a model config, where `kvlayout.models` exists), the layout, the
# tensor-parallel degree and the dtype: the segment table, the proof and the byte map update. Move
# the block and byte controls to read what lies under the cursor (layer, group, offsets, bytes).
# The explorer needs `ipywidgets` (the `notebook` extra); with an interactive matplotlib backend
# (`%matplotlib widget`), `attach_hover(fig)` shows the same text under the mouse.

# %%
# %matplotlib inline
import json
import tempfile
from pathlib import Path

import kvlayout as K
from kvlayout.viz import (Explorer, attach_hover, byte_map, bytes_per_step, compare_maps, describe_at,
                          table_map, variant)

ex = Explorer('dsv4-test')
ex

# %% [markdown]
# The widgets are attributes of the explorer, so this notebook drives them the way a person would and
# checks what they show: the map (a PNG in `ex.image`), the proof, the table, the cursor's text.

# %%
first = ex.image.value
ex.offset.value = 37_400            # inside the 64 B alignment gap after layer 0
print(ex.describe())
assert 'alignment gap' in ex.info.value and 'never zeroed' in ex.info.value
assert ex.image.value != first      # the cursor is drawn on the map

ex.source.value = 'dsv4'            # 46 overlaid groups, 181 rows
assert '46 groups, 181 rows' in ex.status.value and 'SAFE' in ex.proof.value
ex.offset.value = 0
assert '11 groups like c4.*' in ex.info.value

ex.source.value = 'llama-8b'
assert '134,217,728 B buffer' in ex.status.value
ex.tp.value = 2                     # each tp shard holds half of the 8 KV heads
assert '67,108,864 B buffer' in ex.status.value
ex.dtype.value = 'float32'
assert '134,217,728 B buffer' in ex.status.value
ex.layout.value = 'packed'          # K and V together, one row per block
# 32 layers, K+V, 16 tokens, 4 heads, head size 128, fp32
assert ex.spec.layout == 'packed' and ex.layout_obj.block_stride == 32 * 2 * 16 * 4 * 128 * 4
print(ex.status.value)

# %% [markdown]
# A spec file: a bad path is reported in the status line and the last good picture stays.

# %%
ex.layout.value = 'as spec'
ex.tp.value = 1
ex.dtype.value = 'as spec'
ex.source.value = 'spec file'
assert 'color:red' in ex.status.value
path = Path(tempfile.mkdtemp()) / 'spec.json'
path.write_text(json.dumps(K.preset('dsv4-test').with_num_blocks(8).to_dict()))
ex.path.value = str(path)
assert ex.spec.num_blocks == 8 and 'color:red' not in ex.status.value
ex.block.value = 7
assert 'block 7' in ex.info.value

# %% [markdown]
# A model's `config.json` (where `kvlayout.models` is installed): the cache vLLM allocates for one tp rank.

# %%
config = Path('..') / 'tests' / 'fixtures' / 'models' / 'llama' / 'config.json'
if 'model config' in ex.source.options and config.exists():
    ex.source.value = 'model config'
    ex.path.value = str(config)
    rank1 = ex.layout_obj.total_bytes
    ex.tp.value = 2
    assert ex.layout_obj.total_bytes == rank1 // 2 and 'color:red' not in ex.status.value
    print(ex.status.value)

# %% [markdown]
# ## The static pictures (the same ones `kvlayout plot` writes)
# The `dsv4` preset on one screen: groups of one shape share a lane, layers are coloured by kind,
# and the insets show the 64 B gaps at byte scale.

# %%
fig = byte_map(K.preset('dsv4'))
assert len(fig.axes[0].kvlayout.lanes) == 16 and fig.axes[0].kvlayout.insets == ['A', 'B', 'C']

# %% [markdown]
# Two layouts of one model, on one byte scale (`kvlayout plot --preset dsv4 --compare layout=layer_major`).

# %%
dsv4 = K.preset('dsv4')
fig = compare_maps(dsv4, variant(dsv4, {'dtype': 'bfloat16'}), ('dsv4', 'dtype=bfloat16'))
assert 'buffer 1.75x' in fig._suptitle.get_text()

# %% [markdown]
# Bytes written per step: zeroing every group's rows (today) against the group's own rows (per-group
# zeroing, docs/GEOMETRY.md section 7).

# %%
fig = bytes_per_step(dsv4)
steps = fig.axes[0].kvlayout_steps
assert all(per <= every for _, per, every in steps)

# %% [markdown]
# The #50276 table (stride used as span): red only where two blocks share bytes or the buffer ends,
# and the first spill at byte scale.

# %%
good = K.plan(K.preset('dsv4-test'))
rows = tuple(K.Segment(s.base, 149760, 149760, s.group, s.layer) for s in good.segments)
bad = K.SegmentTable(good.total_bytes, 100, rows)
fig = table_map(bad)
print(describe_at(bad, 149_860))
assert 'UNSAFE: blocks 0 and 1 both clear this byte' in describe_at(bad, 149_860)

# %%
fig = byte_map(K.preset('dsv4-test'), insets=False)
cid = attach_hover(fig)   # live with %matplotlib widget; inline, the figure stays static
