"""The verifier's paths added by issue 25's fourth and fifth passes (``_pairs_across``, ``_cross_gaps``):
pairs against brute force with equal starts, the pair budget on both halves, and the (row, gap) count
that leaves a gap's own narrow rows to the sweep."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import TableError
from kvlayout.table import Segment, SegmentTable

V = importlib.import_module("kvlayout.verify")  # the module (kvlayout.verify is also the function)


def test_pairs_across_equal_brute_force_with_shared_starts() -> None:
    """Each meeting pair exactly once, ranges that start together included."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        a, b = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        alo, blo = rng.integers(0, 6, a), rng.integers(0, 6, b)  # few values: many equal starts
        ahi, bhi = alo + rng.integers(1, 5, a), blo + rng.integers(1, 5, b)
        i, j = V._pairs_across(alo, ahi, blo, bhi, 10**6)
        got = sorted(zip(i.tolist(), j.tolist(), strict=True))
        want = sorted((x, y) for x in range(a) for y in range(b) if alo[x] < bhi[y] and blo[y] < ahi[x])
        assert got == want


def test_pairs_across_budget_counts_both_halves() -> None:
    """Two ranges of ``a`` start inside the one of ``b`` and one of ``b`` inside an ``a``: 3 pairs."""
    alo, ahi = np.array([0, 2, 3]), np.array([4, 5, 6])
    blo, bhi = np.array([1]), np.array([9])
    assert len(V._pairs_across(alo, ahi, blo, bhi, 3)[0]) == 3
    with pytest.raises(V._TooMany) as e:
        V._pairs_across(alo, ahi, blo, bhi, 2)
    assert e.value.count == 3


def _many(stride: int, span: int, rows: int) -> SegmentTable:
    """``rows`` identical rows and one padding gap of their own stride over the same bytes."""
    segs = tuple(Segment(0, stride, span, "g", f"l{i}") for i in range(rows))
    gap = Segment(0, stride, span, "g", "gap", "padding")
    return SegmentTable(stride * 4, 4, segs, (gap,), planned=True)


@pytest.mark.parametrize(("stride", "span"), [(4, 4), (1, 1)])
def test_a_gaps_own_narrow_rows_do_not_count_toward_the_bound(stride: int, span: int) -> None:
    """5,001 rows of the gap's stride, as wide as it (and a 1-byte stride): the sweep decides them, so
    they are not (row, gap) pairs across strides; the table is reported, not refused."""
    report = K.verify(_many(stride, span, 5_001))
    assert not report.ok and any(v.invariant == 4 for v in report.violations)


def test_the_cross_gap_refusal() -> None:
    """5,001 rows of another stride over one gap: refused, naming the count."""
    segs = tuple(Segment(0, 8, 4, "g", f"l{i}") for i in range(5_001))
    gap = Segment(0, 4, 4, "h", "gap", "padding")
    with pytest.raises(TableError) as e:
        K.verify(SegmentTable(64, 4, segs, (gap,), planned=True))
    assert (e.value.field, e.value.value) == ("table.segments", 5_001)
