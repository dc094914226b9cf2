"""kvlayout.table's lines that the thirty-fourth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh table`` on the sources of 09f82c9 (table.py of 0fbb943): pass 28's name
checks (a row's group / layer / part, ``for_group``'s argument) were matched by a word of the message only,
with one bad name at a time, and ``check_table``'s subclass refusal (pass 24) was tested only in
tests/test_hostile_s24_core.py, not in the module's list. Here the whole error: message, field, value, and
the name shown as a builtin's repr or, for another object, by its type (its own repr may pose as a str).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvlayout.errors import TableError
from kvlayout.table import Segment, SegmentTable, check_table


class _Poser:
    """Not a str, with a repr that looks like one."""

    def __repr__(self) -> str:
        return "'a'"


class _SubTable(SegmentTable):
    pass


@dataclass(frozen=True)
class _SubRow(Segment):
    pass


def _table() -> SegmentTable:
    return SegmentTable(1024, 4, (Segment(0, 256, 64, "a", "la"), Segment(128, 256, 64, "b", "lb")))


@pytest.mark.parametrize("key", ["group", "layer", "part"])
def test_a_rows_name_that_is_no_str_is_shown_by_its_type(key: str) -> None:
    p = _Poser()
    fields: dict[str, Any] = {"group": "a", "layer": "la", "part": "page", key: p}
    with pytest.raises(TableError) as e:
        Segment(0, 256, 64, **fields)
    assert str(e.value) == f"segment.{key} = <a _Poser>: must be a string"
    assert e.value.field == f"segment.{key}" and e.value.value is p


def test_a_builtin_name_is_shown_by_its_repr() -> None:
    with pytest.raises(TableError) as e:
        Segment(0, 256, 64, "a", ["x"], "page")
    assert str(e.value) == "segment.layer = ['x']: must be a string"
    assert e.value.value == ["x"]


def test_rows_whose_names_are_all_no_str_are_refused() -> None:
    """Every name not a str (and every int plain): the first is named, nothing is built."""
    with pytest.raises(TableError) as e:
        Segment(0, 256, 64, 1, 2, 3)  # type: ignore[arg-type]
    assert str(e.value) == "segment.group = 1: must be a string"
    assert e.value.field == "segment.group" and e.value.value == 1


def test_for_group_names_an_argument_that_is_no_str_by_its_type() -> None:
    t = _table()
    p = _Poser()
    with pytest.raises(TableError) as e:
        t.for_group(p)  # type: ignore[arg-type]
    assert str(e.value) == "group = <a _Poser>: must be a string or None"
    assert e.value.field == "group" and e.value.value is p
    with pytest.raises(TableError) as e:
        t.for_group(3)  # type: ignore[arg-type]
    assert str(e.value) == "group = 3: must be a string or None" and e.value.value == 3
    assert [s.group for s in t.for_group("b").segments] == ["b"]


WHY = "must be a kvlayout.SegmentTable itself (a subclass's methods pick the rows written)"


def test_check_table_refuses_a_table_subclass_with_plain_rows() -> None:
    sub = _SubTable(1024, 4, (Segment(0, 256, 64, "a", "la"),))
    with pytest.raises(TableError) as e:
        check_table(sub)
    assert str(e.value) == f"table type = _SubTable: {WHY}"
    assert e.value.field == "table" and e.value.value == "_SubTable"


def test_check_table_refuses_a_table_of_row_subclasses() -> None:
    t = SegmentTable(1024, 4, (Segment(0, 256, 64, "a", "la"), _SubRow(128, 256, 64, "b", "lb")))
    with pytest.raises(TableError) as e:
        check_table(t)
    kind = "SegmentTable of Segment subclasses"
    assert str(e.value) == f"table type = {kind}: {WHY}"
    assert e.value.field == "table" and e.value.value == kind


def test_check_table_returns_a_plain_table_and_names_what_is_none() -> None:
    t = _table()
    assert check_table(t) is t
    with pytest.raises(TableError) as e:
        check_table([1])
    assert str(e.value) == "table type = list: must be a kvlayout.SegmentTable"
    assert e.value.field == "table" and e.value.value == "list"
