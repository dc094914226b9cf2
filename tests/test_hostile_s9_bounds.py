"""Issue 25's fourth hostile pass: the verifier's time bounds (tests/test_hostile_s9.py has the rest).

The verifier took a mask of every row per stride class, and per padding gap: 100,000 rows of distinct
strides took 13.5 s, a 40,000-layer layer-major spec 9.2 s. Kept apart from the mutation runs'
selections (scripts/mutation.sh): a few seconds each, for every mutant that reaches the verifier.
"""

from __future__ import annotations

import time

import kvlayout as K
from kvlayout.table import Segment, SegmentTable


def _distinct_strides(rows: int) -> SegmentTable:
    segs, base = [], 0
    for i in range(rows):
        stride = 4 * (i + 1)
        segs.append(Segment(base, stride, 4))
        base += stride + 8
    return SegmentTable(base, 2, tuple(segs))


def test_verify_is_not_quadratic_in_stride_classes() -> None:
    """100,000 rows of distinct strides: 13.5 s before, about 2 s here (one sort, not a mask per class)."""
    table = _distinct_strides(100_000)
    t0 = time.process_time()
    report = K.verify(table)
    dt = time.process_time() - t0
    assert report.ok and dt < 8.0, f"{dt:.1f} s"


def test_padding_of_distinct_strides_is_not_quadratic() -> None:
    """A 40,000-layer layer-major spec of distinct pages (30,000 with an alignment gap): every gap was
    compared with every row (9.2 s; 0.9 s here)."""
    layers = tuple(
        K.FullAttentionSpec(f"l{i}", 1, 1, 2 * (i + 1), "float32", alignment=64) for i in range(40_000)
    )
    table = K.plan(K.KVCacheSpec(2, "layer_major", (K.GroupSpec("g", layers),)))
    assert len(table.padding) == 30_000
    t0 = time.process_time()
    report = K.verify(table)
    dt = time.process_time() - t0
    assert report.ok and dt < 4.0, f"{dt:.1f} s"


def test_step_bytes_reads_each_row_once() -> None:
    """20,000 one-row groups and 5,000 allocation keys: every key scanned every row (9.2 s; 0.5 s here)."""
    from kvlayout.viz import charts

    segs = tuple(Segment(16 * i, 16 * 20_000, 16, f"g{i}") for i in range(20_000))
    table = SegmentTable(16 * 20_000 * 4, 4, segs)
    t0 = time.process_time()
    per, every = charts.step_bytes(table, {f"g{i}": [i % 4] for i in range(5_000)})
    dt = time.process_time() - t0
    assert (per, every) == (5_000 * 16, 4 * 20_000 * 16) and dt < 3.0, f"{dt:.1f} s"
