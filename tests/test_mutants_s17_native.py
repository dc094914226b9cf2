"""kvlayout.native's session-16 checks (issue 25): a NumPy version, a group that is not a str, and
arrays whose dtype holds object references, each refused (or normalised) with its field and message."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvlayout.native as N
from kvlayout.errors import LayoutBufferError, SpecError
from kvlayout.native import NativeCacheSpec, NativeLeaf


def _spec() -> NativeCacheSpec:
    a = NativeLeaf(name="a", shape=(4, 8), dtype="float32", group="g")
    b = NativeLeaf(name="b", shape=(4, 8), dtype="uint8", group="h")
    return NativeCacheSpec((a, b))


def test_a_numpy_version_is_made_a_python_int() -> None:
    a = NativeLeaf(name="a", shape=(4, 8), dtype="float32")
    s = NativeCacheSpec((a,), version=np.int64(1))
    assert type(s.version) is int and s.version == 1
    assert json.loads(s.to_json())["version"] == 1


@pytest.mark.parametrize("bad", [np.int64(0), 0, b"g", ("g",)])
def test_a_group_that_is_not_a_str_is_refused_naming_its_type(bad: object) -> None:
    spec = _spec()
    with pytest.raises(SpecError) as e:
        spec.check_group(bad)  # type: ignore[arg-type]
    why = f"must be a group name (a str) or None, not {type(bad).__name__}; valid groups: 'g', 'h'"
    assert str(e.value) == f"group = {bad!r}: {why}"
    assert e.value.field == "group" and e.value.value is bad


def test_a_str_group_that_is_missing_and_the_good_ones() -> None:
    spec = _spec()
    with pytest.raises(SpecError) as e:
        spec.check_group("z")
    assert str(e.value) == "group = 'z': no such group; valid groups: 'g', 'h'"
    assert e.value.field == "group" and e.value.value == "z"
    assert spec.check_group("h") == "h" and spec.check_group(None) is None


def test_object_arrays_are_refused_before_any_array_is_written() -> None:
    spec = _spec()
    first = np.full((4, 8), 5, dtype=np.float32)
    objs = np.empty(4, dtype=object)  # 4 references of 8 B: the leaf's 32 bytes
    assert objs.nbytes == 32 == spec.leaves[1].total_bytes
    with pytest.raises(LayoutBufferError) as e:
        N.zero_native_numpy([first, objs], spec, [1])
    assert str(e.value) == (
        "arrays[1].dtype = object: must hold plain data ('b': its dtype holds object references); "
        "nothing written"
    )
    assert e.value.field == "arrays[1].dtype" and e.value.value == "object"
    assert (first == 5).all()  # the first array, checked before it, was not written either


def test_plain_arrays_are_zeroed_through_each_leaf() -> None:
    spec = _spec()
    a = np.full((4, 8), 5, dtype=np.float32)
    b = np.full((4, 8), 7, dtype=np.uint8)
    N.zero_native_numpy([a, b], spec, [1, 3])
    assert (a[[1, 3]] == 0).all() and (a[[0, 2]] == 5).all()
    assert (b[[1, 3]] == 0).all() and (b[[0, 2]] == 7).all()
