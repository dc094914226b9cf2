"""Tests for the verifier's mutants the seventh session's full run (scripts/mutation.sh verify) left
alive: the order of a stride class's members (one sort, stable) and a stride-1 gap decided once."""

from __future__ import annotations

import kvlayout as K
from kvlayout.table import Segment, SegmentTable
from kvlayout.verify import overlaps_within_block


def test_overlaps_pair_each_row_with_the_first_listed_of_its_stride() -> None:
    """500 rows of stride 16 at byte 0 interleaved with 500 of stride 32 at byte 1,000: each overlaps the
    first listed row of its class in block 0 (a class's members in table order: an unstable sort of the
    strides paired them with another row)."""
    segs = tuple(Segment(0, 16, 16) if i % 2 == 0 else Segment(1000, 32, 16) for i in range(1000))
    got = overlaps_within_block(SegmentTable(2000, 8, segs))
    want = [(0, j, 0) for j in range(2, 1000, 2)] + [(1, j, 0) for j in range(3, 1000, 2)]
    assert got == want


def test_a_stride_one_gap_met_by_its_own_class_is_listed_once() -> None:
    """Row bytes [b, b + 1) and a gap [3 + b, 4 + b) of stride 1: block 3's byte is block 0's gap, found by
    the class sweep only; a stride-2 row meeting the gap (block 0's byte 8 is block 5's gap) makes the gap
    one decided pair by pair too, for the rows of other strides only (taking stride-1 rows there as well
    listed row 0's twice)."""
    table = SegmentTable(32, 8, (Segment(0, 1, 1), Segment(8, 2, 1)), padding=(Segment(3, 1, 1),))
    pad = [v for v in K.verify(table).violations if v.invariant == 4]
    assert [(v.rows, v.blocks) for v in pad] == [((0,), (3, 0)), ((1,), (0, 5))]
