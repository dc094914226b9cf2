"""Issue 19: one named test per mutant that survived the whole suite before (expected values by hand)."""

from __future__ import annotations

import kvlayout as K

from . import oracles as O


def _table(total: int, n: int, rows: list[tuple[int, int, int, str]]) -> K.SegmentTable:
    return K.SegmentTable(
        total, n, tuple(K.Segment(b, st, sp, g, f"r{i}") for i, (b, st, sp, g) in enumerate(rows))
    )


def test_round_up_keeps_an_already_aligned_page() -> None:
    """Survivor 1: ``round_up`` adding a whole unit to an aligned size wasted a page per layer."""
    exact = K.MLASpec(name="a", block_size=4, head_size=8, dtype="float32", alignment=128)  # 128 B, aligned
    assert (exact.real_page, exact.page, exact.gap) == (128, 128, 0)
    divisor = K.MLASpec(name="b", block_size=4, head_size=8, dtype="float32", alignment=32)
    assert divisor.page == 128
    four = K.FullAttentionSpec(
        name="c", block_size=1, num_kv_heads=1, head_size=2, dtype="float16", alignment=4
    )
    assert four.page == 8
    unaligned = K.MLASpec(name="d", block_size=4, head_size=9, dtype="float32", alignment=128)  # 144 B
    assert unaligned.page == 256
    spec = K.KVCacheSpec(
        num_blocks=5, layout="packed", groups=(K.GroupSpec("g", (exact, divisor, unaligned)),)
    )
    t = K.plan(spec)
    assert [(s.base, s.stride, s.span) for s in t.segments] == [
        (0, 512, 128),
        (128, 512, 128),
        (256, 512, 144),
    ]
    assert t.total_bytes == 2560
    assert [(p.base, p.span) for p in t.padding] == [(400, 112)]


def test_coalescing_never_merges_rows_of_different_strides() -> None:
    """Survivor 2: rows that touch in block 0 but have different strides must stay apart."""
    t = _table(208, 4, [(0, 64, 16, "a"), (16, 32, 16, "b")])
    assert K.verify(t).ok and all(O.brute_invariants(t).values())
    c = t.coalesced()
    assert sorted((s.base, s.stride, s.span) for s in c.segments) == [(0, 64, 16), (16, 32, 16)]
    assert O.check_coalescer(lambda x: x.coalesced(), [t]) == []
    # what a merge would have cleared for block 1: [64, 96) instead of [48, 64) + [64, 80)
    assert K.expected_zeroed(c, [1]).tolist() == [[48, 80]]


def test_isolation_checked_between_blocks_two_or_more_apart() -> None:
    """Survivor 3: row 1's block b is row 0's block b + k for k = 2 and 3; neighbours never meet."""
    for k in (2, 3):
        t = _table(32 * k + 3 * 32 + 16, 4, [(0, 32, 16, "g"), (32 * k, 32, 16, "g")])
        rep = K.verify(t)
        assert not rep.ok and not O.brute_invariants(t)[3]
        iso = rep.by_invariant(3)
        assert iso and all(abs(v.blocks[1] - v.blocks[0]) == k for v in iso), [v.message for v in iso]
        a, b = iso[0].byte_range  # type: ignore[misc]
        assert b - a == 16
    # the same rows a span apart do not overlap at all
    t = _table(32 * 2 + 3 * 32 + 32, 4, [(0, 32, 16, "g"), (32 * 2 + 16, 32, 16, "g")])
    assert K.verify(t).ok


def test_isolation_checked_between_rows_of_different_groups() -> None:
    """Survivor 4: overlays share bytes only within one block; across blocks groups collide too."""
    t = _table(128, 3, [(0, 32, 16, "mla"), (32, 32, 16, "indexer")])
    rep = K.verify(t)
    assert not rep.ok
    (v,) = rep.by_invariant(3)
    assert set(v.rows) == {0, 1} and sorted(v.blocks) == [0, 1] and v.byte_range == (32, 48)
    # overlaid groups in the same block are fine: that is what packed groups do
    same_block = _table(96, 3, [(0, 32, 16, "mla"), (8, 32, 16, "indexer")])
    assert K.verify(same_block).ok


def test_dsv4_coalesced_table_keeps_every_block() -> None:
    """The dsv4 preset coalesced: same bytes for every one of its 100 blocks, far fewer rows."""
    t = K.plan(K.preset("dsv4"))
    c = t.coalesced()
    # by hand: C4 attn, attn, indexer, indexer (each geometry's layers together, as vLLM places
    # them: issue 23 item 6) at 0, 37,440, 74,880, 83,520; C128 inside [0, 6,352); SWA at
    # 0, 37,440, 74,880, 112,320 (37,376 B each): the union is four runs with three 64 B gaps
    assert [(s.base, s.stride, s.span) for s in c.segments] == [
        (0, 149_760, 37_376),
        (37_440, 149_760, 37_376),
        (74_880, 149_760, 37_376),
        (112_320, 149_760, 37_376),
    ]
    for b in range(t.num_blocks):
        assert O.merged_block_ranges(c, b) == O.merged_block_ranges(t, b), b
