"""The static verifier: the pre-fix DeepSeek-V4 table, scale, and agreement with brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import kvlayout as K


def prefix_table() -> K.SegmentTable:
    """vLLM #50276 before the fix: the block stride 149,760 used as the span too."""
    good = K.plan(K.preset("dsv4-test"))
    return K.SegmentTable(good.total_bytes, good.num_blocks, tuple(K.Segment(s.base, 149_760, 149_760, s.group, s.layer) for s in good.segments))


def test_prefix_table_rejected_with_spill_and_overrun() -> None:
    rep = K.verify(prefix_table())
    assert not rep.ok
    # invariant 2: rows 1..3 run past the end at block 99; row 3 by 112,320 B
    inb = {v.rows[0]: v for v in rep.by_invariant(2)}
    assert sorted(inb) == [1, 2, 3]
    assert inb[3].blocks[-1] == 99 and "112320 B past" in inb[3].message
    assert inb[3].byte_range == (14_976_000, 14_976_000 + 112_320)
    assert "37440 B past" in inb[1].message
    # invariant 3: block b's rows 1..3 spill into block b+1
    iso = rep.by_invariant(3)
    spilling = {v.rows[0] for v in iso}
    assert spilling == {1, 2, 3}
    for v in iso:
        assert v.blocks == (0, 1)
        assert "spills into" in v.message
    v31 = next(v for v in iso if v.rows == (3, 1))  # row 3 of block 0 runs into row 1 of block 1
    assert v31.byte_range == (37_440 + 149_760, 112_320 + 149_760)
    assert "UNSAFE" in rep.format()


def test_planned_table_passes_at_ten_million_blocks() -> None:
    """Correctness only: timing belongs in bench/bench_core.py, not in a unit test."""
    table = K.plan(K.preset("dsv4").with_num_blocks(10**7))
    assert K.verify(table).ok
    # the row that ends highest, 128 B longer, runs 64 B into the next block's first row
    rows = list(table.segments)
    i = max(range(len(rows)), key=lambda r: rows[r].base + rows[r].span)
    assert rows[i].base + rows[i].span == 149_696
    rows[i] = K.Segment(rows[i].base, rows[i].stride, rows[i].span + 128)
    rep = K.verify(K.SegmentTable(table.total_bytes, table.num_blocks, tuple(rows)))
    assert rep.by_invariant(3) and rep.by_invariant(2)


def test_invariant_1_and_4() -> None:
    t = K.plan(K.preset("dsv4-test"))
    mis = K.SegmentTable(t.total_bytes, t.num_blocks, (K.Segment(2, 149_760, 37_374),))
    rep = K.verify(mis)
    assert [v.invariant for v in rep.violations] == [1]
    assert "base 2" in rep.violations[0].message and "span 37374" in rep.violations[0].message
    # spans rounded up to 512 B write into the 64 B alignment gap
    rounded = K.SegmentTable(t.total_bytes, t.num_blocks, tuple(K.Segment(s.base, s.stride, 37_888, s.group, s.layer) for s in t.segments), t.padding, True)
    rep = K.verify(rounded)
    pad = rep.by_invariant(4)
    assert pad and pad[0].rows == (0,) and pad[0].byte_range == (37_376, 37_440)


def test_json_table_marks_padding_unchecked() -> None:
    t = K.SegmentTable.from_json(K.plan(K.preset("dsv4-test")).to_json())
    rep = K.verify(t)
    assert rep.ok and not rep.padding_checked
    assert "not checked" in rep.format()


def brute_force(table: K.SegmentTable) -> tuple[bool, bool, bool]:
    """Invariants 2-4 by enumerating every block (small tables only)."""
    n, total = table.num_blocks, table.total_bytes
    bad2 = any(min(s.base, s.base + (n - 1) * s.stride) < 0 or max(s.base, s.base + (n - 1) * s.stride) + s.span > total for s in table.segments)
    owner: dict[int, int] = {}
    iso_ok = True
    for b in range(n):
        for s in table.segments:
            for x in range(s.base + b * s.stride, s.base + b * s.stride + s.span):
                if owner.setdefault(x, b) != b:
                    iso_ok = False
    pad_ok = True
    for p in table.padding:
        for b in range(n):
            for x in range(p.base + b * p.stride, p.base + b * p.stride + p.span):
                if x in owner:
                    pad_ok = False
    return not bad2, iso_ok, pad_ok


seg = st.builds(
    lambda base, stride, span: K.Segment(base * 4, stride * 4, span * 4),
    st.integers(-4, 40),
    st.integers(-6, 12),
    st.integers(1, 12),
)


@given(st.lists(seg, min_size=1, max_size=4), st.lists(seg, max_size=2), st.integers(1, 7), st.integers(0, 300))
def test_verifier_agrees_with_brute_force(rows: list[K.Segment], pads: list[K.Segment], n: int, total: int) -> None:
    pads = [p for p in pads if p.stride >= 0 and p.base >= 0]
    table = K.SegmentTable(total * 4, n, tuple(rows), tuple(pads), True)
    rep = K.verify(table)
    ok2, ok3, ok4 = brute_force(table)
    assert (not rep.by_invariant(2)) == ok2
    assert (not rep.by_invariant(3)) == ok3
    assert (not rep.by_invariant(4)) == ok4
    # every reported witness is a real overlap
    for v in rep.by_invariant(3):
        a, b = v.byte_range  # type: ignore[misc]
        assert a < b and v.blocks[0] != v.blocks[1]


@given(st.integers(0, 2**32 - 1))
def test_every_planned_table_passes(seed: int) -> None:
    from kvlayout.testing import random_spec

    spec = random_spec(seed)
    table = K.plan(spec)
    rep = K.verify(table)
    assert rep.ok, rep.format()
    assert rep.padding_checked
    # coalescing keeps the byte set
    ids = np.arange(spec.num_blocks)
    assert (K.expected_zeroed(table, ids) == K.expected_zeroed(table.coalesced(), ids)).all()
    assert K.verify(table.coalesced()).ok
