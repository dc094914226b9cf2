# %% [markdown]
# # Your model: from `config.json` to the cache your engine allocates
# Point `CONFIG` at your model's Hugging Face `config.json`. `kvlayout.models` reads it the way
# vLLM 0.33 does (head size, KV heads per rank, sliding windows, MLA, Mamba states, the hybrid
# block alignment, the groups) and returns a kvlayout spec with vLLM's layer names, so the planner,
# the proof and every zeroing backend apply as they are. A field the engine needs that the config
# lacks is an error naming it, never a guess. The example is Qwen3.5-2B, a hybrid of gated delta
# net (Mamba-style) layers and full attention (`tests/fixtures/models/qwen3_5/SOURCE.md`).

# %%
# %matplotlib inline
from pathlib import Path

import kvlayout as K
import kvlayout.models as M
from kvlayout.conformance import run_case
from kvlayout.viz import byte_map

CONFIG = Path('..') / 'tests' / 'fixtures' / 'models' / 'qwen3_5' / 'config.json'   # your model's config.json
model = M.from_config(CONFIG, num_blocks=4)
print(M.summary(model))

# %% [markdown]
# One attention page must hold one Mamba state, so vLLM raised the attention block from 16 to 544
# tokens and pads each 1,085,440 B state to the 1,114,112 B page. Tensor parallelism and an fp8 KV
# cache move that balance: fewer KV heads per rank, or one byte per element, means more tokens per
# block for the same state.

# %%
print(f"{'tp':>3} {'KV cache':>14} {'tokens':>7} {'bytes per block':>16} {'blocks per GiB':>15}")
for tp in (1, 8):
    for kv in ('auto', 'fp8'):
        m = M.from_config(CONFIG, tp=tp, kv_cache_dtype=kv, num_blocks=4)
        print(f"{tp:>3} {m.kv_cache_dtype:>14} {m.block_size:>7} {m.bytes_per_block:>16,}",
              f"{m.blocks_per_gib:>14,}")
        assert K.verify(K.plan(m.spec)).ok
tp8 = M.from_config(CONFIG, tp=8, kv_cache_dtype='fp8', num_blocks=4)
assert tp8.block_size == 272 and tp8.bytes_per_block == 835_584   # 6 * 272 tokens * (2 * 1 * 256 * 1) B

# %% [markdown]
# The byte map of two blocks: every group (three of Mamba states, one of attention) overlays the
# same block row; hatched grey is the Mamba padding, which zeroing never writes, and the Mamba
# states themselves are never zeroed either.

# %%
fig = byte_map(model.spec, blocks=[0, 1])

# %% [markdown]
# The segment table holds only the attention layers (Mamba states are not zeroed); the verifier
# proves it for every block id at once, and the NumPy reference zeroes two blocks byte for byte
# as the contract says.

# %%
table = K.plan(model.spec)
report = K.verify(table)
print(report.format())
assert report.ok and len(table) == 6
res = run_case(K.ReferenceBackend, table, [1, 3])
print(res.check.describe())
assert res.ok and res.check.zeroed_bytes == 2 * 6 * 1_114_112

# %% [markdown]
# ## The same model on tpu-inference
# tpu-inference keeps the cache as typed per-layer arrays (GEOMETRY.md section 9): attention
# `(pages, page_size, heads_x2 // packing, packing, head_dim)`, with the head size padded to 128
# lanes and the heads to the packing of the dtype. Its Mamba states live per request slot, outside
# the page arrays. Every array is a buffer of its own with one row (base 0, stride = span = page).

# %%
tpu = M.from_config(CONFIG, engine='tpu-inference', num_blocks=4)
print(M.summary(tpu))
tpu8 = M.from_config(CONFIG, engine='tpu-inference', tp=8, kv_cache_dtype='fp8', num_blocks=4, block_size=272)
leaf = tpu8.spec.leaves[0]
print(leaf.name, leaf.shape, leaf.dtype, f"{leaf.page_bytes:,} B per page (8 chips); vLLM's: 139,264 B")
# the global array: 2 KV heads padded to tp 8, one per chip, K and V padded to 4 fp8 lanes: 8 rows of 4
assert leaf.shape == (4, 272, 8, 4, 256) and leaf.page_bytes == 2_228_224
