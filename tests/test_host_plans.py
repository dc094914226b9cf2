"""The backends' host-side plans against the contract's bytes (no kernel runs; NumPy models only).

cuda: ``plan_units`` cuts rows into word units and ``launch_grid`` sizes the grid; pallas:
``plan_rows`` cuts rows into 512 B row items per phase class. Every block's bytes, expanded
from the plan, must equal the table's (tests/oracles.py), for any chunk size, offset and tile.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import KVLayoutError, TableError
from kvlayout.testing import random_safe_table

from . import oracles as O

cuda_kernel = pytest.importorskip("kvlayout.backends.cuda.kernel")
pallas_plan = pytest.importorskip("kvlayout.backends.pallas.plan")


def _tables() -> list[K.SegmentTable]:
    return [random_safe_table(seed) for seed in O.seeds(120)] + [
        K.plan(K.preset("dsv4-test").with_num_blocks(3))
    ]


@pytest.mark.parametrize("chunk_words", [4, 8, 12, 8192])
def test_cuda_units_cover_each_block_exactly(chunk_words: int) -> None:
    for t in _tables():
        p = cuda_kernel.plan_units(t, chunk_words)
        assert p.chunk_words == chunk_words and p.num_blocks == t.num_blocks
        assert p.units_per_block == p.words.size == p.base_words.size == p.stride_words.size
        assert (
            p.words.dtype == np.int32 and p.base_words.dtype == np.int64 and p.stride_words.dtype == np.int64
        )
        assert ((p.words > 0) & (p.words <= chunk_words)).all()
        aligned = all(
            x % 4 == 0 for x in [*p.base_words.tolist(), *p.stride_words.tolist(), *p.words.tolist()]
        )
        assert p.aligned16 == aligned
        want_units = sum(-(-s.span // 4 // chunk_words) for s in t.segments)
        assert p.units_per_block == want_units
        for b in range(t.num_blocks):
            got = O.union_bytes(
                [
                    (4 * (u + b * s), 4 * (u + b * s + w))
                    for u, s, w in zip(p.base_words.tolist(), p.stride_words.tolist(), p.words.tolist())
                ]
            )
            assert got == O.block_bytes(t, b), (t, b)
        # the NumPy model of the kernel clears exactly the contract's bytes for a batch
        ids = np.array(sorted({0, t.num_blocks - 1}), np.int64)
        words = np.ones(t.total_bytes // 4 + 1, np.int32)
        cuda_kernel.zero_units_numpy(words, p, np.concatenate([ids, [-1, t.num_blocks]]))
        want = set().union(*(O.block_bytes(t, b) for b in ids.tolist()))
        assert {4 * w for w in np.flatnonzero(words == 0).tolist()} == {x for x in want if x % 4 == 0}


def test_cuda_units_edge_cases() -> None:
    empty = cuda_kernel.plan_units(K.SegmentTable(0, 5, ()))
    assert (
        empty.units_per_block == 1
        and empty.words.tolist() == [0]
        and empty.aligned16
        and empty.num_blocks == 5
    )
    t = K.SegmentTable(64, 2, (K.Segment(0, 32, 20),))
    p = cuda_kernel.plan_units(t, 4)
    assert (
        p.base_words.tolist() == [0, 4] and p.words.tolist() == [4, 1] and p.stride_words.tolist() == [8, 8]
    )
    assert not p.aligned16
    for bad in (0, -4, 6, True, 4.0, cuda_kernel.MAX_CHUNK_WORDS + 4):
        with pytest.raises(KVLayoutError, match=r"chunk_words = .*: must be a positive multiple of 4"):
            cuda_kernel.plan_units(t, bad)
    assert cuda_kernel.plan_units(t, cuda_kernel.MAX_CHUNK_WORDS).chunk_words == cuda_kernel.MAX_CHUNK_WORDS


def test_cuda_launch_grid() -> None:
    p = cuda_kernel.plan_units(K.SegmentTable(96, 2, (K.Segment(0, 48, 20), K.Segment(20, 48, 28))), 4)
    assert p.units_per_block == 2 + 2
    assert cuda_kernel.launch_grid(p, 3, 100) == (12, 12)
    assert cuda_kernel.launch_grid(p, 3, 5) == (5, 12)
    assert cuda_kernel.launch_grid(p, 0, 5) == (1, 0)
    assert cuda_kernel.launch_grid(p, 2**30, 2**40) == (cuda_kernel.MAX_GRID_X, 2**32)
    assert cuda_kernel.MAX_GRID_X == 2**31 - 1


@pytest.mark.parametrize("offset, tile_rows", [(0, 64), (4, 1), (512, 2), (1000, 3)])
def test_pallas_rows_cover_each_block_exactly(offset: int, tile_rows: int) -> None:
    lanes = pallas_plan.LANES
    for t in _tables():
        c = t.coalesced()
        p = pallas_plan.plan_rows(c, offset, tile_rows)
        assert p.num_blocks == t.num_blocks and p.tile_rows == tile_rows
        period = p.period
        assert period & (period - 1) == 0 and all(period * s.stride % (4 * lanes) == 0 for s in c.segments)
        assert period == 1 or any((period // 2) * s.stride % (4 * lanes) for s in c.segments)
        assert p.full_start.size == p.rmw_start.size == period + 1
        assert ((p.full_rows >= 1) & (p.full_rows <= tile_rows)).all()
        assert set(np.unique(p.masks).tolist()) <= {0, 1} and p.aligned == (p.rmw_row.size == 0)
        full, rmw = p.items_per_block()
        assert (full, rmw) == (p.full_row.size / period, p.rmw_row.size / period)
        need = max(
            [offset + t.total_bytes]
            + [offset + max(s.base, s.base + (t.num_blocks - 1) * s.stride) + s.span for s in c.segments]
        )
        assert p.rows_needed == -(-need // (4 * lanes))
        for b in range(t.num_blocks):
            rows = np.ones((p.rows_needed, lanes), np.int32)
            pallas_plan.zero_rows_numpy(rows, p, np.array([b, b, -1, t.num_blocks]))
            got = {4 * w - offset for w in np.flatnonzero(rows.reshape(-1) == 0).tolist()}
            assert got == {x for x in O.block_bytes(t, b) if x % 4 == 0}, (t, b, offset)


def test_pallas_plan_rejections() -> None:
    t = K.SegmentTable(64, 2, (K.Segment(0, 32, 16), K.Segment(8, 32, 16)))
    with pytest.raises(TableError, match=r"segments\[0\] and segments\[1\] overlap inside block 0"):
        pallas_plan.check_rows_disjoint_per_block(t)
    pallas_plan.check_rows_disjoint_per_block(t.coalesced())
    with pytest.raises(TableError, match=r"offset = 2: must be a multiple of 4"):
        pallas_plan.plan_rows(t, 2)
    huge = K.SegmentTable(2**42, 1, (K.Segment(0, 0, 4),))
    with pytest.raises(TableError, match=r"exceeds int32 row offsets"):
        pallas_plan.plan_rows(huge)
    assert pallas_plan.plan_rows(K.SegmentTable(2**39, 1, (K.Segment(0, 0, 4),))).rows_needed == 2**39 // 512


def test_cuda_units_exact_fields() -> None:
    """Exact ints at 2**58 (no float on the way), dtypes of an empty plan, the aligned flag, the error."""
    big = K.SegmentTable(2**60 + 16, 2, (K.Segment(4, 2**58 + 4, 8),))
    p = cuda_kernel.plan_units(big, 4)
    assert p.base_words.tolist() == [1] and p.stride_words.tolist() == [2**56 + 1] and p.words.tolist() == [2]
    far = cuda_kernel.plan_units(K.SegmentTable(2**60 + 8, 1, (K.Segment(2**60 + 4, 0, 4),)))
    assert far.base_words.tolist() == [2**58 + 1]
    empty = cuda_kernel.plan_units(K.SegmentTable(0, 3, ()))
    assert empty.base_words.tolist() == [0] and empty.stride_words.tolist() == [0]
    assert empty.chunk_words == 8192
    dtypes = (empty.base_words.dtype, empty.stride_words.dtype, empty.words.dtype)
    assert dtypes == (np.int64, np.int64, np.int32)
    assert cuda_kernel.plan_units(K.SegmentTable(256, 4, (K.Segment(0, 64, 16),))).aligned16
    assert not cuda_kernel.plan_units(K.SegmentTable(256, 4, (K.Segment(0, 64, 12),))).aligned16
    assert not cuda_kernel.plan_units(K.SegmentTable(256, 4, (K.Segment(4, 64, 16),))).aligned16
    assert not cuda_kernel.plan_units(K.SegmentTable(256, 4, (K.Segment(0, 60, 16),))).aligned16
    with pytest.raises(KVLayoutError) as ei:
        cuda_kernel.plan_units(big, 6)
    assert (ei.value.field, ei.value.value) == ("chunk_words", 6)


def test_pallas_plan_exact_fields() -> None:
    """Period, items, masks and buffer rows of small hand-made tables; errors name field and value."""
    aligned = pallas_plan.plan_rows(K.SegmentTable(2048, 4, (K.Segment(0, 512, 512),)), 0, 1)
    assert aligned.period == 1 and aligned.aligned and aligned.rows_needed == 4
    assert aligned.masks.shape == (1, 128) and aligned.masks.dtype == np.int32 and not aligned.masks.any()
    assert aligned.full_row.tolist() == [0] and aligned.full_qstride.tolist() == [1]
    assert aligned.full_rows.tolist() == [1]
    one = pallas_plan.plan_rows(K.SegmentTable(64, 1, (K.Segment(0, 0, 8),)))
    assert one.tile_rows == 64  # the default: 64 rows of 512 B = one 32 KiB zero tile
    assert one.period == 1 and one.masks.dtype == np.int32 and one.masks[0].tolist() == [1, 1] + [0] * 126
    # tile_rows 2 over a 5-row run: items of 2, 2 and 1 rows, each row once
    run = pallas_plan.plan_rows(K.SegmentTable(2560, 1, (K.Segment(0, 0, 2560),)), 0, 2)
    assert run.full_row.tolist() == [0, 2, 4] and run.full_rows.tolist() == [2, 2, 1]
    for t in _tables():
        p = pallas_plan.plan_rows(t.coalesced(), 0, 3)
        for c in range(p.period):
            items = range(p.full_start[c], p.full_start[c + 1])
            rows = [r for k in items for r in range(p.full_row[k], p.full_row[k] + p.full_rows[k])]
            assert len(rows) == len(set(rows))  # runs never overlap
    # rows the buffer needs: the furthest row end, even past total_bytes (an unverified table)
    assert pallas_plan.plan_rows(K.SegmentTable(0, 2, (K.Segment(0, 512, 4),))).rows_needed == 2
    assert pallas_plan.plan_rows(K.SegmentTable(0, 0, ())).rows_needed == 0
    assert pallas_plan.plan_rows(K.SegmentTable(1024, 0, ()), 512).rows_needed == 3
    edge = K.SegmentTable((2**31 - 1) * 512, 1, (K.Segment(0, 0, 4),))
    assert pallas_plan.plan_rows(edge).rows_needed == 2**31 - 1
    with pytest.raises(TableError) as ei:
        pallas_plan.plan_rows(K.SegmentTable(2**31 * 512, 1, (K.Segment(0, 0, 4),)))
    assert (ei.value.field, ei.value.value) == ("table.total_bytes", 2**31 * 512)
    with pytest.raises(TableError) as ei:
        pallas_plan.plan_rows(edge, 6)
    assert (ei.value.field, ei.value.value) == ("offset", 6)
    with pytest.raises(TableError, match=r"needs per-block disjoint rows \(coalesce the table\)") as ei:
        pallas_plan.check_rows_disjoint_per_block(
            K.SegmentTable(64, 2, (K.Segment(0, 32, 16), K.Segment(8, 32, 16)))
        )
    assert (ei.value.field, ei.value.value) == ("table", (0, 1))
