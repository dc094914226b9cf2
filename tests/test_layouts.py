"""vLLM 0.33's layout algebra (GEOMETRY.md section 6): the six orders of ``[L, B, H, N, C]``.

Expected offsets are written by hand from each order's definition, and an independent
stride oracle (the address of every logical byte ``(l, b, h, n, c)`` from the physical order)
checks random uniform specs byte by byte. ``packed``/``layer_major`` stay what they were.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import SpecError
from kvlayout.spec import ALL_LAYOUTS, KV_CACHE_LAYOUTS, LAYOUT_ALIASES, layout_order
from kvlayout.testing import random_spec

from . import oracles as O


def rows(table: K.SegmentTable) -> list[tuple[str, str, int, int, int]]:
    return [(s.layer, s.part, s.base, s.stride, s.span) for s in table.segments]


def _two_groups(layout: str, n: int = 3) -> K.KVCacheSpec:
    """Group a: two full layers, H=2, N=4, C=(8+8)*2=32 (N*C=128, page 256); group b: one MLA
    layer with two head slots, N=4, C=8*4=32 (page 256)."""
    full = dict(block_size=4, num_kv_heads=2, head_size=8, dtype="bfloat16")
    a = K.GroupSpec("a", (K.FullAttentionSpec(name="a0", **full), K.FullAttentionSpec(name="a1", **full)))
    b = K.GroupSpec(
        "b", (K.MLASpec(name="b0", block_size=4, head_size=8, dtype="float32", num_head_slots=2),)
    )
    return K.KVCacheSpec(num_blocks=n, layout=layout, groups=(a, b))


def test_layout_names_and_aliases() -> None:
    assert KV_CACHE_LAYOUTS == ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
    assert LAYOUT_ALIASES == {"packed": "BLHNC", "layer_major": "LBHNC"}
    assert [layout_order(x) for x in ALL_LAYOUTS] == ["BLHNC", "LBHNC", *KV_CACHE_LAYOUTS]
    assert _two_groups("packed").order == "BLHNC"
    with pytest.raises(
        SpecError, match=r"layout = 'HBLNC': valid layouts: packed, layer_major, LBHNC, .*BHLNC"
    ):
        _two_groups("HBLNC")


def test_page_geometry_of_the_example() -> None:
    spec = _two_groups("BLHNC")
    a0, b0 = spec.groups[0].layers[0], spec.groups[1].layers[0]
    assert (a0.heads, a0.states, a0.content_bytes, a0.real_page) == (2, 4, 32, 256)
    assert (b0.heads, b0.states, b0.content_bytes, b0.real_page) == (2, 4, 32, 256)


# Hand-written from the definitions (n = 3 blocks):
# block-outer: one 512 B block row (group a's two pages); group b overlays from byte 0.
# BHLNC: head h of the i-th of k layers of a run at h*k*NC + i*NC (NC = 128).
# layer-outer: slot 0 (a0, b0) region [0, 768), slot 1 (a1) [768, 1536).
# LHBNC: head h of block b at region + h*3*128 + b*128.
EXPECTED = {
    "BLHNC": [("a0", "page", 0, 512, 256), ("a1", "page", 256, 512, 256), ("b0", "page", 0, 512, 256)],
    "BLNHC": [("a0", "page", 0, 512, 256), ("a1", "page", 256, 512, 256), ("b0", "page", 0, 512, 256)],
    "BHLNC": [
        ("a0", "head0", 0, 512, 128),
        ("a0", "head1", 256, 512, 128),
        ("a1", "head0", 128, 512, 128),
        ("a1", "head1", 384, 512, 128),
        ("b0", "head0", 0, 512, 128),
        ("b0", "head1", 128, 512, 128),
    ],
    "LBHNC": [("a0", "page", 0, 256, 256), ("a1", "page", 768, 256, 256), ("b0", "page", 0, 256, 256)],
    "LBNHC": [("a0", "page", 0, 256, 256), ("a1", "page", 768, 256, 256), ("b0", "page", 0, 256, 256)],
    "LHBNC": [
        ("a0", "head0", 0, 128, 128),
        ("a0", "head1", 384, 128, 128),
        ("a1", "head0", 768, 128, 128),
        ("a1", "head1", 1152, 128, 128),
        ("b0", "head0", 0, 128, 128),
        ("b0", "head1", 384, 128, 128),
    ],
}


@pytest.mark.parametrize("order", KV_CACHE_LAYOUTS)
def test_hand_written_rows(order: str) -> None:
    lay = K.plan_layout(_two_groups(order))
    t = lay.table()
    assert rows(t) == EXPECTED[order]
    assert lay.total_bytes == t.total_bytes == 1536
    assert lay.order == order
    assert K.verify(t).ok
    assert t.padding == ()


@pytest.mark.parametrize("order", KV_CACHE_LAYOUTS)
def test_every_block_clears_its_whole_logical_tile(order: str) -> None:
    """Every layout stores 768 B of group a per block; block b of a clears exactly those bytes."""
    t = K.plan(_two_groups(order)).for_group("a")
    seen: set[int] = set()
    for b in range(3):
        got = set(itertools.chain.from_iterable(range(x, y) for x, y in K.expected_zeroed(t, [b]).tolist()))
        assert len(got) == 2 * 256 and seen.isdisjoint(got)
        seen |= got


def test_packed_and_layer_major_are_aliases() -> None:
    specs = [K.preset(p) for p in ("dsv4-test", "dsv4", "llama-8b")]
    specs += [random_spec(s, layout=lay) for s in range(60) for lay in ("packed", "layer_major")]
    for spec in specs:
        alias = LAYOUT_ALIASES[spec.layout]
        same = K.KVCacheSpec(spec.num_blocks, alias, spec.groups)
        a, b = K.plan(spec), K.plan(same)
        assert a == b and a.padding == b.padding, spec.to_json()
        if not any(layer.split_kv for _, layer in spec.layers):
            other = "BLNHC" if alias == "BLHNC" else "LBNHC"
            c = K.plan(K.KVCacheSpec(spec.num_blocks, other, spec.groups))
            assert c == a and c.padding == a.padding


def test_today_s_tables_unchanged() -> None:
    """The packed and layer_major numbers of test_planner.py, through the vLLM names."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(100))
    t2 = K.plan(K.KVCacheSpec(100, "BLHNC", K.preset("dsv4-test").groups))
    assert [(s.base, s.stride, s.span) for s in t2.segments] == [
        (0, 149_760, 37_376),
        (37_440, 149_760, 37_376),
        (74_880, 149_760, 37_376),
        (112_320, 149_760, 37_376),
    ]
    assert t2 == t and t2.total_bytes == 14_976_000
    assert [(p.base, p.span) for p in t2.padding] == [(37_376 + i * 37_440, 64) for i in range(4)]
    llama = K.preset("llama-8b")
    t3 = K.plan(K.KVCacheSpec(llama.num_blocks, "LBHNC", llama.groups))
    page = 2 * 16 * 8 * 128 * 2
    assert rows(t3)[:3] == [
        ("model.layers.0.self_attn", "k", 0, page // 2, page // 2),
        ("model.layers.0.self_attn", "v", page // 2 * 64, page // 2, page // 2),
        ("model.layers.1.self_attn", "k", page * 64, page // 2, page // 2),
    ]


# --------------------------------------------------------------------------- stride oracle
def _oracle_bytes(order: str, lays: list[tuple[int, int, int]], n: int, b: int) -> set[int]:
    """Bytes of block ``b`` for one group of ``L`` layers of equal (H, N, C), unpadded.

    Strides follow the physical order exactly as the definition reads: the innermost axis has
    stride 1 (byte), each outer axis the product of the inner extents.
    """
    h, s, c = lays[0]
    shape = {"L": len(lays), "B": n, "H": h, "N": s, "C": c}
    stride, acc = {}, 1
    for axis in reversed(order):
        stride[axis] = acc
        acc *= shape[axis]
    out: set[int] = set()
    for li, hi, ni in itertools.product(range(len(lays)), range(h), range(s)):
        a = li * stride["L"] + b * stride["B"] + hi * stride["H"] + ni * stride["N"]
        out.update(range(a, a + c))
    return out


@pytest.mark.parametrize("order", KV_CACHE_LAYOUTS)
@pytest.mark.parametrize("seed", range(6))
def test_uniform_group_matches_the_stride_oracle(order: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    heads, bs, hs = int(rng.integers(1, 4)), int(rng.choice([1, 2, 4])), int(rng.choice([2, 4, 6]))
    n, num = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    layers = tuple(
        K.FullAttentionSpec(name=f"l{i}", block_size=bs, num_kv_heads=heads, head_size=hs, dtype="float32")
        for i in range(num)
    )
    spec = K.KVCacheSpec(n, order, (K.GroupSpec("g", layers),))
    t = K.plan(spec)
    assert K.verify(t).ok
    geo = [(layer.heads, layer.states, layer.content_bytes) for layer in layers]
    for b in range(n):
        want = _oracle_bytes(order, geo, n, b)
        got = K.expected_zeroed(t, [b])
        assert set(itertools.chain.from_iterable(range(x, y) for x, y in got.tolist())) == want, (order, b)


@pytest.mark.parametrize("order", KV_CACHE_LAYOUTS)
def test_random_specs_of_every_order_are_proven_safe(order: str) -> None:
    for s in O.seeds(25):
        spec = random_spec(5000 + s, layout=order, max_blocks=6)
        t = K.plan(spec)
        rep = K.verify(t)
        assert rep.ok, (spec.to_json(), rep)
        ids = list(range(spec.num_blocks))
        buf = K.poison_pattern(t.total_bytes)
        before = buf.copy()
        K.zero_blocks_numpy(buf, t, ids[::2])
        assert np.array_equal(K.changed_ranges(before, buf), K.expected_zeroed(t, ids[::2]))


# --------------------------------------------------------------------------- alignment and padding
def test_block_stride_alignment_packed_rounds_the_row() -> None:
    """vLLM: bytes_per_block = round_up(widest group's pages, lcm of the alignments)."""
    x = K.MLASpec(name="x", block_size=4, head_size=6, dtype="float32", block_stride_alignment=128)  # 96
    y = K.MLASpec(name="y", block_size=4, head_size=6, dtype="float32", block_stride_alignment=96)  # 96
    for order in ("packed", "BLNHC", "BHLNC"):
        lay = K.plan_layout(K.KVCacheSpec(4, order, (K.GroupSpec("g", (x, y)),)))
        assert lay.block_stride == 384  # round_up(192, lcm(128, 96) = 384)
        t = lay.table()
        assert rows(t) == [("x", "page", 0, 384, 96), ("y", "page", 96, 384, 96)]
        assert [(p.base, p.stride, p.span) for p in t.padding] == [(192, 384, 192)]
        assert t.total_bytes == 4 * 384 and K.verify(t).ok


def test_block_stride_alignment_layer_outer_rounds_each_layer() -> None:
    """vLLM: a layer-outer block stride is the page rounded up to its own alignment."""
    x = K.MLASpec(
        name="x", block_size=4, head_size=6, dtype="float32", block_stride_alignment=128
    )  # 96 -> 128
    y = K.MLASpec(name="y", block_size=4, head_size=8, dtype="float32")  # 128
    lay = K.plan_layout(K.KVCacheSpec(3, "LBNHC", (K.GroupSpec("g", (x, y)),)))
    assert lay.slot_pages == (128, 128)
    t = lay.table()
    assert rows(t) == [("x", "page", 0, 128, 96), ("y", "page", 384, 128, 128)]
    assert [(p.base, p.stride, p.span) for p in t.padding] == [(96, 128, 32)]
    assert K.verify(t).ok


def test_single_head_slot_may_be_padded_outside_the_page() -> None:
    """LHBNC/BHLNC with one head slot pad like LBHNC/BLHNC (the dsv4 geometry)."""
    spec = K.preset("dsv4-test").with_num_blocks(5)
    for order, like in (("LHBNC", "LBHNC"), ("BHLNC", "BLHNC")):
        a = K.plan(K.KVCacheSpec(5, order, spec.groups))
        b = K.plan(K.KVCacheSpec(5, like, spec.groups))
        assert a == b and a.padding == b.padding and K.verify(a).ok


# --------------------------------------------------------------------------- refusals
def _one(layer: K.LayerSpec, order: str) -> K.KVCacheSpec:
    return K.KVCacheSpec(2, order, (K.GroupSpec("g", (layer,)),))


def test_padding_with_head_slots_outside_the_page_refused() -> None:
    layer = K.FullAttentionSpec(
        name="p", block_size=4, num_kv_heads=2, head_size=8, dtype="bfloat16", alignment=384
    )
    for order in ("LHBNC", "BHLNC"):
        with pytest.raises(
            SpecError, match=rf"layer 'p'.alignment = 384: {order} cannot pad a page of 2 head slots"
        ):
            K.plan(_one(layer, order))
    padded = K.FullAttentionSpec(
        name="q", block_size=4, num_kv_heads=2, head_size=8, dtype="bfloat16", padded_page=512
    )
    with pytest.raises(SpecError, match=r"layer 'q'.padded_page = 512: LHBNC cannot pad"):
        K.plan(_one(padded, "LHBNC"))
    assert K.verify(K.plan(_one(layer, "BLHNC"))).ok  # heads inside the page: fine


def test_lhbnc_block_stride_alignment_refused() -> None:
    layer = K.MLASpec(name="x", block_size=4, head_size=6, dtype="float32", block_stride_alignment=128)
    with pytest.raises(SpecError, match=r"layer 'x'.block_stride_alignment = 128: LHBNC cannot pad the page"):
        K.plan(_one(layer, "LHBNC"))


def test_lhbnc_slots_must_agree_on_heads() -> None:
    a = K.FullAttentionSpec(name="a", block_size=4, num_kv_heads=2, head_size=8, dtype="bfloat16")  # 2 x 128
    b = K.FullAttentionSpec(name="b", block_size=4, num_kv_heads=4, head_size=4, dtype="bfloat16")  # 4 x 64
    spec = K.KVCacheSpec(3, "LHBNC", (K.GroupSpec("g", (a,)), K.GroupSpec("h", (b,))))
    with pytest.raises(
        SpecError, match=r"layer 'b'.heads = 4: every layer of slot 0 must agree on head slots"
    ):
        K.plan(spec)
    # the same pair under LBHNC is safe: both pages are whole blocks
    assert K.verify(K.plan(K.KVCacheSpec(3, "LBHNC", spec.groups))).ok


@pytest.mark.parametrize("order", ["LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"])
def test_kv_split_only_in_layer_major(order: str) -> None:
    layer = K.FullAttentionSpec(
        name="kv", block_size=4, num_kv_heads=1, head_size=8, dtype="float32", kv_split=True
    )
    with pytest.raises(
        SpecError, match=rf"layer 'kv'.kv_split = True: kv_split is an error in the {order} layout"
    ):
        K.plan(_one(layer, order))
    assert K.verify(K.plan(_one(layer, "LBHNC"))).ok


def test_head_run_not_whole_words_refused() -> None:
    layer = K.FullAttentionSpec(
        name="w", block_size=1, num_kv_heads=2, head_size=1, dtype="float16"
    )  # N*C = 4
    assert K.verify(K.plan(_one(layer, "BHLNC"))).ok
    odd = K.FullAttentionSpec(
        name="o", block_size=1, num_kv_heads=2, head_size=1, dtype="float16", state_content_bytes=6
    )  # N*C = 6
    with pytest.raises(SpecError, match=r"layer 'o'.real_page = 12: one head slot holds 6 B"):
        K.plan(_one(odd, "LHBNC"))


def test_stride_alignment_not_whole_words_refused() -> None:
    layer = K.MLASpec(
        name="x", block_size=1, head_size=4, dtype="float32", block_stride_alignment=6
    )  # 16 -> 18
    for order in ("BLHNC", "LBHNC"):
        with pytest.raises(
            SpecError, match=r"layer 'x'.block_stride_alignment = 6: aligns the block stride to 18 B"
        ):
            K.plan(_one(layer, order))


def test_limits_of_section_8() -> None:
    big = K.MLASpec(name="x", block_size=1, head_size=4, dtype="float32", block_stride_alignment=2**61 + 4)
    with pytest.raises(SpecError, match=r"num_blocks = 2: the layout would need"):
        K.plan(_one(big, "BLHNC"))
    a = K.MLASpec(name="a", block_size=1, head_size=4, dtype="float32", block_stride_alignment=2**40 + 4)
    b = K.MLASpec(name="b", block_size=1, head_size=4, dtype="float32", block_stride_alignment=2**40 - 4)
    with pytest.raises(
        SpecError, match=r"layer 'b'.block_stride_alignment = .*the lcm of the block-stride alignments"
    ):
        K.plan(K.KVCacheSpec(1, "BLHNC", (K.GroupSpec("g", (a, b)),)))


# --------------------------------------------------------------------------- richer spec kinds
def test_richer_attention_fields_page_arithmetic() -> None:
    base = dict(name="x", block_size=16, num_kv_heads=4, head_size=64, dtype="bfloat16")
    assert K.FullAttentionSpec(**base).real_page == 2 * 16 * 4 * 64 * 2  # type: ignore[arg-type]
    v32 = K.FullAttentionSpec(**base, head_size_v=32)  # type: ignore[arg-type]
    assert v32.real_page == 16 * 4 * (64 + 32) * 2
    slots = K.FullAttentionSpec(**base, num_head_slots=2)  # type: ignore[arg-type]
    assert slots.real_page == 2 * 16 * 2 * 64 * 2
    packed = K.FullAttentionSpec(**base, state_content_bytes=136)  # type: ignore[arg-type]
    assert (packed.heads, packed.states, packed.content_bytes, packed.real_page) == (4, 16, 136, 4 * 16 * 136)
    pooled = K.FullAttentionSpec(**base, states_per_token=4)  # type: ignore[arg-type]
    assert pooled.states == 64 and pooled.real_page == 4 * 64 * 256
    comp = K.FullAttentionSpec(**base, tokens_per_state=4)  # type: ignore[arg-type]
    assert comp.states == 4 and comp.real_page == 4 * 4 * 256
    padded = K.FullAttentionSpec(**base, padded_page=20000)  # type: ignore[arg-type]
    assert (padded.real_page, padded.page, padded.gap) == (16384, 20000, 3616)
    mla = K.MLASpec(
        name="m",
        block_size=256,
        head_size=512,
        dtype="uint8",
        compress_ratio=4,
        token_bytes=584,
        num_head_slots=2,
        alignment=576,
    )
    assert (mla.heads, mla.states, mla.content_bytes, mla.real_page, mla.page) == (2, 64, 584, 74752, 74880)
    assert (
        K.MLASpec(name="w", block_size=8, head_size=4, dtype="float32", states_per_token=2).real_page == 256
    )
    mamba = K.MambaSpec(name="s", state_bytes=100, padded_page=128, block_stride_alignment=256)
    assert (mamba.real_page, mamba.page, mamba.stride_alignment) == (100, 128, 256)


def test_richer_fields_json_round_trip() -> None:
    spec = K.KVCacheSpec(
        4,
        "BHLNC",
        (
            K.GroupSpec(
                "a",
                (
                    K.FullAttentionSpec(
                        name="x",
                        block_size=4,
                        num_kv_heads=2,
                        head_size=8,
                        dtype="float16",
                        head_size_v=4,
                        num_head_slots=2,
                        tokens_per_state=2,
                        block_stride_alignment=64,
                    ),
                    K.SlidingWindowSpec(
                        name="y",
                        block_size=4,
                        num_kv_heads=2,
                        head_size=8,
                        dtype="float16",
                        window=8,
                        state_content_bytes=48,
                        states_per_token=2,
                    ),
                ),
            ),
            K.GroupSpec(
                "b",
                (
                    K.MLASpec(
                        name="z",
                        block_size=4,
                        head_size=8,
                        dtype="uint8",
                        num_head_slots=1,
                        window=16,
                        padded_page=64,
                    ),
                    K.MambaSpec(name="s", state_bytes=12, padded_page=32, block_stride_alignment=32),
                ),
            ),
        ),
    )
    text = spec.to_json()
    assert K.KVCacheSpec.from_json(text) == spec
    assert json.loads(text)["groups"][0]["layers"][0]["head_size_v"] == 4
    assert K.verify(K.plan(spec)).ok


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"head_size_v": -1}, r"head_size_v = -1: must be at least 0"),
        ({"num_head_slots": 0}, r"num_head_slots = 0: must be positive"),
        ({"state_content_bytes": 0}, r"state_content_bytes = 0: must be positive"),
        ({"tokens_per_state": 3}, r"tokens_per_state = 3: block_size 4 is not a multiple of it"),
        (
            {"tokens_per_state": 2, "states_per_token": 2},
            r"states_per_token = 2: a state covers several tokens",
        ),
        ({"padded_page": 200}, r"padded_page = 200: smaller than the real page of 256 B"),
        ({"padded_page": 258}, r"padded_page = 258: padded page 258 B is not a multiple of 4"),
        (
            {"padded_page": 256, "alignment": 256},
            r"padded_page = 256: give alignment or padded_page, not both",
        ),
        ({"block_stride_alignment": 0}, r"block_stride_alignment = 0: must be positive"),
        (
            {"kv_split": True, "state_content_bytes": 32},
            r"state_content_bytes = 32: kv_split needs K and V halves",
        ),
        ({"kv_split": True, "head_size_v": 2}, r"head_size_v = 2: kv_split needs K and V halves"),
        ({"padded_page": 2**62}, r"padded_page = 4611686018427387904: must be at most 2\*\*62 - 1"),
    ],
)
def test_richer_fields_validated(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=r"layer 'x'\." + message):
        K.FullAttentionSpec(  # type: ignore[arg-type]
            name="x", block_size=4, num_kv_heads=2, head_size=4, dtype="float32", **kw
        )
    # and the same through JSON, anchored on the JSON path
    d = {
        "version": 1,
        "num_blocks": 1,
        "layout": "BLHNC",
        "groups": [
            {
                "name": "g",
                "layers": [
                    {
                        "name": "x",
                        "kind": "full",
                        "block_size": 4,
                        "num_kv_heads": 2,
                        "head_size": 4,
                        "dtype": "float32",
                        **kw,
                    }
                ],
            }
        ],
    }
    with pytest.raises(SpecError, match=r"groups\[0\]\.layers\[0\]: layer 'x'\." + message):
        K.KVCacheSpec.from_dict(d)


def test_richer_fields_json_types() -> None:
    d = {
        "version": 1,
        "num_blocks": 1,
        "layout": "LHBNC",
        "groups": [
            {"name": "g", "layers": [{"name": "x", "kind": "mamba", "state_bytes": 8, "padded_page": "64"}]}
        ],
    }
    with pytest.raises(
        SpecError, match=r"groups\[0\]\.layers\[0\]\.padded_page = '64': must be a JSON integer"
    ):
        K.KVCacheSpec.from_dict(d)


# --------------------------------------------------------------------------- virtual splitting
@pytest.mark.parametrize("order", ["LBHNC", "LBNHC", "LHBNC", "BLHNC", "BHLNC"])
def test_virtual_splitting_keeps_the_bytes(order: str) -> None:
    layer = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=2, head_size=8, dtype="float32")
    whole = K.KVCacheSpec(3, order, (K.GroupSpec("g", (layer,)),))
    split = K.KVCacheSpec(3, order, (K.GroupSpec("g", (layer,), kernel_block_size=4),))
    tw, ts = K.plan(whole), K.plan(split)
    assert len(ts) == 4 * len(tw)
    assert {s.virtual_index for s in ts.segments} == {0, 1, 2, 3}
    for b in range(3):
        assert np.array_equal(K.expected_zeroed(ts, [b]), K.expected_zeroed(tw, [b]))
    assert K.verify(ts).ok


def test_layers_of_one_geometry_are_placed_together_as_vllm_places_them() -> None:
    """Issue 23 item 6: vLLM 0.33 puts a group's layers of one spec into one ``KVCacheTensor``
    in every order, so heads 8, 2, 8, 4 sit as layers 0, 2, 1, 3. A hand-written spec listing them
    0, 1, 2, 3 must clear exactly the bytes of vLLM's own plan (read by ``spec_from_kv_cache_config``,
    which tests/test_vllm_ground_truth.py holds equal to vLLM's zeroer), block by block."""
    import os
    from types import SimpleNamespace

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import torch
    from vllm.v1 import kv_cache_interface as I
    from vllm.v1.core import kv_cache_planning as P

    from kvlayout.integrations.vllm import spec_from_kv_cache_config

    def config(layout: str) -> Any:
        cache = SimpleNamespace(
            num_gpu_blocks_override=4,
            prefix_cache_retention_interval=None,
            kv_cache_layout=layout,
            get_resolved_kv_cache_layout=lambda: I.KVCacheLayout[layout],
        )
        return SimpleNamespace(
            cache_config=cache,
            attention_config=SimpleNamespace(hisparse_config=None),
            scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
            model_config=SimpleNamespace(supports_kv_cache_grouping=False),
        )

    planned = 0
    for shapes in ([(8, 8), (2, 8), (8, 8), (4, 8)], [(8, 8), (4, 16), (8, 8), (2, 32)]):
        names = [f"model.layers.{i}.attn" for i in range(len(shapes))]
        for layout in KV_CACHE_LAYOUTS:
            specs = {
                n: I.FullAttentionSpec(block_size=16, num_kv_heads=h, head_size=hs, dtype=torch.bfloat16)
                for n, (h, hs) in zip(names, shapes)
            }
            vc = config(layout)
            groups = P.get_kv_cache_groups(vc, dict(specs))
            try:
                kcc = P.get_kv_cache_config_from_groups(vc, groups, 4 * P._pool_bytes_per_block(vc, groups))
            except ValueError:  # mixed pages under LHBNC/BHLNC: vLLM cannot express them
                assert layout in ("LHBNC", "BHLNC") and len({h * hs for h, hs in shapes}) > 1
                continue
            assert [t.layers for t in kcc.kv_cache_tensors] == [names[0::2], [names[1]], [names[3]]]
            theirs = K.plan(spec_from_kv_cache_config(kcc, I.KVCacheLayout[layout]))
            layers = [
                {
                    "name": n,
                    "kind": "full",
                    "block_size": 16,
                    "num_kv_heads": h,
                    "head_size": hs,
                    "dtype": "bfloat16",
                }
                for n, (h, hs) in zip(names, shapes)
            ]
            ours = K.plan(
                K.KVCacheSpec.from_dict(
                    {
                        "num_blocks": kcc.num_blocks,
                        "layout": layout,
                        "groups": [{"name": "attn", "layers": layers}],
                    }
                )
            )
            assert ours.total_bytes == theirs.total_bytes, layout
            for b in range(ours.num_blocks):
                for n in names:
                    mine = [(s.base + b * s.stride, s.span) for s in ours.segments if s.layer == n]
                    vllm = [(s.base + b * s.stride, s.span) for s in theirs.segments if s.layer == n]
                    assert sorted(mine) == sorted(vllm), (layout, shapes, n, b)
            planned += 1
    assert planned == 10  # every order for equal pages, the four block-compact ones for mixed pages
