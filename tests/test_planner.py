"""Planner geometry: packed, layer_major, kv_split, virtual splitting, mamba, presets."""

from __future__ import annotations

import pytest

import kvlayout as K
from kvlayout.errors import SpecError

from . import oracles as O


def test_dsv4_regression_geometry_through_public_api() -> None:
    """vLLM #51288's assertions: 4 rows, stride 149,760, span 37,376, exact last byte."""
    spec = K.preset("dsv4-test")
    table = K.plan(spec)
    assert len(table) == 4
    assert [s.base for s in table.segments] == [0, 37_440, 74_880, 112_320]
    assert all(s.stride == 149_760 for s in table.segments)
    assert all(s.span == 37_376 for s in table.segments)
    assert all(s.span < s.stride for s in table.segments)
    assert table.total_bytes == 14_976_000
    last = 99
    ends = [s.base + last * s.stride + s.span for s in table.segments]
    assert all(e <= table.total_bytes for e in ends)
    assert ends[-1] == table.total_bytes - 64 == 14_975_936
    assert K.verify(table).ok
    layout = K.plan_layout(spec)
    assert layout.block_stride == 149_760
    assert [p.offset for p in layout.placements] == [0, 37_440, 74_880, 112_320]


def test_table_columns_are_int64() -> None:
    t = K.plan(K.preset("dsv4-test"))
    for col in (t.bases, t.strides, t.spans):
        assert col.dtype.name == "int64" and col.shape == (4,)
    assert t.columns().shape == (4, 3)


def test_packed_groups_overlay_and_stride_is_largest_group() -> None:
    a = K.MambaSpec(name="m", state_bytes=400)
    b = K.MLASpec(name="x", block_size=4, head_size=4, dtype="float32")  # 64 B
    c = K.MLASpec(name="y", block_size=4, head_size=8, dtype="float32", alignment=256)  # 128 -> 256
    spec = K.KVCacheSpec(
        num_blocks=10, layout="packed", groups=(K.GroupSpec("g1", (a, b)), K.GroupSpec("g2", (c,)))
    )
    lay = K.plan_layout(spec)
    assert lay.block_stride == 464
    assert lay.total_bytes == 4640
    t = lay.table()
    # mamba produces no rows; g2's layer starts at offset 0 of the same row
    assert [(s.layer, s.base, s.stride, s.span) for s in t.segments] == [
        ("x", 400, 464, 64),
        ("y", 0, 464, 128),
    ]
    assert K.verify(t).ok


def test_layer_major_slots_and_kv_split() -> None:
    spec = K.preset("llama-8b")
    lay = K.plan_layout(spec)
    page = 2 * 16 * 8 * 128 * 2
    n = spec.num_blocks
    assert lay.slot_pages == (page,) * 32
    assert lay.total_bytes == 32 * page * n
    t = lay.table()
    assert len(t) == 64
    k0, v0, k1 = t.segments[0], t.segments[1], t.segments[2]
    assert (k0.part, k0.base, k0.stride, k0.span) == ("k", 0, page // 2, page // 2)
    assert (v0.part, v0.base, v0.stride, v0.span) == ("v", page // 2 * n, page // 2, page // 2)
    assert k1.base == page * n
    assert K.verify(t).ok


def test_layer_major_slot_page_is_max_over_groups() -> None:
    small = K.MLASpec(name="s", block_size=4, head_size=4, dtype="float32")  # 64
    big = K.MLASpec(name="b", block_size=4, head_size=8, dtype="float32")  # 128
    tail = K.MambaSpec(name="m", state_bytes=40, alignment=64)
    spec = K.KVCacheSpec(
        num_blocks=3, layout="layer_major", groups=(K.GroupSpec("a", (small, tail)), K.GroupSpec("b", (big,)))
    )
    lay = K.plan_layout(spec)
    assert lay.slot_pages == (128, 64)
    assert lay.total_bytes == 128 * 3 + 64 * 3
    t = lay.table()
    assert [(s.layer, s.base, s.stride, s.span) for s in t.segments] == [
        ("s", 0, 128, 64),
        ("b", 0, 128, 128),
    ]
    assert K.verify(t).ok


def test_virtual_block_splitting_same_bytes() -> None:
    layer = K.FullAttentionSpec(
        name="a", block_size=16, num_kv_heads=1, head_size=8, dtype="float32", kv_split=True
    )
    whole = K.KVCacheSpec(num_blocks=4, layout="layer_major", groups=(K.GroupSpec("g", (layer,)),))
    split = K.KVCacheSpec(
        num_blocks=4, layout="layer_major", groups=(K.GroupSpec("g", (layer,), kernel_block_size=4),)
    )
    tw, ts = K.plan(whole), K.plan(split)
    assert len(tw) == 2 and len(ts) == 8
    half = layer.real_page // 2
    ks = [s for s in ts.segments if s.part == "k"]
    assert [(s.base, s.span, s.virtual_index) for s in ks] == [
        (v * half // 4, half // 4, v) for v in range(4)
    ]
    assert all(s.stride == half for s in ts.segments)
    assert ts.bytes_per_block == tw.bytes_per_block
    assert ts.coalesced().segments == tw.coalesced().segments
    ids = [0, 3]
    assert (K.expected_zeroed(ts, ids) == K.expected_zeroed(tw, ids)).all()


def test_virtual_splitting_of_padded_page_rejected() -> None:
    spec = K.preset("dsv4-test")
    g = spec.groups[0]
    bad = K.KVCacheSpec(
        num_blocks=4, layout="packed", groups=(K.GroupSpec("mla", g.layers, kernel_block_size=64),)
    )
    with pytest.raises(
        SpecError, match=r"kernel_block_size = 64: virtual block splitting needs a dense page.*model.layers.0"
    ):
        K.plan(bad)


def test_virtual_splitting_part_not_divisible_rejected() -> None:
    layer = K.MLASpec(name="x", block_size=8, head_size=3, dtype="float32")  # 96 B: 4*8 divides it
    ok = K.KVCacheSpec(
        num_blocks=2, layout="packed", groups=(K.GroupSpec("g", (layer,), kernel_block_size=1),)
    )
    assert len(K.plan(ok)) == 8
    layer2 = K.MLASpec(name="y", block_size=8, head_size=1, dtype="uint8")  # 8 B
    bad = K.KVCacheSpec(
        num_blocks=2, layout="packed", groups=(K.GroupSpec("g", (layer2,), kernel_block_size=1),)
    )
    with pytest.raises(SpecError, match=r"layer 'y' part 'page' of 8 B is not a multiple of 4\*8"):
        K.plan(bad)
    bad2 = K.KVCacheSpec(
        num_blocks=2, layout="packed", groups=(K.GroupSpec("g", (layer2,), kernel_block_size=3),)
    )
    with pytest.raises(SpecError, match=r"kernel_block_size = 3: does not divide block_size 8"):
        K.plan(bad2)


def test_kv_split_in_packed_rejected() -> None:
    layer = K.FullAttentionSpec(
        name="kv", block_size=4, num_kv_heads=1, head_size=8, dtype="float32", kv_split=True
    )
    with pytest.raises(
        SpecError, match=r"layer 'kv'.kv_split = True: kv_split is an error in the packed layout"
    ):
        K.plan(K.KVCacheSpec(num_blocks=2, layout="packed", groups=(K.GroupSpec("g", (layer,)),)))


def test_kv_split_half_not_multiple_of_4_rejected() -> None:
    layer = K.FullAttentionSpec(
        name="kv", block_size=1, num_kv_heads=1, head_size=3, dtype="float16", kv_split=True
    )  # 12 B
    with pytest.raises(SpecError, match=r"layer 'kv'.kv_split.*multiples of 4"):
        K.plan(K.KVCacheSpec(num_blocks=2, layout="layer_major", groups=(K.GroupSpec("g", (layer,)),)))


def test_mixed_kv_split_in_one_slot_rejected() -> None:
    a = K.FullAttentionSpec(
        name="a", block_size=4, num_kv_heads=1, head_size=8, dtype="float32", kv_split=True
    )
    b = K.FullAttentionSpec(name="b", block_size=4, num_kv_heads=1, head_size=8, dtype="float32")
    with pytest.raises(SpecError, match=r"slot 0 must agree on kv_split"):
        K.plan(
            K.KVCacheSpec(
                num_blocks=2, layout="layer_major", groups=(K.GroupSpec("g", (a,)), K.GroupSpec("h", (b,)))
            )
        )


def test_dsv4_preset_shape() -> None:
    spec = K.preset("dsv4")
    lay = K.plan_layout(spec)
    t = lay.table()
    assert len(t) == 181
    assert lay.block_stride == 149_760
    pages = {(p.layer.real_page, p.layer.page) for p in lay.placements}
    assert pages == {(37_376, 37_440), (1_168, 1_728), (8_448, 8_640)}
    assert K.verify(t).ok
    c = t.coalesced()
    # layers of one geometry sit together (vLLM's placement, issue 23 item 6): c4 groups are
    # attn, attn, indexer, indexer; every row is [0, 37,376), [37,440, 74,816),
    # [74,880, 112,256) and [112,320, 149,696)
    assert [(s.base, s.span) for s in c.segments] == [
        (0, 37_376),
        (37_440, 37_376),
        (74_880, 37_376),
        (112_320, 37_376),
    ]
    for b in range(spec.num_blocks):  # every block's bytes, not a sample
        assert O.merged_block_ranges(c, b) == O.merged_block_ranges(t, b), b


def test_padding_of_overlaid_groups_excludes_other_groups_data() -> None:
    a = K.MLASpec(name="a", block_size=4, head_size=4, dtype="float32", alignment=128)  # 64 -> 128
    b = K.MLASpec(name="b", block_size=4, head_size=6, dtype="float32")  # 96, dense
    t = K.plan(
        K.KVCacheSpec(num_blocks=3, layout="packed", groups=(K.GroupSpec("g", (a,)), K.GroupSpec("h", (b,))))
    )
    assert [(p.base, p.span) for p in t.padding] == [(96, 32)]
    assert K.verify(t).ok


def test_planned_table_fields_and_padding_labels() -> None:
    """Provenance the verifier and the CLI print: planned flag, padding rows, placement slots and strides."""
    a = K.MLASpec(name="a", block_size=4, head_size=4, dtype="float32", alignment=128)  # 64 -> 128
    b = K.MLASpec(name="b", block_size=4, head_size=2, dtype="float32")  # 32
    spec = K.KVCacheSpec(num_blocks=3, layout="packed", groups=(K.GroupSpec("g", (a, b)),))
    t = K.plan(spec)
    assert t.planned is True
    assert t.padding == (K.Segment(64, 160, 64, "", "a", "padding", 0),)
    lay = K.plan_layout(spec)
    got = [(p.group, p.slot, p.offset, p.stride) for p in lay.placements]
    assert got == [("g", 0, 0, 160), ("g", 1, 128, 160)]
    assert lay.placement("b").offset == 128
    with pytest.raises(KeyError):
        lay.placement("nope")
    eight = K.MLASpec(name="y", block_size=8, head_size=1, dtype="uint8")  # 8 B over 8 virtual blocks
    group = K.GroupSpec("g", (eight,), kernel_block_size=1)
    bad = K.KVCacheSpec(num_blocks=2, layout="packed", groups=(group,))
    with pytest.raises(SpecError) as ei:
        K.plan(bad)
    assert (ei.value.field, ei.value.value) == ("group 'g'.kernel_block_size", 1)
