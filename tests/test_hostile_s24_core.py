"""Hostile pass 24's core findings (CF1-CF3, /tmp/h24): the NumPy reference paths read an ndarray subclass's
own ``flags``, ``nbytes`` and ``dtype``, and followed a ``SegmentTable`` subclass's own methods. Each test
fails on the code before the fix (b341dc1 + the pass's backend fixes): the reference zeroed bytes past the
buffer, between a strided view's elements, or rows the table was not verified with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout import native as N
from kvlayout.errors import LayoutBufferError, SpecError, TableError


class _Flags:
    c_contiguous = True
    writeable = True


class _LyingFlags(np.ndarray):
    """An ndarray subclass whose ``flags`` say C-contiguous and writeable, whatever it is."""

    @property
    def flags(self) -> Any:
        return _Flags()


class _LyingDtype(np.ndarray):
    """An ndarray subclass whose ``dtype`` says uint8, whatever it holds."""

    @property
    def dtype(self) -> Any:
        return np.dtype(np.uint8)


class _LyingSize(np.ndarray):
    """An ndarray subclass whose ``nbytes`` is ``_n``."""

    _n = 0

    @property
    def nbytes(self) -> int:
        return self._n


def test_cf1_reference_refuses_a_reversed_view_whose_flags_lie() -> None:
    """CF1 (HIGH): a reversed view whose flags said contiguous zeroed 37,375 B past its memory."""
    t = K.plan(K.preset("dsv4-test"))
    big = np.full(3 * t.total_bytes, 7, np.uint8)
    with pytest.raises(LayoutBufferError, match=r"^buffer = 'non-contiguous': must be C-contiguous$"):
        K.ReferenceBackend(t, big[: t.total_bytes][::-1].view(_LyingFlags)).zero([0])
    assert (big == 7).all()


def test_cf1_reference_refuses_a_strided_view_whose_flags_lie() -> None:
    """CF1 (HIGH): a view of every other byte whose flags said contiguous: bytes between its elements."""
    t = K.plan(K.preset("dsv4-test"))
    raw = np.full(2 * t.total_bytes, 7, np.uint8)
    for call in (
        lambda: K.ReferenceBackend(t, raw[::2].view(_LyingFlags)).zero([0, 5]),
        lambda: K.zero_blocks_numpy(raw[::2].view(_LyingFlags), t, [0, 5]),
    ):
        with pytest.raises(LayoutBufferError, match="must be C-contiguous"):
            call()
    assert (raw == 7).all()


def test_cf1_a_lying_dtype_is_named_not_a_raw_error() -> None:
    """CF1: an object array whose dtype said uint8 raised NumPy's raw TypeError."""
    t = K.plan(K.preset("dsv4-test"))
    o = np.empty(t.total_bytes // 8, object).view(_LyingDtype)
    with pytest.raises(LayoutBufferError) as e:
        K.ReferenceBackend(t, o).zero([0])
    assert e.value.field == "buffer.dtype" and e.value.value == "object"


def test_cf1_subclasses_that_tell_the_truth_still_work() -> None:
    """A plain subclass (numpy.matrix stays 2-D) is read as the plain array it is: exact bytes."""
    t = K.plan(K.preset("dsv4-test"))
    plain = K.poison_pattern(t.total_bytes)
    want = plain.copy()
    K.zero_blocks_numpy(want, t, [1, 4])
    sub = plain.copy().view(_LyingFlags)  # its flags happen to be true here
    K.zero_blocks_numpy(sub, t, [1, 4])
    assert np.array_equal(np.asarray(sub).view(np.ndarray), want)


def test_cf2_native_reference_checks_every_array_before_writing() -> None:
    """CF2 (LOW): a second array whose nbytes lied was refused after the first had been zeroed."""
    a = np.zeros((8, 4, 16), np.float32)
    spec = N.spec_from_arrays([a, a.copy()], "g")
    first = np.full(a.shape, 7, np.float32)
    half = np.full((8, 4, 8), 7, np.float32).view(_LyingSize)
    half._n = a.nbytes
    with pytest.raises(SpecError) as e:
        N.zero_native_numpy([first, half], spec, [1])
    assert e.value.field == "arrays[1]" and e.value.value == a.nbytes // 2
    assert (first == 7).all() and (np.asarray(half) == 7).all()


class _OtherRows(K.SegmentTable):
    """A SegmentTable subclass whose ``for_group()`` (what the reference zeroes) is another table."""

    def for_group(self, group: str | None) -> K.SegmentTable:
        return K.SegmentTable(total_bytes=2048, num_blocks=64, segments=(K.Segment(8, 32, 8, "a", "L0"),))


class _Row(K.Segment):
    """A Segment subclass (its methods could say anything)."""


def test_cf3_reference_and_contract_refuse_table_subclasses() -> None:
    """CF3 (LOW/MED): the reference and ``expected_zeroed`` followed a subclass's ``for_group()``: block 1
    zeroed [40, 48) where the verified rows say [32, 40). Tables of Segment subclasses are refused too."""
    rows = (K.Segment(0, 32, 8, "a", "L0"),)
    sub = _OtherRows(total_bytes=2048, num_blocks=64, segments=rows)
    of_subrows = K.SegmentTable(total_bytes=2048, num_blocks=64, segments=(_Row(0, 32, 8, "a", "L0"),))
    buf = K.poison_pattern(2048)
    before = buf.copy()
    for t, kind in ((sub, "_OtherRows"), (of_subrows, "SegmentTable of Segment subclasses")):
        for call in (
            lambda: K.zero_blocks_numpy(buf, t, [1]),  # noqa: B023
            lambda: K.ReferenceBackend(t, buf).zero([1]),  # noqa: B023
            lambda: K.expected_zeroed(t, [1]),  # noqa: B023
        ):
            with pytest.raises(TableError) as e:
                call()
            assert e.value.field == "table" and e.value.value == kind
            assert "must be a kvlayout.SegmentTable itself" in str(e.value)
    assert np.array_equal(buf, before)
    plain = K.SegmentTable(total_bytes=2048, num_blocks=64, segments=rows)
    assert K.expected_zeroed(plain, [1]).tolist() == [[32, 40]]
