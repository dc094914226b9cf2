"""kvlayout.reference's chunked forms (session 16): the union of rows built a chunk at a time, rows of one
stride coalesced, runs of ids cleared by slices, the range-count bound, buffers compared window by window
and the poison pattern made a chunk at a time; and the ``nbytes`` / ``origin`` checks.

The chunk sizes are made tiny here (monkeypatched), so every chunk edge is crossed on small inputs; every
expectation comes from byte sets built here, row by row and id by id, never from the library.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout import reference as R
from kvlayout.errors import LayoutBufferError, TableError
from kvlayout.testing import random_safe_table
from tests.test_mutants_reference import _ranges

M64 = 2**64 - 1


def _union(
    rows: list[tuple[int, int, int]], ids: list[int], shifts: list[int] | None = None
) -> list[list[int]]:
    shifts = [0] * len(ids) if shifts is None else shifts
    return _ranges({x for b, k in zip(ids, shifts) for base, st, sp in rows
                    for x in range(base + b * st + k, base + b * st + k + sp)})


def _random_rows(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    rows = []
    for _ in range(rng.randint(1, 6)):
        stride = rng.choice((0, 4, 8, 12, 16, 24, -8, -16, 64))
        span = rng.choice((4, 8, 12, 16, 20, 32))
        rows.append((rng.randrange(0, 64, 4) + (abs(stride) * n if stride < 0 else 0), stride, span))
    return rows


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 21])
def test_union_of_rows_against_byte_sets(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(R, "UNION_CHUNK", chunk)
    rng = random.Random(chunk)
    for _ in range(60):
        n = rng.randint(1, 12)
        rows = _random_rows(rng, n)
        ids = sorted(rng.sample(range(n), rng.randint(1, n)))
        got = R.union_of_rows(*(np.array(c, np.int64) for c in zip(*rows)), np.array(ids, np.int64))
        assert got.dtype == np.int64 and got.tolist() == _union(rows, ids), (rows, ids, chunk)


@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 21])
def test_union_of_rows_with_shifts(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(R, "UNION_CHUNK", chunk)
    rng = random.Random(100 + chunk)
    for _ in range(40):
        n = rng.randint(1, 8)
        rows = _random_rows(rng, n)
        pts = sorted({(rng.choice((0, 0, 4, 1000)), rng.randrange(n)) for _ in range(rng.randint(1, 10))})
        shifts, ids = [p[0] for p in pts], [p[1] for p in pts]
        got = R.union_of_rows(*(np.array(c, np.int64) for c in zip(*rows)), np.array(ids), np.array(shifts))
        assert got.tolist() == _union(rows, ids, shifts), (rows, pts, chunk)


def _u(bases: list[int], strides: list[int], spans: list[int], ids: list[int], shifts: object = None) -> Any:
    return R.union_of_rows(np.array(bases), np.array(strides), np.array(spans), np.array(ids, np.int64),
                           None if shifts is None else np.array(shifts)).tolist()


def test_union_of_rows_edges() -> None:
    one = np.array([0], np.int64)
    none = R.union_of_rows(one, np.array([8]), np.array([4]), np.zeros(0, np.int64))
    assert none.shape == (0, 2) and none.dtype == np.int64
    empty = np.zeros(0, np.int64)
    none = R.union_of_rows(empty, empty, empty, np.array([1]))
    assert none.shape == (0, 2) and none.dtype == np.int64
    # consecutive ids under shifts one apart are two runs, not one
    assert _u([0], [8], [8], [0, 1], [0, 1]) == [[0, 8], [9, 17]]
    # a dense row (span = stride) over a run of ids is one range; a sparse one a range per id
    assert _u([0], [8], [8], [2, 3, 4, 6]) == [[16, 40], [48, 56]]
    assert _u([0], [8], [4], [2, 3]) == [[16, 20], [24, 28]]
    # a negative dense stride: the run's last id is its lowest range
    assert _u([64], [-8], [8], [1, 2]) == [[48, 64]]
    # shifts split runs: the same ids under two shifts
    assert _u([0], [8], [8], [0, 1, 0, 1], [0, 0, 100, 100]) == [[0, 16], [100, 116]]


def test_union_accumulator_remerges_as_it_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "UNION_CHUNK", 2)
    acc = R._Union()
    assert acc.result().shape == (0, 2) and acc.result().dtype == np.int64
    pieces = [[[0, 4]], [[8, 12]], [[4, 8]], [[20, 24]], [[12, 16], [24, 28]], [[40, 44]]]
    for p in pieces:
        acc.add(np.array(p, np.int64))
        assert acc.size == sum(len(x) for x in acc.pieces)
    assert acc.result().tolist() == [[0, 16], [20, 28], [40, 44]]
    assert len(acc.pieces) < len(pieces)  # merged on the way (the pieces doubled past the chunk)
    single = R._Union()
    single.add(np.array([[8, 12], [0, 4]], np.int64))
    assert single.result().tolist() == [[8, 12], [0, 4]]  # one piece is returned as it is
    assert single.size == 2 and single.merged == 0


def test_coalesce_rows_joins_touching_rows_of_one_stride() -> None:
    b, st, sp = R._coalesce_rows(
        np.array([8, 0, 20, 4, 100]), np.array([64, 64, 64, 32, 64]), np.array([8, 8, 4, 4, 4])
    )
    got = sorted(zip(b.tolist(), st.tolist(), sp.tolist()))
    assert got == [(0, 64, 16), (4, 32, 4), (20, 64, 4), (100, 64, 4)]
    two = R._coalesce_rows(np.array([8, 0]), np.array([64, 64]), np.array([8, 8]))  # two rows that touch
    assert [x.tolist() for x in two] == [[0], [64], [16]]
    pair = K.SegmentTable(256, 4, (K.Segment(0, 64, 8), K.Segment(8, 64, 8)))  # one range per id, not two
    assert R.range_count_bound(pair, [0, 2]) == 2 == len(R.expected_zeroed(pair, [0, 2]))
    one = R._coalesce_rows(np.array([12]), np.array([8]), np.array([4]))
    assert [x.tolist() for x in one] == [[12], [8], [4]]
    # a row inside an earlier longer one: the chain keeps the longer end; a row is compared with the
    # one just before it only (the next one starts past that one's end: a new row, the union the same)
    b, st, sp = R._coalesce_rows(np.array([0, 4, 6]), np.array([64, 64, 64]), np.array([16, 4, 4]))
    assert (b.tolist(), st.tolist(), sp.tolist()) == ([0], [64], [16])
    b, st, sp = R._coalesce_rows(np.array([0, 4, 16]), np.array([64, 64, 64]), np.array([16, 4, 4]))
    assert (b.tolist(), st.tolist(), sp.tolist()) == ([0, 16], [64, 64], [16, 4])


def test_range_count_bound_is_exact_where_rows_do_not_merge() -> None:
    sparse = K.SegmentTable(256, 8, (K.Segment(0, 32, 4), K.Segment(8, 32, 4)))  # two rows, never touching
    dense = K.SegmentTable(256, 8, (K.Segment(0, 32, 32),))  # consecutive blocks touch
    for ids, runs in (([1, 2, 3], 1), ([1, 3, 5], 3), ([0, 1, 4, 5, 7], 3), ([2, 2, 3], 1)):
        n = len(set(ids))
        assert R.range_count_bound(sparse, ids) == 2 * n == len(R.expected_zeroed(sparse, ids))
        assert R.range_count_bound(dense, ids) == runs == len(R.expected_zeroed(dense, ids))
    assert R.range_count_bound(sparse, []) == 0 and R.range_count_bound(dense, []) == 0  # no ids: no range
    assert R.range_count_bound(K.SegmentTable(64, 2, ()), [1]) == 0
    rows = (K.Segment(0, 32, 4, "g"), K.Segment(8, 32, 4, "h"), K.Segment(16, 32, 4, "h"))
    groups = K.SegmentTable(256, 8, rows)
    assert R.range_count_bound(groups, [1, 2], "h") == 4 and R.range_count_bound(groups, [1, 2], "g") == 2
    rng = random.Random(5)
    for _ in range(50):
        t = random_safe_table(rng.randrange(10**6))
        ids = rng.sample(range(t.num_blocks), rng.randint(0, t.num_blocks))
        assert R.range_count_bound(t, ids) >= len(R.expected_zeroed(t, ids))


@pytest.mark.parametrize("words", [1, 2, 3, 1 << 22])
def test_changes_window_by_window(monkeypatch: pytest.MonkeyPatch, words: int) -> None:
    monkeypatch.setattr(R, "_CHUNK_WORDS", words)
    rng = np.random.default_rng(words)
    for _ in range(30):
        n = int(rng.integers(1, 100))
        before = rng.integers(1, 256, n, dtype=np.uint8)
        after = before.copy()
        hit = rng.random(n) < 0.3
        after[hit] = 0
        if rng.random() < 0.5 and n:
            after[int(rng.integers(n))] ^= 0x5A  # a byte changed to something else
        origin = int(rng.integers(-8, 8))
        want = [[a - origin, b - origin] for a, b in _ranges(set(np.flatnonzero(after != before).tolist()))]
        assert R.changed_ranges(before, after, origin).tolist() == want
        ranges, nonzero = R._changes(before, after, origin)
        assert ranges.tolist() == want and nonzero is bool((after[after != before] != 0).any())
    with pytest.raises(LayoutBufferError, match=r"^after = 8 B: must have as many bytes as before \(4\)$"):
        R.changed_ranges(np.zeros(4, np.uint8), np.zeros(8, np.uint8))
    same = np.ones(24, np.uint8)
    none, nonzero = R._changes(same, same.copy(), 0)
    assert none.shape == (0, 2) and none.dtype == np.int64 and nonzero is False


@pytest.mark.parametrize("words", [1, 3])
def test_compare_to_ranges_on_small_windows(monkeypatch: pytest.MonkeyPatch, words: int) -> None:
    monkeypatch.setattr(R, "_CHUNK_WORDS", words)
    before = np.full(64, 9, np.uint8)
    after = before.copy()
    after[8:40] = 0
    ok = R.compare_to_ranges(before, after, np.array([[0, 32]]), origin=8)
    assert ok.matches and ok.zeroed.tolist() == [[0, 32]]
    after[20] = 7  # changed, in the contract, not zero: the slow path names it
    bad = R.compare_to_ranges(before, after, np.array([[0, 32]]), origin=8)
    assert not bad.matches and bad.not_zero.tolist() == [[12, 13]] and bad.zeroed.tolist() == [[0, 32]]


@pytest.mark.parametrize("bad", [1.5, "8", -(2**62) - 1, True])
def test_origin_must_be_an_integer(bad: object) -> None:
    img = np.zeros(8, np.uint8)
    for call in (lambda: R.ranges_to_mask(np.zeros((0, 2)), 8, bad),  # type: ignore[arg-type]
                 lambda: R.compare_to_ranges(img, img, np.zeros((0, 2)), bad)):  # type: ignore[arg-type]
        with pytest.raises(LayoutBufferError) as e:
            call()
        assert e.value.field == "origin"
    assert R.ranges_to_mask(np.array([[0, 2]]), 4, np.int64(1)).tolist() == [False, True, True, False]
    assert R.ranges_to_mask(np.array([[0, 2]]), 4, -(2**62)).tolist() == [False] * 4
    for origin in (-1000, -(2**62)):  # the layout may start before the images: any origin down to -2**62
        assert R.compare_to_ranges(img, img, np.zeros((0, 2), np.int64), origin).matches


def _splitmix(nbytes: int, seed: int) -> bytes:
    out = bytearray()
    for i in range(-(-nbytes // 8)):
        z = ((i + seed) * 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        out += z.to_bytes(8, "little")
    return bytes(x or 0xA5 for x in out[:nbytes])


@pytest.mark.parametrize("words", [1, 2, 3, 1 << 22])
def test_poison_pattern_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch, words: int) -> None:
    monkeypatch.setattr(R, "_CHUNK_WORDS", words)
    for n, seed in ((0, 1), (1, 2), (7, 3), (8, 0x5EED), (29, 4), (64, 2**64 - 3), (100, 0)):
        got = R.poison_pattern(n, seed)
        assert got.dtype == np.uint8 and got.shape == (n,) and got.tobytes() == _splitmix(n, seed), (n, seed)
    assert R.poison_pattern(np.uint64(9)).tobytes() == _splitmix(9, 0x5EED)


@pytest.mark.parametrize(
    "bad, why",
    [(-1, "must be at least 0"), (1.0, "must be an integer"),
     (np.uint64(2**64 - 1), "must be at most 2**62 - 1 (GEOMETRY.md section 8)")],
)
def test_poison_pattern_refuses_bad_sizes(bad: object, why: str) -> None:
    with pytest.raises(LayoutBufferError) as e:
        R.poison_pattern(bad)  # type: ignore[arg-type]
    assert e.value.field == "nbytes" and str(e.value).endswith(f": {why}")


@pytest.mark.parametrize("slice_runs", [0, 1, 2, 64])
def test_zero_blocks_numpy_runs_and_rows(monkeypatch: pytest.MonkeyPatch, slice_runs: int) -> None:
    monkeypatch.setattr(R, "_MAX_SLICE_RUNS", slice_runs)
    rng = random.Random(slice_runs)
    for _ in range(40):
        n = rng.randint(1, 10)
        rows = []
        for _ in range(rng.randint(1, 4)):
            stride = rng.choice((8, 16, 32, -16, -32))
            span = rng.choice((4, 8, 16, 32))
            span = min(span, abs(stride)) if rng.random() < 0.5 else span
            base = rng.randrange(0, 32, 4) + (abs(stride) * (n - 1) if stride < 0 else 0)
            rows.append((base, stride, span))
        total = max(max(b + (n - 1) * s, b) + sp for b, s, sp in rows)
        total = -(-total // 4) * 4
        t = K.SegmentTable(total, n, tuple(K.Segment(b, s, sp) for b, s, sp in rows))
        ids = rng.sample(range(n), rng.randint(0, n))
        off = rng.choice((0, 4, 12))
        buf = np.full(off + total + 8, 0x77, np.uint8)
        R.zero_blocks_numpy(buf, t, ids, np.int8(off) if off else 0)
        want = {x + off for x in range(total) if any(
            b + i * s <= x < b + i * s + sp for b, s, sp in rows for i in ids)}
        assert set(np.flatnonzero(buf == 0).tolist()) == want, (rows, ids, off)


def test_rows_out_of_bounds_are_refused_by_the_public_check() -> None:
    t = K.SegmentTable(64, 2, (K.Segment(0, 32, 40),))
    with pytest.raises(TableError) as e:
        R.check_rows_in_bounds(t, 64)
    assert e.value.field == "table.segments[0]" and "reaches [0, 72)" in str(e.value)
    R.check_rows_in_bounds(K.SegmentTable(64, 2, (K.Segment(0, 32, 32),)), 64)


def test_reference_backend_offset_is_a_python_int() -> None:
    t = K.SegmentTable(64, 2, (K.Segment(0, 32, 8),))
    b = R.ReferenceBackend(t, np.ones(80, np.uint8), offset=np.int8(16))
    assert type(b.offset) is int and b.offset == 16
    b.zero([1])
    assert np.flatnonzero(b.to_host() == 0).tolist() == list(range(48, 56))


def test_union_of_rows_is_exact_integer_arithmetic_up_to_2_62() -> None:
    """Every input is taken as int64, whatever its dtype: uint64 (or float-free int64) values past 2**53
    must not go through float64 (uint64 + int64 does in NumPy), where 2**56 + 4 rounds to 2**56."""
    base, stride, span, bid, shift = 2**56 + 4, 2**43 + 4, 8, 2**13 + 1, 4
    start = base + bid * stride + shift
    for dt in (np.uint64, np.int64):
        got = R.union_of_rows(np.array([base], dt), np.array([stride], dt), np.array([span], dt),
                              np.array([bid], dt), np.array([shift], dt))
        assert got.dtype == np.int64 and got.tolist() == [[start, start + span]], dt
        got = R.union_of_rows(np.array([base], dt), np.array([stride], dt), np.array([span], dt),
                              np.array([bid, bid + 1], dt))
        first = start - shift
        assert got.tolist() == [[first, first + span], [first + stride, first + stride + span]]
