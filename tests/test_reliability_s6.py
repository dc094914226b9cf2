"""Hostile pass of 2026-12-04 (issue 25): masked id arrays and int-subclass ids."""

from __future__ import annotations

import enum

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError


def test_masked_id_arrays_are_checked_on_their_data_and_write_nothing() -> None:
    """A masked -5 was skipped by the range check but reached the zeroer, which cleared block 3."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    buf = K.poison_pattern(t.total_bytes)
    orig = buf.copy()
    with pytest.raises(BlockIdError) as e:
        K.ReferenceBackend(t, buf).zero(np.ma.array([1, -5], mask=[False, True]))
    assert e.value.field == "block_ids[1]" and e.value.value == -5
    assert np.array_equal(buf, orig)
    with pytest.raises(BlockIdError):
        K.expected_zeroed(t, np.ma.array([1, 13], mask=[False, True]))


def test_int_subclass_ids_are_taken_by_value() -> None:
    """IntEnum ids raised a raw StopIteration; they are integers, zeroed as their value."""

    class E(enum.IntEnum):
        A = 3

    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    assert np.array_equal(K.expected_zeroed(t, [E.A]), K.expected_zeroed(t, [3]))
    with pytest.raises(BlockIdError) as e:
        K.expected_zeroed(t, [E.A, "x"])
    assert e.value.field == "block_ids[1]"
