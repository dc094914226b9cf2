"""plan_rows' int32 limit at a byte offset (session 16): a table that fits at offset 0 but not at the
offset asked names the offset (LayoutBufferError); one that fits nowhere stays a TableError. Boundaries
are exact: 2**31 - 1 rows of 512 B is the most a buffer may need."""

from __future__ import annotations

import pytest

import kvlayout as K
from kvlayout.errors import LayoutBufferError, TableError

pallas_plan = pytest.importorskip("kvlayout.backends.pallas.plan")

ROW = 512
MOST = 2**31 - 1  # rows


def _ending_at(total: int) -> K.SegmentTable:
    """One block of ``total`` bytes whose one row is its last 4 bytes."""
    return K.SegmentTable(total, 1, (K.Segment(total - 4, 0, 4),))


def test_a_table_at_the_limit_fits_at_offset_0_and_at_an_offset_that_adds_no_row() -> None:
    assert pallas_plan.plan_rows(_ending_at(MOST * ROW)).rows_needed == MOST
    # one row less, shifted by one row: exactly the limit again
    assert pallas_plan.plan_rows(_ending_at((MOST - 1) * ROW), ROW).rows_needed == MOST


@pytest.mark.parametrize("offset", [4, ROW, 2**20])
def test_the_offset_that_passes_the_limit_is_named(offset: int) -> None:
    t = _ending_at(MOST * ROW)
    need = -(-(MOST * ROW + offset) // ROW)
    with pytest.raises(LayoutBufferError) as e:
        pallas_plan.plan_rows(t, offset)
    assert str(e.value) == (
        f"offset = {offset}: the layout ({MOST * ROW} B) at this byte offset needs a buffer of {need} rows "
        f"of 512 B, beyond int32 row offsets (at most {MOST})"
    )
    assert e.value.field == "offset" and e.value.value == offset


@pytest.mark.parametrize("offset", [0, 4, ROW])
def test_a_table_past_the_limit_alone_is_the_tables_fault(offset: int) -> None:
    t = _ending_at((MOST + 1) * ROW)
    with pytest.raises(TableError) as e:
        pallas_plan.plan_rows(t, offset)
    need = -(-((MOST + 1) * ROW + offset) // ROW)
    assert str(e.value) == f"buffer of {need} rows exceeds int32 row offsets"
    assert e.value.field == "table.total_bytes" and e.value.value == (MOST + 1) * ROW


def test_a_row_past_the_table_at_offset_0_is_not_blamed_on_the_offset() -> None:
    """Rows may end before the block does: the table alone is measured by its bytes, not its last row."""
    t = K.SegmentTable(MOST * ROW, 1, (K.Segment(0, 0, 4),))  # its one row at the start
    with pytest.raises(LayoutBufferError):
        pallas_plan.plan_rows(t, ROW)


@pytest.mark.parametrize(
    "total, row_at, offset",
    [
        (MOST * ROW, "end", 2**62),  # a huge offset: the words' float rounding must not decide
        (MOST * ROW, "end", 2**62 + 4),
        (MOST * ROW + 2, "start", ROW),  # 2 bytes past whole words: the table alone still plans
        ((MOST + 1) * ROW, "start", ROW),  # past the limit alone, its one row at the start
        ((MOST + 1) * ROW, "start", 2**62),
        (MOST * ROW, "start", 4),
    ],
)
def test_the_offset_is_named_exactly_when_the_table_plans_at_offset_0(
    total: int, row_at: str, offset: int
) -> None:
    base = total // 4 * 4 - 4 if row_at == "end" else 0
    t = K.SegmentTable(total, 1, (K.Segment(base, 0, 4),))
    try:
        pallas_plan.plan_rows(t)
        alone_fits = True
    except TableError:
        alone_fits = False
    with pytest.raises((LayoutBufferError, TableError)) as e:
        pallas_plan.plan_rows(t, offset)
    assert isinstance(e.value, LayoutBufferError) is alone_fits, (alone_fits, str(e.value))
    assert e.value.field == ("offset" if alone_fits else "table.total_bytes")
