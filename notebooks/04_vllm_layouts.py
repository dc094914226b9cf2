# %% [markdown]
# # vLLM 0.33's six layouts
# vLLM 0.33 writes a KV-cache tensor's physical layout as an order of the logical axes
# `[L, B, H, N, C]`: layer slot, block, KV head (head slot), token in the block, and the content
# bytes of one (head, token) pair, K and V together (`vllm/v1/kv_cache_layout.py`). Its six
# orders are `LBHNC`, `LBNHC`, `LHBNC`, `BLHNC`, `BLNHC` and `BHLNC`; kvlayout's `packed` is
# `BLHNC` and `layer_major` is `LBHNC` (docs/GEOMETRY.md section 6). Here the same four layers
# are planned under all six: the segment tables, their proofs, zeroing with the NumPy reference
# checked byte for byte against the contract, and the byte maps side by side. Then per-group
# zeroing (section 7), and where it saves bytes.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

import kvlayout as K
from kvlayout.spec import KV_CACHE_LAYOUTS
from kvlayout.viz import Geometry, bytes_per_step, compare_maps, describe_at, group_lanes, step_bytes


def layers(kind, first):
    """Two layers of one kind, Gemma-2 style: sliding-window and full attention alternate."""
    cls, extra = (K.SlidingWindowSpec, {'window': 4096}) if kind == 'swa' else (K.FullAttentionSpec, {})
    return [cls(f'model.layers.{i}.self_attn', block_size=16, num_kv_heads=2, head_size=64,
                dtype='bfloat16', **extra) for i in (first, first + 2)]


def model(layout, num_blocks=4):
    """Four layers in vLLM's two groups of one page size (the groups overlay), under ``layout``."""
    groups = [K.GroupSpec('full', layers('full', 1)), K.GroupSpec('swa', layers('swa', 0))]
    return K.KVCacheSpec(num_blocks=num_blocks, layout=layout, groups=groups)


layer = model('BLHNC').groups[0].layers[0]
H, NC = layer.heads, layer.states * layer.content_bytes
print(f'H = {H} head slots, N = {layer.states} tokens, C = {layer.content_bytes} B: '
      f'N*C = {NC} B per head, page H*N*C = {layer.real_page} B')
assert layer.real_page == 2 * 16 * 2 * 64 * 2 == H * NC

# %% [markdown]
# ## The tables
# Every row clears `[base + b * stride, + span)` for block `b`. Blocks-outermost orders keep a
# block's layers side by side in one row of the buffer (`stride` = the block row); layer-outermost
# orders give each layer slot a region of `num_blocks` pages. An axis that lies physically outside
# `B` gives a row per index: under `LHBNC` each head slot of a layer is its own row (heads are
# `num_blocks * N*C` apart), and under `BHLNC` a layer's bytes in one block are `H` runs.

# %%
tables = {}
for layout in KV_CACHE_LAYOUTS:
    table = K.plan(model(layout))
    report = K.verify(table)
    tables[layout] = table
    print(f'{layout}: {len(table)} rows, total_bytes {table.total_bytes:,}, '
          f'{table.bytes_per_block:,} B per block, {report.format().splitlines()[0].split(": ")[-1]}')
    for s in table.segments:
        print(f'    {s.group:4s} {s.layer:26s} {s.part:5s}',
              f'base {s.base:6d}  stride {s.stride:5d}  span {s.span:5d}')
    assert report.ok
# every order holds the same bytes: the buffer and the bytes of one block are the same
assert len({t.total_bytes for t in tables.values()}) == 1
assert len({t.bytes_per_block for t in tables.values()}) == 1
# one row per layer, except where heads lie outside the block (LHBNC) or outside the layer (BHLNC)
assert {k: len(t) for k, t in tables.items()} == {
    'LBHNC': 4, 'LBNHC': 4, 'LHBNC': 4 * H, 'BLHNC': 4, 'BLNHC': 4, 'BHLNC': 4 * H}
# LHBNC: head h of block b at region + (h * num_blocks + b) * N*C
lh = [s for s in tables['LHBNC'].segments if s.layer == 'model.layers.0.self_attn']
assert [(s.base, s.stride) for s in lh] == [(h * 4 * NC, NC) for h in range(H)]

# %% [markdown]
# ## Zeroing, byte for byte
# The NumPy reference zeroes a few ids on a buffer of stale bytes (a pattern with no zero byte);
# the bytes that changed must be exactly the contract's set, `expected_zeroed(table, ids)`.

# %%
ids = [0, 2, 3]
for layout, table in tables.items():
    stale = K.poison_pattern(table.total_bytes)
    buf = stale.copy()
    K.ReferenceBackend(table, buf).zero(ids)
    changed = K.changed_ranges(stale, buf)
    want = K.expected_zeroed(table, ids)
    assert (changed == want).all()
    print(f'{layout}: blocks {ids} -> {int((want[:, 1] - want[:, 0]).sum()):,} B in {len(want)} ranges, '
          'exactly the contract')

# %% [markdown]
# ## Where one block lives in the buffer
# The bytes zeroing block 1 clears (the contract's set), on the whole 64 KiB buffer: one run of
# the block row when blocks are outermost; a piece of every layer region when layers are; a
# piece of every head's stripe of every region under `LHBNC`.

# %%
fig, ax = plt.subplots(figsize=(11, 2.6))
for y, table in enumerate(tables.values()):
    ax.broken_barh([(0, table.total_bytes)], (y - 0.35, 0.7), color='#eeeeee')
    runs = K.expected_zeroed(table, [1])
    ax.broken_barh([(a, e - a) for a, e in runs.tolist()], (y - 0.35, 0.7), color='#4c72b0')
    ax.text(table.total_bytes * 1.01, y, f'{len(runs)} runs', va='center', fontsize=8)
ax.set_yticks(range(len(tables)), list(tables))
ax.set_ylim(len(tables) - 0.5, -0.5)
ax.set_xlim(0, 1.1 * tables['BLHNC'].total_bytes)
ax.set_xlabel('byte offset in the buffer')
ax.set_title('blue: the bytes of block 1 (zeroing it clears exactly these)', fontsize=9, loc='left')
plt.tight_layout()
runs = {k: len(K.expected_zeroed(t, [1])) for k, t in tables.items()}
assert runs == {'LBHNC': 2, 'LBNHC': 2, 'LHBNC': 4, 'BLHNC': 1, 'BLNHC': 1, 'BHLNC': 1}

# %% [markdown]
# ## Side by side
# Each picture draws two orders on one byte scale, block rows as lanes (one lane per group: the
# two groups overlay). `LBHNC` against `BLHNC`: a layer region per slot against layers side by
# side in a block row. `LBNHC` and `BLNHC` differ from those only inside a page (tokens outside
# heads), so at the byte level they draw the same. `LHBNC` against `BHLNC`: the heads move out of
# the block (each head a stripe of its own region) or out of the layer (`H` runs per block row).

# %%
fig = compare_maps(model('LBHNC'), model('BLHNC'), ('LBHNC (layer_major)', 'BLHNC (packed)'), [0, 1])

# %%
fig = compare_maps(model('LBNHC'), model('BLNHC'), ('LBNHC', 'BLNHC'), [0, 1])

# %%
fig = compare_maps(model('LHBNC'), model('BHLNC'), ('LHBNC', 'BHLNC'), [0, 1])
# the map's coordinates follow the heads: byte 10 of head 1 of block 1 in slot 0 under LHBNC
lay = K.plan_layout(model('LHBNC'))
off = (1 * 4 + 1) * NC + 10
assert Geometry(lay).to_row(off) == (1, NC + 10, 0)
# and its boxes: each head at h * N*C of its slot page, side by side (never drawn on top of each other)
assert [b.x for b in group_lanes(lay)[0].boxes] == [0, NC, 2 * NC, 3 * NC]
print(describe_at(lay, off))

# %% [markdown]
# ## Per-group zeroing
# A block id is used by one group at a time, so a new block of group `g` needs only `g`'s rows
# cleared (vLLM #52187). Here the two groups have the same shape and overlay exactly, so a group's
# rows cover the same bytes as every group's: per-group zeroing halves the rows, not the bytes.

# %%
for layout, table in tables.items():
    one = K.expected_zeroed(table, ids, group='swa')
    every = K.expected_zeroed(table, ids)
    assert (one == every).all() and len(table.for_group('swa')) == len(table) // 2
    print(f"{layout}: group swa {len(table.for_group('swa'))} of {len(table)} rows, same bytes")

# %% [markdown]
# The saving comes where groups differ. DeepSeek-V4 (the `dsv4` preset) overlays 46 groups of
# three shapes in one block row: C4 attention with its indexer, C128 attention and sliding-window
# MLA. Zeroing a group's new blocks clears only that group's layers, where all-group zeroing
# clears the whole block row for every new id.

# %%
dsv4 = K.plan(K.preset('dsv4'))
per, every = step_bytes(dsv4, {'c128.0': range(16)})
print(f'16 new blocks of group c128.0: {per:,} B per group against {every:,} B for every group '
      f'({100 * per / every:.1f} %)')
assert per < every
stale = K.poison_pattern(dsv4.total_bytes)
buf = stale.copy()
K.ReferenceBackend(dsv4, buf).zero(list(range(16)), group='c128.0')
changed = K.changed_ranges(stale, buf)
assert (changed == K.expected_zeroed(dsv4, list(range(16)), group='c128.0')).all()
assert int((changed[:, 1] - changed[:, 0]).sum()) == per
fig = bytes_per_step(K.preset('dsv4'))
