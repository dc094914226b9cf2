"""Exact integer and byte-range arithmetic, in one place (GEOMETRY.md sections 3 and 8).

Every size, offset and extent is a Python int here (never wraps). ``MAX_BYTES`` and
``MAX_BLOCKS`` are the contract's limits; below them, int64 arrays of bases, strides, spans
and extents cannot overflow, which is what lets the rest of kvlayout use NumPy int64.
"""

from __future__ import annotations

import numpy as np

#: Every size, base, stride, span, total and extent must be below this (section 8).
MAX_BYTES = 2**62
#: ``num_blocks`` is at most this (section 8).
MAX_BLOCKS = 2**31 - 1
#: The largest int32: kernels that index in int32 refuse what would pass it.
INT32_MAX = 2**31 - 1


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ``b > 0``, exact for any int ``a``."""
    return -(-a // b)


def round_up(x: int, m: int) -> int:
    """Smallest multiple of ``m`` (> 0) that is ``>= x``."""
    return cdiv(x, m) * m


def extent(base: int, stride: int, span: int, num_blocks: int) -> tuple[int, int]:
    """``[lo, hi)``: the bytes a row reaches over blocks ``[0, num_blocks)`` (``num_blocks >= 1``)."""
    last = base + (num_blocks - 1) * stride
    return min(base, last), max(base, last) + span


def merge_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sort and merge half-open ranges; returns int64 ``[k, 2]``, touching ranges joined."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    if starts.size == 0:
        return np.zeros((0, 2), np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_e = run_end[np.r_[idx[1:] - 1, s.size - 1]]
    return np.stack([s[idx], out_e], axis=1).astype(np.int64)


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*x + b) / m) for x in range(n))`` in O(log m) steps (``m > 0``, ``n >= 0``).

    The Euclid-like reduction of the classic floor-sum identity; lets the verifier count
    overlapping block pairs of two rows without looping over blocks.
    """
    total = 0
    if a < 0 or a >= m:
        total += n * (n - 1) // 2 * (a // m)
        a %= m
    if b < 0 or b >= m:
        total += n * (b // m)
        b %= m
    while True:
        y_max = a * n + b
        if y_max < m:
            return total
        n, b, m, a = y_max // m, y_max % m, a, m
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
