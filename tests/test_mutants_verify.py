"""kvlayout.verify against brute force written here (issue 19 mutation testing).

Oracles enumerate block ids and intervals ``[base + b*stride, + span)`` (GEOMETRY.md section 3);
nothing is computed with the verifier's own arithmetic.
"""

from __future__ import annotations

import importlib
import random

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
        (b, c)
        for b in range(n)
        for c in range(n)
        if (not cross or b != c) and _meet(_iv(ri, b), _iv(rj, c))
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
