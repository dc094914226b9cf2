"""The planner on all six of vLLM's orders against tests/oracles.py's contract formulas (issue 19).

Random specs carry the section-6 fields (head slots, block-stride alignments, explicit padded
pages) so head rows, runs, stride rounding and every refusal are reached; the oracle predicts
rows, padding, offsets and totals, or that planning must fail.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

import kvlayout as K
from kvlayout.errors import SpecError
from kvlayout.testing import rich_spec_dict

from . import oracles as O

ORDERS = ("BLHNC", "BLNHC", "BHLNC", "LBHNC", "LBNHC", "LHBNC")


def _enrich(d: dict[str, Any], seed: int) -> dict[str, Any]:
    """Add section-6 fields to some layers; repeat a layer now and then (BHLNC runs)."""
    rng = random.Random(seed * 7 + 1)
    for g in d["groups"]:
        layers = g["layers"]
        if rng.random() < 0.3:  # a run of equal geometry under a new name
            src = rng.choice(layers)
            layers.insert(layers.index(src) + 1, dict(src, name=src["name"] + "r"))
        for layer in layers:
            if layer["kind"] != "mamba" and rng.random() < 0.3:
                layer["num_head_slots"] = rng.choice((1, 2, 3))
            if rng.random() < 0.25:
                layer["block_stride_alignment"] = rng.choice((4, 8, 12, 64, 96, 6))
            if rng.random() < 0.15 and O._layer_problem(layer) is None:
                layer.pop("alignment", None)
                layer["padded_page"] = O.real_page(layer) + rng.choice((0, 4, 12, 64))
    return d


def _specs(order: str, count: int, enrich: bool) -> list[K.KVCacheSpec]:
    out = []
    for seed in O.seeds(count):
        d = rich_spec_dict(seed, layout=order)
        if enrich:
            d = _enrich(d, seed)
        try:
            out.append(K.KVCacheSpec.from_dict(d))
        except SpecError:
            continue
    return out


@pytest.mark.parametrize("enrich", [False, True])
@pytest.mark.parametrize("order", ORDERS)
def test_every_order_matches_the_contract(order: str, enrich: bool) -> None:
    specs = _specs(order, 300, enrich)
    assert O.check_planner(K.plan, specs) == []
    planned = 0
    for spec in specs:
        ex = O.expected_plan(spec.to_dict())
        if ex.error is not None:
            continue
        planned += 1
        lay = K.plan_layout(spec)
        assert (lay.total_bytes, lay.block_stride, lay.slot_pages) == (
            ex.total,
            ex.block_stride,
            ex.slot_pages,
        )
        assert {p.layer.name: p.offset for p in lay.placements} == ex.offsets, spec.to_json()
        assert lay.order == order and lay.num_blocks == spec.num_blocks
        for g in spec.groups:
            for j, layer in enumerate(g.layers):
                p = lay.placement(layer.name)
                d = layer.to_dict()
                if ex.block_stride is not None:
                    want = ex.block_stride
                else:
                    sp = ex.slot_pages[j]
                    want = sp // O.heads(d) if order == "LHBNC" else sp // 2 if d.get("kv_split") else sp
                assert (p.group, p.slot, p.stride, type(p.stride)) == (g.name, j, want, int), (
                    spec.to_json(),
                    p,
                )
    assert 0 < planned < len(specs)  # both outcomes exercised


def test_enriched_specs_reach_every_branch() -> None:
    """The generator makes head rows, runs, stride rounding and padded pages under every order."""
    heads = runs = rounded = padded = 0
    for order in ORDERS:
        for spec in _specs(order, 300, True):
            ex = O.expected_plan(spec.to_dict())
            if ex.error is not None:
                continue
            heads += any(r[2].startswith("head") for r in ex.rows)
            d = spec.to_dict()
            runs += order == "BHLNC" and any(
                layer["name"].endswith("r") for g in d["groups"] for layer in g["layers"]
            )
            rounded += any(
                O.page(layer) % layer.get("block_stride_alignment", 4)
                for g in d["groups"]
                for layer in g["layers"]
            )
            padded += any("padded_page" in layer for g in d["groups"] for layer in g["layers"])
    assert min(heads, runs, rounded, padded) > 10 * O.SCALE, (heads, runs, rounded, padded)


def _full(name: str, **kw: Any) -> K.FullAttentionSpec:
    args: dict[str, Any] = {
        "name": name,
        "block_size": 16,
        "num_kv_heads": 2,
        "head_size": 8,
        "dtype": "float16",
    }
    return K.FullAttentionSpec(**(args | kw))  # real page 2*16*2*8*2 = 1024


def _mla(name: str, **kw: Any) -> K.MLASpec:
    args: dict[str, Any] = {"name": name, "block_size": 16, "head_size": 8, "dtype": "float16"}
    return K.MLASpec(**(args | kw))  # real page 16*8*2 = 256


def _spec(layout: str, *groups: tuple[K.LayerSpec, ...], n: int = 2, kbs: int | None = None) -> K.KVCacheSpec:
    return K.KVCacheSpec(n, layout, tuple(K.GroupSpec(f"g{i}", g, kbs) for i, g in enumerate(groups)))


LA, LB = "layer 'a'", "layer 'b'"
SIXTY_TWO = "the limit is 2**62 - 1 (section 8)"
# (spec, message, field, value): every refusal of the planner, its field, value and reason
REFUSALS: list[tuple[Any, str, str, object]] = [
    (
        lambda: _spec("LHBNC", (_full("a", num_head_slots=2, state_content_bytes=2, block_size=1),)),
        f"{LA}.real_page = 4: one head slot holds 2 B (N*C), not a multiple of 4: its rows cannot be zeroed "
        "in words",
        f"{LA}.real_page",
        4,
    ),
    (
        lambda: _spec("BHLNC", (_full("a", alignment=2048),)),
        f"{LA}.alignment = 2048: BHLNC cannot pad a page of 2 head slots (heads lie outside the page; vLLM "
        "allows padding there only with one head slot)",
        f"{LA}.alignment",
        2048,
    ),
    (
        lambda: _spec("LHBNC", (_full("a", padded_page=1028),)),
        f"{LA}.padded_page = 1028: LHBNC cannot pad a page of 2 head slots (heads lie outside the page; vLLM "
        "allows padding there only with one head slot)",
        f"{LA}.padded_page",
        1028,
    ),
    (
        lambda: _spec("packed", (_mla("b"), _full("a", kv_split=True))),
        f"{LA}.kv_split = True: kv_split is an error in the packed layout",
        f"{LA}.kv_split",
        True,
    ),
    (
        lambda: _spec("LHBNC", (_full("a", kv_split=True),)),
        f"{LA}.kv_split = True: kv_split is an error in the LHBNC layout",
        f"{LA}.kv_split",
        True,
    ),
    (
        lambda: _spec(
            "BLHNC",
            (_mla("a", block_stride_alignment=2**61),),
            (_mla("b", block_stride_alignment=3 * 2**60),),
        ),
        f"{LB}.block_stride_alignment = {3 * 2**60}: the lcm of the block-stride alignments reaches "
        f"{3 * 2**61}: {SIXTY_TWO}",
        f"{LB}.block_stride_alignment",
        3 * 2**60,
    ),
    (
        # every layer's alignment is odd or 2 mod 4 here; the first layer in spec order is named
        lambda: _spec("BLNHC", (_mla("a", block_stride_alignment=5), _mla("b"))),
        f"{LA}.block_stride_alignment = 5: aligns the block stride to 515 B, not a multiple of 4",
        f"{LA}.block_stride_alignment",
        5,
    ),
    (
        lambda: _spec("BLHNC", (_mla("a", block_stride_alignment=2**61 + 4),)),
        f"num_blocks = 2: the layout would need {2 * (2**61 + 4)} B; {SIXTY_TWO}",
        "num_blocks",
        2,
    ),
    (
        lambda: _spec("LBNHC", (_mla("a", block_stride_alignment=6),)),
        f"{LA}.block_stride_alignment = 6: aligns the block stride to 258 B, not a multiple of 4",
        f"{LA}.block_stride_alignment",
        6,
    ),
    (
        lambda: _spec("LHBNC", (_mla("a", block_stride_alignment=512),)),
        f"{LA}.block_stride_alignment = 512: LHBNC cannot pad the page of 256 B to a block stride of 512 B "
        "(heads lie outside the blocks; vLLM refuses it too)",
        f"{LA}.block_stride_alignment",
        512,
    ),
    (
        # the stride refusal comes first, before the slot's head slots are compared
        lambda: _spec("LHBNC", (_full("b"),), (_mla("a", block_stride_alignment=512, num_head_slots=1),)),
        f"{LA}.block_stride_alignment = 512: LHBNC cannot pad the page of 256 B to a block stride of 512 B "
        "(heads lie outside the blocks; vLLM refuses it too)",
        f"{LA}.block_stride_alignment",
        512,
    ),
    (
        lambda: _spec("LBHNC", (_full("b"),), (_full("a", kv_split=True),)),
        f"{LA}.kv_split = True: every layer of slot 0 must agree on kv_split (halves and whole pages of one "
        "region overlap across blocks)",
        f"{LA}.kv_split",
        True,
    ),
    (
        # slot 0: (2 heads, 1024 B), (1 head, 256 B), (2 heads, 1024 B): the first that differs is 'a'
        lambda: _spec("LHBNC", (_full("c"),), (_mla("a"),), (_full("d"),)),
        f"{LA}.heads = 1: every layer of slot 0 must agree on head slots and page under LHBNC (got "
        "[(1, 256), (2, 1024)]: block b of one group would share bytes with another block of the other)",
        f"{LA}.heads",
        1,
    ),
    (
        lambda: _spec("LHBNC", (_mla("c", num_head_slots=2),), (_mla("b", num_head_slots=2),), (_mla("a"),)),
        f"{LA}.heads = 1: every layer of slot 0 must agree on head slots and page under LHBNC (got "
        "[(1, 256), (2, 512)]: block b of one group would share bytes with another block of the other)",
        f"{LA}.heads",
        1,
    ),
    (
        lambda: _spec("LBHNC", (_full("a", kv_split=True, block_size=1, num_kv_heads=1, head_size=1),)),
        f"{LA}.kv_split = True: half pages (2 B stride, 2 B span) must be multiples of 4",
        f"{LA}.kv_split",
        True,
    ),
    (
        lambda: _spec("LBHNC", (_full("a", kv_split=True, block_size=1, num_kv_heads=1, head_size=3),)),
        f"{LA}.kv_split = True: half pages (6 B stride, 6 B span) must be multiples of 4",
        f"{LA}.kv_split",
        True,
    ),
    (
        lambda: _spec("LBHNC", (_mla("a", alignment=512),), kbs=4),
        "group 'g0'.kernel_block_size = 4: virtual block splitting needs a dense page, but layer 'a' has "
        "real page 256 B padded to 512 B",
        "group 'g0'.kernel_block_size",
        4,
    ),
    (
        lambda: _spec("BLHNC", (_mla("a", token_bytes=4, block_size=16, compress_ratio=4),), kbs=1),
        "group 'g0'.kernel_block_size = 1: layer 'a' part 'page' of 16 B is not a multiple of 4*16",
        "group 'g0'.kernel_block_size",
        1,
    ),
]


@pytest.mark.parametrize("case", range(len(REFUSALS)))
def test_planner_refusal_names_field_value_and_reason(case: int) -> None:
    make, message, field, value = REFUSALS[case]
    spec = make()
    with pytest.raises(SpecError) as e:
        K.plan(spec)
    assert type(e.value) is SpecError and str(e.value) == message
    assert e.value.field == field and type(e.value.value) is type(value) and e.value.value == value
    assert O.expected_plan(spec.to_dict()).error is not None


def test_layout_limits_in_layer_outer_orders() -> None:
    """A slot page or a region end reaching 2**62 is refused naming num_blocks."""
    big = K.MambaSpec("a", 2**61 + 4, block_stride_alignment=2**61)  # its block stride is 2**62
    with pytest.raises(SpecError) as e:
        K.plan(_spec("LBHNC", (big,), n=1))
    assert str(e.value) == f"num_blocks = 1: the layout would need {2**62} B; {SIXTY_TWO}"
    assert e.value.field == "num_blocks" and e.value.value == 1
    n = 2**31 - 1
    wide = _mla("a", block_size=1, head_size=2**33, dtype="int8")
    with pytest.raises(SpecError) as e:
        K.plan(_spec("LBNHC", (wide,), n=n))
    assert str(e.value) == f"num_blocks = {n}: the layout would need {2**33 * n} B; {SIXTY_TWO}"
    assert e.value.field == "num_blocks" and e.value.value == n


def test_placement_lookup_and_strides() -> None:
    spec = _spec("LHBNC", (_full("a"), _mla("b", num_head_slots=1)), n=3)
    lay = K.plan_layout(spec)
    a, b = lay.placement("a"), lay.placement("b")
    assert (a.slot, a.offset, a.stride, a.real_page, a.page) == (0, 0, 512, 1024, 1024)
    assert [(p.name, p.base, p.stride, p.span) for p in a.parts] == [
        ("head0", 0, 512, 512),
        ("head1", 1536, 512, 512),
    ]
    assert (b.slot, b.offset, b.stride) == (1, 3072, 256)
    with pytest.raises(KeyError) as e:
        lay.placement("zz")
    assert e.value.args == ("zz",)
    split = K.plan_layout(_spec("LBHNC", (_full("k", kv_split=True),), n=3)).placement("k")
    assert split.stride == 512 and [(p.name, p.base, p.stride, p.span) for p in split.parts] == [
        ("k", 0, 512, 512),
        ("v", 1536, 512, 512),
    ]


def _m(name: str, real: int, **kw: Any) -> K.MLASpec:
    """An mla layer of one int8 token of ``real`` bytes per block (real page = ``real``)."""
    return K.MLASpec(name=name, block_size=1, head_size=real, dtype="int8", **kw)


def test_padding_pieces_split_by_other_groups() -> None:
    """A gap cut into several pieces by another group's rows; rows meeting a piece at either end.

    Group a: x = [0, 100) real, gap [100, 200). Group b: b1 [0, 100) gap [100, 120), b2 [120, 132)
    gap [132, 152), b3 [152, 160). x's gap keeps [100, 120), [132, 152) and [160, 200).
    """
    spec = _spec(
        "packed",
        (_m("x", 100, alignment=200),),
        (_m("b1", 100, alignment=120), _m("b2", 12, alignment=32), _m("b3", 8)),
        n=1,
    )
    t = K.plan(spec)
    assert t.total_bytes == 200
    assert sorted((p.base, p.span, p.layer) for p in t.padding) == [
        (100, 20, "b1"),
        (100, 20, "x"),
        (132, 20, "b2"),
        (132, 20, "x"),
        (160, 40, "x"),
    ]
    assert all((p.stride, p.group, p.part, p.virtual_index) == (200, "", "padding", 0) for p in t.padding)
    assert O.check_planner(K.plan, [spec]) == []
    # rows that start exactly at a gap's start and end exactly at its end leave no empty pieces
    spec = _spec(
        "packed", (_m("x", 100, alignment=200),), (_m("c1", 100), _m("c2", 8, alignment=92), _m("c3", 8)), n=1
    )
    t = K.plan(spec)
    assert sorted((p.base, p.span, p.layer) for p in t.padding) == [(108, 84, "c2"), (108, 84, "x")]
    assert O.check_planner(K.plan, [spec]) == []


def test_block_stride_tail_padding_and_limits() -> None:
    spec = _spec("BLHNC", (_m("a", 100, block_stride_alignment=64),), n=2)
    t = K.plan(spec)
    assert t.total_bytes == 256 and [(p.base, p.stride, p.span, p.layer, p.part) for p in t.padding] == [
        (100, 128, 28, "", "padding")
    ]
    huge = _spec("BLHNC", (K.MambaSpec("a", 2**61 + 4), K.MambaSpec("b", 2**61 + 4)), n=0)
    with pytest.raises(SpecError) as e:
        K.plan(huge)  # no blocks, but the block stride itself reaches 2**62
    assert str(e.value) == f"num_blocks = 0: the layout would need {2**62 + 8} B; {SIXTY_TWO}"
    assert e.value.field == "num_blocks" and e.value.value == 0


def test_plan_coalesces_when_asked() -> None:
    spec = K.preset("dsv4")
    got = K.plan(spec, coalesce=True)
    want = K.plan(spec).coalesced()
    assert got == want and len(got) < len(K.plan(spec))


def test_row_count_is_bounded_before_any_row_exists() -> None:
    """A table holds at most 100,000 rows (issue 25): counted per layer before planning, a row per head
    slot under LHBNC/BHLNC, two per split K/V page, each times the group's virtual sub-blocks (Mamba
    state has no tokens: never split)."""
    from kvlayout.planner import plan_layout
    from kvlayout.table import MAX_TABLE_ROWS

    def refused(spec: K.KVCacheSpec) -> str:
        with pytest.raises(SpecError) as e:
            plan_layout(spec)
        assert e.value.field == "spec"
        return str(e.value)

    # 50,000 heads in each of 2 layers: exactly the bound under BHLNC and LHBNC; one more head is over
    for order in ("BHLNC", "LHBNC"):
        ok = _spec(order, tuple(_full(x, num_kv_heads=50_000, head_size=2, block_size=1) for x in "ab"), n=1)
        assert sum(len(p.parts) for p in plan_layout(ok).placements) == MAX_TABLE_ROWS
        over = _spec(order, (_full("a", num_kv_heads=50_000, head_size=2, block_size=1),
                             _full("b", num_kv_heads=50_001, head_size=2, block_size=1)), n=1)
        assert refused(over) == (
            "spec = '100001 rows or more': its table would pass 100,000 rows at layer 'b' (50001 rows a "
            "block, 1 virtual sub-blocks each; GEOMETRY.md section 8)"
        )
    # other layouts: one row a page (heads do not count), two with kv_split; times the sub-blocks
    assert len(plan_layout(_spec("packed", (_full("a", num_kv_heads=200_000),), n=1)).placements) == 1
    whole = _spec("packed", (_full("a", block_size=60_000, head_size=4),), n=1, kbs=1)  # 60,000 rows
    assert len(plan_layout(whole).placements) == 1
    split = _spec("layer_major", (_full("a", kv_split=True, block_size=50_000, head_size=4),), n=1, kbs=1)
    assert len(plan_layout(split).table()) == MAX_TABLE_ROWS
    over = _spec("layer_major", (_full("a", kv_split=True, block_size=50_001, head_size=4),), n=1, kbs=1)
    assert refused(over).endswith("(2 rows a block, 50001 virtual sub-blocks each; GEOMETRY.md section 8)")
    # a Mamba layer is not split (it has no block size) and its one part counts once
    mamba = K.MambaSpec(name="m", state_bytes=64)
    mixed = _spec("packed", (_full("a", block_size=16), mamba), n=1, kbs=8)
    assert len(plan_layout(mixed).table()) == 2


def test_padding_ranges_are_bounded() -> None:
    """Groups overlaid on one padded page cut its gap into a piece per real range of the other groups:
    k such groups over n layers made k * n padding ranges (3,000 x 3,000 ran 49 s, 1.45 GB; issue 25).
    Past 100,000 ranges the spec is refused, as soon as they pass the bound."""
    from kvlayout.planner import plan_layout

    def spec(k: int, n: int) -> K.KVCacheSpec:
        one = {"num_kv_heads": 1, "head_size": 2, "block_size": 1}
        small = tuple(_full(f"b{i}", padded_page=16, **one) for i in range(n))
        wide = [(_full(f"a{j}", padded_page=16 * n, **one),) for j in range(k)]
        return _spec("packed", small, *wide, n=4)

    # each small page's gap is one range; each wide page's gap [8, 16 n) is cut by the small layers'
    # real ranges [16 i, 16 i + 8) into n pieces: n + k n ranges, exactly the bound at k = 99, n = 1,000
    assert len(plan_layout(spec(2, 1000)).table().padding) == 1000 + 2 * 1000
    assert len(plan_layout(spec(99, 1000)).table().padding) == 100_000
    with pytest.raises(SpecError) as e:
        plan_layout(spec(100, 1000)).table()
    assert (e.value.field, e.value.value) == ("spec", "101000 padding ranges or more")
    assert str(e.value).endswith(
        "its padding would pass 100,000 ranges (a gap of a99 is cut by the layers of groups overlaid on "
        "it; GEOMETRY.md section 8)"
    )
    # the block row's aligned tail, one more range after exactly 100,000: named as the block row
    tail = spec(99, 1000)
    first = replace(tail.groups[1].layers[0], block_stride_alignment=16_384)
    tail = K.KVCacheSpec(4, "packed", (tail.groups[0], K.GroupSpec("g1", (first,)), *tail.groups[2:]))
    with pytest.raises(SpecError) as e:
        plan_layout(tail).table()
    assert e.value.value == "100001 padding ranges or more"
    assert "(a gap of the block row is cut by" in str(e.value)
