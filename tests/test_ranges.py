"""Exact integer and range helpers (kvlayout/ranges.py) against brute force."""

from __future__ import annotations

import random

import numpy as np

from kvlayout import ranges as R

from . import oracles as O


def test_floor_sum_matches_the_sum() -> None:
    rng = random.Random(19)
    for _ in O.seeds(3000):
        n, m = rng.randint(0, 40), rng.randint(1, 50)
        a, b = rng.randint(-120, 120), rng.randint(-300, 300)
        assert R.floor_sum(n, m, a, b) == sum((a * x + b) // m for x in range(n)), (n, m, a, b)
    n = 2**31 - 1  # large: closed forms, exact Python ints
    assert R.floor_sum(n, 149_760, 3 * 149_760, 0) == 3 * n * (n - 1) // 2
    assert R.floor_sum(n, 149_760, 0, -(2**40)) == n * (-(2**40) // 149_760)
    assert R.floor_sum(n, 2, 1, 0) == (n - 1) ** 2 // 4  # sum of x // 2 over x < n


def test_cdiv_round_up_extent() -> None:
    for x in range(-20, 21):
        for m in range(1, 9):
            assert R.cdiv(x, m) == -(-x // m) == min(q for q in range(-25, 25) if q * m >= x)
            assert R.round_up(x, m) == min(k for k in range(-40, 60) if k % m == 0 and k >= x)
    assert R.round_up(128, 64) == 128 and R.round_up(129, 64) == 192 and R.round_up(0, 576) == 0
    assert R.extent(100, 16, 8, 1) == (100, 108)
    assert R.extent(100, 16, 8, 4) == (100, 156)
    assert R.extent(100, -16, 8, 4) == (52, 108)
    assert R.extent(100, 0, 8, 9) == (100, 108)
    assert (R.MAX_BYTES, R.MAX_BLOCKS) == (2**62, 2**31 - 1)


def test_merge_ranges_matches_brute_force() -> None:
    rng = random.Random(7)
    for _ in O.seeds(500):
        k = rng.randint(0, 8)
        starts = [rng.randint(-20, 60) for _ in range(k)]
        ends = [s + rng.randint(1, 12) for s in starts]
        got = R.merge_ranges(np.array(starts), np.array(ends))
        assert got.dtype == np.int64 and got.shape == (got.shape[0], 2)
        covered = {x for s, e in zip(starts, ends) for x in range(s, e)}
        assert {x for s, e in got.tolist() for x in range(s, e)} == covered
        assert all(a < b for a, b in got.tolist())
        flat = got.reshape(-1).tolist()
        assert flat == sorted(flat) and all(flat[i] < flat[i + 1] for i in range(1, len(flat) - 1, 2))
    empty = R.merge_ranges(np.array([], np.int64), np.array([], np.int64))
    assert empty.shape == (0, 2) and empty.dtype == np.int64
    assert R.merge_ranges([5, 0, 10], [10, 4, 12]).tolist() == [[0, 4], [5, 12]]  # touching ranges join
    assert R.merge_ranges([0, 2], [10, 4]).tolist() == [[0, 10]]  # a range inside another
    assert R.merge_ranges(np.array([2**61], np.uint64), np.array([2**61 + 4], np.uint64)).dtype == np.int64
