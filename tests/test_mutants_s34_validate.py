"""kvlayout.validate's lines that the thirty-fourth session's mutation run found unpinned (issue 25).

Survivors of ``scripts/mutation.sh validate`` on the sources of 09f82c9 (validate.py of 2b2238e, hostile
passes 32 and 33): ``honest_int`` asked of an object that is no int subclass at all (``is_int`` never asks
it so, but it is the module's public reading of an integer), and ``block_ids``' count limit: its field and
that it is "at most" ``MAX_IDS`` ids, the limit itself allowed (a broadcast view stands for the count).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from kvlayout.errors import BlockIdError
from kvlayout.ranges import INT32_MAX
from kvlayout.validate import block_ids, honest_int

V = importlib.import_module("kvlayout.validate")


def test_honest_int_is_false_for_what_is_no_int_subclass() -> None:
    class Fake:
        __class__ = property(lambda self: int)  # type: ignore[assignment]

    for v in (2.5, "3", None, np.int64(3), Fake(), b"\x03"):
        assert honest_int(v) is False  # type: ignore[arg-type]
    assert honest_int(3) is True


def test_ids_counted_past_int32_max_are_refused_by_the_size_field() -> None:
    ids = np.broadcast_to(np.int64(0), (INT32_MAX + 1,))  # 8 B standing for 2**31 ids
    with pytest.raises(BlockIdError) as e:
        block_ids(ids, 8)
    assert e.value.field == "block_ids.size"
    assert e.value.value == 2**31
    assert str(e.value) == "block_ids.size = 2147483648: at most 2147483647 ids in one call"


def test_the_id_limit_itself_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MAX_IDS`` ids pass, one more is refused (the limit made small: 2**31 - 1 ids would take 16 GiB)."""
    monkeypatch.setattr(V, "MAX_IDS", 4)
    got = block_ids(np.array([3, 0, 1, 2], np.int32), 8)
    assert got.dtype == np.int64 and got.tolist() == [3, 0, 1, 2]
    got = block_ids(np.broadcast_to(np.uint8(7), (4,)), 8)
    assert got.tolist() == [7, 7, 7, 7]
    with pytest.raises(BlockIdError, match=r"^block_ids\.size = 5: at most 4 ids in one call$"):
        block_ids(np.arange(5), 8)
