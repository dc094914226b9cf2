"""kvlayout.verify against brute force written here (issue 19 mutation testing).

Oracles enumerate block ids and intervals ``[base + b*stride, + span)`` (GEOMETRY.md section 3);
nothing is computed with the verifier's own arithmetic.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest

import kvlayout as K

from . import oracles as O

Vf = importlib.import_module("kvlayout.verify")  # the module (``kvlayout.verify`` is also the function)
Row = tuple[int, int, int]


def _iv(r: Row, b: int) -> tuple[int, int]:
    return r[0] + b * r[1], r[0] + b * r[1] + r[2]


def _meet(x: tuple[int, int], y: tuple[int, int]) -> bool:
    return max(x[0], y[0]) < min(x[1], y[1])


def _brute_pairs(ri: Row, rj: Row, n: int, cross: bool) -> list[tuple[int, int]]:
    """Every ``(b, b')`` where row ``ri`` of block ``b`` meets row ``rj`` of block ``b'``."""
    return [
        (b, c) for b in range(n) for c in range(n) if (not cross or b != c) and _meet(_iv(ri, b), _iv(rj, c))
    ]


def _random_row(rng: random.Random) -> Row:
    return 4 * rng.randint(-40, 40), 4 * rng.randint(-14, 14), 4 * rng.randint(1, 24)


def test_pair_witness_is_the_smallest_block_with_an_overlap() -> None:
    rng = random.Random(1919)
    found = {True: 0, False: 0}
    for _ in O.seeds(1500):
        ri = _random_row(rng)
        rj = _random_row(rng) if rng.random() < 0.7 else (ri[0] + rng.choice((-8, 0, 8)), ri[1], ri[2])
        n = rng.randint(1, 9)
        for cross in (True, False):
            pairs = _brute_pairs(ri, rj, n, cross)
            got = Vf.pair_witness(ri, rj, n, cross_block=cross)
            if not pairs:
                assert got is None, (ri, rj, n, cross, got)
                continue
            found[cross] += 1
            assert got is not None and got[0] == min(b for b, _ in pairs), (ri, rj, n, cross, got, pairs)
            assert got in pairs, (ri, rj, n, cross, got)
            # the count of overlapping block pairs, for every block range
            p = Vf._Pair(ri, rj, n)
            lo = rng.randint(0, n)
            hi = rng.randint(lo, n)
            every = _brute_pairs(ri, rj, n, False)
            assert p.count(lo, hi) == sum(lo <= b < hi for b, _ in every), (ri, rj, n, lo, hi)
            first, last = p.same_block(lo, hi)
            same = [b for b, c in every if b == c and lo <= b < hi]
            if same:
                assert (first, last) == (min(same), max(same)), (ri, rj, n, lo, hi)
            else:
                assert first > last, (ri, rj, n, lo, hi)
    assert min(found.values()) > 100 * O.SCALE
    assert Vf.pair_witness((0, 4, 0), (0, 4, 4), 3, cross_block=False) is None
    assert Vf.pair_witness((0, 4, 4), (0, 4, 4), 0, cross_block=False) is None
    assert Vf.pair_witness((0, 4, 8), (0, 4, -4), 3, cross_block=True) is None


@pytest.mark.parametrize("n", [2, 3])
def test_a_class_with_hundreds_of_rows_active_at_once(n: int) -> None:
    """One stride class whose circle sweep holds over 512 arcs at once (the sorted set splits buckets).

    Long rows sit at windings 0, n, 2n, ... over the arc [0, s - 4(n-1)); 4-byte bridges at the
    windings between, each at its own arc, keep the cluster connected. Safe as built (arcs that
    meet are n windings apart); one bridge moved 4 B down meets a long row one block away.
    """
    s = 64
    rows: list[K.Segment] = []
    for i in range(600):
        rows.append(K.Segment(i * n * s, s, s - 4 * (n - 1), "g", f"long{i}"))
        for k in range(1, n):
            rows.append(K.Segment(i * n * s + k * s + s - 4 * (n - k), s, 4, "g", f"bridge{i}.{k}"))
    total = max(r.base + (n - 1) * s + r.span for r in rows)
    safe = K.SegmentTable(total, n, tuple(rows))
    assert K.verify(safe).ok and _interval_isolation(safe) == []
    for victim in (5, 300, 597):
        j = next(i for i, r in enumerate(rows) if r.layer == f"bridge{victim}.1")
        bad_rows = list(rows)
        r = rows[j]
        bad_rows[j] = K.Segment(r.base - 4, r.stride, r.span, r.group, r.layer)
        bad = K.SegmentTable(total, n, tuple(bad_rows))
        rep = K.verify(bad)
        want = _interval_isolation(bad)
        assert want and not rep.ok and rep.rows_violating() <= {r for w in want for r in w[:1] + w[2:3]}
        for v in rep.by_invariant(3):
            ra, rb = v.rows if len(v.rows) == 2 else v.rows * 2
            a = _iv((bad_rows[ra].base, s, bad_rows[ra].span), v.blocks[0])
            c = _iv((bad_rows[rb].base, s, bad_rows[rb].span), v.blocks[1])
            assert v.blocks[0] != v.blocks[1] and v.byte_range == (max(a[0], c[0]), min(a[1], c[1]))


def _interval_isolation(t: K.SegmentTable) -> list[tuple[int, int, int, int]]:
    """``(row, block, row', block')`` with ``block != block'`` whose byte intervals meet (sort and sweep)."""
    ivs = sorted(
        (s.base + b * s.stride, s.base + b * s.stride + s.span, r, b)
        for r, s in enumerate(t.segments)
        for b in range(t.num_blocks)
    )
    out = []
    best: dict[int, tuple[int, int]] = {}  # block -> (end, row) of its interval reaching furthest so far
    for a, e, r, b in ivs:
        for b2, (e2, r2) in best.items():
            if b2 != b and e2 > a:
                out.append((r2, b2, r, b))
        if e > best.get(b, (-1, -1))[0]:
            best[b] = (e, r)
    return out


def _label(s: K.Segment) -> str:
    return f"{s.group}/{s.layer}/{s.part}"


def _check_report(t: K.SegmentTable, rep: K.VerifyReport) -> None:
    """Every violation's rows, blocks, bytes and message, against brute force and the message forms."""
    segs, n, total = t.segments, t.num_blocks, t.total_bytes
    # invariant 1 and 2 are per row: the rows named are exactly the rows brute force finds
    bad1 = [r for r, s in enumerate(segs) if s.base % 4 or s.stride % 4 or s.span % 4 or s.span <= 0]
    assert [v.rows[0] for v in rep.by_invariant(1)] == bad1[:64]
    for v in rep.by_invariant(1):
        s = segs[v.rows[0]]
        parts = [f"{k} {x}" for k, x in (("base", s.base), ("stride", s.stride), ("span", s.span)) if x % 4]
        parts += [f"span {s.span} is not positive"] if s.span <= 0 else []
        assert (
            v.message
            == f"row {v.rows[0]} ({_label(s)}): {', '.join(parts)} (must be multiples of 4, span > 0)"
        )
        assert (v.blocks, v.byte_range) == ((), None)
    if n == 0 or not segs:
        assert not rep.by_invariant(2) and not rep.by_invariant(3) and not rep.by_invariant(4)
        return
    below = [r for r, s in enumerate(segs) if min(s.base, s.base + (n - 1) * s.stride) < 0]
    above = [r for r, s in enumerate(segs) if max(s.base, s.base + (n - 1) * s.stride) + s.span > total]
    inv2 = rep.by_invariant(2)
    assert [v.rows[0] for v in inv2] == (below + above)[:64]
    for v in inv2:
        r = v.rows[0]
        s = segs[r]
        if "before the buffer" in v.message:
            (b,) = v.blocks
            start = s.base + b * s.stride
            assert start < 0 and b == (0 if s.base < 0 else n - 1)
            assert v.byte_range == (start, min(0, start + s.span))
            assert (
                v.message
                == f"row {r} ({_label(s)}): block {b} starts at {start}, {-start} B before the buffer"
            )
        else:
            first = min(b for b in range(n) if s.base + b * s.stride + s.span > total)
            last = n - 1 if s.stride > 0 else 0
            assert v.blocks == ((first, last) if s.stride > 0 else (0, 0)), (v.blocks, first, last)
            a, e = s.base + last * s.stride, s.base + last * s.stride + s.span
            assert v.byte_range == (max(a, total), e)
            assert v.message == (
                f"row {r} ({_label(s)}): block {last} ends at {e}, {e - total} B past total_bytes {total}"
                f" (first block out of bounds: {v.blocks[0]})"
            )
    for v in rep.by_invariant(3):
        assert len(set(v.rows)) == len(v.rows), v  # a row meeting itself is named once
        ra, rb = v.rows if len(v.rows) == 2 else v.rows * 2
        ba, bb = v.blocks
        (a0, a1), (c0, c1) = _iv(_r(segs[ra]), ba), _iv(_r(segs[rb]), bb)
        o = (max(a0, c0), min(a1, c1))
        assert 0 <= ba < bb < n and o[0] < o[1] and v.byte_range == o
        assert v.message == (
            f"row {ra} ({_label(segs[ra])}) of block {ba} [{a0}, {a1}) spills into row {rb} "
            f"({_label(segs[rb])}) of block {bb} [{c0}, {c1}): bytes [{o[0]}, {o[1]}) belong to both"
        )
    for v in rep.by_invariant(4):
        (i,) = v.rows
        bi, bj = v.blocks
        x0, x1 = _iv(_r(segs[i]), bi)
        assert v.byte_range is not None and x0 <= v.byte_range[0] < v.byte_range[1] <= x1
        pads = [
            p
            for p in t.padding
            if _iv(_r(p), bj)[0] <= v.byte_range[0] and v.byte_range[1] <= _iv(_r(p), bj)[1]
        ]
        assert pads, v.message
        assert any(
            v.message
            == f"row {i} ({_label(segs[i])}): block {bi} clears [{v.byte_range[0]}, {v.byte_range[1]}), "
            f"alignment padding of layer {p.layer!r} in block {bj}"
            for p in pads
        ), v.message


def _r(s: K.Segment) -> Row:
    return s.base, s.stride, s.span


def test_every_violation_is_exact_on_random_tables() -> None:
    from kvlayout.testing import random_table

    kinds = {1: 0, 2: 0, 3: 0, 4: 0}
    for seed in O.seeds(600):
        t = random_table(seed, max_rows=6, max_blocks=7)
        rep = K.verify(t)
        _check_report(t, rep)
        for inv in kinds:
            kinds[inv] += bool(rep.by_invariant(inv))
        truth = O.brute_invariants(t)
        assert rep.ok == all(truth.values())
        assert rep.padding_checked == (t.planned or bool(t.padding))
        assert (rep.num_rows, rep.num_blocks, rep.total_bytes) == (len(t), t.num_blocks, t.total_bytes)
    assert min(kinds.values()) > 20 * O.SCALE, kinds


@pytest.mark.parametrize(
    "rows, n, total",
    [
        ([(-8, 16, 8)], 3, 64),  # block 0 below the buffer
        ([(40, -16, 8)], 4, 64),  # negative stride: block 3 at -8
        ([(0, 16, 8), (4, 16, 6)], 0, 0),  # no blocks: only invariant 1 can break
        ([(2, 16, 8), (0, 6, 4), (0, 16, 0), (0, 16, -4)], 2, 64),  # invariant 1 in each field
        ([(0, 16, 8), (40, 16, 8)], 3, 64),  # past the end from block 2 on (first out: 2)
        ([(8, 0, 60)], 5, 64),  # stride 0 past the end, and meeting itself in every block
        ([(64, -16, 8)], 3, 64),  # negative stride past the end at block 0
        ([(0, 16, 24)], 2, 48),  # a row wider than its stride meets its next block
        ([(8, 0, 8)], 2, 64),  # stride 0 with two blocks: blocks 0 and 1 are the same bytes
        ([(0, -16, 8)], 3, 64),  # base 0, negative stride: block 2 is the one below the buffer
        ([(60, 1, 8)], 4, 64),  # stride 1: past the end from block 0 to block 3
        ([(0, 16, 1), (8, 16, 4)], 2, 64),  # a span of 1 is misaligned, not "not positive"
    ],
)
def test_hand_written_violations(rows: list[Row], n: int, total: int) -> None:
    t = K.SegmentTable(
        total, n, tuple(K.Segment(b, s, sp, "g", f"l{i}") for i, (b, s, sp) in enumerate(rows))
    )
    rep = K.verify(t)
    _check_report(t, rep)
    assert rep.ok == all(O.brute_invariants(t).values())
    assert not rep.ok


def test_report_format_and_dict() -> None:
    t = K.SegmentTable(
        64, 2, (K.Segment(0, 16, 8, "g", "a"),), (K.Segment(4, 16, 8, "", "a", "padding"),), planned=False
    )
    rep = K.verify(t)
    (v,) = rep.violations
    assert v.invariant == 4 and rep.padding_checked
    assert rep.format() == "\n".join(
        [
            "1 rows, 2 blocks, total_bytes 64: UNSAFE (1 violations)",
            "  invariant 1 (alignment (base, stride, span multiples of 4; span > 0)): ok",
            "  invariant 2 (in bounds): ok",
            "  invariant 3 (block isolation): ok",
            "  invariant 4 (padding untouched): BROKEN",
            f"    - {v.message}",
        ]
    )
    assert v.to_dict() == {
        "invariant": 4,
        "name": "padding untouched",
        "rows": [0],
        "blocks": list(v.blocks),
        "byte_range": list(v.byte_range or ()),
        "message": v.message,
    }
    bad1 = K.verify(K.SegmentTable(64, 2, (K.Segment(2, 16, 8),)))
    assert bad1.violations[0].to_dict()["byte_range"] is None and bad1.violations[0].to_dict()["blocks"] == []
    ok = K.verify(K.SegmentTable(64, 2, (K.Segment(0, 16, 8),)))
    assert ok.format() == "\n".join(
        [
            "1 rows, 2 blocks, total_bytes 64: SAFE",
            "  invariant 1 (alignment (base, stride, span multiples of 4; span > 0)): ok",
            "  invariant 2 (in bounds): ok",
            "  invariant 3 (block isolation): ok",
            "  invariant 4 (padding untouched): not checked, the table carries no layout "
            "(check the spec instead)",
        ]
    )
    assert ok.to_dict() == {
        "ok": True,
        "num_rows": 1,
        "num_blocks": 2,
        "total_bytes": 64,
        "padding_checked": False,
        "violations": [],
    }
    assert K.verify(K.SegmentTable(64, 0, (K.Segment(0, 16, 8),), planned=True)).padding_checked


def test_truncation_per_invariant() -> None:
    """64 violations listed per invariant and the overflow counted: invariant 2 exactly, 3 and 4 as "more".

    Invariants 3 and 4 stop looking in a stride class after 65 hits (the verdict needs one):
    64 listed and "... and 1 more", whether the hits come from long rows, the circle sweep or
    the footprint of gaps; self-hits of stride-0 rows are all counted.
    """
    n = 2
    wide = tuple(K.Segment(128 * i, 64, 96, "g", f"w{i}") for i in range(70))  # each meets its own next block
    rep = K.verify(K.SegmentTable(128 * 70, n, wide))
    assert len(rep.by_invariant(3)) == 64 and rep.truncated == {3: 1}
    assert f"... and {rep.truncated[3]} more" in rep.format()
    # 70 pairs meeting one block apart, found by the sweep (one cluster wider than the stride)
    swept = tuple(K.Segment(64 * i + 60, 64, 4, "g", f"a{i}") for i in range(70)) + tuple(
        K.Segment(64 * i + 124, 64, 4, "g", f"b{i}") for i in range(70)
    )
    rep = K.verify(K.SegmentTable(64 * 72, n, swept))
    assert len(rep.by_invariant(3)) == 64 and rep.truncated == {3: 1}
    # a second wide cluster of the class further up: not looked at once the first gave 65
    far = (K.Segment(8000 + 60, 64, 4, "g", "c"), K.Segment(8000 + 124, 64, 4, "g", "d"))
    rep = K.verify(K.SegmentTable(8256, n, swept + far))
    assert len(rep.by_invariant(3)) == 64 and rep.truncated == {3: 1}
    # 65 long rows, then a swept pair of the same stride: not looked at
    rep = K.verify(K.SegmentTable(8256, n, wide[:65] + far))
    assert len(rep.by_invariant(3)) == 64 and rep.truncated == {3: 1}
    # 10 long rows (far up), then the sweep: 55 more, 65 in all
    rep = K.verify(
        K.SegmentTable(
            128 * 70 + 64 * 72, n, swept + tuple(K.Segment(64 * 72 + s.base, 64, 96) for s in wide[:10])
        )
    )
    assert [v.rows for v in rep.by_invariant(3)][:10] == [(140 + i,) for i in range(10)]
    assert len(rep.by_invariant(3)) == 64 and rep.truncated == {3: 1}
    # and 10 rows of stride 0 (each meets itself in every other block): all counted
    zero = tuple(K.Segment(64 * 72 + 8 * i, 0, 4, "g", f"z{i}") for i in range(10))
    rep = K.verify(K.SegmentTable(64 * 72 + 80, n, swept + zero))
    assert len(rep.by_invariant(3)) == 64 and rep.truncated == {3: 1 + 10}
    out = tuple(K.Segment(16 * i, 4096, 8, "g", f"o{i}") for i in range(80))
    rep = K.verify(K.SegmentTable(4096, n, out))
    assert len(rep.by_invariant(2)) == 64 and rep.truncated == {2: 16}
    pads = tuple(K.Segment(16 * i + 8, 4096, 8, "", f"o{i}", "padding") for i in range(80))
    rep = K.verify(K.SegmentTable(4096 * 2, n, tuple(K.Segment(16 * i, 4096, 16) for i in range(80)), pads))
    assert len(rep.by_invariant(4)) == 64 and rep.truncated == {4: 1}


def test_padding_budget_exactly_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gap of another stride meeting ``MAX_CROSS_PAIRS`` rows' extents is decided; one more is refused.

    Rows ``64 i`` of stride 512 (two blocks) all reach over byte 388, where a stride-0 gap sits;
    only row 6 (block 0) clears it.
    """
    monkeypatch.setattr(Vf, "MAX_CROSS_PAIRS", 6)
    rows = [(64 * i, 512, 8) for i in range(7)]
    gap = [(388, 0, 4)]
    rep = K.verify(_pad_table(4096, 2, rows[1:], gap))
    assert [(v.rows, v.blocks, v.byte_range) for v in rep.violations] == [((5,), (0, 0), (388, 392))]
    with pytest.raises(K.TableError) as e:
        K.verify(_pad_table(4096, 2, rows, gap))
    assert (e.value.field, e.value.value) == ("table.segments", 7)


def test_padding_budget_counts_rows_meeting_the_gap_extent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows counted against a gap of another stride are those whose extents share a byte with the gap's.

    Six rows of stride 512 reach over the two-block extent ``[1000, 1008)`` of a stride +-4 gap
    (none clears it); a seventh row whose extent only touches it (ends at 1000 or starts at
    1008) is not counted, so with ``MAX_CROSS_PAIRS = 6`` the table is decided, and SAFE.
    """
    monkeypatch.setattr(Vf, "MAX_CROSS_PAIRS", 6)
    six = [(600 + 40 * i, 512, 8) for i in range(6)]
    for gap in ((1000, 4, 4), (1004, -4, 4)):
        for touching in ((480, 512, 8), (1008, 512, 8)):
            t = _pad_table(2048, 2, [*six, touching], [gap])
            assert all(O.brute_invariants(t).values())
            assert K.verify(t).ok, (gap, touching)
        with pytest.raises(K.TableError) as e:  # a seventh row meeting the extent
            K.verify(_pad_table(2048, 2, [*six, (484, 512, 8)], [gap]))
        assert e.value.value == 7
    # a gap of no bytes is never looked at, whatever its extent meets
    assert K.verify(_pad_table(2048, 2, [*six, (484, 512, 8)], [(1000, 4, 0)])).ok
    # a gap exactly one stride wide is decided with the rows of its stride (no budget): cleared
    seven = [(64 * i, 512, 8) for i in range(7)]
    rep = K.verify(_pad_table(2048, 2, seven, [(0, 512, 512)]))
    assert rep.by_invariant(4) and not rep.by_invariant(3)


def test_gaps_of_another_stride_keep_their_own_blocks() -> None:
    """A gap is swept with rows of its own stride only; a stride-0 gap is one byte range in every block.

    A stride-0 gap below a row of stride 1 or -2 (never reached: those rows run away from it)
    is untouched; a stride +1 gap crossed by a stride -1 row is cleared at block pairs
    (0, 2), (1, 1), (2, 0), listed once at the first row block with the gap's own block 2.
    """
    for n, row, gap in ((2, (5, 1, 1), (4, 0, 1)), (2, (6, -2, 1), (2, 0, 1)), (3, (9, 1, 1), (8, 0, 1))):
        t = _pad_table(16, n, [row], [gap])
        assert O.brute_invariants(t)[4] and not K.verify(t).by_invariant(4), (row, gap)
    t = _pad_table(16, 3, [(10, -1, 1)], [(8, 1, 1)])
    assert [(v.rows, v.blocks, v.byte_range) for v in K.verify(t).by_invariant(4)] == [
        ((0,), (0, 2), (10, 11))
    ]
    # a stride-1 gap with a stride-1 row: swept in their class, listed once
    t = _pad_table(16, 2, [(8, 1, 1)], [(9, 1, 1)])
    assert [(v.rows, v.blocks, v.byte_range) for v in K.verify(t).by_invariant(4)] == [
        ((0,), (1, 0), (9, 10))
    ]


def test_a_cluster_exactly_one_stride_wide_is_not_swept() -> None:
    """A cluster exactly one stride wide (no two points a stride apart), then two wide ones: each pair once.

    Stride 64, two blocks: row 0 spans one whole stride at 0 (never meets itself); far above,
    two clusters each hold one pair meeting one block apart.
    """
    rows = [(0, 64, 64), (1060, 64, 4), (1124, 64, 4), (3060, 64, 4), (3124, 64, 4)]
    t = K.SegmentTable(4096, 2, tuple(K.Segment(*r, "g", f"r{i}") for i, r in enumerate(rows)))
    rep = K.verify(t)
    assert sorted(tuple(sorted(v.rows)) for v in rep.violations) == [(1, 2), (3, 4)]
    _check_pairs(t, rep)


def test_isolation_listed_cluster_by_cluster_from_the_lowest() -> None:
    """Past the listing limit, a stride class's violations are listed by cluster, lowest addresses first.

    Stride 64, two blocks: 40 pairs (row a of block 1 on row b of block 0), each its own cluster
    (clusters 124 B apart, beyond one stride), at circle position 40; above them 40 more at
    position 8. All 40 low pairs are listed, then 24 high ones.
    """
    low = [r for i in range(40) for r in ((256 * i + 40, 64, 4), (256 * i + 104, 64, 4))]
    high = [r for j in range(40) for r in ((256 * (40 + j) + 8, 64, 4), (256 * (40 + j) + 72, 64, 4))]
    rows = low + high
    t = K.SegmentTable(256 * 81, 2, tuple(K.Segment(*r, "g", f"r{i}") for i, r in enumerate(rows)))
    rep = K.verify(t)
    pairs = [tuple(sorted(v.rows)) for v in rep.by_invariant(3)]
    assert pairs[:40] == [(2 * i, 2 * i + 1) for i in range(40)] and rep.truncated == {3: 1}
    assert all(a >= 80 for a, _ in pairs[40:]) and len(pairs) == 64


def test_a_gap_cleared_twice_in_a_narrow_cluster_is_listed_once() -> None:
    """In a cluster no wider than the stride, a cleared gap is listed once: the row reaching its first byte.

    Stride 64, two blocks: rows [0, 8) and [4, 12) both clear gap [4, 8) in block 0; a row at
    76 sits exactly one stride (the splitting distance) above their cluster, in its own.
    """
    t = _pad_table(256, 2, [(0, 64, 8), (4, 64, 8), (76, 64, 4)], [(4, 64, 4)])
    rep = K.verify(t)
    assert [(v.rows, v.blocks, v.byte_range) for v in rep.violations] == [((0,), (0, 0), (4, 8))]


def test_too_many_cross_stride_pairs_refused() -> None:
    """More than MAX_CROSS_PAIRS meeting pairs of different strides: an answer (TableError), not a guess."""
    rows = [K.Segment(0, 4 * (i + 1), 4) for i in range(80)] + [
        K.Segment(0, 4 * (i + 1), 4) for i in range(80)
    ]
    t = K.SegmentTable(4 * 81 * 2, 2, tuple(rows))
    pairs = sum(1 for i in range(160) for j in range(i + 1, 160) if rows[i].stride != rows[j].stride)
    assert pairs > Vf.MAX_CROSS_PAIRS
    with pytest.raises(K.TableError) as e:
        K.verify(t)
    assert e.value.field == "table.segments" and e.value.value == pairs
    assert str(e.value) == (
        f"table = {pairs} pairs of rows with different strides and meeting extents: kvlayout decides at "
        f"most {Vf.MAX_CROSS_PAIRS} such pairs exactly in its time bound (GEOMETRY.md section 8); give "
        "overlapping rows one stride, or split the table"
    )
    with pytest.raises(K.TableError, match="pairs of rows with different strides"):
        Vf.overlaps_within_block(t)


def _pad_table(total: int, n: int, rows: list[Row], gaps: list[Row]) -> K.SegmentTable:
    return K.SegmentTable(
        total,
        n,
        tuple(K.Segment(b, s, p, "g", f"r{i}") for i, (b, s, p) in enumerate(rows)),
        tuple(K.Segment(b, s, p, "", f"gap{i}", "padding") for i, (b, s, p) in enumerate(gaps)),
        True,
    )


def test_padding_hits_kept_across_clusters_of_one_stride() -> None:
    """Stride 64, 3 blocks: a same-block hit in a narrow cluster and a far, wide cluster with no hit.

    Row [0, 16) clears gap [8, 16) in every block. Far away, rows at circle arcs [40, 56) and
    [12, 16) and a gap at [60, 64) form a cluster wider than the stride that meets nothing.
    """
    t = _pad_table(1300, 3, [(0, 64, 16), (1000, 64, 16), (1100, 64, 4)], [(8, 64, 8), (1020, 64, 4)])
    truth = O.brute_invariants(t)
    assert (truth[3], truth[4]) == (True, False)
    rep = K.verify(t)
    assert not rep.ok and not rep.by_invariant(3)
    v = rep.by_invariant(4)[0]
    assert (v.rows, v.blocks, v.byte_range) == ((0,), (0, 0), (8, 16))
    _check_report(t, rep)


def test_padding_hit_in_a_later_wide_cluster() -> None:
    """A first wide cluster of rows only, then a wide cluster where row block 1 clears gap block 0."""
    t = _pad_table(1300, 3, [(0, 64, 16), (100, 64, 4), (1000, 64, 16)], [(1070, 64, 4)])
    truth = O.brute_invariants(t)
    assert (truth[3], truth[4]) == (True, False)
    rep = K.verify(t)
    (v,) = rep.by_invariant(4)
    assert (v.rows, v.blocks, v.byte_range) == ((2,), (1, 0), (1070, 1074))
    _check_report(t, rep)


def test_overlaps_within_block_edges() -> None:
    ow = Vf.overlaps_within_block
    rows = (K.Segment(0, 16, 8), K.Segment(4, 16, 8), K.Segment(4, 32, 8))
    assert ow(K.SegmentTable(64, 0, rows)) == []  # no blocks, no overlaps
    got = ow(K.SegmentTable(128, 3, rows))
    assert got == [(0, 1, 0), (0, 2, 0), (1, 2, 0)]  # each pair once, at its first block
    # a row of no bytes overlaps nothing, whatever stride; a 1-byte row inside another does
    zero = (K.Segment(0, 16, 8), K.Segment(4, 16, 0), K.Segment(4, 32, 0), K.Segment(4, 24, 1))
    assert ow(K.SegmentTable(128, 3, zero)) == [(0, 3, 0)]
    one = (K.Segment(0, 16, 8), K.Segment(4, 16, 1))
    assert ow(K.SegmentTable(128, 3, one)) == [(0, 1, 0)]
    # rows of different strides that meet first in block 2
    later = (K.Segment(0, 16, 4), K.Segment(32 - 8, 4, 4))
    assert ow(K.SegmentTable(128, 4, later)) == [(0, 1, 2)]
    many = [K.Segment(0, 4 * (i + 1), 4) for i in range(80)] * 2
    t = K.SegmentTable(4 * 81 * 2, 2, tuple(many))
    pairs = sum(1 for i in range(160) for j in range(i + 1, 160) if many[i].stride != many[j].stride)
    with pytest.raises(K.TableError) as e:
        ow(t)
    assert (e.value.field, e.value.value) == ("table.segments", pairs)
    assert str(e.value).startswith(f"table = {pairs} pairs of rows with different strides")


def test_require_safe_names_the_first_violation() -> None:
    bad = K.SegmentTable(64, 2, (K.Segment(2, 16, 8, "g", "a"), K.Segment(0, 16, 24, "g", "b")))
    rep = K.verify(bad)
    with pytest.raises(K.TableError) as e:
        Vf.require_safe(bad)
    assert str(e.value) == f"refusing an unsafe table: {rep.violations[0].message}"
    assert (e.value.field, e.value.value) == ("table", len(rep.violations)) and len(rep.violations) == 2


def test_pair_counts_on_any_small_integers() -> None:
    """Bases, strides and spans of any small integers (not only words): counts, same-block runs, witnesses.

    Spans of 1 and 2 reach the boundaries where no integer lies strictly between two ends;
    touching rows (one ends where the other starts) must never count as meeting.
    """
    rng = random.Random(1901)
    for _ in O.seeds(3000):
        n = rng.randint(0, 7)
        ri = (rng.randint(-12, 12), rng.randint(-5, 5), rng.randint(-1, 5))
        if rng.random() < 0.3:  # touching or equal-stride neighbours
            rj = (ri[0] + rng.choice((ri[2], -1, 0, 1)), ri[1], rng.randint(1, 3))
        else:
            rj = (rng.randint(-12, 12), rng.randint(-5, 5), rng.randint(-1, 5))
        live = n > 0 and ri[2] > 0 and rj[2] > 0
        every = _brute_pairs(ri, rj, n, False) if live else []
        for cross in (True, False):
            pairs = [(b, c) for b, c in every if not cross or b != c]
            got = Vf.pair_witness(ri, rj, n, cross_block=cross)
            if not pairs:
                assert got is None, (ri, rj, n, cross, got)
            else:
                assert got is not None and got[0] == min(b for b, _ in pairs) and got in pairs, (
                    ri,
                    rj,
                    n,
                    got,
                )
        if not live:
            continue
        p = Vf._Pair(ri, rj, n)
        for lo, hi in ((0, n), (rng.randint(0, n), n), (0, rng.randint(0, n)), (n, 0)):
            assert p.count(lo, hi) == sum(lo <= b < hi for b, _ in every), (ri, rj, n, lo, hi)
            first, last = p.same_block(lo, hi)
            same = [b for b, c in every if b == c and lo <= b < hi]
            assert (first, last) == (min(same), max(same)) if same else first > last, (ri, rj, n, lo, hi)


def test_verifier_on_one_stride_class_of_many_rows() -> None:
    """Many rows and gaps of one stride, windings far apart and near: the circle sweep against brute force."""
    rng = random.Random(1902)
    tables = []
    for _ in O.seeds(400):
        n = rng.randint(1, 6)
        s = rng.choice((8, 12, 16, 32))
        rows: list[Row] = []
        gaps: list[Row] = []
        for _ in range(rng.randint(2, 9)):
            base = s * rng.randint(0, 3 * n) + 4 * rng.randint(0, s // 4 - 1)
            span = 4 * rng.randint(1, max(1, (s // 4) - 1)) if rng.random() < 0.9 else s + 4
            (gaps if rng.random() < 0.25 else rows).append((base, s, span if len(rows) else min(span, s)))
        if not rows:
            continue
        if rng.random() < 0.3:
            rows = [(b + (n - 1) * s, -s, sp) for b, s_, sp in rows]  # the same class, negative stride
        top = max(max(b, b + (n - 1) * st) + sp for b, st, sp in rows + gaps)
        tables.append(_pad_table(top + rng.choice((0, 4)), n, rows, [g for g in gaps if g[2] <= s]))
    assert O.check_verifier(K.verify, tables) == []
    unsafe = [t for t in tables if not K.verify(t).ok]
    assert 0.2 * len(tables) < len(unsafe) < 0.9 * len(tables)
    assert sum(bool(K.verify(t).by_invariant(4)) for t in tables) > 10 * O.SCALE
    for t in tables:
        _check_report(t, K.verify(t))


@pytest.fixture
def meeting_budgets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The budget of every ``_meeting_pairs`` call verify makes (which path ran, how far it got)."""
    budgets: list[int] = []
    real = Vf._meeting_pairs

    def spy(lo: Any, hi: Any, budget: int) -> Any:
        budgets.append(budget)
        return real(lo, hi, budget)

    monkeypatch.setattr(Vf, "_meeting_pairs", spy)
    return budgets


def test_cross_stride_pairs_found_through_class_hulls(meeting_budgets: list[int]) -> None:
    """Over 2,000,000 meeting row pairs: the verifier goes class pair by class pair (hulls first).

    1,700 stride classes of 50 rows each (all rows of a class meet, 1,225 pairs a class; class
    hulls apart). Row x, of its own stride, sits on block 1 of row 7 of class 5 at its block 0.
    """
    budgets = meeting_budgets
    width = 7400
    rows = [
        K.Segment(c * width + 4 * i, 256 + 4 * c, 4, "g", f"c{c}.{i}") for c in range(1700) for i in range(50)
    ]
    total = 1700 * width + 8000
    assert K.verify(K.SegmentTable(total, 2, tuple(rows))).ok
    assert Vf.MAX_CLASS_PAIRS in budgets  # the class-hull path ran
    x = K.Segment(5 * width + 28 + 276, 4, 4, "g", "x")
    rep = K.verify(K.SegmentTable(total, 2, (*rows, x)))
    (v,) = rep.violations
    assert (v.invariant, v.rows, v.blocks, v.byte_range) == (3, (85000, 257), (0, 1), (37304, 37308))


def test_report_fields_with_no_blocks_or_no_rows() -> None:
    """The early answer (no blocks, or no rows) keeps every field of the report."""
    rows = tuple(K.Segment(4 * i + 2, 16, 8) for i in range(70))  # 70 misaligned rows
    gaps = (K.Segment(0, 16, 4, "", "l", "padding"),)
    rep = K.verify(K.SegmentTable(4096, 0, rows, gaps))
    assert (rep.num_rows, rep.num_blocks, rep.total_bytes, rep.padding_checked) == (70, 0, 4096, True)
    assert len(rep.by_invariant(1)) == 64 and rep.truncated == {1: 6}
    v = rep.violations[0]
    assert v.message == "row 0 (//page): base 2 (must be multiples of 4, span > 0)"
    bad = K.verify(K.SegmentTable(64, 0, (K.Segment(0, 6, 0), K.Segment(8, 16, 2))))
    assert [v.message for v in bad.violations] == [
        "row 0 (//page): stride 6, span 0 is not positive (must be multiples of 4, span > 0)",
        "row 1 (//page): span 2 (must be multiples of 4, span > 0)",
    ]
    none = K.verify(K.SegmentTable(64, 5, ()))
    assert (none.ok, none.num_rows, none.num_blocks, none.total_bytes, none.padding_checked) == (
        True,
        0,
        5,
        64,
        False,
    )
    assert none.truncated == {}


def test_gaps_of_any_size_and_stride() -> None:
    """Gaps of 0-3 bytes (never touched when empty), of the rows' stride or another, against brute force."""
    rng = random.Random(1903)
    tables = []
    for _ in O.seeds(300):
        n = rng.randint(1, 5)
        s = rng.choice((16, 32))
        rows = [
            (4 * rng.randint(0, 3 * s // 4), s, 4 * rng.randint(1, s // 8)) for _ in range(rng.randint(1, 4))
        ]
        gaps = [
            (rng.randint(0, 4 * s), rng.choice((s, s, 0, 8, -s, 1)), rng.choice((0, 1, 2, 3, 4, 8)))
            for _ in range(rng.randint(1, 3))
        ]
        gaps = [(b - (n - 1) * st if st < 0 and b - (n - 1) * st >= 0 else b, st, sp) for b, st, sp in gaps]
        top = max(max(b, b + (n - 1) * st) + sp for b, st, sp in rows + gaps)
        tables.append(_pad_table(top, n, rows, gaps))
    assert O.check_verifier(K.verify, tables) == []
    assert sum(not O.brute_invariants(t)[4] for t in tables) > 20 * O.SCALE
    # an empty gap inside a row is never touched; a one-byte gap inside a row is
    assert K.verify(_pad_table(64, 3, [(0, 16, 16)], [(4, 16, 0)])).ok
    (v,) = K.verify(_pad_table(64, 3, [(0, 16, 16)], [(5, 16, 1)])).by_invariant(4)
    assert v.byte_range == (5, 6)


def test_padding_not_checked_is_not_safe() -> None:
    """5,100 rows of stride 20,500 meet a stride-0 gap; row 7 of block 1 clears it (brute force agrees).

    Expected: a violation of invariant 4, or a refusal (TableError) as for too many cross pairs;
    never ``ok`` with invariant 4 unchecked.
    """
    s = 20_500
    rows = tuple(K.Segment(4 * i, s, 4, "g", f"r{i}") for i in range(5100))
    gap = K.Segment(s + 28, 0, 4, "", "L", "padding")
    t = K.SegmentTable(s + 4 * 5100 + 64, 2, rows, (gap,), True)
    assert [(i, b) for i in (6, 7, 8) for b in (0, 1) if 4 * i + b * s == s + 28] == [(7, 1)]
    # found by mutation testing (issue 19): this gap used to be skipped and the table called SAFE
    with pytest.raises(K.TableError, match="pairs of rows with different strides"):
        K.verify(t)


def test_sorted_set_queries_across_buckets() -> None:
    """Hundreds of arcs active at once, then one short row at a random winding: verdict vs brute force.

    The long rows of the bridge structure above fill the sorted set past several bucket splits;
    a 4-byte row dropped anywhere meets a long row within n - 1 windings or not, and only a
    query that reaches the right bucket finds it.
    """
    rng = random.Random(1904)
    n, s = 2, 64
    rows = []
    for i in range(700):
        rows.append(K.Segment(i * n * s, s, s - 4, "g", f"long{i}"))
        rows.append(K.Segment(i * n * s + s + s - 4, s, 4, "g", f"bridge{i}"))
    total = 700 * n * s + 2 * s
    verdicts = set()
    for _ in O.seeds(40):
        w = rng.randint(0, 700 * n - 1)
        extra = K.Segment(w * s + 4 * rng.randint(0, s // 4 - 1), s, 4, "g", "extra")
        t = K.SegmentTable(total, n, (*rows, extra))
        want = _interval_isolation(t)
        rep = K.verify(t)
        assert rep.ok == (not want), (extra, want[:3])
        assert {r for v in rep.by_invariant(3) for r in v.rows} <= {x for h in want for x in (h[0], h[2])}
        verdicts.add(rep.ok)
    assert verdicts == {True, False}


# ---------------------------------------------------------------- helpers' contracts (issue 19, round 2)
def test_sorted_keys_stay_sorted_with_bounded_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random inserts and removes against a sorted list: every query, and each bucket within ``2*LOAD``.

    The set's purpose is memmoves of O(sqrt) size (a bucket never holds more than ``2*LOAD``
    keys); ``maxes`` is each bucket's last key, which add/remove/iter_from bisect on.
    """
    rng = random.Random(1905)
    for load in (2, 3, 256):
        monkeypatch.setattr(Vf._SortedKeys, "LOAD", load)
        ks = Vf._SortedKeys()
        ref: list[tuple[int, int]] = []
        ops = 3000 if load == 256 else 400
        for step in range(ops):
            if ref and rng.random() < 0.3:
                key = ref.pop(rng.randrange(len(ref)))
                ks.remove(key)
            else:
                key = (rng.randint(-50, 50), step)
                ref.append(key)
                ref.sort()
                ks.add(key)
            assert all(ks.buckets) and [b[-1] for b in ks.buckets] == ks.maxes
            assert max(map(len, ks.buckets), default=0) <= 2 * load
            if step % 7 == 0 or load != 256:
                assert [k for b in ks.buckets for k in b] == ref
                q = (rng.randint(-52, 52), -1)
                assert list(ks.iter_from(q)) == [k for k in ref if k >= q], (load, step, q)
        assert len(ks.buckets) > 2  # the buckets did split (and, with the removes, empty)


def test_pair_counts_with_strides_past_float_precision() -> None:
    """Strides of 2**50 to 2**61: counts and witnesses are floors of exact integer quotients.

    Row j is placed on row i's block b, shifted by -span_j .. span_i (touching, meeting or
    apart); brute force over the few block ids decides.
    """
    rng = random.Random(1906)
    for _ in O.seeds(1500):
        n = rng.randint(2, 5)
        big = 2 ** rng.randint(50, 61) // (n * 4)
        si = 4 * rng.choice((-1, 1)) * rng.randint(big // 2, big)
        sj = rng.choice((4 * rng.choice((-1, 1)) * rng.randint(big // 2, big), si, 0, 4))
        pi, pj = rng.choice((4, 8, 1, abs(si) + 4)), rng.choice((4, 8, 3))
        bi = 2**62 // 2
        b, c = rng.randrange(n), rng.randrange(n)
        ri = (bi, si, pi)
        rj = (bi + b * si - c * sj + rng.choice((-pj, -pj + 1, -1, 0, 1, pi - 1, pi)), sj, pj)
        every = _brute_pairs(ri, rj, n, False)
        p = Vf._Pair(ri, rj, n)
        assert p.count(0, n) == len(every), (ri, rj, n)
        for cross in (True, False):
            pairs = [(x, y) for x, y in every if not cross or x != y]
            got = Vf.pair_witness(ri, rj, n, cross_block=cross)
            assert (got is None) if not pairs else (got in pairs and got[0] == min(x for x, _ in pairs))
    # touching rows whose quotient (T - 1) / T rounds to 1.0 as a float: safe
    t = 2**56
    rows = (K.Segment(8, 4, 4, "g", "a"), K.Segment(t + 4, -t, 4, "g", "b"))
    table = K.SegmentTable(t + 64, 2, rows)
    assert all(O.brute_invariants(table).values()) and K.verify(table).ok
    assert Vf.pair_witness((8, 4, 4), (t + 4, -t, 4), 2, cross_block=True) is None


def test_meeting_pairs_are_exactly_the_meeting_pairs() -> None:
    """``_meeting_pairs``: every ``i < j`` whose ``[lo, hi)`` share a point, once; over budget, the count."""
    import numpy as np

    rng = random.Random(1907)
    for _ in O.seeds(300):
        m = rng.randint(0, 30)
        lo = [rng.randint(0, 40) for _ in range(m)]
        hi = [x + rng.randint(1, 12) for x in lo]
        want = {(i, j) for i in range(m) for j in range(i + 1, m) if max(lo[i], lo[j]) < min(hi[i], hi[j])}
        got = Vf._meeting_pairs(np.array(lo, np.int64), np.array(hi, np.int64), len(want))
        assert got.shape == (len(want), 2) and {(int(a), int(b)) for a, b in got.tolist()} == want
        if want:
            with pytest.raises(Vf._TooMany) as e:
                Vf._meeting_pairs(np.array(lo, np.int64), np.array(hi, np.int64), len(want) - 1)
            assert e.value.count == len(want)


def _extent_pairs(rows: list[Row], n: int) -> set[tuple[int, int]]:
    """Row pairs of different strides whose block ranges' extents share a byte."""

    def ext(r: Row) -> tuple[int, int]:
        return min(r[0], r[0] + (n - 1) * r[1]), max(r[0], r[0] + (n - 1) * r[1]) + r[2]

    return {
        (i, j)
        for i in range(len(rows))
        for j in range(i + 1, len(rows))
        if (rows[i][1] != rows[j][1] or rows[i][1] == 0) and _meet(ext(rows[i]), ext(rows[j]))
    }


def _isolation_pairs(t: K.SegmentTable) -> set[tuple[int, ...]]:
    """Rows ``(a,)`` meeting themselves, ``(a, b)`` each other, at two different blocks (brute force)."""
    n, segs = t.num_blocks, t.segments
    out = set()
    for a in range(len(segs)):
        for b in range(a, len(segs)):
            if any(
                _meet(_iv(_r(segs[a]), x), _iv(_r(segs[b]), y)) for x in range(n) for y in range(n) if x != y
            ):
                out.add((a,) if a == b else (a, b))
    return out


def _check_pairs(t: K.SegmentTable, rep: K.VerifyReport) -> None:
    """Invariant 3 lists each broken row pair once, and all of them (up to the listing limit).

    One exception, by design: a row wider than its stride is reported meeting itself, not
    meeting the other rows of its stride (its table is unsafe either way).
    """
    segs = t.segments
    listed = [tuple(sorted(v.rows)) for v in rep.by_invariant(3)]
    assert len(listed) == len(set(listed)), listed

    def long(r: int) -> bool:
        return segs[r].stride != 0 and segs[r].span > abs(segs[r].stride)

    want = {
        p
        for p in _isolation_pairs(t)
        if len(p) == 1
        or segs[p[0]].stride != segs[p[1]].stride
        or segs[p[0]].stride == 0
        or not (long(p[0]) or long(p[1]))
    }
    if len(want) <= Vf.MAX_PER_INVARIANT:
        assert set(listed) == want and not rep.truncated.get(3)
    else:
        assert set(listed) <= want and len(listed) == Vf.MAX_PER_INVARIANT and rep.truncated[3] >= 1


@pytest.mark.parametrize("hulls", [False, True])
def test_cross_stride_budget_exactly_at_the_limit(
    monkeypatch: pytest.MonkeyPatch, meeting_budgets: list[int], hulls: bool
) -> None:
    """``MAX_CROSS_PAIRS`` meeting cross-stride pairs are decided; one more is refused, and counted.

    Rows of one stride are apart, so every meeting pair is a cross pair. ``hulls``: the
    class-pair path (``MAX_MEETING_PAIRS`` below the meeting pairs), which counts class pair by
    class pair and stops at the first past the budget: one pair per class pair when every
    class has one row.
    """
    if hulls:
        monkeypatch.setattr(Vf, "MAX_MEETING_PAIRS", 0)
    spy = meeting_budgets
    n = 2
    several = [
        (0, 4000, 4),
        (5000, 4000, 4),
        (2000, 4004, 8),
        (3004, 4008, 4),
        (9000, 4008, 4),
        (96, 12000, 4),
    ]
    several += [(6000, -900, 4), (10_000, 0, 4)]
    single = [(40 * i, 400 + 4 * i, 4) for i in range(9)]  # one row per class, every pair meets
    for rows in (several, single):
        t = K.SegmentTable(30_000, n, tuple(K.Segment(*r, "g", f"r{k}") for k, r in enumerate(rows)))
        same = [(i, j) for i, j in _extent_pairs(rows, n) if rows[i][1] == rows[j][1]]
        cross = len(_extent_pairs(rows, n))
        assert not same and cross >= 8
        for limit in (cross, cross - 1, cross - 3):
            monkeypatch.setattr(Vf, "MAX_CROSS_PAIRS", limit)
            spy.clear()
            if limit == cross:
                rep = K.verify(t)
                assert rep.ok == all(O.brute_invariants(t).values())
                _check_report(t, rep)
                _check_pairs(t, rep)
                continue
            with pytest.raises(K.TableError) as e:
                K.verify(t)
            if limit == cross - 1 or not hulls:
                assert e.value.value == cross
            elif rows is single:
                assert e.value.value == limit + 1
            assert e.value.field == "table.segments"
            assert str(e.value).startswith(f"table = {e.value.value} pairs of rows with different strides")
        assert (Vf.MAX_CLASS_PAIRS in spy) == hulls


def _touched_gaps(t: K.SegmentTable) -> set[str]:
    """Layers of the gaps some row clears, at any two blocks (brute force)."""
    n = t.num_blocks
    return {
        p.layer
        for p in t.padding
        if any(_meet(_iv(_r(s), x), _iv(_r(p), y)) for s in t.segments for x in range(n) for y in range(n))
    }


@pytest.mark.parametrize("hulls", [False, True])
def test_every_broken_pair_and_cleared_gap_listed(monkeypatch: pytest.MonkeyPatch, hulls: bool) -> None:
    """Rows and gaps of strides 0, +-1, +-2, +-4, +-8, +-12 and any bytes: the listing against brute force.

    Invariant 3 names every broken row pair once (:func:`_check_pairs`); invariant 4 names every
    gap that some row clears. ``hulls``: cross-stride pairs found class pair by class pair.
    """
    if hulls:
        monkeypatch.setattr(Vf, "MAX_MEETING_PAIRS", 0)
    rng = random.Random(1908 + hulls)
    strides = (0, 1, -1, 2, -2, 4, -4, 8, -8, 12, -12)
    seen = {"3 and 4 hold": 0, "3": 0, "4": 0}
    for _ in O.seeds(250):
        n = rng.randint(1, 5)
        pick = rng.sample(strides, 3)
        rows = []
        for _ in range(rng.randint(1, 5)):
            st = rng.choice(pick) if rng.random() < 0.3 else rng.choice([x for x in pick if x] or [4])
            short = rng.random() < 0.8  # mostly no wider than the stride: safe tables too
            span = (
                rng.randint(1, max(1, abs(st)) if short else 9) if rng.random() < 0.9 else rng.choice((0, -4))
            )
            rows.append((rng.randint(0, 60), st, span))  # a span of 0 or less meets nothing
        gaps = [(rng.randint(0, 60), rng.choice(pick), rng.randint(0, 9)) for _ in range(rng.randint(0, 3))]
        lift = max([0] + [-(b + (n - 1) * st) for b, st, _ in rows + gaps])  # keep every block in bounds
        rows = [(b + lift, st, sp) for b, st, sp in rows]
        gaps = [(b + lift, st, sp) for b, st, sp in gaps]
        t = _pad_table(max(max(b, b + (n - 1) * st) + sp for b, st, sp in rows + gaps), n, rows, gaps)
        rep = K.verify(t)
        assert O.check_verifier(K.verify, [t]) == []
        _check_report(t, rep)
        _check_pairs(t, rep)
        named = {v.message.rsplit("padding of layer ", 1)[1].split("'")[1] for v in rep.by_invariant(4)}
        assert named == _touched_gaps(t), (rows, gaps, n)
        seen["3 and 4 hold"] += not rep.by_invariant(3) and not rep.by_invariant(4)
        seen["3"] += bool(rep.by_invariant(3))
        seen["4"] += bool(rep.by_invariant(4))
    assert min(seen.values()) > 20 * O.SCALE, seen


def test_sweep_finds_each_meeting_pair_once() -> None:
    """``_sweep`` on one stride class: every pair of items meeting at blocks ``|k| <= n-1`` apart, once.

    Items are ``(base, span, id, kind)`` no wider than the stride; ids of rows (kind 0) and gaps
    (kind 1) are numbered independently, as verify passes them. Isolation (``same_kind``): pairs
    of kind-0 items at two different blocks; padding: a row against a gap at any two blocks, the
    row first. Each hit's blocks are a real meeting; ``want`` caps the hits returned.
    """
    rng = random.Random(1909)
    found = 0
    for _ in O.seeds(500):
        s = rng.choice((8, 12, 16))
        n = rng.randint(1, 5)
        same = rng.random() < 0.4
        items = []
        for kind in (0,) if same else (0, 1):
            for i in range(rng.randint(1, 5)):
                items.append((rng.randint(0, 4 * s), rng.randint(1, s), i, kind))
        row_of = {(it[2], it[3]): (it[0], s, it[1]) for it in items}
        want = set()
        for a in items:
            for b in items:
                if same and a[2] < b[2] or not same and (a[3], b[3]) == (0, 1):
                    ra, rb = row_of[a[2], a[3]], row_of[b[2], b[3]]
                    if any(
                        _meet(_iv(ra, x), _iv(rb, y))
                        for x in range(n)
                        for y in range(n)
                        if x != y or not same
                    ):
                        want.add((a[2], b[2]))
        hits = Vf._sweep(items, s, n, same, 10**6)
        pairs = [(min(h[0], h[2]), max(h[0], h[2])) if same else (h[0], h[2]) for h in hits]
        assert sorted(pairs) == sorted(want), (items, s, n, same, hits)
        for ra, ba, rb, bb in hits:
            x, y = row_of[ra, 0], row_of[rb, 0 if same else 1]
            assert 0 <= ba < n and 0 <= bb < n and (ba != bb or not same) and _meet(_iv(x, ba), _iv(y, bb))
        found += len(want) > 1
        for cap in range(1, len(want) + 1):
            assert Vf._sweep(items, s, n, same, cap) == hits[:cap]
    assert found > 100 * O.SCALE


def _cleared_gaps(t: K.SegmentTable) -> set[int]:
    """Brute force: the gaps some row of some block clears (invariant 4), by gap index."""
    n, out = t.num_blocks, set()
    for j, g in enumerate(t.padding):
        for s in t.segments:
            if any(_meet(_iv(_row(s), b), _iv(_row(g), c)) for b in range(n) for c in range(n)):
                out.add(j)
    return out


def _row(s: K.Segment) -> Row:
    return s.base, s.stride, s.span


def test_every_cleared_gap_is_named_when_nothing_is_truncated() -> None:
    """Regression (mutation review): duplicate hits counted toward a class's listing limit made it
    stop early, so a cleared gap went unnamed while the report said nothing was left out."""
    rows = [(40, 16, 12), (0, 16, 12), (20, 16, 4), (60, 16, 4), (28, 16, 4), (0, 16, 12)]
    gaps = [
        (72, 16, 4), (48, 16, 4), (28, 16, 8), (72, 16, 4), (48, 16, 4), (44, 16, 8), (68, 16, 4),
        (60, 16, 8), (52, 16, 8), (16, 16, 4), (36, 16, 4), (16, 16, 8), (44, 16, 4), (16, 16, 8),
        (56, 16, 4), (0, 16, 4), (32, 16, 8), (16, 16, 4), (52, 16, 8), (4, 16, 4), (20, 16, 8),
        (0, 16, 8), (52, 16, 8), (24, 16, 4), (64, 16, 4), (60, 16, 4), (36, 16, 8), (24, 16, 4),
        (20, 16, 8), (4, 16, 8),
    ]  # fmt: skip
    t = _pad_table(328, 2, rows, gaps)
    rep = K.verify(t)
    named = {int(v.message.rsplit("padding of layer 'gap", 1)[1].split("'")[0]) for v in rep.by_invariant(4)}
    assert rep.truncated.get(4, 0) == 0
    assert named == _cleared_gaps(t) and 14 in named


def test_a_row_wider_than_its_stride_clears_a_gap_once() -> None:
    """Regression (mutation review): such a row went through both the stride-class path and the
    pair-by-pair path, so the same violation was listed (and counted) twice."""
    t = _pad_table(40, 2, [(8, 8, 12)], [(24, 8, 8)])
    rep = K.verify(t)
    listed = [(v.rows, v.blocks, v.byte_range, v.message) for v in rep.by_invariant(4)]
    assert len(listed) == len(set(listed)) and len(listed) >= 1
    assert _cleared_gaps(t) == {0}


@pytest.mark.parametrize("seed", range(40))
def test_padding_listing_is_exact_against_brute_force(seed: int) -> None:
    """Random rows and gaps of one or two strides, some rows wider than their stride: the gaps
    named are exactly the cleared ones, each (row, blocks, bytes) once, when nothing is truncated."""
    rng = random.Random(7000 + seed)
    n = rng.randint(2, 4)
    strides = rng.sample([8, 12, 16, -16], rng.randint(1, 2))
    rows = [
        (4 * rng.randint(0, 16), rng.choice(strides), 4 * rng.randint(1, 6)) for _ in range(rng.randint(1, 5))
    ]
    gaps = [
        (4 * rng.randint(0, 16), rng.choice(strides), 4 * rng.randint(1, 3)) for _ in range(rng.randint(1, 6))
    ]
    lo = min(min(b, b + (n - 1) * s) for b, s, _ in rows + gaps)
    shift = -lo if lo < 0 else 0
    rows = [(b + shift, s, p) for b, s, p in rows]
    gaps = [(b + shift, s, p) for b, s, p in gaps]
    total = max(max(b, b + (n - 1) * s) + p for b, s, p in rows + gaps)
    t = _pad_table(total, n, rows, gaps)
    rep = K.verify(t)
    v4 = rep.by_invariant(4)
    listed = [(v.rows, v.blocks, v.byte_range, v.message) for v in v4]
    assert len(listed) == len(set(listed)), listed
    if rep.truncated.get(4, 0) == 0:
        named = {int(v.message.rsplit("padding of layer 'gap", 1)[1].split("'")[0]) for v in v4}
        assert named == _cleared_gaps(t)


def test_padding_listing_full_from_the_same_block_with_a_wide_cluster_left() -> None:
    """A stride class whose same-block hits alone fill the listing, with a cluster wider than
    one stride still to visit: the listing stops there, full, and says more exist."""
    s, n = 4096, 2
    rows = [(0, s, s), (s, s, 4)]  # touching rows: one cluster wider than a stride
    gaps = [(4 * i, s, 4) for i in range(70)]  # all cleared in block 0 by the first row
    rep = K.verify(_pad_table(s * n + 8, n, rows, gaps))
    assert len(rep.by_invariant(4)) == 64 and rep.truncated.get(4, 0) >= 1
