"""kvlayout.validate's honest integers (session 16): an ``int`` subclass whose stored value, ``int()``
and ``__index__()`` disagree is no integer, in ``is_int``, in ``block_ids`` and in the message that
names a refused id element (``id_element_why``)."""

from __future__ import annotations

import enum

import numpy as np
import pytest

from kvlayout.errors import BlockIdError
from kvlayout.validate import LYING_INT_WHY, block_ids, honest_int, id_element_why, is_int


class Color(enum.IntEnum):
    RED = 1
    BLUE = 3


class Plain(int):
    pass


class IndexLies(int):
    def __index__(self) -> int:
        return int.__int__(self) + 1


class IntLies(int):
    def __int__(self) -> int:
        return 0


class IndexRaises(int):
    def __index__(self) -> int:
        raise RuntimeError("user code")


class IndexNotInt(int):
    def __index__(self) -> float:  # type: ignore[override]
        return 2.0


class IndexBool(int):
    def __index__(self) -> bool:  # type: ignore[override]
        return True  # an int (bool), reading the same as 1


def test_honest_int_takes_every_reading_from_int() -> None:
    """Since pass 32 a subclass redefining a reading is refused even where it agrees (IndexBool(1),
    IntLies(0)): what is checked is that int's own code answers, not one value."""
    assert honest_int(5) and honest_int(Color.BLUE) and honest_int(Plain(7))
    assert not honest_int(True)  # bool redefines int's bitwise operators (is_int refuses bools first)
    assert not honest_int(IndexBool(1)) and not honest_int(IndexBool(2))
    assert not honest_int(IndexLies(3)) and not honest_int(IntLies(3)) and not honest_int(IntLies(0))
    assert not honest_int(IndexRaises(3)) and not honest_int(IndexNotInt(2))

    class Grand(Plain):  # a redefinition two classes down is found too
        def __lt__(self, other: object) -> bool:
            return False

    class Child(Grand):
        pass

    assert not honest_int(Child(1)) and honest_int(type("P2", (Plain,), {})(4))


@pytest.mark.parametrize(
    "v, want",
    [
        (0, True), (-4, True), (2**70, True), (np.int64(3), True), (np.uint8(2), True), (Color.RED, True),
        (Plain(2), True), (True, False), (np.bool_(True), False), (np.timedelta64(3), False), (3.0, False),
        ("3", False), (None, False), (IndexLies(1), False), (IntLies(1), False), (IndexRaises(1), False),
    ],
)
def test_is_int(v: object, want: bool) -> None:
    assert is_int(v) is want


def test_id_element_why_names_bools_and_lying_ints() -> None:
    assert id_element_why(True) == "must be an integer block id, not a bool"
    assert id_element_why(np.bool_(False)) == "must be an integer block id, not a bool"
    assert id_element_why(IndexLies(1)) == f"must be an integer block id: {LYING_INT_WHY}"
    assert id_element_why(1.5) == "must be an integer block id"
    assert id_element_why("1") == "must be an integer block id"
    assert id_element_why(True, "must be an id") == "must be an id, not a bool"
    assert id_element_why(IntLies(2), "must be an id") == f"must be an id: {LYING_INT_WHY}"
    assert id_element_why(None, "must be an id") == "must be an id"
    why = "an int subclass that redefines int's operators or reads differently is no integer"
    assert why == LYING_INT_WHY


@pytest.mark.parametrize("liar", [IndexLies(1), IntLies(1), IndexRaises(1)])
def test_block_ids_refuse_a_lying_int_naming_why(liar: int) -> None:
    with pytest.raises(BlockIdError) as e:
        block_ids([0, 2, liar], 4)
    assert str(e.value) == f"block_ids[2] = 1: must be an integer: {LYING_INT_WHY} (nothing was written)"
    assert e.value.field == "block_ids[2]" and e.value.value is liar


@pytest.mark.parametrize("bad", [True, np.bool_(True), 1.0, "1", None])
def test_block_ids_refuse_other_elements_without_the_lying_clause(bad: object) -> None:
    with pytest.raises(BlockIdError) as e:
        block_ids([0, bad], 4)
    assert str(e.value) == f"block_ids[1] = {bad!r}: must be an integer (nothing was written)"
    assert e.value.field == "block_ids[1]" and e.value.value is bad


def test_block_ids_take_honest_int_subclasses_by_value() -> None:
    got = block_ids([Color.BLUE, Plain(2), np.int32(0), 1], 4)
    assert got.dtype == np.int64 and got.tolist() == [3, 2, 0, 1]
