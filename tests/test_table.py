"""The segment table: coalescing on arbitrary verified tables, columns, groups, JSON (GEOMETRY.md 3, 4, 7)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import TableError
from kvlayout.testing import random_safe_table, random_table

from . import oracles as O


def _verified_tables() -> list[K.SegmentTable]:
    """Safe by construction, and random tables the verifier proves safe (different strides, groups)."""
    out = [random_safe_table(seed) for seed in O.seeds(400)]
    for seed in O.seeds(600):
        t = random_table(seed, misaligned=0)
        if K.verify(t).ok:
            out.append(t)
    assert len(out) > 0.5 * (len(O.seeds(400)) + len(O.seeds(600)))
    return out


def test_coalescing_keeps_every_block_of_verified_tables() -> None:
    tables = _verified_tables()
    assert O.check_coalescer(lambda t: t.coalesced(), tables) == []
    for t in tables:
        c = t.coalesced()
        assert K.verify(c).ok
        # rows of one stride keep their own bytes: strides never mix, even where blocks agree (n = 1)
        for s in {r.stride for r in t.segments}:
            want = O.union_bytes([(r.base, r.base + r.span) for r in t.segments if r.stride == s])
            got = O.union_bytes([(r.base, r.base + r.span) for r in c.segments if r.stride == s])
            assert want == got, (t, c)
        assert {r.stride for r in c.segments} == {r.stride for r in t.segments}


def test_coalescing_is_maximal_sorted_and_idempotent() -> None:
    """No two rows of one stride touch after coalescing; rows sorted by (base, stride)."""
    for t in _verified_tables():
        c = t.coalesced()
        keys = [(r.base, r.stride) for r in c.segments]
        assert keys == sorted(keys)
        by_stride: dict[int, list[K.Segment]] = {}
        for r in c.segments:
            by_stride.setdefault(r.stride, []).append(r)
        for rows in by_stride.values():
            for a, b in zip(rows, rows[1:]):
                assert a.base + a.span < b.base, (a, b)
        assert c.coalesced().segments == c.segments
        assert c.total_bytes == t.total_bytes and c.num_blocks == t.num_blocks


def test_coalescing_provenance_and_padding() -> None:
    pad = (K.Segment(40, 64, 8, "", "x", "padding"),)
    t = K.SegmentTable(
        256,
        4,
        (
            K.Segment(16, 64, 8, "g2", "L2", "k", 1),
            K.Segment(0, 64, 16, "g1", "L1", "page", 0),
            K.Segment(0, 64, 8, "g1", "L1b", "page", 0),
            K.Segment(48, 64, 8, "g3", "L3", "v", 2),
            K.Segment(0, 32, 4, "g4", "L4", "page", 3),
        ),
        pad,
        True,
    )
    c = t.coalesced()
    assert c.padding is pad and c.planned
    assert c.segments == (
        K.Segment(0, 32, 4, "g4", "L4", "page", 3),  # alone: kept as it was
        K.Segment(
            0, 64, 24, "g1+g2", "L1+L1b+L2", "page+k", 0
        ),  # widest first, then same base, then touching
        K.Segment(48, 64, 8, "g3", "L3", "v", 2),  # 8 B after the run: not merged
    )
    assert not K.SegmentTable(0, 0, ()).coalesced().segments


def test_bytes_per_block_and_columns() -> None:
    for seed in O.seeds(300):
        t = random_table(seed, misaligned=0)
        assert t.bytes_per_block == len(O.block_bytes(t, 0)), t
        cols = t.columns()
        assert cols.dtype == np.int64 and cols.shape == (len(t), 3)
        assert cols.tolist() == [[s.base, s.stride, s.span] for s in t.segments]
    empty = K.SegmentTable(0, 3, ())
    assert (
        empty.bytes_per_block == 0 and empty.columns().shape == (0, 3) and empty.columns().dtype == np.int64
    )
    nested = K.SegmentTable(
        64, 1, (K.Segment(0, 0, 32), K.Segment(8, 0, 8), K.Segment(40, 0, 8), K.Segment(44, 0, 12))
    )
    assert nested.bytes_per_block == 32 + 16


def test_labels_groups_and_for_group() -> None:
    assert K.Segment(0, 4, 4, "g", "l", "k", 0).label == "g/l/k"
    assert K.Segment(0, 4, 4, "g", "l", "v", 2).label == "g/l/v[2]"
    t = K.SegmentTable(
        64, 2, (K.Segment(0, 32, 8, "b"), K.Segment(8, 32, 8, "a"), K.Segment(16, 32, 8, "b")), (), True
    )
    assert t.groups == ("b", "a")
    assert t.for_group(None) is t
    b = t.for_group("b")
    assert [s.base for s in b.segments] == [0, 16] and b.planned and b.total_bytes == 64 and b.num_blocks == 2
    with pytest.raises(TableError, match=r"group = 'c': unknown group; valid groups: 'b', 'a'"):
        t.for_group("c")
    with pytest.raises(TableError, match=r"valid groups: none"):
        K.SegmentTable(64, 2, ()).for_group("a")


def test_json_round_trip_of_random_tables() -> None:
    for seed in O.seeds(200):
        t = random_table(seed)
        d = json.loads(t.to_json())
        assert d["version"] == 1 and d["total_bytes"] == t.total_bytes and d["num_blocks"] == t.num_blocks
        assert d["segments"] == [
            {
                "base": s.base,
                "stride": s.stride,
                "span": s.span,
                "group": s.group,
                "layer": s.layer,
                "part": s.part,
                "virtual_index": s.virtual_index,
            }
            for s in t.segments
        ]
        again = K.SegmentTable.from_json(t.to_json(indent=2))
        assert again == t and again.segments == t.segments and not again.planned and again.padding == ()
    minimal = K.SegmentTable.from_dict(
        {"total_bytes": 8, "num_blocks": 2, "segments": [{"base": 0, "stride": 4, "span": 4}]}
    )
    assert minimal.segments == (K.Segment(0, 4, 4, "", "", "page", 0),)


ROW = {"base": 0, "stride": 4, "span": 4}


@pytest.mark.parametrize(
    "data, message",
    [
        ([], r"table = \[\]: must be a JSON object"),
        ({"num_blocks": 1, "segments": []}, r"table.total_bytes = None: missing required field"),
        ({"total_bytes": 1, "segments": []}, r"table.num_blocks = None: missing required field"),
        ({"total_bytes": 1, "num_blocks": 1}, r"table.segments = None: missing required field"),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [], "zz": 1, "extra": 2},
            r"table.extra = 2: unknown field",
        ),
        (
            {"version": 2, "total_bytes": 1, "num_blocks": 1, "segments": []},
            r"table.version = 2: only version 1",
        ),
        ({"total_bytes": -1, "num_blocks": 1, "segments": []}, r"table.total_bytes = -1: must be at least 0"),
        (
            {"total_bytes": 1, "num_blocks": 2**31, "segments": []},
            r"table.num_blocks = 2147483648: must be at most 2\*\*31 - 1",
        ),
        ({"total_bytes": 1, "num_blocks": 1, "segments": {}}, r"table.segments = \{\}: must be a list"),
        ({"total_bytes": 1, "num_blocks": 1, "segments": [3]}, r"table.segments\[0\] = 3: must be an object"),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [dict(ROW, a=1, b=2)]},
            r"table.segments\[0\].a = 1: unknown field",
        ),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [{"base": 0, "span": 4}]},
            r"segments\[0\].stride = None: missing",
        ),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [dict(ROW, span=True)]},
            r"segments\[0\].span = True: must be an integer",
        ),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [dict(ROW, base=-(2**62))]},
            r"segments\[0\].base = -4611686018427387904",
        ),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [dict(ROW, group=3)]},
            r"segments\[0\].group = 3: must be a string",
        ),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [dict(ROW, part="a\nb")]},
            r"segments\[0\].part = 'a\\nb': must not contain",
        ),
        (
            {"total_bytes": 1, "num_blocks": 1, "segments": [dict(ROW, virtual_index=-1)]},
            r"virtual_index = -1: must be at least 0",
        ),
    ],
)
def test_table_json_rejections_name_field_and_value(data: object, message: str) -> None:
    with pytest.raises(TableError, match=message):
        K.SegmentTable.from_dict(data)


def test_table_construction_limits() -> None:
    """Section 8: extents below 2**62, num_blocks at most 2**31 - 1, rows are Segments."""
    ok = K.SegmentTable(0, 2**31 - 1, (K.Segment(0, 2**30, 4),))
    assert ok.num_blocks == 2**31 - 1
    with pytest.raises(
        TableError, match=r"table.segments\[0\] = .*reaches bytes \[0, 4611686018427387908\) over 3 blocks"
    ):
        K.SegmentTable(0, 3, (K.Segment(0, 2**61, 4),))
    with pytest.raises(TableError, match=r"table.padding\[0\] = .*reaches bytes"):
        K.SegmentTable(0, 3, (), (K.Segment(-(2**61), -(2**61), 4),))
    with pytest.raises(TableError, match=r"table.segments\[1\] = \(0, 4, 4\): must be a Segment"):
        K.SegmentTable(0, 1, (K.Segment(0, 4, 4), (0, 4, 4)))  # type: ignore[arg-type]
    as_list = K.SegmentTable(8, 1, [K.Segment(0, 4, 4)])  # type: ignore[arg-type]
    assert as_list.segments == (K.Segment(0, 4, 4),)
    with pytest.raises(TableError, match=r"table.num_blocks = -1"):
        K.SegmentTable(0, -1, ())
    with pytest.raises(
        TableError, match=r"table.total_bytes = 4611686018427387904: must be at most 2\*\*62 - 1"
    ):
        K.SegmentTable(2**62, 1, ())
    # one block: the stride never applies, so only base and span count
    assert K.SegmentTable(0, 1, (K.Segment(0, 2**62 - 8, 4),)).num_blocks == 1


def test_table_limits_at_their_edges() -> None:
    """Each bound of section 8 at the last accepted and the first refused value, with its message."""
    with pytest.raises(TableError, match=r"table.total_bytes = -4: must be at least 0"):
        K.SegmentTable(-4, 1, ())
    with pytest.raises(TableError, match=r"table.num_blocks = 2147483648: must be at most 2\*\*31 - 1"):
        K.SegmentTable(0, 2**31, ())
    with pytest.raises(TableError, match=r"table.segments\[0\].base = True: must be an integer"):
        K.SegmentTable(0, 1, (K.Segment(True, 0, 4),))  # type: ignore[arg-type]
    with pytest.raises(TableError, match=r"table.padding\[0\].span = 2.5: must be an integer"):
        K.SegmentTable(0, 1, (), (K.Segment(0, 0, 2.5),))  # type: ignore[arg-type]
    low = -(2**62) + 1
    assert K.SegmentTable(0, 1, (K.Segment(low, 0, 4),)).segments[0].base == low
    with pytest.raises(
        TableError,
        match=r"table.segments\[0\].base = -4611686018427387904: must be at least -4611686018427387903",
    ):
        K.SegmentTable(0, 1, (K.Segment(low - 1, 0, 4),))
    # one block: the stride is never used, so a huge stride is fine; two blocks reach past 2**62
    assert K.SegmentTable(0, 1, (K.Segment(0, 2**62 - 1, 4),)).num_blocks == 1
    assert K.SegmentTable(0, 0, (K.Segment(0, 2**62 - 1, 4),)).num_blocks == 0
    with pytest.raises(TableError, match=r"reaches bytes \[0, 4611686018427387907\) over 2 blocks"):
        K.SegmentTable(0, 2, (K.Segment(0, 2**62 - 1, 4),))
    # extents exactly at -2**62 and 2**62 are refused; one word inside is accepted
    msg = r"table.segments\[0\] = \(0, -2305843009213693952, 4\): "
    msg += r"reaches bytes \[-4611686018427387904, 4\) over 3 blocks: "
    with pytest.raises(
        TableError, match=msg + r"extents must stay within \(-2\*\*62, 2\*\*62\) \(GEOMETRY.md section 8\)"
    ):
        K.SegmentTable(0, 3, (K.Segment(0, -(2**61), 4),))
    assert K.SegmentTable(0, 3, (K.Segment(4, -(2**61) + 4, 4),)).num_blocks == 3
    with pytest.raises(TableError, match=r"reaches bytes \[0, 4611686018427387904\)"):
        K.SegmentTable(0, 3, (K.Segment(0, 2**61 - 2, 4),))
    assert K.SegmentTable(0, 3, (K.Segment(0, 2**61 - 4, 4),)).num_blocks == 3
    # from JSON: num_blocks 0 is a valid pool, the most negative base is accepted
    d = {
        "total_bytes": 0,
        "num_blocks": 0,
        "segments": [{"base": low, "stride": 0, "span": 4, "virtual_index": 2}],
    }
    t = K.SegmentTable.from_dict(d)
    assert t.num_blocks == 0 and t.segments[0].base == low and t.segments[0].virtual_index == 2


def test_table_json_text_forms() -> None:
    t = K.SegmentTable(64, 2, (K.Segment(0, 32, 8, "g", "l", "v", 3),))
    assert "\n" not in t.to_json() and '\n  "total_bytes": 64' in t.to_json(indent=2)
    assert K.SegmentTable.from_json(t.to_json()).segments[0].virtual_index == 3
    assert K.SegmentTable.from_json(t.to_json().encode()).segments == t.segments
    with pytest.raises(TableError, match=r"^table is not valid JSON") as ei:
        K.SegmentTable.from_json("{nope")
    assert ei.value.field == "json"


def test_row_bound_and_check_table() -> None:
    """A table holds at most MAX_TABLE_ROWS rows, made or read (issue 25); check_table takes a
    SegmentTable and refuses anything else by its type."""
    from kvlayout.table import MAX_TABLE_ROWS, Segment, SegmentTable, check_table

    assert MAX_TABLE_ROWS == 100_000
    row = K.Segment(0, 4, 4)
    assert len(SegmentTable(4, 1, (row,) * MAX_TABLE_ROWS)) == MAX_TABLE_ROWS
    for make in (
        lambda: SegmentTable(4, 1, [row] * (MAX_TABLE_ROWS + 1)),
        lambda: SegmentTable.from_dict(
            {"total_bytes": 4, "num_blocks": 1, "segments": [{"base": 0, "stride": 4, "span": 4}] * 100_001}
        ),
    ):
        with pytest.raises(TableError) as e:
            make()
        assert (e.value.field, e.value.value) == ("table.segments", "100001 rows")
        assert str(e.value) == "table.segments = '100001 rows': at most 100,000 rows (GEOMETRY.md section 8)"
    big = {"total_bytes": 4, "num_blocks": 1, "segments": [{"base": 0, "stride": 4, "span": 4}] * 100_000}
    assert len(SegmentTable.from_dict(big)) == MAX_TABLE_ROWS
    t = SegmentTable(4, 1, (Segment(0, 4, 4),))
    assert check_table(t) is t
    for bad, kind in (([1, 2], "list"), (None, "NoneType")):
        with pytest.raises(TableError) as e:
            check_table(bad)
        assert (e.value.field, e.value.value) == ("table", kind)
        assert str(e.value) == f"table type = {kind}: must be a kvlayout.SegmentTable"
