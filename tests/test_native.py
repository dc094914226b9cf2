"""Native caches (GEOMETRY.md section 9): the spec form, its tables and the NumPy reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvlayout as K
from kvlayout.native import (
    NativeCacheSpec,
    NativeLeaf,
    expected_zeroed_native,
    native_tables,
    spec_from_arrays,
    verify_native,
    zero_native_numpy,
)

#: tpu-inference shapes (CONTEXT.md): attention bf16 / fp8, MLA, DeepSeek-V4 uint8 roles
TPU_SHAPES = {
    "attn_bf16": ((6, 16, 4, 2, 128), "bfloat16"),
    "attn_fp8": ((6, 16, 2, 4, 128), "float8_e4m3fn"),
    "mla": ((6, 2, 32, 640), "bfloat16"),
    "v4_nope": ((6, 8, 4, 128), "uint8"),
    "v4_indexer": ((6, 2, 4, 256), "uint8"),
}


def tpu_spec(n: int = 6) -> NativeCacheSpec:
    groups = {"attn_bf16": "full", "attn_fp8": "full", "mla": "mla", "v4_nope": "v4", "v4_indexer": "v4"}
    leaves = (NativeLeaf(k, (n, *s[1:]), d, groups[k]) for k, (s, d) in TPU_SHAPES.items())
    return NativeCacheSpec(tuple(leaves))


def test_leaf_page_arithmetic_and_table() -> None:
    leaf = NativeLeaf("l0", (1024, 16, 4, 2, 128), "bfloat16", "full")
    assert leaf.num_blocks == 1024 and leaf.page_shape == (16, 4, 2, 128)
    assert leaf.page_bytes == 16 * 4 * 2 * 128 * 2 == 32768
    assert leaf.total_bytes == 1024 * 32768
    t = leaf.table()
    assert len(t) == 1 and t.total_bytes == leaf.total_bytes and t.num_blocks == 1024
    s = t.segments[0]
    assert (s.base, s.stride, s.span, s.group, s.layer) == (0, 32768, 32768, "full", "l0")
    assert K.verify(t).ok
    assert len(NativeLeaf("m", (4, 8), "float32", zeroed=False).table()) == 0


@pytest.mark.parametrize(
    ("kw", "field", "match"),
    [
        ({"name": ""}, "leaf.name", "non-empty"),
        ({"shape": (4,)}, "leaf 'x'.shape", "rank 2 to 32"),
        ({"shape": (4, 0)}, "leaf 'x'.shape[1]", "positive"),
        ({"shape": (-1, 4)}, "leaf 'x'.shape[0]", "at least 0"),
        ({"shape": (2**31, 4)}, "leaf 'x'.shape[0]", "2\\*\\*31 - 1"),
        ({"shape": (4, 2.0)}, "leaf 'x'.shape[1]", "integer"),
        ({"shape": (4, 3), "dtype": "uint8"}, "leaf 'x'.shape", "multiple of 4"),
        ({"shape": (2**30, 2**30, 2**10)}, "leaf 'x'.shape", "2\\*\\*62"),
        ({"dtype": "complex64"}, "leaf 'x'.dtype", "unknown dtype"),
        ({"zeroed": 1}, "leaf 'x'.zeroed", "true or false"),
        ({"group": "a\nb"}, "leaf 'x'.group", "control"),
    ],
)
def test_leaf_validation_names_the_field(kw: dict, field: str, match: str) -> None:
    args = {"name": "x", "shape": (4, 8), "dtype": "float32", **kw}
    with pytest.raises(K.SpecError, match=match) as e:
        NativeLeaf(**args)
    assert e.value.field == field


def test_spec_validation() -> None:
    a = NativeLeaf("a", (4, 8), "float32")
    with pytest.raises(K.SpecError, match="duplicate leaf name"):
        NativeCacheSpec((a, a))
    with pytest.raises(K.SpecError, match="same number of pages"):
        NativeCacheSpec((a, NativeLeaf("b", (5, 8), "float32")))
    with pytest.raises(K.SpecError, match="non-empty"):
        NativeCacheSpec(())
    with pytest.raises(K.SpecError, match="no such group; valid groups: 'full', 'mla', 'v4'"):
        native_tables(tpu_spec(), group="nope")


def test_json_round_trip_and_errors() -> None:
    spec = tpu_spec()
    text = spec.to_json()
    assert NativeCacheSpec.from_json(text) == spec and NativeCacheSpec.from_json(text).to_json() == text
    d = json.loads(text)
    assert d["layout"] == "native" and d["leaves"][0] == {
        "name": "attn_bf16", "shape": [6, 16, 4, 2, 128], "dtype": "bfloat16", "group": "full"}
    cold = NativeCacheSpec((NativeLeaf("s", (3, 4), "int32", zeroed=False),))
    assert NativeCacheSpec.from_dict(cold.to_dict()) == cold
    bad = [
        ({**d, "layout": "packed"}, "layout"),
        ({**d, "extra": 1}, "spec.extra"),
        ({"layout": "native"}, "spec.leaves"),
        ({**d, "leaves": [{**d["leaves"][0], "color": 1}]}, "leaves[0].color"),
        ({**d, "leaves": [{"name": "a", "dtype": "uint8"}]}, "leaves[0].shape"),
        ({**d, "leaves": [{"name": "a", "dtype": "uint8", "shape": "4,4"}]}, "leaves[0].shape"),
    ]
    for data, field in bad:
        with pytest.raises(K.SpecError) as e:
            NativeCacheSpec.from_dict(data)
        assert e.value.field == field, (field, str(e.value))
    with pytest.raises(K.SpecError, match="leaves\\[0\\]: leaf 'a'.dtype"):
        NativeCacheSpec.from_dict({
            "layout": "native", "leaves": [{"name": "a", "shape": [2, 4], "dtype": "x"}]})


def test_tables_per_group_and_verified() -> None:
    spec = tpu_spec()
    tables = native_tables(spec)
    assert list(tables) == list(TPU_SHAPES) and all(len(t) == 1 for t in tables.values())
    assert all(r.ok for r in verify_native(spec).values())
    mla_only = native_tables(spec, group="mla")
    assert [n for n, t in mla_only.items() if len(t)] == ["mla"]
    assert tables["mla"].segments[0].span == 2 * 32 * 640 * 2
    assert spec.bytes_per_block == sum(t.segments[0].span for t in tables.values())


def test_reference_is_page_assignment() -> None:
    """The contract's byte set on each leaf equals ``arr[ids] = 0`` on a poisoned array."""
    spec = tpu_spec()
    arrays = [K.poison_pattern(leaf.total_bytes, seed=i).copy() for i, leaf in enumerate(spec.leaves)]
    before = [a.copy() for a in arrays]
    ids = [5, 0, 5, 2]
    zero_native_numpy(arrays, spec, ids, group="v4")
    exp = expected_zeroed_native(spec, ids, group="v4")
    for a, b, leaf in zip(arrays, before, spec.leaves):
        model = b.reshape(leaf.num_blocks, -1).copy()
        if leaf.group == "v4":
            model[ids] = 0
        assert np.array_equal(a, model.reshape(-1)), leaf.name
        assert K.reference.compare_to_ranges(b, a, exp[leaf.name]).matches
    with pytest.raises(K.BlockIdError, match="outside \\[0, 6\\)"):
        zero_native_numpy(arrays, spec, [1, 6])


def test_spec_from_arrays() -> None:
    arrays = [np.zeros((3, 4, 8), np.float32), np.zeros((3, 16), np.uint8)]
    spec = spec_from_arrays(arrays, ["g", "h"])
    assert spec.names == ("leaf0", "leaf1") and spec.groups == ("g", "h") and spec.num_blocks == 3
    assert spec.leaves[0] == NativeLeaf("leaf0", (3, 4, 8), "float32", "g")
    named = spec_from_arrays({"k": arrays[0], "v": arrays[1]}, {"v": "late"})
    assert [(x.name, x.group) for x in named.leaves] == [("k", ""), ("v", "late")]
    with pytest.raises(K.SpecError, match="no such leaf"):
        spec_from_arrays({"k": arrays[0]}, {"q": "g"})
    with pytest.raises(K.SpecError, match="one group per array"):
        spec_from_arrays(arrays, ["g"])
    with pytest.raises(K.SpecError, match=".shape and .dtype"):
        spec_from_arrays([3])


def test_overlaid_slot_leaf_belongs_to_several_groups() -> None:
    """A slot array shared by layers of two groups is cleared when either group is zeroed."""
    spec = NativeCacheSpec((
        NativeLeaf("slot0", (4, 8, 128), "bfloat16", ("full", "swa")),
        NativeLeaf("full1", (4, 8, 128), "bfloat16", "full"),
        NativeLeaf("swa1", (4, 2, 128), "bfloat16", "swa"),
    ))
    assert spec.groups == ("full", "swa")
    assert spec.zeroed_mask("swa") == (True, False, True) and spec.zeroed_mask("full") == (True, True, False)
    assert native_tables(spec)["slot0"].segments[0].group == "full+swa"
    d = spec.to_dict()
    assert d["leaves"][0]["group"] == ["full", "swa"] and NativeCacheSpec.from_dict(d) == spec
    with pytest.raises(K.SpecError, match="names a group twice"):
        NativeLeaf("x", (4, 8), "float32", ("a", "a"))
    with pytest.raises(K.SpecError, match="must not be empty"):
        NativeLeaf("x", (4, 8), "float32", ())


def test_cold_leaves_stay_cold_through_with_num_blocks_and_byte_counts() -> None:
    """Issue 25: a leaf marked ``zeroed=False`` (state addressed by request slot) keeps that mark
    when the page count changes, and never counts toward the bytes one block clears."""
    spec = NativeCacheSpec((
        NativeLeaf("kv", (4, 8, 128), "bfloat16", "full"),
        NativeLeaf("state", (4, 64), "float32", "full", zeroed=False),
    ))
    assert spec.bytes_per_block == 8 * 128 * 2
    grown = spec.with_num_blocks(9)
    assert [(x.name, x.num_blocks, x.zeroed, x.group) for x in grown.leaves] == [
        ("kv", 9, True, "full"), ("state", 9, False, "full")]
    assert grown.bytes_per_block == spec.bytes_per_block
    assert grown.zeroed_mask() == (True, False) and len(native_tables(grown)["state"]) == 0
    arrays = [np.full(x.total_bytes, 0xAB, np.uint8) for x in grown.leaves]
    zero_native_numpy(arrays, grown, [3])
    assert (arrays[1] == 0xAB).all() and not arrays[0].reshape(9, -1)[3].any()


def test_native_api_is_exported_lazily_without_jax() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kvlayout as K\n"
        "assert 'kvlayout.native' not in sys.modules  # loaded on first use\n"
        "import kvlayout.native as N\n"
        "names = ['NativeCacheSpec', 'NativeLeaf', 'expected_zeroed_native', 'native_tables',\n"
        "         'spec_from_arrays', 'verify_native', 'zero_native_numpy']\n"
        "assert all(getattr(K, n) is getattr(N, n) for n in names) and set(names) <= set(K.__all__)\n"
        "assert set(names) <= set(dir(K))\n"
        "heavy = sorted(m for m in ('jax', 'torch', 'vllm', 'triton') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        K.NoSuchThing  # noqa: B018
