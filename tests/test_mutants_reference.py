"""kvlayout.reference against oracles written here (issue 19 mutation testing).

The poison stream is recomputed with Python ints from splitmix64's published constants, the
zeroed bytes from the contract's ``[base + b*stride, + span)`` per row and block, and the
range/mask helpers from byte sets, so none of the expectations comes from the library.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout import reference as R

from . import oracles as O

M64 = 2**64 - 1


def _splitmix_raw(nbytes: int, seed: int) -> list[int]:
    """splitmix64 of (index + seed) for each 8-byte word, little-endian bytes."""
    out: list[int] = []
    for i in range(-(-nbytes // 8)):
        z = ((i + seed) * 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        out += list(z.to_bytes(8, "little"))
    return out[:nbytes]


def _splitmix_bytes(nbytes: int, seed: int) -> list[int]:
    """The poison stream: zero bytes replaced by 0xA5."""
    return [x or 0xA5 for x in _splitmix_raw(nbytes, seed)]


def _table(total: int, n: int, rows: list[tuple[int, int, int, str]]) -> K.SegmentTable:
    return K.SegmentTable(
        total, n, tuple(K.Segment(b, st, sp, g, f"l{i}") for i, (b, st, sp, g) in enumerate(rows))
    )


def _bytes_of(t: K.SegmentTable, ids: list[int], group: str | None = None) -> set[int]:
    rows = [s for s in t.segments if group is None or s.group == group]
    return {
        x
        for b in set(ids)
        for s in rows
        for x in range(s.base + b * s.stride, s.base + b * s.stride + s.span)
    }


def _ranges(xs: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for x in sorted(xs):
        if out and out[-1][1] == x:
            out[-1][1] += 1
        else:
            out.append([x, x + 1])
    return out


def test_poison_pattern_is_splitmix64() -> None:
    for nbytes, seed in ((0, 0x5EED), (5, 0x5EED), (4099, 0x5EED), (64, 1), (13, 2**64 - 3)):
        want = _splitmix_bytes(nbytes, seed)
        got = R.poison_pattern(nbytes) if seed == 0x5EED else R.poison_pattern(nbytes, seed)
        assert got.dtype == np.uint8 and got.shape == (nbytes,) and got.tolist() == want
    # the default stream has zero bytes, so the replacement above was exercised
    raw = _splitmix_raw(4099, 0x5EED)
    zeros = [i for i, x in enumerate(raw) if x == 0]
    assert len(zeros) >= 4 and (R.poison_pattern(4099)[zeros] == 0xA5).all()


# a safe hand-made table of two groups, positive and negative strides (total 256, 4 blocks)
MIXED = _table(256, 4, [(0, 32, 8, "a"), (8, 32, 4, "b"), (224, -32, 8, "b"), (168, 4, 4, "a")])


@pytest.mark.parametrize("group", [None, "a", "b"])
@pytest.mark.parametrize("offset", [0, 12])
def test_zero_blocks_numpy_against_contract_bytes(group: str | None, offset: int) -> None:
    """Any strides, an offset and a group: the bytes changed are exactly the contract's, set to 0."""
    t = MIXED
    assert K.verify(t).ok
    for ids in ([0], [3], [1, 2], [3, 0, 3], [0, 1, 2, 3]):
        buf = K.poison_pattern(offset + t.total_bytes + 8)
        before = buf.copy()
        if offset == 0 and group is None:
            K.zero_blocks_numpy(buf, t, ids)
        else:
            K.zero_blocks_numpy(buf, t, ids, offset, group)
        want = {offset + x for x in _bytes_of(t, ids, group)}
        changed = set(np.flatnonzero(buf != before).tolist())
        assert changed == want, (ids, group, offset)
        assert not buf[sorted(want)].any()
        exp = K.expected_zeroed(t, ids, group) if group else K.expected_zeroed(t, ids)
        assert exp.tolist() == _ranges(_bytes_of(t, ids, group))
        be = K.ReferenceBackend(t, before.copy(), offset=offset)
        be.zero(ids, group) if group else be.zero(ids)
        assert (be.to_host() == buf).all()


def test_zero_blocks_numpy_empty_and_unknown_group() -> None:
    buf = K.poison_pattern(MIXED.total_bytes)
    before = buf.copy()
    K.zero_blocks_numpy(buf, MIXED, [])
    assert (buf == before).all()
    with pytest.raises(K.TableError, match=r"^group = 'c': unknown group"):
        K.zero_blocks_numpy(buf, MIXED, [0], 0, "c")
    assert K.expected_zeroed(MIXED, [], "a").shape == (0, 2)


@pytest.mark.parametrize(
    "row, why",
    [
        ((-4, 32, 8), "reaches [-4, 100)"),
        ((100, -32, 8), None),  # in bounds: blocks at 100, 68, 36, 4
        ((0, 32, 8), None),
        ((160, 32, 4), "reaches [160, 260)"),
        ((156, 32, 4), None),  # last block ends exactly at 256
        ((0, 32, 0), "reaches [0, 96)"),
        ((0, 32, 6), "reaches [0, 102)"),
        ((0, 0, 12), None),
    ],
)
def test_reference_bounds_check(row: tuple[int, int, int], why: str | None) -> None:
    """Rows reaching below 0 or past the buffer, or with no whole-word span: refused, nothing written."""
    b, st, sp = row
    t = K.SegmentTable(256, 4, (K.Segment(b, st, sp, "g", "lay", "k"),))
    buf = K.poison_pattern(256 + 4)
    before = buf.copy()
    if why is None:
        K.zero_blocks_numpy(buf, t, [0, 3], 4)
        assert set(np.flatnonzero(buf != before).tolist()) == {4 + x for x in _bytes_of(t, [0, 3])}
        return
    with pytest.raises(K.TableError) as e:
        K.zero_blocks_numpy(buf, t, [1], 4)
    assert e.value.field == "table.segments[0]" and e.value.value == (b, st, sp)
    assert str(e.value) == (
        f"table.segments[0] = {(b, st, sp)!r}: (g/lay/k) {why}: outside the buffer of 256 B, or no "
        "whole-word span; run `kvlayout check`"
    )
    assert (buf == before).all()


def test_masks_and_ranges() -> None:
    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 7, 40):
        for _ in range(6):
            mask = rng.random(size) < rng.random()
            for origin in (0, 3):
                got = R.mask_to_ranges(mask, origin)
                want = [[a - origin, b - origin] for a, b in _ranges(set(np.flatnonzero(mask).tolist()))]
                assert got.dtype == np.int64 and got.shape == (len(want), 2) and got.tolist() == want
                back = R.ranges_to_mask(got, size, origin)
                assert back.dtype == np.bool_ and back.tolist() == mask.tolist()
    assert R.mask_to_ranges(np.ones(3, bool)).tolist() == [[0, 3]]
    assert R.mask_to_ranges(np.zeros(3, bool)).shape == (0, 2)
    # ranges reaching below the buffer start are clipped at 0, never wrapped
    assert R.ranges_to_mask(np.array([[-3, 2]]), 5).tolist() == [True, True, False, False, False]
    assert R.ranges_to_mask(np.array([[-9, -2], [1, 2]]), 4, 4).tolist() == [True, True, False, False]
    assert R.ranges_to_mask(np.array([[-4, -3]]), 3, 2).tolist() == [False, False, False]
    before = np.array([1, 2, 3, 4, 5, 6], np.uint8)
    after = np.array([1, 0, 0, 4, 9, 6], np.uint8)
    assert R.changed_ranges(before, after).tolist() == [[1, 3], [4, 5]]
    assert R.changed_ranges(before, after, 2).tolist() == [[-1, 1], [2, 3]]


def test_compare_to_ranges_reports_each_kind_of_error() -> None:
    before = np.full(16, 7, np.uint8)
    exp = np.array([[4, 8]], np.int64)
    ok = before.copy()
    ok[6:10] = 0  # origin 2: layout bytes [4, 8)
    chk = R.compare_to_ranges(before, ok, exp, 2)
    assert chk.matches and chk.describe() == "matches the contract" and chk.zeroed_bytes == 4
    assert chk.zeroed.tolist() == [[4, 8]] and chk.expected.tolist() == [[4, 8]]
    assert chk.extra.shape == chk.missing.shape == chk.not_zero.shape == (0, 2)
    bad = before.copy()
    bad[0] = 0  # guard band: layout byte -2
    bad[6] = 5  # changed, not to zero
    bad[7] = 0
    bad[9] = 0  # byte 7 of the layout: expected, changed
    bad[11] = 0  # byte 9: outside
    chk = R.compare_to_ranges(before, bad, exp, 2)
    assert not chk.matches
    assert chk.zeroed.tolist() == [[-2, -1], [4, 6], [7, 8], [9, 10]]
    assert chk.extra.tolist() == [[-2, -1], [9, 10]]
    assert chk.missing.tolist() == [[6, 7]]
    assert chk.not_zero.tolist() == [[4, 5]]
    assert chk.zeroed_bytes == 5
    assert chk.describe() == (
        "written outside the contract: [-2, -1], [9, 10); not cleared: [6, 7); changed but not zero: [4, 5)"
    ).replace("[-2, -1], [9, 10)", "[-2, -1), [9, 10)")
    assert chk.describe(limit=1) == (
        "written outside the contract: [-2, -1) (+1 more); not cleared: [6, 7); changed but not zero: [4, 5)"
    )
    only_nonzero = before.copy()
    only_nonzero[6:10] = 1  # every expected byte changed, none to zero: only not_zero
    chk = R.compare_to_ranges(before, only_nonzero, exp, 2)
    assert (len(chk.extra), len(chk.missing), chk.not_zero.tolist()) == (0, 0, [[4, 8]]) and not chk.matches
    assert chk.describe() == "changed but not zero: [4, 8)"
    missing = before.copy()
    chk = R.compare_to_ranges(before, missing, exp, 2)
    assert chk.describe() == "not cleared: [4, 8)" and chk.zeroed_bytes == 0 and chk.zeroed.shape == (0, 2)
    said = r"^after = 15 B: must have as many bytes as before \(16\)$"
    with pytest.raises(K.LayoutBufferError, match=said):
        R.compare_to_ranges(before, before[:15], exp)


def test_compare_to_contract_uses_ids_and_group() -> None:
    t = MIXED
    for group in (None, "a", "b"):
        data = K.poison_pattern(t.total_bytes + 8)
        after = data.copy()
        want = _bytes_of(t, [2], group)
        after[[4 + x for x in sorted(want)]] = 0
        chk = K.reference.compare_to_contract(data, after, t, [2], origin=4, group=group)
        assert chk.matches and chk.zeroed_bytes == len(want)
        other = K.reference.compare_to_contract(data, after, t, [1], origin=4, group=group)
        assert not other.matches


def test_reference_backend_surface() -> None:
    t = MIXED
    data = K.poison_pattern(t.total_bytes + 4).view(np.uint32).copy()
    be = K.ReferenceBackend.from_host(t, data, offset=4)
    assert be.name == "reference" and be.extra is None and be.mode == "native" and be.offset == 4
    assert be.table is t and be.buffer is not data
    be.zero([1])
    assert (data == K.poison_pattern(t.total_bytes + 4).view(np.uint32)).all()  # from_host copied
    host = be.to_host()
    assert host.dtype == np.uint8 and host.shape == (t.total_bytes + 4,)
    host[:] = 0
    assert be.to_host().any()  # to_host returns a copy
    with pytest.raises(K.LayoutBufferError, match=r"^offset = 2: must be a multiple of 4$"):
        K.ReferenceBackend(t, np.zeros(t.total_bytes + 4, np.uint8), offset=2)
    assert R.normalize_block_ids((1, 1), 2).tolist() == [1, 1]


def test_expected_zeroed_on_random_safe_tables_with_groups() -> None:
    from kvlayout.testing import random_safe_table

    for seed in O.seeds(60):
        t = random_safe_table(seed)
        ids = [seed % t.num_blocks, (3 * seed + 1) % t.num_blocks]
        for g in (None, *sorted(t.groups)):
            assert K.expected_zeroed(t, ids, g).tolist() == _ranges(_bytes_of(t, ids, g)), (seed, g)


def test_survivors_of_the_first_mutation_run() -> None:
    """Defaults, dtypes of empty results, non-flat buffers and integer masks (mutation survivors)."""
    t = MIXED
    # empty results are int64 [0, 2] like the others
    for got in (K.expected_zeroed(t, []), K.expected_zeroed(K.SegmentTable(8, 2, ()), [1])):
        assert got.dtype == np.int64 and got.shape == (0, 2)
    before = np.full(8, 3, np.uint8)
    after = before.copy()
    after[2:4] = 0
    fast = R.compare_to_ranges(before, after, np.array([[2, 4]], np.int64))  # origin defaults to 0
    assert fast.matches and fast.zeroed.tolist() == [[2, 4]]
    assert all(x.dtype == np.int64 and x.shape == (0, 2) for x in (fast.extra, fast.missing, fast.not_zero))
    slow = R.compare_to_ranges(before, after, np.array([[2, 6]], np.int64))
    assert slow.expected.tolist() == [[2, 6]] and slow.missing.tolist() == [[4, 6]]
    # buffers of any shape and dtype are compared byte by byte
    b2 = K.poison_pattern(64).view(np.float32).reshape(4, 4)
    a2 = b2.copy()
    a2.view(np.uint8).reshape(-1)[20:28] = 0
    assert R.changed_ranges(b2, a2).tolist() == [[20, 28]]
    assert R.compare_to_ranges(b2, a2, np.array([[20, 28]])).matches
    be = K.ReferenceBackend.from_host(t, K.poison_pattern(t.total_bytes).view(np.float32).reshape(-1, 4))
    assert be.offset == 0 and be.to_host().shape == (t.total_bytes,)
    be.zero([0])
    assert set(np.flatnonzero(be.to_host() == 0).tolist()) >= _bytes_of(t, [0])
    # a mask of 0/1 integers is a mask
    assert R.mask_to_ranges(np.array([0, 1, 1, 0, 1])).tolist() == [[1, 3], [4, 5]]
    # describe shows five ranges per kind by default
    many = R.ZeroCheck(
        np.zeros((0, 2), np.int64),
        np.zeros((0, 2), np.int64),
        np.array([[i, i + 1] for i in range(0, 14, 2)]),
        np.zeros((0, 2), np.int64),
        np.zeros((0, 2), np.int64),
    )
    assert many.describe() == (
        "written outside the contract: [0, 1), [2, 3), [4, 5), [6, 7), [8, 9) (+2 more)"
    )
