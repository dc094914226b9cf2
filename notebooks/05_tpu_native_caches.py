# %% [markdown]
# # TPU caches as typed per-layer arrays
# TPU serving stacks (tpu-inference, sglang-jax, JetStream) do not keep the KV cache in one
# flat buffer: they keep a list of typed `jax.Array`s, page axis first, donated into every
# model step. On a TPU those arrays are tiled in HBM, so a flat `int32[rows, 128]` view of them
# is a relayout copy of the whole cache. `CacheZeroer` zeroes `leaf[b]` in each leaf's own
# shape and dtype, in place (GEOMETRY.md section 9). Here it runs on the CPU in Pallas's TPU
# interpret mode (race detection on), which runs the TPU kernel's DMAs as they are written.

# %%
# %matplotlib inline
import os
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
import json
import numpy as np
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import kvlayout as K
import kvlayout.backends.pallas as kp
from kvlayout.native import spec_from_arrays, native_tables, zero_native_numpy

PAGES, PAGE_SIZE = 8, 4  # tiny: TPU interpret mode simulates every DMA


def poisoned(shape, dtype, seed):
    """Stale bytes: a pattern with no zero byte, in the leaf's dtype. bf16 NaN patterns lose
    one exponent bit: the step's own scatter runs on XLA:CPU here, which quiets NaN payloads."""
    dt = jnp.dtype(dtype)
    raw = K.poison_pattern(int(np.prod(shape)) * dt.itemsize, seed=seed).copy()
    if dt == jnp.bfloat16:
        w = raw.view(np.uint16)
        w[(w & 0x7F80) == 0x7F80] &= 0xBFFF
    return raw.view(dt).reshape(shape)


# tpu-inference shapes: attention (pages, page_size, heads_x2 // packing, packing, head_dim)
# in bf16 (packing 2) and fp8 (packing 4), MLA (pages, page_size // 32, 32, 640), and a
# DeepSeek-V4 uint8 indexer role (pages, T / 4, 4, 256)
layout = {
    'layer0.attn': ((PAGES, PAGE_SIZE, 2, 2, 128), 'bfloat16', 'full'),
    'layer1.attn': ((PAGES, PAGE_SIZE, 1, 4, 128), 'float8_e4m3fn', 'full'),
    'layer2.mla': ((PAGES, 1, 32, 640), 'bfloat16', 'mla'),
    'layer3.indexer': ((PAGES, 1, 4, 256), 'uint8', 'mla'),
}
host = [poisoned(s, d, i) for i, (s, d, _) in enumerate(layout.values())]
caches = [jnp.asarray(a) for a in host]
spec = spec_from_arrays(caches, [g for *_, g in layout.values()], names=list(layout))
print(spec.to_json(indent=None)[:300], '...')

# %% [markdown]
# In the contract's terms every leaf is a buffer of its own with one row: base 0, stride and
# span both the logical bytes of one page. So the static verifier proves each leaf safe, as
# it proves any segment table.

# %%
for name, table in native_tables(spec).items():
    seg = table.segments[0]
    print(f'{name:15s} page {seg.span:6d} B  stride {seg.stride:6d} B  proven safe: {K.verify(table).ok}')

# %% [markdown]
# ## A tpu-inference-style step
# The scheduler hands the worker the ids of newly allocated pages; the step zeroes them and
# then writes the new tokens' K/V into its pages, all inside one jitted, donated function.
# `z.apply` is the traceable form; the caches never leave their own shapes.

# %%
z = kp.CacheZeroer(caches, [g for *_, g in layout.values()])
print('kernel mode:', z.mode)


def model_step(caches, new_page_ids, slots, new_kv):
    """Zero the step's new pages, then write one token's K/V into each slot (page, token)."""
    caches, bad = z.apply(caches, new_page_ids)
    k = caches[0]
    caches[0] = k.at[slots[:, 0], slots[:, 1]].set(new_kv.astype(k.dtype))
    return caches, bad


step = jax.jit(model_step, donate_argnums=0)
new_pages = jnp.array([2, 5, 6], jnp.int32)
slots = jnp.array([[2, 0], [5, 0], [5, 1]], jnp.int32)  # three new tokens
new_kv = jnp.ones((3, 2, 2, 128), jnp.float32)
out, bad = step(caches, new_pages, slots, new_kv)
print('bad ids:', int(bad), '| input donated:', caches[0].is_deleted())

# the NumPy reference: zero the pages (contract), then the same writes
want = [a.copy() for a in host]
zero_native_numpy(want, spec, [2, 5, 6])
want[0][[2, 5, 5], [0, 0, 1]] = 1
assert all(np.array_equal(np.asarray(o).view(np.uint8), w.view(np.uint8)) for o, w in zip(out, want))
print('every byte of every leaf equals the reference')

# %% [markdown]
# ## Which pages were cleared
# One row per leaf, one column per page: cleared pages are all zero, written ones hold the
# new tokens, and every other page keeps its stale bytes, untouched.

# %%
state = np.zeros((len(out), PAGES))
for i, (o, h) in enumerate(zip(out, host)):
    o8 = np.asarray(o).view(np.uint8).reshape(PAGES, -1)
    h8 = h.view(np.uint8).reshape(PAGES, -1)
    for b in range(PAGES):
        state[i, b] = 0 if (o8[b] == h8[b]).all() else (1 if not o8[b].any() else 2)
fig, ax = plt.subplots(figsize=(8, 2.4))
ax.imshow(state, cmap=plt.matplotlib.colors.ListedColormap(['#d9d9d9', '#4c72b0', '#dd8452']), vmin=0, vmax=2)
ax.set_yticks(range(len(out)), [f'{n} {d}' for n, (_, d, _) in layout.items()])
ax.set_xticks(range(PAGES))
ax.set_xlabel('page (block id)')
ax.set_title('grey: stale, untouched    blue: cleared    orange: cleared, then new K/V', fontsize=9)
plt.tight_layout()

# %% [markdown]
# ## Bad ids are counted, never clipped
# JAX's own indexing hides a bad page id: `.at[ids].set(0)` silently drops id 8 of an
# 8-page pool and wraps id -1 around to the last page (a page that may be in use). The
# zeroer writes nothing for such an id and counts it; `check()` raises.

# %%
leaf = jnp.asarray(host[3])
dropped = leaf.at[jnp.array([8])].set(0)
wrapped = leaf.at[jnp.array([-1])].set(0)
print('id 8 changed a page:', bool((dropped != leaf).any()),
      '| id -1 zeroed page 7:', not bool(wrapped[7].any()))
out = z(out, jnp.array([8, -1, 1], jnp.int32))
try:
    z.check()
except K.BlockIdError as e:
    print('check():', e)
print('page 7 still holds its bytes:', np.array_equal(np.asarray(out[3][7]), host[3][7]))

# %% [markdown]
# ## Per-group zeroing
# With the groups of the leaves known, `z(caches, ids, group='mla')` zeroes only the MLA
# group's leaves (vLLM #52187: zeroing every id in every group multiplies the work).

# %%
out = z(out, [0], group='mla')
print([bool(np.asarray(o[0]).view(np.uint8).any()) for o in out], '(page 0 still non-zero?)')

# %% [markdown]
# ## What the TPU compiler does (no TPU needed)
# `tests/native_hlo.py` compiles both paths for v5e and v6e with the real Mosaic compiler
# (libtpu, deviceless) on a bf16 cache `(16, 128, 8, 2, 128)`: this zeroer, and the old flat
# path through an `int32[rows, 128]` view. Its saved output:

# %%
with open('../bench/results/native_hlo.json') as f:
    evidence = json.load(f)
for e in evidence:
    for path in ('native', 'flat'):
        facts = e[path]
        ops = sorted({op for op, _ in facts['touched']}) or 'none'
        print(f"{e['topology']} {path:6s} ops on the cache: {ops}; "
              f"temporaries {facts['temp_size_in_bytes'] / e['cache_bytes']:.2f}x the cache")
