"""ShardedLayout (NumPy only): per-shard specs, id routing, the gathered-buffer contract."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.sharding import ShardedLayout, shard_spec, split_heads
from kvlayout.testing import random_spec


def test_block_sharded_2d_mesh_geometry() -> None:
    lay = shard_spec(K.preset("dsv4-test"), {"dp": 2, "tp": 4}, block_axes=("dp",), head_axes=("tp",))
    assert lay.mode == "block_sharded"
    assert (lay.num_shards, lay.block_shards, lay.blocks_per_shard, lay.num_blocks) == (8, 2, 50, 100)
    assert lay.shard_axes == ("dp", "tp") and lay.replica_axes == ()
    assert [lay.block_shard(k) for k in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert lay.shard_coords(6) == {"dp": 1, "tp": 2}
    assert [lay.shard_of_rank(r) for r in range(8)] == list(range(8))
    assert (
        lay.local_table.total_bytes == 50 * 149_760 and lay.shard_bytes == 50 * 149_760
    )  # 7,488,000 = 14,625 rows
    routed = lay.route([99, 0, 50, 49, 0])
    assert [r.tolist() for r in routed] == [[0, 49]] * 4 + [[0, 49]] * 4
    assert lay.local_ids(5, [3, 60, 61]).tolist() == [10, 11]
    assert lay.verify().ok


def test_replicated_heads_split_and_replica_axis() -> None:
    spec = K.preset("llama-8b")  # 8 KV heads
    lay = shard_spec(spec, {"r": 2, "tp": 4}, head_axes=("tp",))
    assert lay.mode == "replicated" and lay.num_shards == 4 and lay.replica_axes == ("r",)
    layer = lay.local_spec.groups[0].layers[0]
    assert isinstance(layer, K.FullAttentionSpec) and layer.num_kv_heads == 2
    assert lay.local_table.total_bytes * 4 == K.plan(spec).total_bytes
    assert lay.num_blocks == spec.num_blocks
    assert all(r.tolist() == [1, 7] for r in lay.route([7, 1]))
    # ranks are row-major over (r, tp): ranks 0..3 and 4..7 hold the same four shards
    assert [lay.shard_of_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_mla_and_mamba_stay_whole_when_heads_split() -> None:
    spec = K.KVCacheSpec(
        num_blocks=4,
        layout="packed",
        groups=(
            K.GroupSpec(
                "g",
                (
                    K.MLASpec(name="mla", block_size=4, head_size=8, dtype="bfloat16"),
                    K.MambaSpec(name="m", state_bytes=64),
                ),
            ),
        ),
    )
    assert split_heads(spec, 4) == spec


@pytest.mark.parametrize(
    ("kwargs", "field", "match"),
    [
        (
            {"mesh_axes": {"dp": 3}, "block_axes": ("dp",)},
            "num_blocks",
            r"num_blocks = 100: not divisible by the 3 block shards",
        ),
        (
            {"mesh_axes": {"tp": 3}, "head_axes": ("tp",)},
            "num_kv_heads",
            r"num_kv_heads = 8: not divisible by mesh axis 'tp' of size 3",
        ),
        (
            {"mesh_axes": {"dp": 2}, "block_axes": ("x",)},
            "block_axes",
            r"'x' is not a mesh axis \(axes: dp\)",
        ),
        (
            {"mesh_axes": {"dp": 2}, "block_axes": ("dp",), "head_axes": ("dp",)},
            "head_axes",
            r"'dp' is already a block axis",
        ),
        ({"mesh_axes": {"dp": 0}}, "mesh_axes.dp", r"mesh_axes\['dp'\] = 0: must be a positive integer"),
        ({"mesh_axes": {}}, "mesh_axes", r"at least one axis"),
    ],
)
def test_bad_mesh_specs_name_field_and_value(kwargs: dict, field: str, match: str) -> None:
    spec = K.preset("llama-8b").with_num_blocks(100)
    kwargs = dict(kwargs)  # the parameter is shared between runs in one process (mutmut): never pop it
    axes = kwargs.pop("mesh_axes")
    with pytest.raises(K.SpecError, match=match) as e:
        shard_spec(spec, axes, **kwargs)
    assert field in str(e.value.field)


def test_bad_ids_raise_and_write_nothing_on_any_shard() -> None:
    lay = shard_spec(K.preset("dsv4-test"), {"dp": 4}, block_axes=("dp",))
    assert lay.shard_bytes == 25 * 149_760 + 256  # 25 rows of 292.5 x 512 B: padded to a whole row
    data = K.poison_pattern(lay.gathered_bytes)
    buf = data.copy()
    for ids in ([0, 100], [-1], [True], [1.0]):
        with pytest.raises(K.BlockIdError):
            lay.zero_reference(buf, ids)
        assert np.array_equal(buf, data)
    with pytest.raises(K.BlockIdError, match=r"block_ids\[1\] = 100: outside \[0, 100\)"):
        lay.route([3, 100])
    with pytest.raises(K.LayoutBufferError, match="shard = 4"):
        lay.local_ids(4, [0])
    with pytest.raises(K.LayoutBufferError, match="rank = 4"):
        lay.shard_of_rank(4)


def test_packed_block_sharded_gathered_equals_single_device_layout() -> None:
    """Block-outermost rows: the gathered shards are byte for byte the global layout."""
    spec = K.preset("dsv4-test")
    lay = shard_spec(spec, {"dp": 5}, block_axes=("dp",))
    glob = K.plan(spec)
    assert lay.gathered_bytes == glob.total_bytes  # 20 blocks x 149,760 B = 5,850 whole 512 B rows
    ids = [0, 19, 20, 21, 74, 99, 99]
    assert np.array_equal(lay.expected_zeroed(ids), K.expected_zeroed(glob, ids))
    data = K.poison_pattern(glob.total_bytes)
    a, b = data.copy(), data.copy()
    lay.zero_reference(a, ids)
    K.zero_blocks_numpy(b, glob, ids)
    assert np.array_equal(a, b)


@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([(("a", 2),), (("a", 2), ("b", 3)), (("a", 1), ("b", 2))]),
    st.data(),
)
@settings(max_examples=30)
def test_reference_changes_exactly_the_gathered_contract(seed: int, axes: tuple, data: st.DataObject) -> None:
    local = random_spec(seed, max_blocks=5)
    names = [a for a, _ in axes]
    block_axes = data.draw(st.sampled_from([(), (names[0],), tuple(names)]))
    lay = ShardedLayout.from_local(local, axes, block_axes=block_axes)
    ids = data.draw(st.lists(st.integers(0, lay.num_blocks - 1), max_size=6))
    before = K.poison_pattern(lay.gathered_bytes, seed=seed)
    after = before.copy()
    lay.zero_reference(after, ids)
    chk = lay.compare(before, after, ids)
    assert chk.matches, chk.describe()
    # shard by shard: the local contract of the ids routed there, nothing else
    for k, local_ids in enumerate(lay.route(ids)):
        sl = slice(k * lay.shard_bytes, (k + 1) * lay.shard_bytes)
        assert K.reference.compare_to_contract(before[sl], after[sl], lay.local_table, local_ids).matches


def test_compare_catches_a_shard_written_in_the_wrong_place() -> None:
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": 2}, block_axes=("dp",))
    before = K.poison_pattern(lay.gathered_bytes)
    after = before.copy()
    K.zero_blocks_numpy(after, lay.local_table, [1])  # global id 5 zeroed on shard 0 instead of shard 1
    chk = lay.compare(before, after, [5])
    assert not chk.matches and len(chk.extra) and len(chk.missing)


def test_describe_and_dict() -> None:
    lay = shard_spec(K.preset("dsv4"), {"dp": 2}, block_axes=("dp",))
    text = lay.describe()
    assert "block_sharded" in text and "50 per shard" in text
    d = lay.to_dict()
    assert d["num_shards"] == 2 and d["local_spec"]["num_blocks"] == 50


def test_sharding_module_imports_neither_torch_nor_jax() -> None:
    code = "import sys, kvlayout.sharding; print('jax' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "False"]
