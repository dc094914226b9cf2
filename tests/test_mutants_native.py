"""kvlayout.native: every rule's field, value and message, dtype names, tables and the
once-per-page-size verifier (issue 25, mutation coverage).

Expected messages are typed out from the form ``field = repr(value): why`` (kvlayout.errors),
page bytes from ``prod(shape[1:]) * itemsize`` computed here, never read from the library.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvlayout.native as N
from kvlayout.errors import SpecError
from kvlayout.native import NativeCacheSpec, NativeLeaf

ALL_DTYPES = (
    "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8, uint8, int16, uint16, int32, uint32, "
    "float8_e4m3fnuz, float8_e5m2fnuz, float8_e4m3b11fnuz, float8_e8m0fnu"
)
X = "leaf 'x'"


def _err(fn: Callable[[], object], field: str, value: Any, why: str) -> SpecError:
    """``fn`` raises a SpecError naming ``field`` and ``value``, message ``field = repr(value): why``."""
    with pytest.raises(SpecError) as e:
        fn()
    err = e.value
    assert err.field == field, (err.field, str(err))
    assert type(err.value) is type(value) and err.value == value, (err.value, str(err))
    assert str(err) == f"{field} = {value!r}: {why}"
    return err


def leaf(**kw: Any) -> NativeLeaf:
    args: dict[str, Any] = {"name": "x", "shape": (4, 8), "dtype": "float32"}
    return NativeLeaf(**(args | kw))


def test_dtype_name_of_strings_dtypes_scalar_types_and_named_objects() -> None:
    class Named:  # a dtype-like object NumPy cannot read (e.g. a JAX extended dtype)
        name = "bfloat16"

    class Opaque:
        def __str__(self) -> str:
            return "opaque8"

    assert N.dtype_name("uint16") == "uint16"
    assert N.dtype_name(np.dtype("int32")) == "int32"
    assert N.dtype_name(np.float16) == "float16"  # a scalar type has no .name: NumPy names it
    assert N.dtype_name(Named()) == "bfloat16"
    assert N.dtype_name(Opaque()) == "opaque8"


def test_leaf_normalises_shape_and_group_lists_to_python_ints() -> None:
    a = leaf(shape=[4, 8])
    assert a.shape == (4, 8) and type(a.shape) is tuple
    b = leaf(shape=(np.int64(3), np.int32(4)), group=["g", "h"])
    assert b.shape == (3, 4) and all(type(d) is int for d in b.shape)
    assert b.group == ("g", "h") and b.group_label == "g+h"
    assert json.loads(NativeCacheSpec((b,)).to_json())["leaves"][0]["shape"] == [3, 4]


def test_leaf_rules_name_field_value_and_why() -> None:
    _err(lambda: leaf(shape=5), f"{X}.shape", 5, "must be a list or tuple of integers")
    rank = "needs rank 2 to 32: the page axis first, then the page"
    _err(lambda: leaf(shape=(4,)), f"{X}.shape", (4,), rank)
    N._CHECKED_FIELDS.clear()  # a shape checked before (the mutation run's parent) skips the checks
    assert leaf(shape=(4,) + (1,) * 30 + (4,)).page_bytes == 16  # rank 32
    with pytest.raises(SpecError) as e:  # rank 33; the value is shown cut to 80 characters
        leaf(shape=(4,) + (1,) * 31 + (4,))
    assert (e.value.field, e.value.value) == (f"{X}.shape", (4,) + (1,) * 31 + (4,))
    assert str(e.value).endswith(f", ...): {rank}")  # 24 items shown (errors.short)
    _err(lambda: leaf(shape=(4, "8")), f"{X}.shape[1]", "8", "must be an integer")
    _err(lambda: leaf(dtype="complex64"), f"{X}.dtype", "complex64", f"unknown dtype; valid: {ALL_DTYPES}")
    _err(lambda: leaf(group=()), f"{X}.group", (), "a tuple of groups must not be empty")
    _err(lambda: leaf(group=("a", "")), f"{X}.group[1]", "", "must be a non-empty string")
    _err(lambda: leaf(group=("a", "b", "a")), f"{X}.group", ("a", "b", "a"), "names a group twice")
    _err(lambda: leaf(zeroed=1), f"{X}.zeroed", 1, "must be true or false")
    _err(lambda: leaf(shape=(4, 3), dtype="uint8"), f"{X}.shape", (4, 3),
         "one page is 3 B: must be a multiple of 4 (invariant 1)")
    big = "page and array bytes must be below 2**62 (section 8)"
    # exactly 2**62 B is refused, for a page and for the whole array; just below is fine
    _err(lambda: leaf(shape=(0, 2**31, 2**31), dtype="uint8"), f"{X}.shape", (0, 2**31, 2**31), big)
    _err(lambda: leaf(shape=(2, 2**61), dtype="uint8"), f"{X}.shape", (2, 2**61), big)
    assert leaf(shape=(1, 2**62 - 4), dtype="uint8").total_bytes == 2**62 - 4


def test_leaf_table_is_one_planned_page_row() -> None:
    x = leaf(shape=(5, 3, 4), dtype="bfloat16", group=("g", "h"))
    t = x.table()
    assert t.planned is True and (t.total_bytes, t.num_blocks) == (5 * 24, 5)
    s = t.segments[0]
    assert (s.base, s.stride, s.span, s.group, s.layer, s.part) == (0, 24, 24, "g+h", "x", "page")
    assert N.verify_native(NativeCacheSpec((x,)))["x"].padding_checked is True


def test_leaf_from_dict_rules() -> None:
    _err(lambda: NativeLeaf.from_dict([1]), "leaf", [1], "must be a JSON object")
    _err(lambda: NativeLeaf.from_dict({"name": "a", "shape": [2, 4]}, "p"), "p.dtype", None,
         "missing required field")
    good = {"name": "a", "shape": [2, 4], "dtype": "uint8"}
    _err(lambda: NativeLeaf.from_dict({**good, "color": 3}, "p"), "p.color", 3,
         "unknown field; allowed: name, shape, dtype, group, zeroed")
    _err(lambda: NativeLeaf.from_dict({**good, "shape": (2, 4)}, "p"), "p.shape", (2, 4),
         "must be a JSON list of integers")
    with pytest.raises(SpecError) as e:  # an error of the leaf keeps its field and value, path first
        NativeLeaf.from_dict({**good, "zeroed": "no"}, "leaves[3]")
    assert (e.value.field, e.value.value) == ("leaf 'a'.zeroed", "no")
    assert str(e.value) == "leaves[3]: leaf 'a'.zeroed = 'no': must be true or false"


def test_spec_rules_name_field_value_and_why() -> None:
    a, b = leaf(name="a"), leaf(name="b", shape=(5, 8))
    assert NativeCacheSpec([a]).leaves == (a,)
    _err(lambda: NativeCacheSpec((a,), version=2), "version", 2, "only version 1 is supported")
    _err(lambda: NativeCacheSpec(()), "leaves", (), "must be a non-empty list or tuple of NativeLeaf")
    _err(lambda: NativeCacheSpec((a, "b")), "leaves[1]", "b", "must be a NativeLeaf")
    _err(lambda: NativeCacheSpec((a, leaf(name="c"), a)), "leaves[2].name", "a", "duplicate leaf name")
    _err(lambda: NativeCacheSpec((a, b)), "leaves[1].shape[0]", 5,
         "every leaf needs the same number of pages ('a' has 4)")
    spec = NativeCacheSpec((a, leaf(name="c", group="g")))
    assert spec.leaf("c") is spec.leaves[1] and spec.leaf("a") is a
    _err(lambda: spec.leaf("z"), "leaf", "z", "no such leaf; leaves: a, c")
    _err(lambda: spec.check_group("h"), "group", "h", "no such group; valid groups: '', 'g'")
    _err(lambda: N.native_tables("spec"), "spec", "str",  # type: ignore[arg-type]
         "must be a kvlayout.native.NativeCacheSpec")


def test_spec_json_rules() -> None:
    good = {"layout": "native", "leaves": [{"name": "a", "shape": [2, 4], "dtype": "uint8"}]}
    spec = NativeCacheSpec.from_dict(good)
    assert spec.to_json(indent=2) == json.dumps(spec.to_dict(), indent=2) and "\n  " in spec.to_json(indent=2)
    F = NativeCacheSpec.from_dict
    _err(lambda: F([1]), "spec", [1], "must be a JSON object")
    _err(lambda: F({"leaves": []}), "spec.layout", None, "missing required field")
    _err(lambda: F({**good, "mesh": 1}), "spec.mesh", 1, "unknown field; allowed: layout, leaves, version")
    _err(lambda: F({**good, "layout": "packed"}), "layout", "packed", "a native spec has layout 'native'")
    _err(lambda: F({**good, "version": 2}), "version", 2, "only version 1 is supported")
    _err(lambda: F({**good, "version": "1"}), "version", "1", "must be a JSON integer")
    _err(lambda: F({**good, "leaves": []}), "leaves", [], "must be a non-empty list")
    _err(lambda: F({**good, "leaves": {"a": 1}}), "leaves", {"a": 1}, "must be a non-empty list")
    assert F({**good, "version": 1}) == spec
    with pytest.raises(SpecError) as e:
        NativeCacheSpec.from_json("{")
    assert e.value.field == "json" and str(e.value).startswith("spec is not valid JSON: ")
    with pytest.raises(SpecError) as e:
        NativeCacheSpec.from_json(b"\xff")
    assert str(e.value) == "spec = 'byte 0': is not UTF-8 text"


def test_verify_native_runs_once_per_table_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaves with equal tables share one report (verified once); each leaf's report is its own
    table's, and leaves outside ``group`` get the report of an empty table."""
    spec = NativeCacheSpec((
        leaf(name="a", group="g"), leaf(name="b", group="g"), leaf(name="c", shape=(4, 2, 8), group="h"),
        leaf(name="d", group="h"),
    ))
    calls: list[int] = []
    real = N.verify
    monkeypatch.setattr(N, "verify", lambda t: calls.append(len(t)) or real(t))
    r = N.verify_native(spec)
    assert len(calls) == 2 and r["a"] is r["b"] is r["d"] and r["c"] is not r["a"]
    assert [(x.num_rows, x.total_bytes) for x in r.values()] == [(1, 128), (1, 128), (1, 256), (1, 128)]
    calls.clear()
    r = N.verify_native(spec, "h")
    assert sorted(calls) == [0, 1, 1] and all(x.ok for x in r.values())
    assert [(x.num_rows, x.total_bytes) for x in r.values()] == [(0, 128), (0, 128), (1, 256), (1, 128)]


def test_zero_native_numpy_refuses_wrong_arrays_and_writes_nothing() -> None:
    spec = NativeCacheSpec((leaf(name="a"), leaf(name="b", shape=(4, 2))))
    arrays = [np.full(128, 7, np.uint8), np.full(32, 7, np.uint8)]
    _err(lambda: N.zero_native_numpy(arrays[:1], spec, [0]), "arrays", 1, "needs one array per leaf (2)")
    _err(lambda: N.zero_native_numpy([arrays[0], np.zeros(8, np.uint8)], spec, [0]), "arrays[1]", 8,
         "must be a NumPy array of 32 B ('b')")
    _err(lambda: N.zero_native_numpy([arrays[0], [0] * 32], spec, [0]), "arrays[1]", "list",
         "must be a NumPy array of 32 B ('b')")
    assert all((x == 7).all() for x in arrays)
    N.zero_native_numpy(arrays, spec, [3])
    assert not arrays[0][96:].any() and (arrays[0][:96] == 7).all()
    assert not arrays[1][24:].any() and (arrays[1][:24] == 7).all()


def test_spec_from_arrays_rules_and_defaults() -> None:
    a, b = np.zeros((2, 4), np.float32), np.zeros((2, 8), np.uint8)

    class ShapeOnly:
        shape = (2, 4)

    S = N.spec_from_arrays
    plain = S([a, b])
    assert [(x.name, x.group, x.zeroed) for x in plain.leaves] == [("leaf0", "", True), ("leaf1", "", True)]
    flags = S((a, b), "g", names=["k", "v"], zeroed=[False, True])
    assert [(x.name, x.group, x.zeroed) for x in flags.leaves] == [("k", "g", False), ("v", "g", True)]
    _err(lambda: S({"": a}), "arrays key", "", "must be a non-empty string")
    _err(lambda: S({"k": a}, names=["k"]), "names", ["k"], "give names or a mapping of arrays, not both")
    _err(lambda: S("ab"), "arrays", "str", "must be a sequence or a mapping of arrays")
    _err(lambda: S(7), "arrays", "int", "must be a sequence or a mapping of arrays")  # type: ignore[arg-type]
    _err(lambda: S([a, b], names=["k"]), "names", 1, "needs one name per array (2)")
    _err(lambda: S({"k": a, "v": b}, {"q": "g", "k": "h"}), "groups['q']", "g", "no such leaf; leaves: k, v")
    _err(lambda: S([a, b], ["g"]), "groups", 1, "needs one group per array (2)")
    _err(lambda: S([a, b], zeroed=[True]), "zeroed", 1, "needs one flag per array (2)")
    _err(lambda: S([a, ShapeOnly()]), "arrays[1]", "ShapeOnly", "must have .shape and .dtype")


def test_spec_from_arrays_refuses_non_lists_per_array() -> None:
    """Regression (issue 25): ``zeroed=5``, ``groups=5`` and ``names=5`` raised a raw TypeError, and
    ``names="kv"`` was split into the names 'k' and 'v'; each is now a SpecError naming the field."""
    a = [np.zeros((2, 4), np.float32), np.zeros((2, 8), np.float32)]
    why = "must be a list with one entry per array"
    _err(lambda: N.spec_from_arrays(a, zeroed=5), "zeroed", 5, why)  # type: ignore[arg-type]
    _err(lambda: N.spec_from_arrays(a, zeroed=True), "zeroed", True, why)  # type: ignore[arg-type]
    _err(lambda: N.spec_from_arrays(a, 5), "groups", 5, why)  # type: ignore[arg-type]
    _err(lambda: N.spec_from_arrays(a, names="kv"), "names", "kv", why)
    _err(lambda: N.spec_from_arrays(a, names=5), "names", 5, why)  # type: ignore[arg-type]
    assert N.spec_from_arrays(a, names=np.array(["k", "v"])).names == ("k", "v")


def test_leaf_checks_run_once_per_distinct_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo of checked leaf fields (issue 25: checking 100,000 leaves one by one took 3 s): a
    leaf whose (shape, dtype, group, zeroed) of exact built-in types was checked before is not checked
    again; a leaf differing in any field, or typed otherwise, is checked in full."""
    monkeypatch.setattr(N, "_CHECKED_FIELDS", set())
    calls: list[str] = []
    real = N.check_int
    monkeypatch.setattr(N, "check_int", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    cases: list[dict[str, Any]] = [
        {}, {"group": "g"}, {"group": ("a", "b")}, {"group": ("c",)}, {"zeroed": False},
        {"dtype": "bfloat16"}, {"shape": (4, 2, 8)}, {"shape": (4, 8), "group": "g", "zeroed": False},
    ]
    keys = []
    for kw in cases:
        x = leaf(**kw)
        keys.append((x.shape, x.dtype, x.group, x.zeroed))
        assert calls == [f"{X}.shape[{i}]" for i in range(len(x.shape))], (kw, calls)
        calls.clear()
        for name in ("y", "z"):  # the same fields again: no check runs
            assert leaf(name=name, **kw) == NativeLeaf(name, x.shape, x.dtype, x.group, x.zeroed)
            assert calls == [], (kw, calls)
    assert set(keys) == N._CHECKED_FIELDS and len(keys) == len(cases)
    # fields equal to checked ones but of other types are not memo keys: checked every time
    for _ in range(2):
        leaf(shape=(np.int64(4), 8))
        assert calls == [f"{X}.shape[0]", f"{X}.shape[1]"]
        calls.clear()
    assert set(keys) == N._CHECKED_FIELDS
    # hostile groups: refused by name (not a raw TypeError from reading them as a memo key)
    for g in (5, {"a"}, frozenset({"a"})):
        _err(lambda g=g: leaf(group=g), f"{X}.group", g, "must be a string")


def test_leaf_check_memo_is_capped_at_4096_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo holds at most 4,096 keys: adding to a full memo empties it first."""
    pad = {("pad", i) for i in range(4095)}
    monkeypatch.setattr(N, "_CHECKED_FIELDS", set(pad))
    leaf(shape=(4, 12))
    assert pad | {((4, 12), "float32", "", True)} == N._CHECKED_FIELDS  # 4,096: not yet over
    leaf(shape=(4, 16))
    assert {((4, 16), "float32", "", True)} == N._CHECKED_FIELDS


def test_native_tables_builds_one_table_per_distinct_leaf_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaves of equal page bytes, pages, groups and zeroing share one built table (renamed per leaf)."""
    spec = NativeCacheSpec((
        leaf(name="a", group="g"), leaf(name="b", group="g"), leaf(name="c", shape=(4, 2, 8), group="g"),
        leaf(name="d", group="h"), leaf(name="e", group="g", zeroed=False), leaf(name="f", group="g"),
    ))
    calls: list[str] = []
    real = NativeLeaf.table
    monkeypatch.setattr(NativeLeaf, "table",
                        lambda self, zeroed=None: calls.append(self.name) or real(self, zeroed))
    tables = N.native_tables(spec)
    assert calls == ["a", "c", "d", "e"]
    rows = {n: [(s.base, s.stride, s.span, s.group, s.layer, s.part) for s in t.segments]
            for n, t in tables.items()}
    assert rows == {
        "a": [(0, 32, 32, "g", "a", "page")], "b": [(0, 32, 32, "g", "b", "page")],
        "c": [(0, 64, 64, "g", "c", "page")], "d": [(0, 32, 32, "h", "d", "page")], "e": [],
        "f": [(0, 32, 32, "g", "f", "page")],
    }
    assert {n: (t.total_bytes, t.num_blocks) for n, t in tables.items()} == {
        n: (128 if n != "c" else 256, 4) for n in "abcdef"}


def test_verify_native_refuses_what_is_not_a_native_spec() -> None:
    _err(lambda: N.verify_native("spec"), "spec", "str",  # type: ignore[arg-type]
         "must be a kvlayout.native.NativeCacheSpec")
    _err(lambda: N.verify_native(None), "spec", "NoneType",  # type: ignore[arg-type]
         "must be a kvlayout.native.NativeCacheSpec")


def test_dtypes_without_zero_are_refused_for_kernel_zeroers() -> None:
    """float8_e8m0fnu has no zero (0 rounds to 0xff): a zeroed leaf of it is refused by name, the
    first such leaf; a leaf zeroing never touches may be of it (issue 25)."""
    from kvlayout.errors import LayoutBufferError

    assert frozenset({"float8_e8m0fnu"}) == N.NO_ZERO_DTYPES
    ok = NativeCacheSpec((leaf(name="s", dtype="float8_e8m0fnu", zeroed=False), leaf(name="v")))
    N.refuse_dtypes_without_zero(ok)  # nothing raised
    bad = NativeCacheSpec((leaf(name="v"), leaf(name="k", dtype="float8_e8m0fnu", shape=(4, 8)),
                           leaf(name="k2", dtype="float8_e8m0fnu", shape=(4, 8))))
    with pytest.raises(LayoutBufferError) as e:
        N.refuse_dtypes_without_zero(bad)
    assert (e.value.field, e.value.value) == ("leaf 'k'.dtype", "float8_e8m0fnu")
    assert str(e.value) == (
        "leaf 'k'.dtype = 'float8_e8m0fnu': has no zero: the kernels write the value 0, which this dtype "
        "rounds to 0xff (NaN), not zero bytes; zero a uint8 view of the array"
    )
