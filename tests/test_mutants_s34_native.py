"""kvlayout.native's lines that the thirty-fourth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh native`` on the sources of 09f82c9 (native.py of 4ca4ea0): pass 32's
refusal of ``NativeCacheSpec`` and ``NativeLeaf`` subclasses was tested only in tests/test_hostile_s32.py
(not in the module's list: its last part runs JAX) and by the start of the message. Here the whole error:
message, field and value, for a subclass and for an object that is no spec at all.
"""

from __future__ import annotations

import pytest

from kvlayout.errors import LayoutBufferError, SpecError
from kvlayout.native import NativeCacheSpec, NativeLeaf, check_native_spec, native_tables


class _Lying(NativeCacheSpec):
    def zeroed_mask(self, group: str | None = None) -> tuple[bool, ...]:
        return tuple(True for _ in self.leaves)


class _AllGroups(NativeLeaf):
    @property
    def group_names(self) -> tuple[str, ...]:
        return ("a", "b")


def _leaves() -> tuple[NativeLeaf, NativeLeaf]:
    return NativeLeaf("k", (8, 128), "float32", "a"), NativeLeaf("v", (8, 128), "float32", "b")


def test_a_leaf_subclass_is_refused_by_its_index_and_type_name() -> None:
    k, _ = _leaves()
    with pytest.raises(SpecError) as e:
        NativeCacheSpec((k, _AllGroups("v", (8, 128), "float32", "b")))
    why = "must be a NativeLeaf itself (a subclass's methods pick the bytes written)"
    assert str(e.value) == f"leaves[1] = '_AllGroups': {why}"
    assert e.value.field == "leaves[1]" and e.value.value == "_AllGroups"


def test_a_spec_subclass_is_refused_saying_itself() -> None:
    lying = _Lying(_leaves())
    why = "must be a kvlayout.native.NativeCacheSpec itself (a subclass's methods pick the leaves written)"
    with pytest.raises(SpecError) as e:
        native_tables(lying)
    assert str(e.value) == f"spec = '_Lying': {why}"
    assert e.value.field == "spec" and e.value.value == "_Lying"
    with pytest.raises(LayoutBufferError) as e2:
        check_native_spec(lying, LayoutBufferError, "caches.spec")
    assert str(e2.value) == f"caches.spec = '_Lying': {why}"


def test_what_is_no_spec_is_refused_without_itself() -> None:
    with pytest.raises(SpecError) as e:
        check_native_spec({"leaves": []})
    assert str(e.value) == "spec = 'dict': must be a kvlayout.native.NativeCacheSpec"
    assert e.value.field == "spec" and e.value.value == "dict"
    assert check_native_spec(NativeCacheSpec(_leaves())) is None
