"""Hostile inputs to the vLLM adapter (issue 25), against vLLM 0.33.0's own objects on the CPU.

- ``KVBlockZeroer.from_kv_caches`` on views that start at a nonzero byte of their storage
  (vLLM's ``create_kv_cache_views`` honours its buffer's storage offset): exact bytes on a
  poisoned storage with guard bytes, and views off the plan refused naming the layer.
- ``table_from_block_zeroer`` on a malformed ``_meta``: a ``TableError`` naming the field.
- ``KVBlockZeroer.warmup`` leaves no bad-id flag behind.
- a V head size different from the K head size is planned (vLLM builds it), a string dtype refused.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.driver import ground_truth

G = ground_truth()

import torch  # noqa: E402
from vllm.v1 import kv_cache_interface as I  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.errors import BlockIdError, SpecError, TableError  # noqa: E402
from kvlayout.integrations.vllm import (  # noqa: E402
    KVBlockZeroer,
    spec_from_kv_cache_config,
    table_from_block_zeroer,
)

NAMES = ["model.layers.0.attn", "model.layers.1.attn"]
ATTN = I.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)  # 1,024 B
TENSOR = I.KVCacheTensor(size=8192, layers=NAMES, layer_stride=1024, block_stride=2048)
CONFIG = I.KVCacheConfig(  # the README's two layers under BLHNC, 4 blocks
    num_blocks=4,
    kv_cache_tensors=[TENSOR],
    kv_cache_groups=[I.KVCacheGroupSpec(NAMES, ATTN)],
    kv_cache_layout="BLHNC",
)
GUARD = 4096


def _storage_views(
    lead: int = GUARD, tail: int = GUARD, seed: int = 7
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A poisoned uint8 storage and vLLM's views of the cache placed ``lead`` bytes into it."""
    poison = K.poison_pattern(lead + TENSOR.size + tail, seed=seed)
    storage = torch.from_numpy(poison.copy())
    raw = storage.view(torch.int8)[lead : lead + TENSOR.size]  # vLLM's int8 buffer at a storage offset
    views = I.create_kv_cache_views(raw, ATTN, CONFIG.num_blocks, I.KVCacheLayout.BLHNC, TENSOR)
    return storage, dict(zip(NAMES, views))


@pytest.mark.parametrize("lead", [GUARD, 0])
def test_from_kv_caches_zeroes_the_views_bytes_at_their_storage_offset(lead: int) -> None:
    """Views at storage bytes [4096, 12288): block 0 is [4096, 5120) and [5120, 6144), not [0, 2048)."""
    storage, views = _storage_views(lead)
    assert views[NAMES[0]].storage_offset() * 2 == lead  # vLLM honours its buffer's storage offset
    poison = storage.numpy().copy()
    z = KVBlockZeroer.from_kv_caches(CONFIG, views)
    for ids in ([0], [3, 1], [0, 1, 2, 3]):
        storage.copy_(torch.from_numpy(poison))
        z.zero_block_ids(ids)
        expected = poison.copy()
        K.zero_blocks_numpy(expected[lead : lead + TENSOR.size], z.table, ids)
        assert np.array_equal(storage.numpy(), expected), (lead, ids)
    storage.copy_(torch.from_numpy(poison))
    z.zero_block_ids([0])
    changed = K.changed_ranges(poison, storage.numpy()).tolist()
    assert changed == [[lead, lead + 2048]]  # both layers' block 0, through the views themselves
    views[NAMES[1]][0].fill_(0)
    views[NAMES[0]][0].fill_(0)
    assert np.array_equal(storage.numpy()[lead : lead + 2048], np.zeros(2048, np.uint8))


def test_from_kv_caches_refuses_views_off_the_plan() -> None:
    storage, views = _storage_views()
    v0, v1 = views[NAMES[0]], views[NAMES[1]]
    shifted = dict(views)
    shifted[NAMES[1]] = v1.as_strided(v1.shape, v1.stride(), v1.storage_offset() + 2)  # 4 bytes later
    with pytest.raises(
        SpecError,
        match=r"kv_caches\['model.layers.1.attn'\]\.storage_offset = 2562: block 0 covers storage "
        r"bytes \[\(5124, 6148\)\], kvlayout's BLHNC plan puts this layer at \[\(5120, 6144\)\]",
    ):
        KVBlockZeroer.from_kv_caches(CONFIG, shifted)
    strided = dict(views)
    strided[NAMES[0]] = v0.as_strided((3, *v0.shape[1:]), (1536, *v0.stride()[1:]), v0.storage_offset())
    with pytest.raises(SpecError, match=r"kv_caches\['model.layers.0.attn'\]\.shape = \(3, 2, 16, 16\)"):
        KVBlockZeroer.from_kv_caches(CONFIG, strided)
    strided[NAMES[0]] = v0.as_strided(v0.shape, (1536, *v0.stride()[1:]), v0.storage_offset())
    with pytest.raises(
        SpecError,
        match=r"kv_caches\['model.layers.0.attn'\]\.stride = \(1536, 256, 16, 1\): strides blocks by "
        r"3072 B; kvlayout's BLHNC plan by \[2048\] B",
    ):
        KVBlockZeroer.from_kv_caches(CONFIG, strided)
    heads = dict(views)  # the head axis strided past the page: block 0 is not the plan's bytes
    heads[NAMES[1]] = v1.as_strided(v1.shape, (1024, 512, 16, 1), v1.storage_offset())
    with pytest.raises(SpecError, match=r"kv_caches\['model.layers.1.attn'\]\.storage_offset"):
        KVBlockZeroer.from_kv_caches(CONFIG, heads)
    with pytest.raises(SpecError, match=r"kv_caches\['model.layers.1.attn'\] = None: no view"):
        KVBlockZeroer.from_kv_caches(CONFIG, {NAMES[0]: v0})
    with pytest.raises(SpecError, match=r"offset = 0: taken from the views' storage offset"):
        KVBlockZeroer.from_kv_caches(CONFIG, views, offset=0)
    with pytest.raises(SpecError, match=r"kv_caches\['model.layers.1.attn'\] = 'another storage'"):
        KVBlockZeroer.from_kv_caches(CONFIG, {NAMES[0]: v0, NAMES[1]: v1.clone()})
    assert np.array_equal(storage.numpy(), K.poison_pattern(storage.numel(), seed=7))  # nothing written


def test_from_kv_caches_checks_state_tuples_and_runner_only_layers() -> None:
    """A layer bound as a tuple of state tensors must lie inside its planned bytes."""
    storage, views = _storage_views()
    v1 = views[NAMES[1]]
    ok = {NAMES[0]: views[NAMES[0]], NAMES[1]: (v1[:, :1], v1[:, 1:])}
    KVBlockZeroer.from_kv_caches(CONFIG, ok)
    out = {
        NAMES[0]: views[NAMES[0]],
        NAMES[1]: (v1.as_strided(v1.shape, v1.stride(), v1.storage_offset() + 8),),
    }
    with pytest.raises(SpecError, match=r"kv_caches\['model.layers.1.attn'\]\.storage_offset"):
        KVBlockZeroer.from_kv_caches(CONFIG, out)
    # a str inside the list: refused as such (seventeenth pass; it was skipped, and the list held no tensor)
    with pytest.raises(SpecError, match=r"kv_caches\['model.layers.1.attn'\] = a str: must hold tensors"):
        KVBlockZeroer.from_kv_caches(CONFIG, {NAMES[0]: views[NAMES[0]], NAMES[1]: ["x"]})


# --------------------------------------------------------------------------- hostile _meta
def _meta(*cols: Any) -> SimpleNamespace:
    return SimpleNamespace(_meta=cols)


def _good() -> list[Any]:
    return [
        torch.tensor([1000, 2024], dtype=torch.uint64),
        torch.tensor([512, 512], dtype=torch.int64),
        torch.tensor([256, 256], dtype=torch.int64),
        1,
        256,
        2,
    ]


def test_table_from_block_zeroer_reads_a_good_meta() -> None:
    t = table_from_block_zeroer(_meta(*_good()), 1000, 8192, 4)
    assert [(s.base, s.stride, s.span) for s in t.segments] == [(0, 2048, 1024), (1024, 2048, 1024)]
    lists = [[1000, 2024], (512, 512), np.array([256, 256]), 1, 256, 2]
    assert table_from_block_zeroer(_meta(*lists), 1000, 8192, 4) == t
    assert len(table_from_block_zeroer(SimpleNamespace(_meta=None), 1000, 8192, 4)) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {1: torch.tensor([512], dtype=torch.int64)},
            r"zeroer\._meta\[1\] \(seg_block_strides\) = 1: entries",
        ),
        ({2: torch.tensor([256, 256, 256])}, r"zeroer\._meta\[2\] \(seg_page_sizes\) = 3: entries"),
        (
            {2: torch.tensor([256.5, 256.0])},
            r"zeroer\._meta\[2\] \(seg_page_sizes\)\[0\] = 256\.5: must be an",
        ),
        ({1: [512.0, 512]}, r"zeroer\._meta\[1\] \(seg_block_strides\)\[0\] = 512\.0: must be an integer"),
        ({0: [1000, True]}, r"zeroer\._meta\[0\] \(seg_addrs\)\[1\] = True: must be an integer"),
        ({0: torch.zeros(2, 2, dtype=torch.int64)}, r"zeroer\._meta\[0\] \(seg_addrs\)\[0\] = \[0, 0\]"),
        ({0: 1000}, r"zeroer\._meta\[0\] \(seg_addrs\) = 1000: must be a 1-D tensor"),
        ({5: 1}, r"zeroer\._meta\[5\] \(n_segs\) = 1: the table has 2 segments"),
        ({5: 2.0}, r"zeroer\._meta\[5\] \(n_segs\) = 2\.0: must be an integer"),
        ({3: 0}, r"zeroer\._meta\[3\] \(max_chunks\) = 0: 0 chunks of 256 words do not cover"),
    ],
)
def test_table_from_block_zeroer_refuses_a_hostile_meta(change: dict[int, Any], message: str) -> None:
    cols = _good()
    for i, v in change.items():
        cols[i] = v
    with pytest.raises(TableError, match=message):
        table_from_block_zeroer(_meta(*cols), 1000, 8192, 4)


def test_table_from_block_zeroer_refuses_a_short_or_foreign_meta() -> None:
    for meta, shown in ((tuple(_good()[:2]), "2 entries"), (7, "int"), ("abc", "str")):
        with pytest.raises(TableError, match=rf"zeroer\._meta = {shown}: must be a tuple \(seg_addrs"):
            table_from_block_zeroer(SimpleNamespace(_meta=meta), 1000, 8192, 4)
    with pytest.raises(TableError, match=r"base_address = 1\.5: must be an integer"):
        table_from_block_zeroer(_meta(*_good()), 1.5, 8192, 4)  # type: ignore[arg-type]
    # three columns only (no launch fields) are read as rows
    assert len(table_from_block_zeroer(_meta(*_good()[:3]), 1000, 8192, 4)) == 2


# --------------------------------------------------------------------------- warmup, head_size_v, dtype
def test_warmup_leaves_no_bad_id_flag() -> None:
    storage, views = _storage_views(seed=9)
    poison = storage.numpy().copy()
    z = KVBlockZeroer.from_kv_caches(CONFIG, views)
    z.warmup()
    z.check()  # warmup's skipped id (num_blocks) must not count as a bad id
    assert np.array_equal(storage.numpy(), poison)
    # the same launch with the pool's own limit counts that id as bad, and check() reports it
    z._zeroer._launch(torch.tensor([CONFIG.num_blocks]))
    with pytest.raises(BlockIdError, match=r"outside \[0, 4\)"):
        z.check()
    assert np.array_equal(storage.numpy(), poison)


def test_v_head_size_other_than_k_is_planned_as_vllm_builds_it() -> None:
    """Head size 8, V head size 4: vLLM plans and views it; kvlayout clears vLLM's bytes."""
    for lay in G.LAYOUTS:
        spec = G._full(hs=8, head_size_v=4)
        assert (spec.head_size, spec.head_size_v, spec.page_size_bytes) == (8, 4, 16 * 2 * 12 * 2)
        built = G.build(
            G.Case(f"{lay}:head-size-v", lay, G._named("attn", [(spec, G.TritonAttentionBackend)] * 2))
        )
        kspec = G.kvlayout_spec(built)
        assert {layer.head_size_v for _, layer in kspec.layers} == {4}
        table = K.plan(kspec)
        vt = built.vllm_table()
        for b in range(built.num_blocks):
            assert G._ranges(K.expected_zeroed(table, [b])) == G.vllm_bytes(vt, [b]), (lay, b)


def test_a_string_dtype_is_refused_naming_the_field() -> None:
    g = CONFIG.kv_cache_groups[0]
    for bad in ("bfloat16", "torch.bfloat16", 2):
        spec = I.FullAttentionSpec(  # type: ignore[arg-type]
            block_size=16, num_kv_heads=2, head_size=8, dtype=bad
        )
        cfg = replace(CONFIG, kv_cache_groups=[replace(g, kv_cache_spec=spec)])
        with pytest.raises(
            SpecError,
            match=rf"kv_cache_groups\[0\]\['model.layers.0.attn'\]\.dtype = {bad!r}: must be a torch",
        ):
            spec_from_kv_cache_config(cfg)
    mamba = I.MambaSpec(block_size=16, shapes=((3, 40),), dtypes=("float32",))  # type: ignore[arg-type]
    cfg = replace(CONFIG, kv_cache_groups=[replace(g, kv_cache_spec=mamba)])
    with pytest.raises(
        SpecError, match=r"\['model.layers.0.attn'\]\.dtypes = \('float32',\): must be a tuple"
    ):
        spec_from_kv_cache_config(cfg)
