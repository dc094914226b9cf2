"""The static verifier: the pre-fix DeepSeek-V4 table, scale, and agreement with brute force."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.testing import random_table
from kvlayout.verify import require_safe

from . import oracles as O


def prefix_table() -> K.SegmentTable:
    """vLLM #50276 before the fix: the block stride 149,760 used as the span too."""
    good = K.plan(K.preset("dsv4-test"))
    return K.SegmentTable(
        good.total_bytes,
        good.num_blocks,
        tuple(K.Segment(s.base, 149_760, 149_760, s.group, s.layer) for s in good.segments),
    )


def test_prefix_table_rejected_with_spill_and_overrun() -> None:
    rep = K.verify(prefix_table())
    assert not rep.ok
    # invariant 2: rows 1..3 run past the end at block 99; row 3 by 112,320 B
    inb = {v.rows[0]: v for v in rep.by_invariant(2)}
    assert sorted(inb) == [1, 2, 3]
    assert inb[3].blocks[-1] == 99 and "112320 B past" in inb[3].message
    assert inb[3].byte_range == (14_976_000, 14_976_000 + 112_320)
    assert "37440 B past" in inb[1].message
    # invariant 3: block b's rows 1..3 spill into block b+1
    iso = rep.by_invariant(3)
    spilling = {v.rows[0] for v in iso}
    assert spilling == {1, 2, 3}
    for v in iso:
        assert v.blocks == (0, 1)
        assert "spills into" in v.message
    v31 = next(v for v in iso if v.rows == (3, 1))  # row 3 of block 0 runs into row 1 of block 1
    assert v31.byte_range == (37_440 + 149_760, 112_320 + 149_760)
    assert "UNSAFE" in rep.format()


def test_planned_table_passes_at_ten_million_blocks() -> None:
    """Correctness only: timing belongs in bench/bench_core.py, not in a unit test."""
    table = K.plan(K.preset("dsv4").with_num_blocks(10**7))
    assert K.verify(table).ok
    # the row that ends highest, 128 B longer, runs 64 B into the next block's first row
    rows = list(table.segments)
    i = max(range(len(rows)), key=lambda r: rows[r].base + rows[r].span)
    assert rows[i].base + rows[i].span == 149_696
    rows[i] = K.Segment(rows[i].base, rows[i].stride, rows[i].span + 128)
    rep = K.verify(K.SegmentTable(table.total_bytes, table.num_blocks, tuple(rows)))
    assert rep.by_invariant(3) and rep.by_invariant(2)


def test_invariant_1_and_4() -> None:
    t = K.plan(K.preset("dsv4-test"))
    mis = K.SegmentTable(t.total_bytes, t.num_blocks, (K.Segment(2, 149_760, 37_374),))
    rep = K.verify(mis)
    assert [v.invariant for v in rep.violations] == [1]
    assert "base 2" in rep.violations[0].message and "span 37374" in rep.violations[0].message
    # spans rounded up to 512 B write into the 64 B alignment gap
    rounded = K.SegmentTable(
        t.total_bytes,
        t.num_blocks,
        tuple(K.Segment(s.base, s.stride, 37_888, s.group, s.layer) for s in t.segments),
        t.padding,
        True,
    )
    rep = K.verify(rounded)
    pad = rep.by_invariant(4)
    assert pad and pad[0].rows == (0,) and pad[0].byte_range == (37_376, 37_440)


def test_json_table_marks_padding_unchecked() -> None:
    t = K.SegmentTable.from_json(K.plan(K.preset("dsv4-test")).to_json())
    rep = K.verify(t)
    assert rep.ok and not rep.padding_checked
    assert "not checked" in rep.format()


def brute_force(table: K.SegmentTable) -> tuple[bool, bool, bool]:
    """Invariants 2-4 by enumerating every block (small tables only)."""
    n, total = table.num_blocks, table.total_bytes
    bad2 = any(
        min(s.base, s.base + (n - 1) * s.stride) < 0
        or max(s.base, s.base + (n - 1) * s.stride) + s.span > total
        for s in table.segments
    )
    owner: dict[int, int] = {}
    iso_ok = True
    for b in range(n):
        for s in table.segments:
            for x in range(s.base + b * s.stride, s.base + b * s.stride + s.span):
                if owner.setdefault(x, b) != b:
                    iso_ok = False
    pad_ok = True
    for p in table.padding:
        for b in range(n):
            for x in range(p.base + b * p.stride, p.base + b * p.stride + p.span):
                if x in owner:
                    pad_ok = False
    return not bad2, iso_ok, pad_ok


seg = st.builds(
    lambda base, stride, span: K.Segment(base * 4, stride * 4, span * 4),
    st.integers(-4, 40),
    st.integers(-6, 12),
    st.integers(1, 12),
)


@given(
    st.lists(seg, min_size=1, max_size=4), st.lists(seg, max_size=2), st.integers(1, 7), st.integers(0, 300)
)
def test_verifier_agrees_with_brute_force(
    rows: list[K.Segment], pads: list[K.Segment], n: int, total: int
) -> None:
    pads = [p for p in pads if p.stride >= 0 and p.base >= 0]
    table = K.SegmentTable(total * 4, n, tuple(rows), tuple(pads), True)
    rep = K.verify(table)
    ok2, ok3, ok4 = brute_force(table)
    assert (not rep.by_invariant(2)) == ok2
    assert (not rep.by_invariant(3)) == ok3
    assert (not rep.by_invariant(4)) == ok4
    # every reported witness is a real overlap
    for v in rep.by_invariant(3):
        a, b = v.byte_range  # type: ignore[misc]
        assert a < b and v.blocks[0] != v.blocks[1]


@given(st.integers(0, 2**32 - 1))
def test_every_planned_table_passes(seed: int) -> None:
    from kvlayout.testing import random_spec

    spec = random_spec(seed)
    table = K.plan(spec)
    rep = K.verify(table)
    assert rep.ok, rep.format()
    assert rep.padding_checked
    # coalescing keeps the byte set
    ids = np.arange(spec.num_blocks)
    assert (K.expected_zeroed(table, ids) == K.expected_zeroed(table.coalesced(), ids)).all()
    assert K.verify(table.coalesced()).ok


# ---------------------------------------------------------------- issue 19: rich brute-force comparison
def _check_witnesses(t: K.SegmentTable, rep: K.VerifyReport, witnesses_4: bool = True) -> None:
    """Every reported violation names real rows, blocks and bytes."""

    def rng(row: K.Segment, b: int) -> tuple[int, int]:
        return row.base + b * row.stride, row.base + b * row.stride + row.span

    segs = t.segments
    for v in rep.by_invariant(3):
        (ra, rb) = v.rows if len(v.rows) == 2 else (v.rows[0], v.rows[0])
        ba, bb = v.blocks
        assert ba < bb and v.byte_range is not None
        a, e = v.byte_range
        (a0, a1), (c0, c1) = rng(segs[ra], ba), rng(segs[rb], bb)
        assert (a, e) == (max(a0, c0), min(a1, c1)) and a < e, v.message
    for v in rep.by_invariant(2):
        assert v.byte_range is not None and v.byte_range[0] < v.byte_range[1], v.message
        assert v.byte_range[1] <= 0 or v.byte_range[0] >= t.total_bytes, v.message
        r0, r1 = rng(segs[v.rows[0]], v.blocks[-1])
        assert r0 <= v.byte_range[0] and v.byte_range[1] <= r1 or v.byte_range[0] == r0, v.message
    for v in rep.by_invariant(4):
        if not witnesses_4:
            continue
        assert v.byte_range is not None
        a, e = v.byte_range
        r0, r1 = rng(segs[v.rows[0]], v.blocks[0])
        assert r0 <= a < e <= r1, v.message
        assert any(
            p.base + v.blocks[1] * p.stride <= a and e <= p.base + v.blocks[1] * p.stride + p.span
            for p in t.padding
        ), v.message


def test_verifier_matches_brute_force_on_rich_tables() -> None:
    """Rows of several groups, k strides apart, equal/other/zero/negative strides, touching spans."""
    tables = [random_table(seed, max_rows=6, max_blocks=9) for seed in O.seeds(1200)]
    assert O.check_verifier(K.verify, tables) == []
    for t in tables:
        _check_witnesses(t, K.verify(t), witnesses_4=False)  # see test_padding_witness_names_meeting_blocks


def test_padding_witness_names_meeting_blocks() -> None:
    """Row block b = [96+16b, 108+16b) meets padding block b' = [112+16b', 120+16b') for b = b'+1.

    The shared bytes are the whole gap, [112+16b', 120+16b').
    """
    t = K.SegmentTable(180, 5, (K.Segment(96, 16, 12),), (K.Segment(112, 16, 8, "", "x", "padding"),), True)
    (v, *_) = K.verify(t).by_invariant(4)
    assert v.blocks[0] == v.blocks[1] + 1 and v.byte_range == (112 + 16 * v.blocks[1], 120 + 16 * v.blocks[1])
    for t in (random_table(seed, max_rows=6, max_blocks=9) for seed in range(300)):
        _check_witnesses(t, K.verify(t))


def test_verifier_matches_brute_force_with_more_blocks() -> None:
    tables = [random_table(seed, max_rows=4, max_blocks=40) for seed in O.seeds(200, 10_000)]
    assert O.check_verifier(K.verify, tables) == []


def test_verifier_at_the_last_block_pair() -> None:
    """Rows that meet only between blocks 0 and n-1 (k = n-1 strides apart), or just miss (k = n)."""
    rng = random.Random(19)
    tables = []
    for _ in O.seeds(400):
        n = rng.randint(2, 24)
        s1 = rng.choice((16, 32, 48, 64))
        s2 = rng.choice((s1, s1, 2 * s1, s1 + 16, -s1))
        k = rng.choice((n - 2, n - 1, n - 1, n))
        span = rng.choice((8, 16))
        base2 = k * s1 + rng.choice((0, -4, 4, span, -span)) + max(0, -(n - 1) * s2)
        rows = (K.Segment(0, s1, span, "a"), K.Segment(max(0, base2), s2, span, rng.choice("ab")))
        total = max(max(r.base, r.base + (n - 1) * r.stride) + r.span for r in rows)
        tables.append(K.SegmentTable(total, n, rows))
    assert O.check_verifier(K.verify, tables) == []
    assert 0.1 * len(tables) < sum(not K.verify(t).ok for t in tables) < 0.9 * len(tables)


def test_verifier_decides_far_blocks_without_looping() -> None:
    """At a million blocks: row 1's block 0 is row 0's block n-1 (unsafe); one stride later, safe."""
    n = 10**6
    for s2 in (64, 128):
        hit = K.SegmentTable(
            64 * (n - 1) + (n - 1) * s2 + 16, n, (K.Segment(0, 64, 16), K.Segment(64 * (n - 1), s2, 16))
        )
        (v,) = K.verify(hit).by_invariant(3)
        assert v.blocks == (0, n - 1) and v.byte_range == (64 * (n - 1), 64 * (n - 1) + 16), v.message
        miss = K.SegmentTable(
            64 * n + (n - 1) * s2 + 16, n, (K.Segment(0, 64, 16), K.Segment(64 * n, s2, 16))
        )
        assert K.verify(miss).ok


def test_overlaps_within_block_matches_brute_force() -> None:
    """Pairs of rows sharing bytes inside one block, with the first such block."""
    from kvlayout.verify import overlaps_within_block

    for seed in O.seeds(400):
        t = random_table(seed, max_rows=5, max_blocks=6)
        if any(s.span <= 0 for s in t.segments):
            continue
        want = []
        segs = t.segments
        for i in range(len(segs)):
            for j in range(i + 1, len(segs)):
                blocks = [
                    b
                    for b in range(t.num_blocks)
                    if max(segs[i].base + b * segs[i].stride, segs[j].base + b * segs[j].stride)
                    < min(
                        segs[i].base + b * segs[i].stride + segs[i].span,
                        segs[j].base + b * segs[j].stride + segs[j].span,
                    )
                ]
                if blocks:
                    want.append((i, j, blocks[0]))
        got = overlaps_within_block(t)
        # every reported pair is real, with its first block; together they name every overlapping row
        # (a row overlapping several others may be reported against one of them only)
        assert set(got) <= set(want), (seed, got, want)
        assert {r for i, j, _ in got for r in (i, j)} == {r for i, j, _ in want for r in (i, j)}, (
            seed,
            got,
            want,
        )


def test_report_helpers_and_require_safe() -> None:
    bad = K.SegmentTable(
        112, 3, (K.Segment(0, 32, 16, "g", "a"), K.Segment(32, 32, 16, "h", "b"), K.Segment(18, 32, 4))
    )
    rep = K.verify(bad)
    assert (
        rep.rows_violating() == {0, 1, 2} and rep.rows_violating(3) == {0, 1} and rep.rows_violating(1) == {2}
    )
    d: dict[str, Any] = rep.to_dict()
    assert d["ok"] is False and d["num_rows"] == 3 and d["num_blocks"] == 3 and d["total_bytes"] == 112
    assert [v["invariant"] for v in d["violations"]] == [1, 3]
    assert d["violations"][1]["name"] == "block isolation" and d["violations"][1]["byte_range"] == [32, 48]
    text = rep.format()
    assert "3 rows, 3 blocks, total_bytes 112: UNSAFE (2 violations)" in text
    assert "invariant 3 (block isolation): BROKEN" in text and "invariant 2 (in bounds): ok" in text
    assert "row 1 (h/b/page) of block 0 [32, 48) spills into row 0 (g/a/page) of block 1 [32, 48)" in text
    assert "invariant 4 (padding untouched): not checked" in text
    with pytest.raises(K.TableError, match=r"refusing an unsafe table: row 2 \(//page\): base 18 "):
        require_safe(bad)
    good = K.plan(K.preset("dsv4-test"))
    assert require_safe(good).ok


def test_many_violations_are_truncated_not_lost() -> None:
    rows = tuple(K.Segment(4 * i + 1, 4, 4) for i in range(100))  # 100 misaligned rows
    rep = K.verify(K.SegmentTable(1000, 1, rows))
    assert len(rep.by_invariant(1)) == 64 and rep.truncated == {1: 36}
    assert "... and 36 more" in rep.format()
