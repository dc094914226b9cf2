"""kvlayout.sharding: every rule's field, value and message, mesh bounds at their edges, id routing
at part boundaries, the gathered-buffer contract and its reference (issue 25, mutation coverage).

Expected messages are typed out; byte counts come from the layer formula (K and V pages of
``block_size * heads * head_size * itemsize``) and ``ceil(local / 512) * 512``, computed here.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvlayout as K
import kvlayout.sharding as S
from kvlayout.errors import LayoutBufferError, SpecError
from kvlayout.sharding import ShardedLayout, shard_spec, split_heads
from kvlayout.table import Segment, SegmentTable


def _err(fn: Callable[[], object], cls: type[Exception], field: str, value: Any, message: str) -> None:
    """``fn`` raises ``cls`` naming ``field`` and ``value``, with exactly ``message``."""
    with pytest.raises(cls) as e:
        fn()
    err = e.value
    assert err.field == field, (err.field, str(err))  # type: ignore[attr-defined]
    assert type(err.value) is type(value) and err.value == value, (err.value, str(err))
    assert str(err) == message


def spec(num_blocks: int = 6, heads: int = 4, *, kernel_block_size: int | None = None) -> K.KVCacheSpec:
    """One group: a full and a sliding-window layer, block 1, head size 2, float32 (16 B per head
    and block for K and V together)."""
    g: dict[str, Any] = {"name": "g", "layers": [
        {"name": "f", "kind": "full", "block_size": 1, "num_kv_heads": heads, "head_size": 2,
         "dtype": "float32"},
        {"name": "w", "kind": "sliding_window", "block_size": 1, "num_kv_heads": heads, "head_size": 2,
         "dtype": "float32", "window": 8},
    ]}
    if kernel_block_size is not None:
        g["kernel_block_size"] = kernel_block_size
    return K.KVCacheSpec.from_dict({"num_blocks": num_blocks, "layout": "packed", "groups": [g]})


def test_mesh_axes_rules_and_bounds() -> None:
    local = spec()
    F = ShardedLayout.from_local
    _err(lambda: F(local, {}), SpecError, "mesh_axes", (), "mesh_axes = (): a mesh needs at least one axis")
    seventeen = [(f"a{i}", 1) for i in range(17)]
    _err(lambda: F(local, seventeen), SpecError, "mesh_axes", 17, "mesh_axes: 17 axes, at most 16 allowed")
    assert F(local, seventeen[:16]).num_devices == 1
    _err(lambda: F(local, [["dp", 2]]), SpecError, "mesh_axes", ["dp", 2],  # type: ignore[list-item]
         "mesh_axes item = ['dp', 2]: must be (name, size)")
    _err(lambda: F(local, [("dp", 2, 1)]), SpecError, "mesh_axes", ("dp", 2, 1),  # type: ignore[list-item]
         "mesh_axes item = ('dp', 2, 1): must be (name, size)")
    _err(lambda: F(local, [(5, 2)]), SpecError, "mesh_axes", 5,  # type: ignore[list-item]
         "mesh_axes name = 5: must be a non-empty string")
    _err(lambda: F(local, [("", 2)]), SpecError, "mesh_axes", "",
         "mesh_axes name = '': must be a non-empty string")
    _err(lambda: F(local, [("dp", 2), ("tp", 1), ("dp", 1)]), SpecError, "mesh_axes", "dp",
         "mesh_axes name = 'dp': duplicate axis")
    for bad in (0, True, 2.0, "2"):
        _err(lambda: F(local, {"dp": bad}), SpecError, "mesh_axes.dp", bad,  # noqa: B023
             f"mesh_axes['dp'] = {bad!r}: must be a positive integer")
    # the device count is bounded over the product of the sizes, at exactly MAX_MESH_DEVICES
    assert F(local, {"dp": 2**16}).num_devices == 2**16 == S.MAX_MESH_DEVICES
    assert F(local, {"a": 256, "b": 256}).num_devices == 2**16
    sizes = F(local, {"a": np.int64(2)}).mesh_axes
    assert sizes == (("a", 2),) and type(sizes[0][1]) is int
    too = "the mesh would have more than 65536 devices"
    _err(lambda: F(local, {"dp": 2**16 + 1}), SpecError, "mesh_axes.dp", 2**16 + 1,
         f"mesh_axes['dp'] = 65537: {too}")
    _err(lambda: F(local, {"a": 256, "b": 257}), SpecError, "mesh_axes.b", 257,
         f"mesh_axes['b'] = 257: {too}")
    _err(lambda: F(local, {"a": 2, "b": 10**30}), SpecError, "mesh_axes.b", 10**30,
         f"mesh_axes['b'] = {10**30}: {too}")


def test_axis_subsets_rules() -> None:
    local = spec()
    axes = {"dp": 2, "tp": 2}
    F = ShardedLayout.from_local
    _err(lambda: F(local, axes, block_axes=("dp", "x")), SpecError, "block_axes", "x",
         "block_axes = ('dp', 'x'): 'x' is not a mesh axis (axes: dp, tp)")
    _err(lambda: F(local, axes, shard_axes=("y",)), SpecError, "shard_axes", "y",
         "shard_axes = ('y',): 'y' is not a mesh axis (axes: dp, tp)")
    _err(lambda: F(local, axes, block_axes=("dp", "dp")), SpecError, "block_axes", ("dp", "dp"),
         "block_axes = ('dp', 'dp'): an axis is named twice")
    _err(lambda: shard_spec(local, axes, head_axes=["tp", "tp"]), SpecError, "head_axes", ("tp", "tp"),
         "head_axes = ('tp', 'tp'): an axis is named twice")
    _err(lambda: shard_spec(local, axes, head_axes=("q",)), SpecError, "head_axes", "q",
         "head_axes = ('q',): 'q' is not a mesh axis (axes: dp, tp)")
    # one axis may be given as a string; subsets come back in mesh order
    lay = shard_spec(local, axes, block_axes="dp", head_axes="tp")  # type: ignore[arg-type]
    assert (lay.block_axes, lay.shard_axes) == (("dp",), ("dp", "tp"))
    assert F(local, axes, shard_axes=("tp", "dp")).shard_axes == ("dp", "tp")
    assert F(local, axes, shard_axes=("tp",)).shard_axes == ("tp",)
    assert F(local, axes).shard_axes == ("dp", "tp")
    # the constructor checks what from_local checks, naming its own fields
    A = (("dp", 2), ("tp", 2))
    _err(lambda: ShardedLayout(local, A, (), ("z",)), SpecError, "shard_axes", "z",
         "shard_axes = ('z',): 'z' is not a mesh axis (axes: dp, tp)")
    _err(lambda: ShardedLayout(local, A, ("z",), ("dp",)), SpecError, "block_axes", "z",
         "block_axes = ('z',): 'z' is not a mesh axis (axes: dp, tp)")
    _err(lambda: ShardedLayout(local, A, ("tp",), ("dp",)), SpecError, "block_axes", "tp",
         "block_axes = ('tp',): 'tp' must also split the buffer (shard_axes)")


def test_rank_and_shard_checks() -> None:
    lay = ShardedLayout.from_local(spec(), {"dp": 2, "r": 2}, block_axes=("dp",), shard_axes=("dp",))
    assert [lay.shard_of_rank(r) for r in range(4)] == [0, 0, 1, 1] and lay.shard_of_rank(np.int64(3)) == 1
    for bad in (True, 1.0, -1, 4):
        _err(lambda: lay.shard_of_rank(bad), LayoutBufferError, "rank", bad,  # noqa: B023
             f"rank = {bad!r}: must be in [0, 4)")
        _err(lambda: lay.shard_coords(bad), LayoutBufferError, "shard", bad,  # noqa: B023
             f"shard = {bad!r}: must be in [0, 2)")
    assert lay.shard_coords(np.int32(1)) == {"dp": 1}


def test_local_ids_at_the_part_boundaries() -> None:
    lay = ShardedLayout.from_local(spec(num_blocks=4), {"dp": 3}, block_axes=("dp",))
    ids = list(range(12))
    assert [lay.local_ids(k, ids).tolist() for k in range(3)] == [[0, 1, 2, 3]] * 3
    assert [lay.local_ids(k, [3, 4, 7, 8]).tolist() for k in range(3)] == [[3], [0, 3], [0]]
    routed = lay.route([4, 8, 3])
    assert [r.tolist() for r in routed] == [[3], [0], [0]]
    for r in routed:  # read-only: shards of one part share the array
        assert not r.flags.writeable
        with pytest.raises(ValueError):
            r[:1] = 0


def test_expected_zeroed_is_an_empty_int64_range_list_without_ids() -> None:
    for block_axes in ((), ("dp",)):
        lay = ShardedLayout.from_local(spec(), {"dp": 2}, block_axes=block_axes)
        exp = lay.expected_zeroed([])
        assert exp.dtype == np.int64 and exp.shape == (0, 2)


def test_zero_reference_refuses_small_or_foreign_buffers() -> None:
    lay = ShardedLayout.from_local(spec(), {"dp": 2}, block_axes=("dp",))
    assert lay.gathered_bytes == 2 * 1024  # 6 blocks x 2 layers x 4 heads x 16 B = 768 B: two 512 B rows
    small = np.full(1000, 7, np.uint8)
    _err(lambda: lay.zero_reference(small, [0]), LayoutBufferError, "buffer.nbytes", 1000,
         "gathered bytes = 1000: needs 2048")
    assert (small == 7).all()
    # a buffer that is no NumPy array is refused by its type (pass 23, L8), before its size is read
    _err(lambda: lay.zero_reference(bytearray(2048), [0]), LayoutBufferError, "buffer", "bytearray",
         "gathered type = bytearray: must be a NumPy array")


def test_reference_and_contract_with_negative_strides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference walks a row with a negative stride from its lowest block (any table the local
    spec plans to; today's planner steps forward, so the table is swapped in here)."""
    local = spec(num_blocks=4)
    rows = (Segment(384, -128, 64), Segment(64, 128, 32), Segment(480, -128, 16))
    t = SegmentTable(512, 4, rows, planned=True)
    assert K.verify(t).ok
    monkeypatch.setattr(S, "plan", lambda s: t)
    for block_axes in ((), ("dp",)):
        lay = ShardedLayout.from_local(local, {"dp": 3}, block_axes=block_axes)
        assert lay.shard_bytes == 512
        for ids in ([0], [3], [1, 2], [0, 1, 2, 3], list(range(0, lay.num_blocks, 5))):
            before = K.poison_pattern(lay.gathered_bytes, seed=len(ids))
            after = before.copy()
            lay.zero_reference(after, ids)
            chk = lay.compare(before, after, ids)
            assert chk.matches, (block_axes, ids, chk.describe())
            # shard by shard, against the core reference on the swapped-in table
            for k, local_ids in enumerate(lay.route(ids)):
                want = before[k * 512:(k + 1) * 512].copy()
                K.zero_blocks_numpy(want, t, local_ids)
                assert np.array_equal(after[k * 512:(k + 1) * 512], want), (block_axes, ids, k)


def test_compare_reads_the_image_after_origin() -> None:
    lay = ShardedLayout.from_local(spec(), {"dp": 2}, block_axes=("dp",))
    guard = 64
    before = K.poison_pattern(guard + lay.gathered_bytes + guard)
    after = before.copy()
    lay.zero_reference(after[guard:guard + lay.gathered_bytes], [1, 7])
    assert lay.compare(before, after, [1, 7], origin=guard).matches
    assert not lay.compare(before, after, [1, 7]).matches


def test_replicated_reference_does_not_expand_shard_id_pairs() -> None:
    """Replicated zeroing clears the same local ids on every shard without building a (shard, id)
    pair per write: 256 shards x 4,096 ids would be 1M pairs (tens of MiB of index arrays)."""
    local = spec(num_blocks=4096, heads=1)  # 2 layers x 16 B per block: 128 KiB per shard
    lay = ShardedLayout.from_local(local, {"dp": 256})
    buf = np.full(lay.gathered_bytes, 0xAB, np.uint8)
    ids = np.arange(4096)
    tracemalloc.start()
    try:
        lay.zero_reference(buf, ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not buf.any()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_require_safe_describe_and_dict() -> None:
    local = spec(num_blocks=3, heads=2)  # 3 blocks x 2 layers x 2 heads x 16 B = 192 B, padded to 512
    mesh = {"r": 2, "dp": 2, "tp": 3}
    lay = ShardedLayout.from_local(local, mesh, block_axes=("dp",), shard_axes=("dp", "tp"))
    assert lay.require_safe().ok and lay.local_table.total_bytes == 192
    assert lay.describe() == (
        "mesh r=2 x dp=2 x tp=3: block_sharded, buffer split over (dp, tp) into 6 shards, replicated over r; "
        "6 global blocks, 3 per shard; local layout packed, 2 rows, 192 B (+320 B row padding)"
    )
    assert lay.to_dict() == {
        "mode": "block_sharded", "mesh_axes": {"r": 2, "dp": 2, "tp": 3}, "block_axes": ["dp"],
        "shard_axes": ["dp", "tp"], "num_shards": 6, "num_blocks": 6, "blocks_per_shard": 3,
        "shard_bytes": 512, "local_total_bytes": 192, "local_spec": local.to_dict(),
    }
    whole = ShardedLayout.from_local(local, {"r": 2}, shard_axes=())
    assert whole.describe() == (
        "mesh r=2: replicated, buffer not split (1 shard), replicated over r; "
        "3 global blocks, 3 per shard; local layout packed, 2 rows, 192 B (+320 B row padding)"
    )
    two = ShardedLayout.from_local(local, {"r": 2, "dp": 2, "s": 3}, shard_axes=("dp",))
    assert "into 2 shards, replicated over r, s; 3 global blocks" in two.describe()
    assert ShardedLayout.from_local(local, {"a": 2, "b": 1}).describe().startswith(
        "mesh a=2 x b=1: replicated, buffer split over (a, b) into 2 shards; 3 global")


def test_split_heads_rules() -> None:
    s = spec(heads=4, kernel_block_size=1)
    assert split_heads(s, 1) is s
    half = split_heads(s, 2)
    assert [(x.name, x.num_kv_heads) for x in half.groups[0].layers] == [("f", 2), ("w", 2)]
    assert half.groups[0].kernel_block_size == 1 and half.num_blocks == 6 and half.layout == "packed"
    _err(lambda: split_heads(s, 0), SpecError, "ways", 0, "ways = 0: must be positive")
    _err(lambda: split_heads(s, 3), SpecError, "layer 'f'.num_kv_heads", 4,
         "layer 'f'.num_kv_heads = 4: not divisible by mesh axis 'heads' of size 3")
    _err(lambda: split_heads(s, 3, "tp"), SpecError, "layer 'f'.num_kv_heads", 4,
         "layer 'f'.num_kv_heads = 4: not divisible by mesh axis 'tp' of size 3")


def test_shard_spec_rules() -> None:
    s = spec(num_blocks=6, heads=4)
    axes = {"dp": 2, "tp": 2, "x": 3}
    _err(lambda: shard_spec(s, axes, block_axes=("q",)), SpecError, "block_axes", "q",
         "block_axes = ('q',): 'q' is not a mesh axis (axes: dp, tp, x)")
    _err(lambda: shard_spec(s, axes, block_axes=("tp", "dp"), head_axes=("x", "tp", "dp")), SpecError,
         "head_axes", "dp", "head_axes: 'dp' is already a block axis")
    _err(lambda: shard_spec(s, axes, head_axes=("tp", "x")), SpecError, "layer 'f'.num_kv_heads", 4,
         "layer 'f'.num_kv_heads = 4: not divisible by mesh axis 'tp+x' of size 6")
    _err(lambda: shard_spec(s, {"dp": 4}, block_axes=("dp",)), SpecError, "num_blocks", 6,
         "num_blocks = 6: not divisible by the 4 block shards of axes ('dp',)")
    lay = shard_spec(s, axes, block_axes=("x",), head_axes=("tp", "dp"))
    assert (lay.block_axes, lay.shard_axes, lay.replica_axes) == (("x",), ("dp", "tp", "x"), ())
    assert lay.local_spec.num_blocks == 2 and lay.local_spec.groups[0].layers[0].num_kv_heads == 1


def test_non_list_axes_and_foreign_specs_are_spec_errors() -> None:
    """Regression (issue 25): ``block_axes=5``, ``mesh_axes=5`` and a spec that is not a KVCacheSpec
    raised raw TypeError / AttributeError; each is now a SpecError naming the field and value."""
    s = spec()
    _err(lambda: shard_spec(s, {"dp": 2}, block_axes=5), SpecError, "block_axes", 5,  # type: ignore[arg-type]
         "block_axes = 5: must be an axis name or a list of them")
    _err(lambda: shard_spec(s, {"dp": 2}, head_axes=None), SpecError, "head_axes", None,
         "head_axes = None: must be an axis name or a list of them")
    _err(lambda: ShardedLayout.from_local(s, {"dp": 2}, shard_axes=2), SpecError, "shard_axes", 2,
         "shard_axes = 2: must be an axis name or a list of them")
    for bad in (5, "dp"):
        _err(lambda: shard_spec(s, bad), SpecError, "mesh_axes", bad,  # type: ignore[arg-type]  # noqa: B023
             f"mesh_axes = {bad!r}: must be a mapping or a list of (name, size) pairs")
    _err(lambda: shard_spec(s.to_dict(), {"dp": 2}), SpecError, "spec", "dict",  # type: ignore[arg-type]
         "spec = 'dict': must be a kvlayout.KVCacheSpec")
    _err(lambda: split_heads(None, 2), SpecError, "spec", "NoneType",  # type: ignore[arg-type]
         "spec = 'NoneType': must be a kvlayout.KVCacheSpec")
    _err(lambda: ShardedLayout(3, (("a", 1),), (), ()), SpecError, "local_spec", "int",
         "local_spec = 'int': must be a kvlayout.KVCacheSpec")
    assert ShardedLayout.from_local(s, {"dp": 2, "tp": 2}, shard_axes={"tp", "dp"}).shard_axes == ("dp", "tp")
