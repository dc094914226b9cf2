"""Static verifier: proves the invariants of GEOMETRY.md section 3 for every block id.

Exact and bounded (section 8): all arithmetic is on Python ints or on int64 values that the
table's limits keep below 2**63; time is O(R log R) in the rows R and never depends on
``num_blocks``; memory is O(R).

- Rows with one stride ``s`` form a class. Block ``b`` of a class is its block-0 footprint
  shifted by ``b*s``, so two blocks of one class collide iff two footprint points differ by
  ``k*s`` with ``1 <= |k| <= n-1``. Reduced modulo ``s`` (a circle), each row is one or two
  arcs with a *winding* ``base // s``; a sweep over the circle keeps the windings of the
  arcs covering the current point in a sorted set and asks, as each arc starts, whether
  another winding lies within ``n-1`` of its own. Clusters of rows further apart than
  ``(n-1)*s``, or no wider than ``s``, are decided without the sweep.
- Rows of different strides whose extents meet are decided pair by pair by counting the
  block pairs ``(b, b')`` that overlap with floor sums (no loop over blocks); a table with
  more such pairs than :data:`MAX_CROSS_PAIRS` is refused (an answer, never a wrong one).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .errors import TableError
from .ranges import MAX_BYTES, floor_sum, merge_ranges
from .table import Segment, SegmentTable

#: Violations listed per invariant (the verdict counts all of them).
MAX_PER_INVARIANT = 64
#: Pairs of rows with different strides and meeting extents decided exactly (about 0.2 ms each).
MAX_CROSS_PAIRS = 5_000
#: Meeting pairs of rows enumerated at once (vectorised) before going class pair by class pair.
MAX_MEETING_PAIRS = 2_000_000
#: Pairs of stride classes whose extents meet, looked at before refusing.
MAX_CLASS_PAIRS = 50_000

INVARIANT_NAMES = {
    1: "alignment (base, stride, span multiples of 4; span > 0)",
    2: "in bounds",
    3: "block isolation",
    4: "padding untouched",
}


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which rows, the first offending blocks and bytes."""

    invariant: int
    rows: tuple[int, ...]
    blocks: tuple[int, ...]
    byte_range: tuple[int, int] | None
    message: str

    def to_dict(self) -> dict[str, object]:
        return {
            "invariant": self.invariant,
            "name": INVARIANT_NAMES[self.invariant],
            "rows": list(self.rows),
            "blocks": list(self.blocks),
            "byte_range": list(self.byte_range) if self.byte_range else None,
            "message": self.message,
        }


@dataclass(frozen=True)
class VerifyReport:
    """Verdict for a table: ``ok`` iff no invariant is broken for any block id."""

    num_rows: int
    num_blocks: int
    total_bytes: int
    violations: tuple[Violation, ...]
    padding_checked: bool
    truncated: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_invariant(self, inv: int) -> list[Violation]:
        return [v for v in self.violations if v.invariant == inv]

    def rows_violating(self, inv: int | None = None) -> set[int]:
        return {r for v in self.violations if inv is None or v.invariant == inv for r in v.rows}

    def format(self) -> str:
        verdict = "SAFE" if self.ok else f"UNSAFE ({len(self.violations)} violations)"
        head = f"{self.num_rows} rows, {self.num_blocks} blocks, total_bytes {self.total_bytes}: {verdict}"
        lines = [head]
        for inv in (1, 2, 3, 4):
            if inv == 4 and not self.padding_checked:
                lines.append(
                    "  invariant 4 (padding untouched): not checked, the table carries no layout "
                    "(check the spec instead)"
                )
                continue
            vs = self.by_invariant(inv)
            lines.append(f"  invariant {inv} ({INVARIANT_NAMES[inv]}): {'ok' if not vs else 'BROKEN'}")
            lines.extend(f"    - {v.message}" for v in vs)
            if self.truncated.get(inv):
                lines.append(f"    ... and {self.truncated[inv]} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "num_rows": self.num_rows,
            "num_blocks": self.num_blocks,
            "total_bytes": self.total_bytes,
            "padding_checked": self.padding_checked,
            "violations": [v.to_dict() for v in self.violations],
        }


# --------------------------------------------------------------------------- two rows, any strides
#: (base, stride, span) of one row, Python ints
Row = tuple[int, int, int]


def _switch(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """First ``b`` in ``[lo, hi)`` where a monotone ``pred`` differs from ``pred(lo)``; None if never."""
    if hi - lo <= 1:
        return None
    first = pred(lo)
    if pred(hi - 1) == first:
        return None
    a, e = lo, hi - 1
    while e - a > 1:
        mid = (a + e) // 2
        if pred(mid) == first:
            a = mid
        else:
            e = mid
    return e


def _count_1d(g: int, low: int, high: int, lo: int, hi: int) -> tuple[int, int]:
    """``[first, last]`` of the ``b`` in ``[lo, hi)`` with ``low < b*g < high``."""
    if g == 0:
        return (lo, hi - 1) if low < 0 < high else (lo, lo - 1)
    if g > 0:
        bmin, bmax = low // g + 1, (high - 1) // g
    else:
        bmin, bmax = (-high) // -g + 1, (-low - 1) // -g
    return max(bmin, lo), min(bmax, hi - 1)


class _Pair:
    """Block pairs ``(b, b')`` at which row ``i`` block ``b`` overlaps row ``j`` block ``b'``.

    Overlap iff ``low < b*si + c*t < high`` with ``c`` the other row's block (or ``n-1-c``
    when its stride is positive), so for each ``b`` the ``c`` form one interval whose ends
    are floors of linear functions of ``b``; sums of them are floor sums.
    """

    def __init__(self, ri: Row, rj: Row, n: int) -> None:
        (bi, si, pi), (bj, sj, pj) = ri, rj
        self.n, self.si, self.sj = n, si, sj
        d = bj - bi
        self.low, self.high = d - pi, d + pj  # overlap iff low < b*si - b'*sj < high
        t = -sj
        self.flip = t < 0  # count over c = n-1-b' so that the coefficient of c is positive
        if self.flip:
            self.low, self.high, t = self.low - (n - 1) * t, self.high - (n - 1) * t, -t
        self.t = t

    def c_range(self, b: int) -> tuple[int, int]:
        """``[first, last]`` of the other row's (transformed) blocks overlapping block ``b``."""
        n, t = self.n, self.t
        if t == 0:
            return (0, n - 1) if self.low < b * self.si < self.high else (0, -1)
        return max((self.low - b * self.si) // t + 1, 0), min((self.high - 1 - b * self.si) // t, n - 1)

    def other_block(self, c: int) -> int:
        return self.n - 1 - c if self.flip else c

    def count(self, lo: int, hi: int) -> int:
        """Overlapping ``(b, b')`` with ``b`` in ``[lo, hi)``, ``b'`` in ``[0, n)``."""
        if hi <= lo or self.high - self.low < 2:
            return 0
        n, t, si, low, high = self.n, self.t, self.si, self.low, self.high
        if t == 0:
            first, last = _count_1d(si, low, high, lo, hi)
            return max(0, last - first + 1) * n

        def c_lo(b: int) -> int:
            return (low - b * si) // t + 1

        def c_hi(b: int) -> int:
            return (high - 1 - b * si) // t

        preds = (
            lambda b: c_hi(b) < 0,
            lambda b: c_lo(b) > n - 1,
            lambda b: c_lo(b) <= 0,
            lambda b: c_hi(b) >= n - 1,
        )
        cuts = {lo, hi}
        for p in preds:
            x = _switch(p, lo, hi)
            if x is not None:
                cuts.add(x)
        edges = sorted(cuts)
        total = 0
        for a, e in zip(edges, edges[1:]):
            if c_hi(a) < 0 or c_lo(a) > n - 1:
                continue
            m = e - a
            hi_sum = m * (n - 1) if c_hi(a) >= n - 1 else floor_sum(m, t, -si, high - 1 - a * si)
            lo_sum = 0 if c_lo(a) <= 0 else floor_sum(m, t, -si, low - a * si) + m
            total += hi_sum - lo_sum + m
        return total

    def same_block(self, lo: int, hi: int) -> tuple[int, int]:
        """``[first, last]`` of the ``b`` in ``[lo, hi)`` where both rows overlap in block ``b``."""
        if self.high - self.low < 2:
            return lo, lo - 1
        d_low, d_high = self.low, self.high
        if self.flip:  # undo the shift: same block means b' = b in the original blocks
            d_low, d_high = d_low - (self.n - 1) * self.t, d_high - (self.n - 1) * self.t
        return _count_1d(self.si - self.sj, d_low, d_high, lo, hi)

    def witness(self, cross_block: bool) -> tuple[int, int] | None:
        """The smallest ``b`` (and one ``b'``) with an overlap; ``b' != b`` if ``cross_block``."""

        def found(m: int) -> int:
            c = self.count(0, m)
            if cross_block:
                first, last = self.same_block(0, m)
                c -= max(0, last - first + 1)
            return c

        n = self.n
        if found(n) <= 0:
            return None
        a, e = 0, n  # found(a) == 0 < found(e)
        while e - a > 1:
            mid = (a + e) // 2
            if found(mid) > 0:
                e = mid
            else:
                a = mid
        b = e - 1
        c0, c1 = self.c_range(b)
        for c in range(c0, min(c1, c0 + 1) + 1):
            if not cross_block or self.other_block(c) != b:
                return b, self.other_block(c)
        raise AssertionError("unreachable: counted an overlap without a witness")  # pragma: no cover


def pair_witness(ri: Row, rj: Row, n: int, *, cross_block: bool) -> tuple[int, int] | None:
    """Blocks ``(b, b')`` where row ``ri`` of ``b`` overlaps row ``rj`` of ``b'``, or None.

    ``cross_block``: only ``b != b'`` counts (block isolation); else any blocks (padding).
    Exact for any strides and ``n``; O(log) floor sums and bisections, no loop over blocks.
    """
    if n <= 0 or ri[2] <= 0 or rj[2] <= 0:
        return None
    return _Pair(ri, rj, n).witness(cross_block)


# --------------------------------------------------------------------------- one stride class
class _SortedKeys:
    """A sorted set of tuples in buckets (insert/remove in O(sqrt) memmoves, not O(size))."""

    LOAD = 256

    def __init__(self) -> None:
        self.buckets: list[list[tuple[int, int]]] = []
        self.maxes: list[tuple[int, int]] = []

    def add(self, key: tuple[int, int]) -> None:
        if not self.buckets:
            self.buckets.append([key])
            self.maxes.append(key)
            return
        i = min(bisect.bisect_left(self.maxes, key), len(self.buckets) - 1)
        b = self.buckets[i]
        bisect.insort(b, key)
        if len(b) > 2 * self.LOAD:
            self.buckets[i : i + 1] = [b[: self.LOAD], b[self.LOAD :]]
            self.maxes[i : i + 1] = [b[self.LOAD - 1], b[-1]]
        else:
            self.maxes[i] = b[-1]

    def remove(self, key: tuple[int, int]) -> None:
        i = bisect.bisect_left(self.maxes, key)
        b = self.buckets[i]
        del b[bisect.bisect_left(b, key)]
        if b:
            self.maxes[i] = b[-1]
        else:
            del self.buckets[i]
            del self.maxes[i]

    def iter_from(self, key: tuple[int, int]) -> Iterator[tuple[int, int]]:
        i = bisect.bisect_left(self.maxes, key)
        if i == len(self.buckets):
            return
        yield from self.buckets[i][bisect.bisect_left(self.buckets[i], key) :]
        for b in self.buckets[i + 1 :]:
            yield from b


#: (row a, block of a, row b, block of b): row a's bytes in its block meet row b's in its block
Hit = tuple[int, int, int, int]


def _arcs(base: int, span: int, s: int) -> list[tuple[int, int, int]]:
    """``(start, end, winding)`` arcs of ``[base, base + span)`` on the circle of length ``s``."""
    w, r = divmod(base, s)
    if r + span <= s:
        return [(r, r + span, w)]
    return [(r, s, w), (0, r + span - s, w + 1)]


def _sweep(items: list[tuple[int, int, int, int]], s: int, n: int, same_kind: bool, want: int) -> list[Hit]:
    """Arcs of ``items`` = (base, span, row, kind) that meet at windings ``k`` apart, ``|k| <= n-1``.

    ``same_kind``: hits between items of one kind with ``k != 0`` (isolation); else hits
    between kind 0 and kind 1 with any ``k`` (rows against padding). Blocks are returned in
    the class's own (normalised) numbering: ``(row, k, other_row, 0)``.
    """
    arcs: list[tuple[int, int, int, int, int]] = []  # start, end, winding, row, kind
    for base, span, row, kind in items:
        arcs.extend((a, e, w, row, kind) for a, e, w in _arcs(base, span, s))
    events = sorted([(a[1], 0, k) for k, a in enumerate(arcs)] + [(a[0], 1, k) for k, a in enumerate(arcs)])
    active = (_SortedKeys(), _SortedKeys())
    hits: list[Hit] = []
    seen: set[tuple[int, int]] = set()
    reach = n - 1
    for _, starting, k in events:
        _, _, w, row, kind = arcs[k]
        if not starting:
            active[kind].remove((w, k))
            continue
        other = active[kind] if same_kind else active[1 - kind]
        windows = ((w - reach, w - 1), (w + 1, w + reach)) if same_kind else ((w - reach, w + reach),)
        for lo_w, hi_w in windows:
            for w2, k2 in other.iter_from((lo_w, -1)):
                if w2 > hi_w:
                    break
                row2 = arcs[k2][3]
                pair = (
                    (min(row, row2), max(row, row2))
                    if same_kind
                    else (row, row2)
                    if kind == 0
                    else (row2, row)
                )
                if pair in seen:
                    continue
                seen.add(pair)
                # the arcs meet at this circle point, at windings w (this row) and w2 (the other)
                new_first = w2 > w
                hit = (row, w2 - w, row2, 0) if new_first else (row2, w - w2, row, 0)
                if not same_kind and new_first == (kind == 1):  # rows first, then padding
                    hit = (hit[2], hit[3], hit[0], hit[1])
                hits.append(hit)
                if len(hits) >= want:
                    return hits
        active[kind].add((w, k))
    return hits


def _wide_clusters(base: np.ndarray, end: np.ndarray, gap: int, s: int) -> list[np.ndarray]:
    """Index groups of rows that need the sweep: clusters wider than ``s`` after splitting at gaps >= ``gap``.

    Rows further apart than ``gap = (n-1)*s`` never meet at blocks ``|k| <= n-1``; a cluster no
    wider than ``s`` holds no two points a whole stride apart. Both tests are vectorised.
    """
    order = np.argsort(base, kind="stable")
    b, e = base[order], np.maximum.accumulate(end[order])
    split = (b[1:] - e[:-1] >= gap) if gap < MAX_BYTES else np.zeros(b.size - 1, bool)
    starts = np.r_[0, np.flatnonzero(split) + 1]
    width = np.maximum.reduceat(e, starts) - b[starts]
    ends = np.r_[starts[1:], b.size]
    return [order[a:z] for a, z in zip(starts[width > s].tolist(), ends[width > s].tolist())]


def _class_isolation(
    idx: np.ndarray, base: np.ndarray, span: np.ndarray, s: int, n: int, want: int
) -> list[Hit]:
    """Block-isolation hits among rows ``idx`` of one class (stride ``s > 0``, normalised bases)."""
    hits: list[Hit] = []
    long = span > s
    for r in idx[long].tolist():  # a row wider than its stride meets itself one block later
        hits.append((r, 0, r, 1))
    keep = ~long
    idx, base, span = idx[keep], base[keep], span[keep]
    if idx.size < 1 or len(hits) >= want:
        return hits[:want]
    for grp in _wide_clusters(base, base + span, min((n - 1) * s, MAX_BYTES), s):
        items = [(int(base[g]), int(span[g]), int(idx[g]), 0) for g in grp]
        hits += _sweep(items, s, n, True, want - len(hits))
        if len(hits) >= want:
            break
    return hits


def _class_padding(
    idx: np.ndarray,
    base: np.ndarray,
    span: np.ndarray,
    pidx: np.ndarray,
    pbase: np.ndarray,
    pspan: np.ndarray,
    s: int,
    n: int,
    want: int,
) -> list[Hit]:
    """Rows of one class (no wider than ``s``) clearing gaps of the same class, at any two blocks."""
    if idx.size == 0 or pidx.size == 0:
        return []
    # distinct hits in the order found: the sweep can find a same-block hit again, and a
    # duplicate must not count toward ``want`` (the caller reads ``want`` hits as "more exist")
    hits: dict[Hit, None] = {}
    # the same block: intersect the rows' block-0 footprint with each gap (vectorised)
    u = merge_ranges(base, base + span)
    j = np.searchsorted(u[:, 0], pbase + pspan, side="left") - 1
    meet = np.flatnonzero((j >= 0) & (u[np.maximum(j, 0), 1] > pbase))
    for p in meet[:want].tolist():
        x = max(int(pbase[p]), int(u[j[p], 0]))  # a byte in both the gap and the footprint
        r = int(np.flatnonzero((base <= x) & (x < base + span))[0])
        hits[(int(idx[r]), 0, int(pidx[p]), 0)] = None
    # other blocks: only clusters wider than one stride can reach them
    allb = np.concatenate([base, pbase])
    alle = np.concatenate([base + span, pbase + pspan])
    kind = np.r_[np.zeros(idx.size, np.int64), np.ones(pidx.size, np.int64)]
    ids = np.r_[idx, pidx]
    for grp in _wide_clusters(allb, alle, min((n - 1) * s, MAX_BYTES), s):
        if len(hits) >= want:
            break
        if kind[grp].min() == kind[grp].max():
            continue
        items = [(int(allb[g]), int(alle[g] - allb[g]), int(ids[g]), int(kind[g])) for g in grp]
        hits.update(dict.fromkeys(_sweep(items, s, n, False, want)))  # want of its own: some may repeat
    return list(hits)[:want]


# --------------------------------------------------------------------------- rows of different strides
def _meeting_pairs(lo: np.ndarray, hi: np.ndarray, budget: int) -> np.ndarray:
    """``[k, 2]`` index pairs ``i < j`` whose ``[lo, hi)`` meet; TableError beyond ``budget``."""
    order = np.argsort(lo, kind="stable")
    slo, shi = lo[order], hi[order]
    end = np.searchsorted(slo, shi, side="left")
    pos = np.arange(order.size)
    cnt = np.maximum(end - pos - 1, 0)
    total = int(cnt.sum())
    if total > budget:
        raise _TooMany(total)
    first = np.repeat(pos, cnt)
    offs = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    a, b = order[first], order[first + 1 + offs]
    return np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)


def _pairs_across(
    alo: np.ndarray, ahi: np.ndarray, blo: np.ndarray, bhi: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``(i, j)`` where non-empty ``[alo[i], ahi[i])`` and ``[blo[j], bhi[j])`` meet, in
    O((A + B) log + pairs): ``b`` starting inside ``a``, or ``a`` starting strictly inside ``b``
    (every meeting pair is one of the two, never both). _TooMany beyond ``budget``: pairs within a
    side are neither made nor counted (a fallback that counted them refused 2,000 rows of one stride
    beside one of another; issue 25, fifth pass)."""

    def starts_inside(lo: np.ndarray, hi: np.ndarray, olo: np.ndarray, side: str) -> tuple[np.ndarray, ...]:
        order = np.argsort(olo, kind="stable")
        first = np.searchsorted(olo[order], lo, side=side)  # type: ignore[call-overload]
        cnt = np.maximum(np.searchsorted(olo[order], hi, side="left") - first, 0)
        return order, first, cnt

    ob, fb, cb = starts_inside(alo, ahi, blo, "left")  # b starts in [alo, ahi)
    oa, fa, ca = starts_inside(blo, bhi, alo, "right")  # a starts in (blo, bhi)
    total = int(cb.sum()) + int(ca.sum())
    if total > budget:
        raise _TooMany(total)

    def expand(order: np.ndarray, first: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = int(cnt.sum())
        offs = np.arange(n) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        return np.repeat(np.arange(cnt.size), cnt), order[np.repeat(first, cnt) + offs]

    i1, j1 = expand(ob, fb, cb)
    j2, i2 = expand(oa, fa, ca)
    return np.concatenate([i1, i2]), np.concatenate([j1, j2])


class _TooMany(Exception):
    def __init__(self, count: int) -> None:
        self.count = count


def _cross_candidates(lo: np.ndarray, hi: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """``[k, 2]`` row pairs of different classes whose extents meet (stride-0 rows: own classes)."""
    keys, inv = np.unique(cls, return_inverse=True)
    if keys.size < 2:
        return np.zeros((0, 2), np.int64)
    try:  # few meeting pairs in all (the usual case): take them all, keep those across classes
        pr = _meeting_pairs(lo, hi, MAX_MEETING_PAIRS)
    except _TooMany:
        pass
    else:
        pr = pr[inv[pr[:, 0]] != inv[pr[:, 1]]]
        if len(pr) > MAX_CROSS_PAIRS:
            raise _TooMany(len(pr))
        return pr
    # class hulls first: only rows of classes whose hulls meet can meet
    hlo = np.full(keys.size, np.iinfo(np.int64).max)
    hhi = np.full(keys.size, np.iinfo(np.int64).min)
    np.minimum.at(hlo, inv, lo)
    np.maximum.at(hhi, inv, hi)
    cpairs = _meeting_pairs(hlo, hhi, MAX_CLASS_PAIRS)
    order = np.argsort(inv, kind="stable")
    starts = np.searchsorted(inv[order], np.arange(keys.size + 1))
    out: list[np.ndarray] = []
    total = 0
    for ca, cb in cpairs.tolist():
        ra, rb = order[starts[ca] : starts[ca + 1]], order[starts[cb] : starts[cb + 1]]
        try:  # only pairs across the two classes count (same-stride pairs are the sweep's)
            ia, ib = _pairs_across(lo[ra], hi[ra], lo[rb], hi[rb], MAX_CROSS_PAIRS - total)
        except _TooMany as e:
            raise _TooMany(total + e.count) from None
        a, b = ra[ia], rb[ib]
        total += len(a)
        out.append(np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2), np.int64)


def _cross_gaps(
    keys: np.ndarray,
    span: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    pk: np.ndarray,
    ps: np.ndarray,
    pp: np.ndarray,
    plo: np.ndarray,
    phi: np.ndarray,
) -> np.ndarray:
    """The gaps a row of another sweep meets (a row of another stride, a row wider than the gap's
    stride, any row where the gap is stride-0 or wider than its stride), counted without a pass over
    the rows per gap (quadratic: a 100,000-layer spec took 59 s; issue 25, fourth pass). A table
    with more such (row, gap) pairs than the bound is refused, as for rows of different strides. A gap's
    count is exactly the rows the caller decides pair by pair for it, so their total is the bound's."""
    gaps = np.flatnonzero(pp > 0)
    if not gaps.size or not keys.size:
        return gaps
    count = _meeting(lo, hi, plo[gaps], phi[gaps])  # every live row
    swept = (ps[gaps] != 0) & (pp[gaps] <= np.abs(ps[gaps]))  # gaps whose own class the sweep decides
    narrow = dict(_by_key(keys, np.flatnonzero((keys < MAX_BYTES) & (span <= np.abs(keys)))))
    for k, at in _by_key(pk[gaps], np.flatnonzero(swept)):  # less the narrow rows of the gap's class
        own = narrow.get(k)
        if own is not None:
            count[at] -= _meeting(lo[own], hi[own], plo[gaps[at]], phi[gaps[at]])
    total = int(count.sum())
    if total > MAX_CROSS_PAIRS:
        raise _refuse(total)
    return gaps[count > 0]


# --------------------------------------------------------------------------- the verifier
def _class_keys(stride: np.ndarray) -> np.ndarray:
    """Sweep classes: one per nonzero stride value; stride-0 rows each get their own key."""
    keys = stride.copy()
    zero = np.flatnonzero(stride == 0)
    keys[zero] = MAX_BYTES + zero  # unique, never a real stride
    return keys


def _by_key(keys: np.ndarray, members: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(key, the members with that key)`` for each distinct key of ``keys[members]``, keys ascending,
    members in their given order: one sort, where a mask per key was quadratic in the keys (100,000
    rows of distinct strides took 13.5 s; issue 25, fourth pass)."""
    if not members.size:
        return
    k = keys[members]
    order = np.argsort(k, kind="stable")
    sk = k[order]
    cuts = np.flatnonzero(sk[1:] != sk[:-1]) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, sk.size].tolist(), strict=True):
        yield int(sk[a]), members[order[a:b]]


def _meeting(lo: np.ndarray, hi: np.ndarray, qlo: np.ndarray, qhi: np.ndarray) -> np.ndarray:
    """How many of the non-empty ranges ``[lo, hi)`` meet each non-empty ``[qlo, qhi)``: those starting
    before ``qhi`` less those ending by ``qlo`` (which all start before ``qhi``)."""
    return np.searchsorted(np.sort(lo), qhi, side="left") - np.searchsorted(np.sort(hi), qlo, side="right")


def _normalised(base: np.ndarray, stride: np.ndarray, n: int) -> np.ndarray:
    """Bases after renumbering blocks ``b -> n-1-b`` in negative-stride rows (stride becomes positive)."""
    return np.where(stride < 0, base + (n - 1) * stride, base)


def _to_blocks(b: int, stride: int, n: int) -> int:
    return n - 1 - b if stride < 0 else b


def _rng(s: Segment, b: int) -> tuple[int, int]:
    start = s.base + b * s.stride
    return start, start + s.span


def verify(table: SegmentTable) -> VerifyReport:
    """Prove invariants 1-4 of GEOMETRY.md section 3 for every block id in ``[0, num_blocks)``."""
    if not isinstance(table, SegmentTable):  # verify(spec) read .total_bytes of a KVCacheSpec (pass 34)
        kind = type(table).__name__
        proves = " (verify(kvlayout.plan(spec)) proves a spec's table)"
        hint = proves if kind in ("KVCacheSpec", "Layout") else ""
        msg = f"table type = {kind}: must be a kvlayout.SegmentTable{hint}"
        raise TableError(msg, field="table", value=kind)
    n, total = table.num_blocks, table.total_bytes
    segs = table.segments
    viol: dict[int, list[Violation]] = {1: [], 2: [], 3: [], 4: []}
    dropped: dict[int, int] = {}

    def add(v: Violation) -> None:
        if len(viol[v.invariant]) < MAX_PER_INVARIANT:
            viol[v.invariant].append(v)
        else:
            dropped[v.invariant] = dropped.get(v.invariant, 0) + 1

    def name(r: int) -> str:
        return f"row {r} ({segs[r].label})"

    base, stride, span = table.bases, table.strides, table.spans
    # 1. multiples of 4, span > 0 (vectorised; messages only for the rows that break it)
    for r in np.flatnonzero((base % 4 != 0) | (stride % 4 != 0) | (span % 4 != 0) | (span <= 0)).tolist():
        s = segs[r]
        bad = [f"{k} {v}" for k, v in (("base", s.base), ("stride", s.stride), ("span", s.span)) if v % 4]
        if s.span <= 0:
            bad.append(f"span {s.span} is not positive")
        add(Violation(1, (r,), (), None, f"{name(r)}: {', '.join(bad)} (must be multiples of 4, span > 0)"))
    if n == 0 or not segs:
        return VerifyReport(len(segs), n, total, _flat(viol), table.planned or bool(table.padding), dropped)

    # 2. in bounds, at both ends of the block range (int64 is exact: extents are below 2**62)
    lo = np.minimum(base, base + (n - 1) * stride)
    hi = np.maximum(base, base + (n - 1) * stride) + span
    for r in np.flatnonzero(lo < 0).tolist():
        s = segs[r]
        b = 0 if s.base < 0 else n - 1
        start, _ = _rng(s, b)
        add(
            Violation(
                2,
                (r,),
                (b,),
                (start, min(0, start + s.span)),
                f"{name(r)}: block {b} starts at {start}, {-start} B before the buffer",
            )
        )
    for r in np.flatnonzero(hi > total).tolist():
        s = segs[r]
        if s.stride > 0:
            b_first, b_last = max(0, (total - s.span - s.base) // s.stride + 1), n - 1
        else:
            b_first = b_last = 0
        a, e = _rng(s, b_last)
        add(
            Violation(
                2,
                (r,),
                (b_first, b_last),
                (max(a, total), e),
                f"{name(r)}: block {b_last} ends at {e}, {e - total} B past total_bytes {total}"
                f" (first block out of bounds: {b_first})",
            )
        )

    live = np.flatnonzero(span > 0)  # rows with no bytes meet nothing (invariant 1 reports them)
    nb = _normalised(base, stride, n)
    keys = _class_keys(stride)

    # 3. block isolation: within stride classes by the circle sweep, across classes pair by pair
    if n >= 2:
        hits: list[Hit] = []
        for r in live[stride[live] == 0].tolist():
            hits.append((r, 0, r, 1))
        try:  # first: a table refused for its cross pairs is refused before the classes are swept
            cand = _cross_candidates(lo[live], hi[live], keys[live])
        except _TooMany as e:
            raise _refuse(e.count) from None
        for k, idx in _by_key(keys, live):
            if k >= MAX_BYTES:
                continue
            step = abs(k)
            if idx.size == 1:  # one row meets itself only where wider than its stride, one block on (100,000
                r = int(idx[0])  # one-row classes were swept one by one: 3.4 s, pass 32)
                if span[r] > step:
                    hits.append((r, _to_blocks(0, int(k), n), r, _to_blocks(1, int(k), n)))
                continue
            for ra, ba, rb, bb in _class_isolation(idx, nb[idx], span[idx], step, n, MAX_PER_INVARIANT + 1):
                hits.append((ra, _to_blocks(ba, int(k), n), rb, _to_blocks(bb, int(k), n)))
        for a, b in live[cand].tolist() if len(cand) else []:
            w = pair_witness(_row(segs[a]), _row(segs[b]), n, cross_block=True)
            if w is not None:
                hits.append((a, w[0], b, w[1]))
        for ra, ba, rb, bb in hits:
            if ba > bb:  # say it as "the lower block spills into the higher one"
                ra, ba, rb, bb = rb, bb, ra, ba
            a0, a1 = _rng(segs[ra], ba)
            c0, c1 = _rng(segs[rb], bb)
            ov = (max(a0, c0), min(a1, c1))
            add(
                Violation(
                    3,
                    (ra, rb) if ra != rb else (ra,),
                    (ba, bb),
                    ov,
                    f"{name(ra)} of block {ba} [{a0}, {a1}) spills into {name(rb)} of block {bb} "
                    f"[{c0}, {c1}): bytes [{ov[0]}, {ov[1]}) belong to both",
                )
            )

    # 4. padding untouched, at any two blocks
    if table.padding:
        pad = table.padding
        pb = np.array([p.base for p in pad], np.int64)
        ps = np.array([p.stride for p in pad], np.int64)
        pp = np.array([p.span for p in pad], np.int64)
        pk = np.where(ps == 0, -1, ps)  # stride-0 gaps are decided pair by pair
        phits: list[Hit] = []
        gaps_of = dict(_by_key(pk, np.flatnonzero(pp > 0)))
        pnb = _normalised(pb, ps, n)
        for k, idx in _by_key(keys, live):
            if k >= MAX_BYTES:
                continue
            step = abs(k)
            # rows wider than their stride go pair by pair below (as gaps wider than theirs do):
            # each (row, gap) pair is decided on exactly one path, so listed once
            idx = idx[span[idx] <= step]
            pidx = gaps_of.get(k, np.zeros(0, np.int64))
            pidx = pidx[pp[pidx] <= step]
            for ra, ba, pj, bj in _class_padding(
                idx,
                nb[idx],
                span[idx],
                pidx,
                pnb[pidx],
                pp[pidx],
                step,
                n,
                MAX_PER_INVARIANT + 1,
            ):
                phits.append((ra, _to_blocks(ba, int(k), n), pj, _to_blocks(bj, int(k), n)))
        # gaps of other strides (never made by the planner): pair by pair over meeting extents
        plo = np.minimum(pb, pb + (n - 1) * ps)
        phi = np.maximum(pb, pb + (n - 1) * ps) + pp
        # the (row, gap) pairs below are those _cross_gaps counted against the bound (it refused more)
        for j in _cross_gaps(keys[live], span[live], lo[live], hi[live], pk, ps, pp, plo, phi).tolist():
            wide = pp[j] > abs(int(ps[j]))  # gaps wider than their stride (stride-0 ones too) are not swept
            other = (keys[live] != ps[j]) | wide | (span[live] > abs(int(ps[j])))
            rows = live[(lo[live] < phi[j]) & (plo[j] < hi[live]) & other]
            for a in rows.tolist():
                w = pair_witness(_row(segs[a]), _row(pad[j]), n, cross_block=False)
                if w is not None:
                    phits.append((a, w[0], j, w[1]))
        for i, bi, j, bj in phits:
            a0, a1 = _rng(segs[i], bi)
            c0, c1 = _rng(pad[j], bj)
            ov = (max(a0, c0), min(a1, c1))
            add(
                Violation(
                    4,
                    (i,),
                    (bi, bj),
                    ov,
                    f"{name(i)}: block {bi} clears [{ov[0]}, {ov[1]}), alignment padding of layer "
                    f"{pad[j].layer!r} in block {bj}",
                )
            )
    return VerifyReport(len(segs), n, total, _flat(viol), table.planned or bool(table.padding), dropped)


def _flat(viol: dict[int, list[Violation]]) -> tuple[Violation, ...]:
    return tuple(v for inv in (1, 2, 3, 4) for v in viol[inv])


def _row(s: Segment) -> Row:
    return (s.base, s.stride, s.span)


def _refuse(count: int) -> TableError:
    return TableError(
        f"table = {count} pairs of rows with different strides and meeting extents: kvlayout decides at most "
        f"{MAX_CROSS_PAIRS} such pairs exactly in its time bound (GEOMETRY.md section 8); give overlapping "
        "rows one stride, or split the table",
        field="table.segments",
        value=count,
    )


def overlaps_within_block(table: SegmentTable) -> list[tuple[int, int, int]]:
    """``(i, j, b)`` with ``i < j``: rows that overlap inside the same block ``b`` (first block each).

    Kernels that clear whole rows by DMA and partial rows by read-modify-write need rows that
    are disjoint within every block. Same-stride rows are compared at block 0; rows of other
    strides pair by pair, exactly.
    """
    n = table.num_blocks
    segs = table.segments
    if n == 0 or len(segs) < 2:
        return []
    base, stride, span = table.bases, table.strides, table.spans
    out: list[tuple[int, int, int]] = []
    for _, idx in _by_key(stride, np.flatnonzero(span > 0)):
        order = idx[np.argsort(base[idx], kind="stable")]
        run_end, run_row = None, -1
        for r in order.tolist():
            if run_end is not None and segs[r].base < run_end:
                out.append((min(run_row, r), max(run_row, r), 0))
            if run_end is None or segs[r].base + segs[r].span > run_end:
                run_end, run_row = segs[r].base + segs[r].span, r
    lo = np.minimum(base, base + (n - 1) * stride)
    hi = np.maximum(base, base + (n - 1) * stride) + span
    live = np.flatnonzero(span > 0)
    try:
        cand = _cross_candidates(lo[live], hi[live], stride[live])
    except _TooMany as e:
        raise _refuse(e.count) from None
    for a, b in live[cand].tolist() if len(cand) else []:
        first, last = _Pair(_row(segs[a]), _row(segs[b]), n).same_block(0, n)
        if first <= last:
            out.append((min(a, b), max(a, b), first))
    return sorted(out)


def require_safe(table: SegmentTable) -> VerifyReport:
    """Verify ``table`` and raise :class:`TableError` naming the first violation if unsafe.

    Every kernel-backed zeroer calls this at construction, so no kernel ever runs an
    unproven table.
    """
    report = verify(table)
    if not report.ok:
        first = report.violations[0].message
        raise TableError(f"refusing an unsafe table: {first}", field="table", value=len(report.violations))
    return report


__all__ = [
    "INVARIANT_NAMES",
    "MAX_CROSS_PAIRS",
    "Segment",
    "VerifyReport",
    "Violation",
    "overlaps_within_block",
    "pair_witness",
    "require_safe",
    "verify",
]
