"""NumPy reference: the contract's byte set, the in-place zeroer, and poisoned test buffers.

``expected_zeroed`` is the oracle every backend is compared against: the exact union of
``[base + b*stride, + span)`` over rows and block ids (GEOMETRY.md section 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from . import validate
from .backend import Backend, validate_host_buffer
from .errors import LayoutBufferError, TableError, bad_value
from .ranges import extent, merge_ranges
from .table import SegmentTable, check_table

BlockIds = Sequence[int] | np.ndarray


def normalize_block_ids(block_ids: Any, num_blocks: int) -> np.ndarray:
    """Validate a batch of block ids, returned as int64 ``[n]`` (:func:`kvlayout.validate.block_ids`)."""
    return validate.block_ids(block_ids, num_blocks)


def expected_zeroed(table: SegmentTable, block_ids: BlockIds, group: str | None = None) -> np.ndarray:
    """The contract: merged, sorted ``[k, 2]`` byte ranges that zeroing ``block_ids`` of ``group`` clears."""
    table = check_table(table).for_group(group)  # another object: raw AttributeError (issue 25, pass 23)
    ids = np.unique(normalize_block_ids(block_ids, table.num_blocks))
    if ids.size == 0 or len(table) == 0:
        return np.zeros((0, 2), np.int64)
    return union_of_rows(table.bases, table.strides, table.spans, ids)


#: Most (row, id) ranges materialised at once by :func:`union_of_rows` (16 B each, a few copies).
UNION_CHUNK = 1 << 21


def union_of_rows(
    bases: np.ndarray,
    strides: np.ndarray,
    spans: np.ndarray,
    ids: np.ndarray,
    shifts: np.ndarray | None = None,
) -> np.ndarray:
    """Merged ``[k, 2]`` union of ``[base + id * stride + shift, + span)`` over rows and points.

    ``ids`` (with ``shifts``, the same length, default 0) are the points, sorted by
    ``(shift, id)`` and unique. Memory stays O(k + UNION_CHUNK), never O(rows * ids): rows of
    one stride that touch are coalesced first; a row whose span reaches its stride turns a
    run of consecutive ids into one range; the rest is built :data:`UNION_CHUNK` ranges at a
    time and merged as it goes.
    """
    bases, strides, spans = _coalesce_rows(
        np.asarray(bases, np.int64), np.asarray(strides, np.int64), np.asarray(spans, np.int64)
    )
    ids = np.asarray(ids, np.int64)
    shift = np.zeros(ids.size, np.int64) if shifts is None else np.asarray(shifts, np.int64)
    if ids.size == 0 or bases.size == 0:
        return np.zeros((0, 2), np.int64)
    # runs of consecutive ids (same shift): first id, last id, shift
    brk = np.flatnonzero((np.diff(ids) != 1) | (np.diff(shift) != 0)) + 1
    first = ids[np.r_[0, brk]]
    last = ids[np.r_[brk - 1, ids.size - 1]]
    run_shift = shift[np.r_[0, brk]]
    dense = spans >= np.abs(strides)
    acc = _Union()
    for rows, (lo, hi, sh) in ((dense, (first, last, run_shift)), (~dense, (ids, ids, shift))):
        b, st, sp = bases[rows], strides[rows], spans[rows]
        points = lo.size
        per = max(1, UNION_CHUNK // points)  # rows per chunk
        step = min(points, UNION_CHUNK)  # points per chunk
        for r0 in range(0, b.size, per):
            bb, ss, pp = b[r0 : r0 + per, None], st[r0 : r0 + per, None], sp[r0 : r0 + per, None]
            for p0 in range(0, points, step):
                a, e, k = lo[None, p0 : p0 + step], hi[None, p0 : p0 + step], sh[None, p0 : p0 + step]
                start = bb + k + np.where(ss >= 0, a, e) * ss
                end = bb + k + np.where(ss >= 0, e, a) * ss + pp
                acc.add(merge_ranges(start.ravel(), end.ravel()))
    return acc.result()


class _Union:
    """Merged ranges accumulated piece by piece; re-merged whenever the pieces double in size."""

    def __init__(self) -> None:
        self.pieces: list[np.ndarray] = []
        self.size = 0
        self.merged = 0

    def add(self, r: np.ndarray) -> None:
        self.pieces.append(r)
        self.size += len(r)
        if self.size > 2 * self.merged + UNION_CHUNK:
            self.pieces = [self.result()]
            self.size = self.merged = len(self.pieces[0])

    def result(self) -> np.ndarray:
        if not self.pieces:
            return np.zeros((0, 2), np.int64)
        if len(self.pieces) == 1:
            return self.pieces[0]
        r = np.concatenate(self.pieces)
        return merge_ranges(r[:, 0], r[:, 1])


def _coalesce_rows(bases: np.ndarray, strides: np.ndarray, spans: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows of one stride whose per-block ranges touch, joined (the union is unchanged).

    Sorted by (stride, base), a row joins the one before it when it starts at or before that
    row's end: a chain of such rows covers one contiguous range per block.
    """
    order = np.lexsort((bases, strides))
    b, st, ends = bases[order], strides[order], bases[order] + spans[order]
    if b.size < 2:
        return b, st, ends - b
    new = np.ones(b.size, bool)
    new[1:] = (st[1:] != st[:-1]) | (b[1:] > ends[:-1])
    heads = np.flatnonzero(new)
    out_b = b[heads]
    return out_b, st[heads], np.maximum.reduceat(ends, heads) - out_b


def range_count_bound(table: SegmentTable, block_ids: BlockIds, group: str | None = None) -> int:
    """An upper bound on ``len(expected_zeroed(table, block_ids, group))``, in O(rows + ids).

    Lets a caller refuse a contract too large to list before computing it.
    """
    table = check_table(table).for_group(group)
    ids = np.unique(normalize_block_ids(block_ids, table.num_blocks))
    if ids.size == 0 or len(table) == 0:
        return 0
    bases, strides, spans = _coalesce_rows(table.bases, table.strides, table.spans)
    runs = 1 + int(np.count_nonzero(np.diff(ids) != 1))
    dense = int(np.count_nonzero(spans >= np.abs(strides)))
    return dense * runs + (bases.size - dense) * int(ids.size)


def changed_ranges(before: np.ndarray, after: np.ndarray, origin: int = 0) -> np.ndarray:
    """Merged ``[k, 2]`` ranges where two byte buffers differ, shifted by ``-origin``."""
    origin = validate.check_int(LayoutBufferError, "origin", origin, lo=-(2**62))  # as compare_to_ranges
    return _changes(_bytes(before, "before"), _bytes(after, "after"), origin)[0]


def _bytes(x: np.ndarray, name: str = "image") -> np.ndarray:
    """An image's bytes (uint8 ``[n]``); anything that is not plain data refused by name (None, an object
    array: NumPy's raw TypeError before, issue 25, twentieth pass)."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise bad_value(LayoutBufferError, name, type(x).__name__, f"must be an array of bytes ({e})") from e
    if arr.dtype.hasobject or arr.dtype.kind not in "biufcmMV":  # plain data only
        why = "must be an array of plain data (bytes)"
        raise bad_value(LayoutBufferError, name, str(arr.dtype), why, shown=str(arr.dtype))
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _changes(b: np.ndarray, a: np.ndarray, origin: int) -> tuple[np.ndarray, bool]:
    """(merged changed ranges shifted by ``-origin``, whether a changed byte is not zero).

    Window by window (:data:`_CHUNK_WORDS` * 8 bytes), so the masks stay chunk-sized
    whatever the buffer's size.
    """
    if a.shape != b.shape:  # a KVLayoutError naming the field (a bare ValueError before: issue 25)
        why = f"must have as many bytes as before ({b.size})"
        raise bad_value(LayoutBufferError, "after", f"{a.size} B", why, shown=f"{a.size} B")
    window = _CHUNK_WORDS * 8
    parts, nonzero = [], False
    for w0 in range(0, b.size, window):
        aw = a[w0 : w0 + window]
        d = aw != b[w0 : w0 + window]
        if d.any():
            parts.append(mask_to_ranges(d, origin - w0))
            nonzero = nonzero or bool(aw[d].any())
    if not parts:
        return np.zeros((0, 2), np.int64), False
    r = np.concatenate(parts)
    return merge_ranges(r[:, 0], r[:, 1]), nonzero  # joins ranges cut at window edges


def poison_pattern(nbytes: int, seed: int = 0x5EED) -> np.ndarray:
    """``nbytes`` of a splitmix64 byte stream with every zero byte replaced by 0xA5.

    A zeroed byte therefore always differs from the pattern, so comparison finds every
    write. The same function of (index, seed) can be generated on a device.
    """
    nbytes = validate.check_int(LayoutBufferError, "nbytes", nbytes, lo=0)  # unsigned NumPy wrapped
    words = -(-nbytes // 8)
    out = np.empty(words * 8, np.uint8)
    w = out.view(np.uint64)  # native byte order, as the unchunked form had it
    for w0 in range(0, words, _CHUNK_WORDS):  # a few chunk-sized temporaries, never a buffer-sized one
        w1 = min(words, w0 + _CHUNK_WORDS)
        with np.errstate(over="ignore"):
            z = np.arange(w0, w1, dtype=np.uint64) + np.uint64(seed)
            z *= np.uint64(0x9E3779B97F4A7C15)
            z ^= z >> np.uint64(30)
            z *= np.uint64(0xBF58476D1CE4E5B9)
            z ^= z >> np.uint64(27)
            z *= np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
        w[w0:w1] = z
        part = out[w0 * 8 : w1 * 8]
        part[part == 0] = 0xA5
    return out[:nbytes]


#: Words of the poison pattern (and bytes of a comparison) handled at a time.
_CHUNK_WORDS = 1 << 22


def zero_blocks_numpy(
    buf: np.ndarray, table: SegmentTable, block_ids: BlockIds, offset: int = 0, group: str | None = None
) -> None:
    """Zero ``block_ids`` in place in host buffer ``buf`` (layout starting at byte ``offset``).

    Vectorised per row: each row is a strided ``[num_blocks, span]`` byte view and the
    selected block rows are assigned zero in one fancy-indexed store.
    """
    data = validate_host_buffer(buf, check_table(table), offset)
    offset = int(offset)  # checked above: never NumPy arithmetic (an int8 offset overflowed)
    table = table.for_group(group)
    ids = np.unique(normalize_block_ids(block_ids, table.num_blocks))
    if ids.size == 0:
        return
    check_rows_in_bounds(table, data.nbytes - offset)
    brk = np.flatnonzero(np.diff(ids) != 1) + 1
    runs = list(zip(ids[np.r_[0, brk]].tolist(), ids[np.r_[brk - 1, ids.size - 1]].tolist()))
    bases, strides, spans = _coalesce_rows(table.bases, table.strides, table.spans)  # same union
    for base, stride, span in zip(bases.tolist(), strides.tolist(), spans.tolist()):
        if span >= abs(stride) and len(runs) <= _MAX_SLICE_RUNS:
            # consecutive blocks of this row touch: one slice per run of ids
            for a, e in runs:
                lo, hi = (a, e) if stride >= 0 else (e, a)
                data[offset + base + lo * stride : offset + base + hi * stride + span] = 0
            continue
        # a [num_blocks, span] view starting at the row's lowest block (negative strides too)
        low = 0 if stride >= 0 else table.num_blocks - 1
        start = offset + base + low * stride
        view = np.lib.stride_tricks.as_strided(
            data[start:], shape=(table.num_blocks, span), strides=(abs(stride), 1), writeable=True
        )
        view[ids if stride >= 0 else table.num_blocks - 1 - ids] = 0


#: Above this many runs of consecutive ids, a dense row is cleared by one fancy-indexed store.
_MAX_SLICE_RUNS = 64


def check_rows_in_bounds(table: SegmentTable, nbytes: int) -> None:
    """Refuse rows that leave the buffer or clear nothing (the reference never writes out of bounds)."""
    for r, s in enumerate(table.segments):
        lo, hi = extent(s.base, s.stride, s.span, table.num_blocks)
        if lo < 0 or hi > nbytes or s.span <= 0 or s.span % 4:
            raise bad_value(
                TableError,
                f"table.segments[{r}]",
                (s.base, s.stride, s.span),
                f"({s.label}) reaches [{lo}, {hi}): outside the buffer of {nbytes} B, or no whole-word span; "
                "run `kvlayout check`",
            )


class ReferenceBackend(Backend):
    """Backend ``reference``: NumPy on host memory, also the oracle for every other backend."""

    name: ClassVar[str] = "reference"
    extra: ClassVar[str | None] = None

    def __init__(self, table: SegmentTable, buffer: np.ndarray, *, offset: int = 0) -> None:
        validate_host_buffer(buffer, table, offset)
        self.table = table
        self.buffer = buffer
        self.offset = int(offset)  # checked above

    @property
    def mode(self) -> str:
        return "native"

    def zero(self, block_ids: BlockIds, group: str | None = None) -> None:
        zero_blocks_numpy(self.buffer, self.table, block_ids, self.offset, group)

    @classmethod
    def from_host(cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0) -> ReferenceBackend:
        return cls(table, data.copy(), offset=offset)

    def to_host(self) -> np.ndarray:
        return np.asarray(self.buffer).view(np.uint8).reshape(-1).copy()


def ranges_to_mask(ranges: np.ndarray, nbytes: int, origin: int = 0) -> np.ndarray:
    """Boolean ``[nbytes]`` mask of ``ranges`` (given relative to ``origin``)."""
    origin = validate.check_int(LayoutBufferError, "origin", origin, lo=-(2**62))
    mask = np.zeros(nbytes, bool)
    for a, b in (np.asarray(ranges, np.int64).reshape(-1, 2) + origin).tolist():
        mask[max(a, 0) : max(b, 0)] = True
    return mask


def mask_to_ranges(mask: np.ndarray, origin: int = 0) -> np.ndarray:
    """Merged ``[k, 2]`` ranges where ``mask`` is set, shifted by ``-origin``."""
    m = np.asarray(mask, bool)
    if m.size == 0:
        return np.zeros((0, 2), np.int64)
    edges = np.flatnonzero(m[1:] != m[:-1]) + 1
    bounds = np.concatenate([[0], edges, [m.size]])
    starts = bounds[:-1][m[bounds[:-1]]] if bounds.size > 1 else bounds[:0]
    idx = np.searchsorted(bounds, starts)
    ends = bounds[idx + 1]
    return (np.stack([starts, ends], axis=1) - origin).astype(np.int64)


@dataclass(frozen=True)
class ZeroCheck:
    """What a zeroing run changed, against the contract (offsets relative to the layout start)."""

    zeroed: np.ndarray  # [k, 2] every changed range, merged and sorted
    expected: np.ndarray  # [k, 2] the contract's ranges
    extra: np.ndarray  # changed but not in the contract (includes guard bands: < 0 or >= total)
    missing: np.ndarray  # in the contract but unchanged
    not_zero: np.ndarray  # changed, in the contract, but not to zero

    @property
    def matches(self) -> bool:
        return not (len(self.extra) or len(self.missing) or len(self.not_zero))

    @property
    def zeroed_bytes(self) -> int:
        return int((self.zeroed[:, 1] - self.zeroed[:, 0]).sum()) if len(self.zeroed) else 0

    def describe(self, limit: int = 5) -> str:
        """Human summary of the first differing ranges."""
        if self.matches:
            return "matches the contract"
        parts = []
        for label, r in (
            ("written outside the contract", self.extra),
            ("not cleared", self.missing),
            ("changed but not zero", self.not_zero),
        ):
            if len(r):
                shown = ", ".join(f"[{a}, {b})" for a, b in r[:limit].tolist())
                more = f" (+{len(r) - limit} more)" if len(r) > limit else ""
                parts.append(f"{label}: {shown}{more}")
        return "; ".join(parts)


def compare_to_contract(
    before: np.ndarray,
    after: np.ndarray,
    table: SegmentTable,
    block_ids: BlockIds,
    origin: int = 0,
    group: str | None = None,
) -> ZeroCheck:
    """Compare two byte images (guard bands included, layout at ``origin``) with the contract."""
    return compare_to_ranges(
        before, after, expected_zeroed(table, block_ids, group), origin, layout_bytes=table.total_bytes
    )


def compare_to_ranges(
    before: np.ndarray, after: np.ndarray, exp: np.ndarray, origin: int = 0, *, layout_bytes: int = 0
) -> ZeroCheck:
    """Compare two byte images with expected merged ranges ``exp`` (relative to ``origin``, which may lie
    outside the images: they can be a window). Every expected range must lie in the images, and with
    ``layout_bytes`` the whole layout from ``origin``: a truncated image dropped the ranges past its end
    and the check passed on 3 bytes (issue 25, nineteenth pass)."""
    origin = validate.check_int(LayoutBufferError, "origin", origin, lo=-(2**62))  # not uint64: floats
    layout_bytes = validate.check_int(LayoutBufferError, "layout_bytes", layout_bytes, lo=0)
    b, a = _bytes(before, "before"), _bytes(after, "after")
    given = type(exp).__name__  # the caller's type, named in the error (not the array it converts to)
    try:  # [k, 2] integer ranges, start <= end (a malformed list got NumPy's raw error: issue 25, passes
        raw = np.asarray(exp)  # 20 and 21; floats and strings were coerced)
        ok = raw.size == 0 or raw.dtype.kind in "iu" and raw.ndim == 2 and raw.shape[1] == 2
        exp = np.asarray(raw, np.int64)
        ok = ok and bool((exp[:, 0] <= exp[:, 1]).all()) if exp.size else ok
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        why = "must be [k, 2] integer [start, end) ranges (int64)"
        raise bad_value(LayoutBufferError, "expected", given, why)
    exp = exp.reshape(-1, 2)
    lo, hi = (origin, origin + layout_bytes) if layout_bytes else (b.size, 0)  # (b.size, 0): no layout bound
    if exp.size:
        lo, hi = min(lo, origin + int(exp[:, 0].min())), max(hi, origin + int(exp[:, 1].max()))
    if lo < 0 or hi > b.size:
        why = f"must hold bytes [{lo}, {hi}) (the layout at origin {origin} and the ranges expected zeroed)"
        raise bad_value(LayoutBufferError, "before", f"{b.size} B", why, shown=f"{b.size} B")
    zeroed, nonzero = _changes(b, a, origin)
    empty = np.zeros((0, 2), np.int64)
    if zeroed.shape == exp.shape and (zeroed == exp).all() and not nonzero:
        return ZeroCheck(zeroed, exp, empty, empty, empty)  # the common, fast path: chunk-sized memory
    changed = a != b
    emask = ranges_to_mask(exp, b.size, origin)
    return ZeroCheck(
        zeroed=zeroed,
        expected=exp,
        extra=mask_to_ranges(changed & ~emask, origin),
        missing=mask_to_ranges(emask & ~changed, origin),
        not_zero=mask_to_ranges(emask & changed & (a != 0), origin),
    )
