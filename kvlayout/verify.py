"""Static verifier: proves the invariants of GEOMETRY.md section 3 for every block id.

Nothing here loops over blocks for the tables the planner makes. Each pair of rows with the
same stride is decided in closed form: blocks ``b`` and ``b' = b + k`` of rows ``i`` and
``j`` overlap iff ``d + k*stride`` lies in ``(-span_j, span_i)`` with ``d = base_j - base_i``,
an interval of integers ``k`` that is computed directly. Pairs of rows whose extents are
disjoint are dismissed first. Only pairs with *different* strides and overlapping extents
(never produced by the planner, possible in a hand-written table) fall back to a vectorised
scan over the blocks of one row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .table import Segment, SegmentTable

_CHUNK = 1 << 20
_MAX_PER_INVARIANT = 64

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
        head = (
            f"{self.num_rows} rows, {self.num_blocks} blocks, total_bytes {self.total_bytes}: "
            + ("SAFE" if self.ok else f"UNSAFE ({len(self.violations)} violations)")
        )
        lines = [head]
        for inv in (1, 2, 3, 4):
            if inv == 4 and not self.padding_checked:
                lines.append("  invariant 4 (padding untouched): not checked, the table carries no layout (check the spec instead)")
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


def _fdiv(a: np.ndarray, b: np.ndarray | np.integer) -> np.ndarray:
    return np.floor_divide(a, b)


def _cdiv(a: np.ndarray, b: np.ndarray | np.integer) -> np.ndarray:
    return -np.floor_divide(-a, b)


def _pair_overlaps(
    a: tuple[np.ndarray, np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray, np.ndarray],
    n: int,
    *,
    same_set: bool,
    allow_same_block: bool,
) -> list[tuple[int, int, int, int]]:
    """All row pairs (i of a, j of b) whose blocks overlap, each with one witness (bi, bj).

    With ``same_set`` only ``i <= j`` is considered. With ``allow_same_block=False`` the
    witness must have ``bi != bj`` (block isolation); otherwise any blocks count (padding).
    """
    ab, as_, asp = a
    bb, bs, bsp = b
    if len(ab) == 0 or len(bb) == 0 or n == 0:
        return []
    if same_set:
        ii, jj = np.triu_indices(len(ab))
    else:
        ii, jj = (x.ravel() for x in np.meshgrid(np.arange(len(ab)), np.arange(len(bb)), indexing="ij"))
    last_i, last_j = ab[ii] + (n - 1) * as_[ii], bb[jj] + (n - 1) * bs[jj]
    lo_i, hi_i = np.minimum(ab[ii], last_i), np.maximum(ab[ii], last_i) + asp[ii]
    lo_j, hi_j = np.minimum(bb[jj], last_j), np.maximum(bb[jj], last_j) + bsp[jj]
    cand = (lo_i < hi_j) & (lo_j < hi_i)
    if not allow_same_block and n < 2:
        return []
    ii, jj = ii[cand], jj[cand]
    si, sj = as_[ii], bs[jj]
    d = bb[jj] - ab[ii]
    spi, spj = asp[ii], bsp[jj]
    out: list[tuple[int, int, int, int]] = []

    eq = si == sj
    # stride 0 on both rows: the same bytes for every block.
    z = eq & (si == 0)
    hit = z & (-spj < d) & (d < spi)
    for i, j in zip(ii[hit], jj[hit]):
        out.append((int(i), int(j), 0, 0 if allow_same_block else 1))
    # equal positive strides: closed form in k = bj - bi.
    e = eq & (si > 0)
    ei, ej, es, ed, espi, espj = ii[e], jj[e], si[e], d[e], spi[e], spj[e]
    kmin = np.maximum(_fdiv(-espj - ed, es) + 1, -(n - 1))
    kmax = np.minimum(_cdiv(espi - ed, es) - 1, n - 1)
    if allow_same_block:
        k = np.clip(0, kmin, kmax)
        ok = kmin <= kmax
    else:
        kpos = np.maximum(kmin, 1)
        kneg = np.minimum(kmax, -1)
        has_pos = kpos <= kmax
        has_neg = kneg >= kmin
        k = np.where(has_pos, kpos, kneg)
        ok = has_pos | has_neg
    for i, j, kk in zip(ei[ok], ej[ok], k[ok]):
        kk = int(kk)
        out.append((int(i), int(j), max(0, -kk), max(0, kk)))
    # different or negative strides: vectorised scan over the blocks of one row.
    rest = ~(z | e)
    for i, j in zip(ii[rest], jj[rest]):
        w = _scan_pair(int(ab[i]), int(as_[i]), int(asp[i]), int(bb[j]), int(bs[j]), int(bsp[j]), n, allow_same_block)
        if w is not None:
            out.append((int(i), int(j), w[0], w[1]))
    return out


def _scan_pair(bi: int, si: int, pi: int, bj: int, sj: int, pj: int, n: int, allow_same: bool) -> tuple[int, int] | None:
    """First (b, b') with overlapping blocks, scanning b over row i in chunks."""
    swapped = False
    if sj == 0:  # the inner row must move with its block id: swap roles
        bi, si, pi, bj, sj, pj = bj, sj, pj, bi, si, pi
        swapped = True
    flip = sj < 0  # walk row j backwards: b' -> n-1-b' has stride -sj
    if flip:
        bj, sj = bj + (n - 1) * sj, -sj
    for start in range(0, n, _CHUNK):
        blk = np.arange(start, min(n, start + _CHUNK), dtype=np.int64)
        p = bi + blk * si
        lo = np.maximum(_fdiv(p - pj - bj, np.int64(sj)) + 1, 0)
        hi = np.minimum(_cdiv(p + pi - bj, np.int64(sj)) - 1, n - 1)
        if flip:
            lo, hi = n - 1 - hi, n - 1 - lo
        ok = lo <= hi
        if not allow_same:
            ok &= ~((lo == hi) & (lo == blk))
        idx = np.flatnonzero(ok)
        if idx.size:
            b0 = int(blk[idx[0]])
            l0 = int(lo[idx[0]])
            b1 = l0 if (allow_same or l0 != b0) else l0 + 1
            return (b1, b0) if swapped else (b0, b1)
    return None


def _rng(base: int, stride: int, span: int, b: int) -> tuple[int, int]:
    s = base + b * stride
    return s, s + span


def verify(table: SegmentTable) -> VerifyReport:
    """Prove invariants 1-4 of GEOMETRY.md section 3 for every block id in ``[0, num_blocks)``."""
    n, total = table.num_blocks, table.total_bytes
    segs = table.segments
    viol: dict[int, list[Violation]] = {1: [], 2: [], 3: [], 4: []}
    dropped: dict[int, int] = {}

    def add(v: Violation) -> None:
        if len(viol[v.invariant]) < _MAX_PER_INVARIANT:
            viol[v.invariant].append(v)
        else:
            dropped[v.invariant] = dropped.get(v.invariant, 0) + 1

    def name(r: int) -> str:
        return f"row {r} ({segs[r].label})"

    # 1. multiples of 4, span > 0
    for r, s in enumerate(segs):
        bad = [f"{k} {v}" for k, v in (("base", s.base), ("stride", s.stride), ("span", s.span)) if v % 4]
        if s.span <= 0:
            bad.append(f"span {s.span} is not positive")
        if bad:
            add(Violation(1, (r,), (), None, f"{name(r)}: {', '.join(bad)} (must be multiples of 4, span > 0)"))

    base, stride, span = table.bases, table.strides, table.spans
    if n > 0 and len(segs):
        # 2. in bounds, at both ends of the block range
        first = np.minimum(base, base + (n - 1) * stride)
        last_end = np.maximum(base, base + (n - 1) * stride) + span
        for r in np.flatnonzero(first < 0).tolist():
            s = segs[r]
            b = 0 if s.base < 0 else n - 1
            lo, hi = _rng(s.base, s.stride, s.span, b)
            add(Violation(2, (int(r),), (b,), (lo, hi), f"{name(int(r))}: block {b} starts at {lo}, {-lo} B before the buffer"))
        for r in np.flatnonzero(last_end > total).tolist():
            s = segs[r]
            if s.stride > 0:
                b_first = max(0, (total - s.span - s.base) // s.stride + 1)
                b_last = n - 1
            elif s.stride < 0:
                b_first, b_last = 0, 0
            else:
                b_first = b_last = 0
            lo, hi = _rng(s.base, s.stride, s.span, b_last)
            add(
                Violation(
                    2,
                    (int(r),),
                    (b_first, b_last),
                    (max(lo, total), hi),
                    f"{name(int(r))}: block {b_last} ends at {hi}, {hi - total} B past total_bytes {total}"
                    f" (first block out of bounds: {b_first})",
                )
            )
        # 3. block isolation over all pairs of rows, a row with itself included
        for i, j, bi_r, bj_r in _pair_overlaps((base, stride, span), (base, stride, span), n, same_set=True, allow_same_block=False):
            a0, a1 = _rng(segs[i].base, segs[i].stride, segs[i].span, bi_r)
            c0, c1 = _rng(segs[j].base, segs[j].stride, segs[j].span, bj_r)
            ov = (max(a0, c0), min(a1, c1))
            if bi_r > bj_r:  # say it as "the lower block spills into the higher one"
                i, j, bi_r, bj_r, a0, a1, c0, c1 = j, i, bj_r, bi_r, c0, c1, a0, a1
            add(
                Violation(
                    3,
                    (i, j) if i != j else (i,),
                    (bi_r, bj_r),
                    ov,
                    f"{name(i)} of block {bi_r} [{a0}, {a1}) spills into {name(j)} of block {bj_r} "
                    f"[{c0}, {c1}): bytes [{ov[0]}, {ov[1]}) belong to both",
                )
            )
        # 4. padding untouched
        if table.padding:
            pb = np.array([p.base for p in table.padding], np.int64)
            ps = np.array([p.stride for p in table.padding], np.int64)
            pp = np.array([p.span for p in table.padding], np.int64)
            hits = _pair_overlaps((base, stride, span), (pb, ps, pp), n, same_set=False, allow_same_block=True)
            for i, j, bi_r, bj_r in hits:
                a0, a1 = _rng(segs[i].base, segs[i].stride, segs[i].span, bi_r)
                pad = table.padding[j]
                c0, c1 = _rng(pad.base, pad.stride, pad.span, bj_r)
                ov = (max(a0, c0), min(a1, c1))
                add(
                    Violation(
                        4,
                        (i,),
                        (bi_r, bj_r),
                        ov,
                        f"{name(i)}: block {bi_r} clears [{ov[0]}, {ov[1]}), alignment padding of layer "
                        f"{pad.layer!r} in block {bj_r}",
                    )
                )

    flat = tuple(v for inv in (1, 2, 3, 4) for v in viol[inv])
    return VerifyReport(len(segs), n, total, flat, table.planned or bool(table.padding), dropped)


def require_safe(table: SegmentTable) -> VerifyReport:
    """Verify ``table`` and raise :class:`TableError` naming the first violation if unsafe.

    Every kernel-backed zeroer calls this at construction, so no kernel ever runs an
    unproven table.
    """
    from .errors import TableError

    report = verify(table)
    if not report.ok:
        raise TableError(f"refusing an unsafe table: {report.violations[0].message}", field="table", value=len(report.violations))
    return report


__all__ = ["require_safe", "Violation", "VerifyReport", "verify", "INVARIANT_NAMES", "Segment"]
