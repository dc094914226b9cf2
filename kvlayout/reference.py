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
from .errors import TableError, bad_value
from .ranges import extent, merge_ranges
from .table import SegmentTable

BlockIds = Sequence[int] | np.ndarray


def normalize_block_ids(block_ids: Any, num_blocks: int) -> np.ndarray:
    """Validate a batch of block ids, returned as int64 ``[n]`` (:func:`kvlayout.validate.block_ids`)."""
    return validate.block_ids(block_ids, num_blocks)


def expected_zeroed(table: SegmentTable, block_ids: BlockIds, group: str | None = None) -> np.ndarray:
    """The contract: merged, sorted ``[k, 2]`` byte ranges that zeroing ``block_ids`` of ``group`` clears."""
    table = table.for_group(group)
    ids = np.unique(normalize_block_ids(block_ids, table.num_blocks))
    if ids.size == 0 or len(table) == 0:
        return np.zeros((0, 2), np.int64)
    starts = (table.bases[:, None] + ids[None, :] * table.strides[:, None]).ravel()
    ends = starts + np.repeat(table.spans, ids.size)
    return merge_ranges(starts, ends)


def changed_ranges(before: np.ndarray, after: np.ndarray, origin: int = 0) -> np.ndarray:
    """Merged ``[k, 2]`` ranges where two byte buffers differ, shifted by ``-origin``."""
    diff = np.asarray(before).reshape(-1).view(np.uint8) != np.asarray(after).reshape(-1).view(np.uint8)
    return mask_to_ranges(diff, origin)


def poison_pattern(nbytes: int, seed: int = 0x5EED) -> np.ndarray:
    """``nbytes`` of a splitmix64 byte stream with every zero byte replaced by 0xA5.

    A zeroed byte therefore always differs from the pattern, so comparison finds every
    write. The same function of (index, seed) can be generated on a device.
    """
    words = -(-nbytes // 8)
    with np.errstate(over="ignore"):
        z = np.arange(words, dtype=np.uint64) + np.uint64(seed)
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    b = z.view(np.uint8)[:nbytes].copy()
    b[b == 0] = 0xA5
    return b


def zero_blocks_numpy(
    buf: np.ndarray, table: SegmentTable, block_ids: BlockIds, offset: int = 0, group: str | None = None
) -> None:
    """Zero ``block_ids`` in place in host buffer ``buf`` (layout starting at byte ``offset``).

    Vectorised per row: each row is a strided ``[num_blocks, span]`` byte view and the
    selected block rows are assigned zero in one fancy-indexed store.
    """
    data = validate_host_buffer(buf, table, offset)
    table = table.for_group(group)
    ids = np.unique(normalize_block_ids(block_ids, table.num_blocks))
    if ids.size == 0:
        return
    _check_rows_in_bounds(table, data.nbytes - offset)
    for s in table.segments:
        # a [num_blocks, span] view starting at the row's lowest block (negative strides too)
        low = 0 if s.stride >= 0 else table.num_blocks - 1
        start = offset + s.base + low * s.stride
        view = np.lib.stride_tricks.as_strided(
            data[start:], shape=(table.num_blocks, s.span), strides=(abs(s.stride), 1), writeable=True
        )
        view[ids if s.stride >= 0 else table.num_blocks - 1 - ids] = 0


def _check_rows_in_bounds(table: SegmentTable, nbytes: int) -> None:
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
        self.offset = offset

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
    return compare_to_ranges(before, after, expected_zeroed(table, block_ids, group), origin)


def compare_to_ranges(before: np.ndarray, after: np.ndarray, exp: np.ndarray, origin: int = 0) -> ZeroCheck:
    """Compare two byte images with expected merged ranges ``exp`` (relative to ``origin``)."""
    b = np.asarray(before).reshape(-1).view(np.uint8)
    a = np.asarray(after).reshape(-1).view(np.uint8)
    if a.shape != b.shape:
        raise ValueError(f"before has {b.size} bytes, after {a.size}")
    changed = a != b
    zeroed = mask_to_ranges(changed, origin)
    empty = np.zeros((0, 2), np.int64)
    if zeroed.shape == exp.shape and (zeroed == exp).all() and not a[changed].any():
        return ZeroCheck(zeroed, exp, empty, empty, empty)  # the common, fast path
    emask = ranges_to_mask(exp, b.size, origin)
    return ZeroCheck(
        zeroed=zeroed,
        expected=exp,
        extra=mask_to_ranges(changed & ~emask, origin),
        missing=mask_to_ranges(emask & ~changed, origin),
        not_zero=mask_to_ranges(emask & changed & (a != 0), origin),
    )
