"""kvlayout.spec: every rule's field, value and message, and the page arithmetic by formula (issue 19).

Expected messages are typed out from the form ``field = repr(value): why``; pages come from
vLLM's ``H * N * C`` (GEOMETRY.md sections 1 and 6) computed here, never from the library.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

import kvlayout as K
from kvlayout import spec as S
from kvlayout.errors import SpecError

ITEM = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}
DTYPES = "float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int8, uint8"
LAYOUTS = "packed, layer_major, LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC"
BIG = 2**20  # 2 * BIG**3 * 2 = 2**62


def _err(fn: Callable[[], object]) -> SpecError:
    with pytest.raises(SpecError) as e:
        fn()
    return e.value


def full(**kw: Any) -> K.FullAttentionSpec:
    args: dict[str, Any] = {
        "name": "a",
        "block_size": 16,
        "num_kv_heads": 2,
        "head_size": 8,
        "dtype": "float16",
    }
    return K.FullAttentionSpec(**(args | kw))


def mla(**kw: Any) -> K.MLASpec:
    args: dict[str, Any] = {"name": "a", "block_size": 16, "head_size": 8, "dtype": "float16"}
    return K.MLASpec(**(args | kw))


def _g(*layers: K.LayerSpec, **kw: Any) -> K.GroupSpec:
    return K.GroupSpec("g", layers, **kw)


L = "layer 'a'"
# (what raises, message, field, value)
CASES: list[tuple[Callable[[], object], str, str, object]] = [
    (lambda: S.layout_order("nope"), f"layout = 'nope': valid layouts: {LAYOUTS}", "layout", "nope"),
    (
        lambda: S.layout_order(3),  # type: ignore[arg-type]
        f"layout = 3: valid layouts: {LAYOUTS}",
        "layout",
        3,
    ),
    (lambda: full(dtype="fp4"), f"{L}.dtype = 'fp4': unknown dtype; valid: {DTYPES}", f"{L}.dtype", "fp4"),
    (lambda: full(dtype=4), f"{L}.dtype = 4: unknown dtype; valid: {DTYPES}", f"{L}.dtype", 4),
    (lambda: full(block_size=0), f"{L}.block_size = 0: must be positive", f"{L}.block_size", 0),
    (lambda: full(num_kv_heads=0), f"{L}.num_kv_heads = 0: must be positive", f"{L}.num_kv_heads", 0),
    (lambda: full(head_size=-1), f"{L}.head_size = -1: must be positive", f"{L}.head_size", -1),
    (lambda: full(kv_split="yes"), f"{L}.kv_split = 'yes': must be true or false", f"{L}.kv_split", "yes"),
    (lambda: full(kv_split=1), f"{L}.kv_split = 1: must be true or false", f"{L}.kv_split", 1),
    (lambda: full(head_size_v=-1), f"{L}.head_size_v = -1: must be at least 0", f"{L}.head_size_v", -1),
    (lambda: full(num_head_slots=0), f"{L}.num_head_slots = 0: must be positive", f"{L}.num_head_slots", 0),
    (
        lambda: full(state_content_bytes=0),
        f"{L}.state_content_bytes = 0: must be positive",
        f"{L}.state_content_bytes",
        0,
    ),
    (
        lambda: full(tokens_per_state=0),
        f"{L}.tokens_per_state = 0: must be positive",
        f"{L}.tokens_per_state",
        0,
    ),
    (
        lambda: full(states_per_token=0),
        f"{L}.states_per_token = 0: must be positive",
        f"{L}.states_per_token",
        0,
    ),
    (
        lambda: full(tokens_per_state=3),
        f"{L}.tokens_per_state = 3: block_size 16 is not a multiple of it",
        f"{L}.tokens_per_state",
        3,
    ),
    (
        lambda: full(tokens_per_state=2, states_per_token=2),
        f"{L}.states_per_token = 2: a state covers several tokens or a token several states",
        f"{L}.states_per_token",
        2,
    ),
    (
        lambda: full(kv_split=True, head_size_v=4),
        f"{L}.head_size_v = 4: kv_split needs K and V halves of one size",
        f"{L}.head_size_v",
        4,
    ),
    (
        lambda: full(kv_split=True, state_content_bytes=64),
        f"{L}.state_content_bytes = 64: kv_split needs K and V halves of one size",
        f"{L}.state_content_bytes",
        64,
    ),
    (lambda: full(alignment=0), f"{L}.alignment = 0: must be positive", f"{L}.alignment", 0),
    (lambda: full(padded_page=0), f"{L}.padded_page = 0: must be positive", f"{L}.padded_page", 0),
    (
        lambda: full(block_stride_alignment=0),
        f"{L}.block_stride_alignment = 0: must be positive",
        f"{L}.block_stride_alignment",
        0,
    ),
    (
        lambda: full(alignment=64, padded_page=1024),
        f"{L}.padded_page = 1024: give alignment or padded_page, not both",
        f"{L}.padded_page",
        1024,
    ),
    (
        lambda: full(padded_page=1020),  # real page 2*16*2*8*2 = 1024
        f"{L}.padded_page = 1020: smaller than the real page of 1024 B",
        f"{L}.padded_page",
        1020,
    ),
    (
        lambda: full(block_size=BIG, num_kv_heads=BIG, head_size=BIG),
        f"{L}.real_page = {2**62}: page bytes must be below 2**62 (section 8)",
        f"{L}.real_page",
        2**62,
    ),
    (
        lambda: full(block_size=BIG, num_kv_heads=BIG, head_size=BIG - 1, alignment=2**61),
        f"{L}.real_page = {2**62 - 2**42}: page bytes must be below 2**62 (section 8)",
        f"{L}.real_page",
        2**62 - 2**42,
    ),
    (
        lambda: full(block_size=1, num_kv_heads=1, head_size=1, dtype="int8"),
        f"{L}.real_page = 2: page bytes must be a multiple of 4",
        f"{L}.real_page",
        2,
    ),
    (
        lambda: full(padded_page=1026),
        f"{L}.padded_page = 1026: padded page 1026 B is not a multiple of 4",
        f"{L}.padded_page",
        1026,
    ),
    (
        lambda: full(alignment=6, block_size=1, num_kv_heads=1, head_size=1),  # real 4 -> page 6
        f"{L}.alignment = 6: padded page 6 B is not a multiple of 4",
        f"{L}.alignment",
        6,
    ),
    (
        lambda: K.SlidingWindowSpec("a", 16, 2, 8, "float16", window=0),
        f"{L}.window = 0: must be positive",
        f"{L}.window",
        0,
    ),
    (
        lambda: K.SlidingWindowSpec("a", 0, 2, 8, "float16", window=4),
        f"{L}.block_size = 0: must be positive",
        f"{L}.block_size",
        0,
    ),
    (lambda: mla(block_size=0), f"{L}.block_size = 0: must be positive", f"{L}.block_size", 0),
    (lambda: mla(num_head_slots=0), f"{L}.num_head_slots = 0: must be positive", f"{L}.num_head_slots", 0),
    (lambda: mla(window=0), f"{L}.window = 0: must be positive", f"{L}.window", 0),
    (lambda: mla(head_size=0), f"{L}.head_size = 0: must be positive", f"{L}.head_size", 0),
    (lambda: mla(dtype="x"), f"{L}.dtype = 'x': unknown dtype; valid: {DTYPES}", f"{L}.dtype", "x"),
    (
        lambda: mla(cache_dtype="fp4"),
        f"{L}.cache_dtype = 'fp4': unknown cache dtype; valid: fp8_ds_mla, {DTYPES}",
        f"{L}.cache_dtype",
        "fp4",
    ),
    (
        lambda: mla(dtype=None),
        f"{L}.dtype = None: an mla layer needs dtype or cache_dtype",
        f"{L}.dtype",
        None,
    ),
    (lambda: mla(compress_ratio=0), f"{L}.compress_ratio = 0: must be positive", f"{L}.compress_ratio", 0),
    (
        lambda: mla(compress_ratio=3),
        f"{L}.compress_ratio = 3: block_size 16 is not a multiple of it",
        f"{L}.compress_ratio",
        3,
    ),
    (lambda: mla(token_bytes=0), f"{L}.token_bytes = 0: must be positive", f"{L}.token_bytes", 0),
    (
        lambda: mla(compress_ratio=4, states_per_token=2),
        f"{L}.states_per_token = 2: a state covers several tokens or a token several states",
        f"{L}.states_per_token",
        2,
    ),
    (
        lambda: mla(states_per_token=0),
        f"{L}.states_per_token = 0: must be positive",
        f"{L}.states_per_token",
        0,
    ),
    (lambda: mla(alignment=0), f"{L}.alignment = 0: must be positive", f"{L}.alignment", 0),
    (lambda: K.MambaSpec("a", 0), f"{L}.state_bytes = 0: must be positive", f"{L}.state_bytes", 0),
    (
        lambda: K.MambaSpec("a", 8, padded_page=1),
        f"{L}.padded_page = 1: smaller than the real page of 8 B",
        f"{L}.padded_page",
        1,
    ),
    (
        lambda: K.MambaSpec("a", 6),
        f"{L}.real_page = 6: page bytes must be a multiple of 4",
        f"{L}.real_page",
        6,
    ),
    (lambda: K.MambaSpec("", 8), "layer.name = '': must be a non-empty string", "layer.name", ""),
    (lambda: K.GroupSpec("", (mla(),)), "group.name = '': must be a non-empty string", "group.name", ""),
    (
        lambda: K.GroupSpec("g", []),  # type: ignore[arg-type]
        "group 'g'.layers = (): must be a non-empty list or tuple",
        "group 'g'.layers",
        (),
    ),
    (
        lambda: K.GroupSpec("g", "ab"),  # type: ignore[arg-type]
        "group 'g'.layers = 'ab': must be a non-empty list or tuple",
        "group 'g'.layers",
        "ab",
    ),
    (
        lambda: K.GroupSpec("g", (mla(), 3)),  # type: ignore[arg-type]
        "group 'g'.layers[1] = 3: must be a layer spec",
        "group 'g'.layers[1]",
        3,
    ),
    (
        lambda: K.GroupSpec("g", (mla(),), 0),
        "group 'g'.kernel_block_size = 0: must be positive",
        "group 'g'.kernel_block_size",
        0,
    ),
    (
        lambda: K.GroupSpec("g", (mla(),), 3).split_ratio(mla()),
        "group 'g'.kernel_block_size = 3: does not divide block_size 16 of layer 'a'",
        "group 'g'.kernel_block_size",
        3,
    ),
    (
        lambda: K.KVCacheSpec(1, "packed", (_g(mla()),), version=2),
        "version = 2: only version 1 is supported",
        "version",
        2,
    ),
    (
        lambda: K.KVCacheSpec(-1, "packed", (_g(mla()),)),
        "num_blocks = -1: must be at least 0",
        "num_blocks",
        -1,
    ),
    (
        lambda: K.KVCacheSpec(2**31, "packed", (_g(mla()),)),
        f"num_blocks = {2**31}: must be at most 2**31 - 1 (GEOMETRY.md section 8)",
        "num_blocks",
        2**31,
    ),
    (lambda: K.KVCacheSpec(1, "P", (_g(mla()),)), f"layout = 'P': valid layouts: {LAYOUTS}", "layout", "P"),
    (
        lambda: K.KVCacheSpec(1, "packed", []),  # type: ignore[arg-type]
        "groups = (): must be a non-empty list or tuple",
        "groups",
        (),
    ),
    (
        lambda: K.KVCacheSpec(1, "packed", "g"),  # type: ignore[arg-type]
        "groups = 'g': must be a non-empty list or tuple",
        "groups",
        "g",
    ),
    (
        lambda: K.KVCacheSpec(1, "packed", [_g(mla()), 3]),  # type: ignore[arg-type]
        "groups[1] = 3: must be a GroupSpec",
        "groups[1]",
        3,
    ),
    (
        lambda: K.KVCacheSpec(1, "packed", (_g(mla()), K.GroupSpec("g", (mla(name="b"),)))),
        "group.name = 'g': duplicate group name",
        "group.name",
        "g",
    ),
    (
        lambda: K.KVCacheSpec(1, "packed", (_g(mla()), K.GroupSpec("h", (mla(),)))),
        "layer.name = 'a': duplicate layer name",
        "layer.name",
        "a",
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rule_names_field_value_and_reason(case: int) -> None:
    fn, message, field, value = CASES[case]
    e = _err(fn)
    assert type(e) is SpecError
    assert str(e) == message
    assert e.field == field
    assert type(e.value) is type(value) and e.value == value


def test_edges_that_load() -> None:
    """The other side of each bound above: these load."""
    full(padded_page=1024)  # equal to the real page
    full(block_stride_alignment=1, num_head_slots=1, state_content_bytes=1, tokens_per_state=1)
    mla(window=1, num_head_slots=1, compress_ratio=1, token_bytes=1, alignment=4)
    full(head_size_v=0)
    full(tokens_per_state=2, states_per_token=1)
    full(tokens_per_state=1, states_per_token=2)
    full(kv_split=True, head_size_v=8)
    full(kv_split=False, head_size_v=4)
    full(block_size=BIG, num_kv_heads=BIG, head_size=BIG - 1)  # 2**62 - 2**42: just below the limit
    big = full(block_size=BIG, num_kv_heads=BIG, head_size=BIG - 1, alignment=7 * 2**40)
    assert big.page == 2**62 - 2**41
    mla(compress_ratio=4, states_per_token=1)
    mla(compress_ratio=1, states_per_token=3)
    mla(dtype=None, cache_dtype="fp8_ds_mla")
    mla(dtype=None, cache_dtype="int8")
    K.MambaSpec("a", 4, padded_page=8)
    assert S.layout_order("LHBNC") == "LHBNC" and S.layout_order("packed") == "BLHNC"
    assert S.layout_order("layer_major") == "LBHNC"


def _page_oracle(d: dict[str, Any]) -> tuple[int, int]:
    """(real page, padded page) of a layer's JSON by vLLM's H * N * C."""
    kind = d["kind"]
    if kind == "mamba":
        real = d["state_bytes"]
    elif kind == "mla":
        heads = d.get("num_head_slots") or 1
        states = d["block_size"] // (d.get("compress_ratio") or 1) * (d.get("states_per_token") or 1)
        if d.get("token_bytes") is not None:
            cell = d["token_bytes"]
        elif d.get("cache_dtype") == "fp8_ds_mla":
            cell = 584
        else:
            cell = d["head_size"] * ITEM[d.get("cache_dtype") or d["dtype"]]
        real = heads * states * cell
    else:
        heads = d.get("num_head_slots") or d["num_kv_heads"]
        states = d["block_size"] // (d.get("tokens_per_state") or 1) * (d.get("states_per_token") or 1)
        if d.get("state_content_bytes") is not None:
            cell = d["state_content_bytes"]
        else:
            v = d["head_size"] if d.get("head_size_v") is None else d["head_size_v"]
            cell = (d["head_size"] + v) * ITEM[d["dtype"]]
        real = heads * states * cell
    if d.get("padded_page") is not None:
        return real, d["padded_page"]
    a = d.get("alignment")
    return real, (-(-real // a) * a if a else real)


def _random_layer(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.choice(("full", "sliding_window", "mla", "mamba"))
    d: dict[str, Any] = {"name": f"l{i}", "kind": kind}
    if kind == "mamba":
        d["state_bytes"] = 4 * rng.randint(1, 300)
    else:
        d["block_size"] = rng.choice((4, 8, 16, 64))
        d["head_size"] = rng.choice((4, 8, 12, 64, 132))
        d["dtype"] = rng.choice(list(ITEM))
        if rng.random() < 0.4:
            d["num_head_slots"] = rng.randint(1, 4)
    if kind in ("full", "sliding_window"):
        d["num_kv_heads"] = rng.randint(1, 4)
        if kind == "sliding_window":
            d["window"] = rng.randint(1, 512)
        r = rng.random()
        if r < 0.25:
            d["tokens_per_state"] = rng.choice((1, 2, 4))
        elif r < 0.5:
            d["states_per_token"] = rng.choice((1, 2, 3))
        if rng.random() < 0.3:
            d["head_size_v"] = rng.choice((0, 4, 8, 32))
        if rng.random() < 0.2:
            d["state_content_bytes"] = 4 * rng.randint(1, 40)
    elif kind == "mla":
        r = rng.random()
        if r < 0.3:
            d["compress_ratio"] = rng.choice((1, 2, 4))
        elif r < 0.5:
            d["states_per_token"] = rng.choice((1, 2))
        if rng.random() < 0.3:
            d["cache_dtype"] = rng.choice(["fp8_ds_mla", *ITEM])
        if rng.random() < 0.2:
            d["token_bytes"] = 4 * rng.randint(1, 200)
    r = rng.random()
    if r < 0.3:
        d["alignment"] = rng.choice((4, 8, 64, 128, 576))
    elif r < 0.45:
        d["padded_page"] = 4 * rng.randint(1, 3000)
    if rng.random() < 0.2:
        d["block_stride_alignment"] = rng.choice((4, 16, 512))
    return d


def test_pages_match_the_formula_on_random_layers() -> None:
    """Real and padded pages, heads, states and gap of every loadable random layer, by H * N * C."""
    rng = random.Random(1914)
    loaded = 0
    for i in range(600):
        d = _random_layer(rng, i)
        spec = {"num_blocks": 2, "layout": "packed", "groups": [{"name": "g", "layers": [d]}]}
        real, page = _page_oracle(d)
        try:
            layer = K.KVCacheSpec.from_dict(spec).groups[0].layers[0]
        except SpecError as e:
            assert real % 4 or page % 4 or page < real, (d, str(e))
            continue
        loaded += 1
        assert (layer.real_page, layer.page, layer.gap) == (real, page, page - real), d
        assert layer.to_dict() == d and list(layer.to_dict())[:2] == ["name", "kind"]
        assert layer.zeroed == (d["kind"] != "mamba")
        assert layer.stride_alignment == (d.get("block_stride_alignment") or 1)
        assert layer.split_kv is False
        assert layer.logical_block_size == d.get("block_size")
        assert layer.geometry_key == tuple(sorted((k, v) for k, v in d.items() if k != "name"))
    assert loaded > 300


def test_heads_and_states() -> None:
    f = full(num_head_slots=3, tokens_per_state=4)
    assert (f.heads, f.states, f.content_bytes) == (3, 4, 32)
    assert (full().heads, full(states_per_token=3).states) == (2, 48)
    m = mla(compress_ratio=4, num_head_slots=2, token_bytes=12)
    assert (m.heads, m.states, m.ratio, m.stored_tokens, m.content_bytes) == (2, 4, 4, 4, 12)
    assert (mla().heads, mla().ratio, mla(states_per_token=2).states) == (1, 1, 32)
    assert (
        mla(cache_dtype="float32").bytes_per_token == 32
        and mla(cache_dtype="fp8_ds_mla").bytes_per_token == 584
    )
    assert K.MambaSpec("a", 8).heads == 1 and K.MambaSpec("a", 8).states == 1
    assert K.MambaSpec("a", 8).logical_block_size is None and full(kv_split=True).split_kv is True


def test_group_and_spec_objects() -> None:
    a, b = mla(), K.MambaSpec("b", 8)
    g = K.GroupSpec("g", [a, b], 4)  # type: ignore[arg-type]
    assert g.layers == (a, b)
    assert (g.split_ratio(a), g.split_ratio(b), K.GroupSpec("h", (a,)).split_ratio(a)) == (4, 1, 1)
    assert list(g.to_dict()) == ["name", "kernel_block_size", "layers"]
    assert list(K.GroupSpec("h", (a,)).to_dict()) == ["name", "layers"]
    spec = K.KVCacheSpec(3, "LHBNC", [g])  # type: ignore[arg-type]
    assert spec.groups == (g,) and spec.order == "LHBNC" and spec.layers == ((g, a), (g, b))
    other = spec.with_num_blocks(7)
    assert (other.num_blocks, other.layout, other.groups, other.version) == (7, "LHBNC", (g,), 1)
    d = spec.to_dict()
    assert list(d) == ["version", "num_blocks", "layout", "groups"] and d["num_blocks"] == 3
    assert spec.to_json() == json.dumps(d) and spec.to_json(indent=2) == json.dumps(d, indent=2)
    assert K.KVCacheSpec.from_json(spec.to_json()) == spec
    assert K.KVCacheSpec.from_json(spec.to_json().encode()) == spec
    assert K.KVCacheSpec.from_dict(d) == spec


def _layer_json(**kw: Any) -> dict[str, Any]:
    return {
        "name": "a",
        "kind": "full",
        "block_size": 16,
        "num_kv_heads": 2,
        "head_size": 8,
        "dtype": "float16",
    } | kw


def _spec_json(layers: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "num_blocks": 2,
        "layout": "packed",
        "groups": [{"name": "g", "layers": layers or [_layer_json()]}],
    } | kw


P = "groups[0].layers[0]"
ALLOWED_TOP = "groups, layout, num_blocks, version"
ALLOWED_FULL = (
    "alignment, block_size, block_stride_alignment, dtype, head_size, head_size_v, kind, kv_split, name, "
    "num_head_slots, num_kv_heads, padded_page, state_content_bytes, states_per_token, tokens_per_state"
)
JSON_CASES: list[tuple[object, str, str, object]] = [
    ([], "spec = []: must be a JSON object", "spec", []),
    (
        {"layout": "packed", "groups": []},
        "spec.num_blocks = None: missing required field",
        "spec.num_blocks",
        None,
    ),
    (_spec_json(extra=1), f"spec.extra = 1: unknown field; allowed: {ALLOWED_TOP}", "spec.extra", 1),
    (_spec_json(version="1"), "version = '1': must be a JSON integer", "version", "1"),
    (_spec_json(version=True), "version = True: must be a JSON integer", "version", True),
    (_spec_json(num_blocks=2.0), "num_blocks = 2.0: must be a JSON integer", "num_blocks", 2.0),
    (_spec_json(layout=1), "layout = 1: must be a JSON string", "layout", 1),
    (_spec_json(groups={}), "groups = {}: must be a non-empty list", "groups", {}),
    (_spec_json(groups=[]), "groups = []: must be a non-empty list", "groups", []),
    (_spec_json(groups=[3]), "groups[0] = 3: must be a JSON object", "groups[0]", 3),
    (
        _spec_json(groups=[{"name": "g"}]),
        "groups[0].layers = None: missing required field",
        "groups[0].layers",
        None,
    ),
    (
        _spec_json(groups=[{"name": "g", "layers": [_layer_json()], "k": 1}]),
        "groups[0].k = 1: unknown field; allowed: kernel_block_size, layers, name",
        "groups[0].k",
        1,
    ),
    (
        _spec_json(groups=[{"name": 1, "layers": [_layer_json()]}]),
        "groups[0].name = 1: must be a JSON string",
        "groups[0].name",
        1,
    ),
    (
        _spec_json(groups=[{"name": "g", "kernel_block_size": "4", "layers": [_layer_json()]}]),
        "groups[0].kernel_block_size = '4': must be a JSON integer",
        "groups[0].kernel_block_size",
        "4",
    ),
    (
        _spec_json(groups=[{"name": "g", "layers": []}]),
        "groups[0].layers = []: must be a non-empty list",
        "groups[0].layers",
        [],
    ),
    (
        _spec_json(groups=[{"name": "g", "layers": {}}]),
        "groups[0].layers = {}: must be a non-empty list",
        "groups[0].layers",
        {},
    ),
    (_spec_json([3]), f"{P} = 3: must be a JSON object", P, 3),
    (_spec_json([{"name": "a"}]), f"{P}.kind = None: missing required field", f"{P}.kind", None),
    (
        _spec_json([{"name": "a", "kind": "gqa"}]),
        f"{P}.kind = 'gqa': unknown layer kind; valid: full, sliding_window, mla, mamba",
        f"{P}.kind",
        "gqa",
    ),
    (
        _spec_json([{k: v for k, v in _layer_json().items() if k != "head_size"}]),
        f"{P}.head_size = None: missing required field",
        f"{P}.head_size",
        None,
    ),
    (
        _spec_json([{k: v for k, v in _layer_json().items() if k != "name"}]),
        f"{P}.name = None: missing required field",
        f"{P}.name",
        None,
    ),
    (
        _spec_json([_layer_json(kind="sliding_window")]),
        f"{P}.window = None: missing required field",
        f"{P}.window",
        None,
    ),
    (
        _spec_json([{"name": "a", "kind": "mla", "block_size": 4}]),
        f"{P}.head_size = None: missing required field",
        f"{P}.head_size",
        None,
    ),
    (
        _spec_json([{"name": "a", "kind": "mamba"}]),
        f"{P}.state_bytes = None: missing required field",
        f"{P}.state_bytes",
        None,
    ),
    (
        _spec_json([_layer_json(window=4)]),
        f"{P}.window = 4: unknown field; allowed: {ALLOWED_FULL}",
        f"{P}.window",
        4,
    ),
    (_spec_json([_layer_json(kv_split=1)]), f"{P}.kv_split = 1: must be a JSON boolean", f"{P}.kv_split", 1),
    (_spec_json([_layer_json(name=5)]), f"{P}.name = 5: must be a JSON string", f"{P}.name", 5),
    (
        _spec_json([_layer_json(block_size="16")]),
        f"{P}.block_size = '16': must be a JSON integer",
        f"{P}.block_size",
        "16",
    ),
    (
        _spec_json([_layer_json(block_size=0)]),
        f"{P}: {L}.block_size = 0: must be positive",
        f"{L}.block_size",
        0,
    ),
]


@pytest.mark.parametrize("case", range(len(JSON_CASES)))
def test_json_rule_names_field_value_and_reason(case: int) -> None:
    data, message, field, value = JSON_CASES[case]
    e = _err(lambda: K.KVCacheSpec.from_dict(data))
    assert type(e) is SpecError and str(e) == message and e.field == field
    assert type(e.value) is type(value) and e.value == value


def test_json_optional_fields_load() -> None:
    sw = {
        "name": "w",
        "kind": "sliding_window",
        "block_size": 16,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": "float32",
        "window": 64,
    }
    mamba = {"name": "m", "kind": "mamba", "state_bytes": 64, "padded_page": 128}
    m = {"name": "c", "kind": "mla", "block_size": 16, "head_size": 8, "cache_dtype": "int8", "window": 8}
    spec = K.KVCacheSpec.from_dict(_spec_json([sw, mamba, m], version=1))
    assert [type(x) for x in spec.groups[0].layers] == [K.SlidingWindowSpec, K.MambaSpec, K.MLASpec]
    first, second = spec.groups[0].layers[0], spec.groups[0].layers[1]
    assert first.window == 64 and second.page == 128  # type: ignore[attr-defined]
    assert K.KVCacheSpec.from_dict(_spec_json()).version == 1


def test_from_json_names_the_spec() -> None:
    e = _err(lambda: K.KVCacheSpec.from_json("{nope"))
    assert str(e).startswith("spec is not valid JSON: ") and e.field == "json"
    e = _err(lambda: K.KVCacheSpec.from_json(b"[\xff]"))
    assert str(e) == "spec = 'byte 1': is not UTF-8 text" and e.field == "spec"


# --------------------------------------------------------------------------- repeated layers (issue 25)


def _raw(name: object, **kw: object) -> dict[str, object]:
    layer: dict[str, object] = {
        "kind": "full",
        "block_size": 16,
        "num_kv_heads": 2,
        "head_size": 64,
        "dtype": "bfloat16",
        "name": name,
    }
    layer.update(kw)
    return layer


def _one_by_one(raw_layers: list[Any]) -> tuple[S.LayerSpec, ...]:
    """The layers checked each on its own: what the parse of repeated layers must equal."""
    return tuple(S._layer_from_dict(f"groups[0].layers[{i}]", rl) for i, rl in enumerate(raw_layers))


def _spec(raw_layers: list[Any]) -> dict[str, object]:
    return {"num_blocks": 4, "layout": "packed", "groups": [{"name": "g", "layers": raw_layers}]}


def _message(raw_layers: list[Any]) -> str:
    with pytest.raises(SpecError) as e:
        S.spec_from_dict(_spec(raw_layers))
    return str(e.value)


def test_repeated_layers_parse_as_each_on_its_own() -> None:
    """Equal layers but for the name are reused renamed: the same layers, each with its own name."""
    rng = random.Random(25)
    for _ in range(60):
        kinds = [
            {},
            {"kind": "sliding_window", "window": 64},
            {"head_size_v": 32},
            {"alignment": 256},
            {"kv_split": True},
            {"num_kv_heads": 4, "head_size": 128, "dtype": "float8_e4m3fn"},
        ]
        raw = [_raw(f"l{i}", **rng.choice(kinds)) for i in range(rng.randint(1, 12))]
        rng.shuffle(raw)
        for rl in raw:  # the same fields in another order are the same layer
            if rng.random() < 0.5:
                items = list(rl.items())
                rng.shuffle(items)
                rl.clear()
                rl.update(items)
        got = S.spec_from_dict(_spec(raw)).groups[0].layers
        assert got == _one_by_one(raw)
        assert [x.name for x in got] == [f"{r['name']}" for r in raw]
        assert len({id(x) for x in got}) == len(got)


def test_repeated_layers_keep_every_check_of_their_own() -> None:
    """A repeat differing only in a value's type, or with a bad name, is refused as on its own."""
    cases = [
        ([_raw("a"), _raw("b", num_kv_heads=True)], "groups[0].layers[1].num_kv_heads"),
        ([_raw("a", kv_split=True), _raw("b", kv_split=1)], "groups[0].layers[1].kv_split"),
        ([_raw("a"), _raw("b", num_kv_heads=2.0)], "groups[0].layers[1].num_kv_heads"),
        ([_raw("a"), _raw(7)], "groups[0].layers[1].name"),
        ([_raw("a"), _raw(None)], "groups[0].layers[1].name"),
        ([_raw("a"), _raw("")], "groups[0].layers[1]"),
        ([_raw("a"), _raw("bad name\n")], "groups[0].layers[1]"),
        ([_raw("a"), _raw("x" * 5000)], "groups[0].layers[1]"),
        ([_raw("a"), {k: v for k, v in _raw("b").items() if k != "name"}], "groups[0].layers[1].name"),
        ([_raw("a"), [_raw("b")]], "groups[0].layers[1]"),
        ([_raw("a"), _raw("b", extra=1)], "groups[0].layers[1].extra"),
        ([_raw("a"), {**_raw("b"), 1: 2}], "groups[0].layers[1].1"),  # a key that is not a string
        ([_raw("a"), {1: 2, **_raw("b")}], "groups[0].layers[1].1"),
    ]
    for raw, where in cases:
        msg = _message(raw)
        assert msg.startswith(where), (raw[1], msg)
        with pytest.raises(SpecError) as alone:  # the message a layer gets when it is checked alone
            _one_by_one(raw)
        assert msg == str(alone.value)
        with pytest.raises(SpecError) as e:
            S.spec_from_dict(_spec(raw))
        assert (e.value.field, e.value.value) == (alone.value.field, alone.value.value)


def test_repeated_layers_are_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound (issue 25): 3 distinct layers among 3,000 are checked field by field 3 times."""
    calls = []
    one = S._layer_from_dict

    def counted(path: str, raw: object) -> S.LayerSpec:
        calls.append(path)
        return one(path, raw)

    monkeypatch.setattr(S, "_layer_from_dict", counted)
    shapes: list[dict[str, object]] = [{}, {"head_size": 128}, {"kind": "sliding_window", "window": 32}]
    raw = [_raw(f"l{i}", **shapes[i % 3]) for i in range(3000)]
    raw.append({k: v for k, v in _raw("m").items()} | {"name": "m"})  # a repeat written again
    layers = S.spec_from_dict(_spec(raw)).groups[0].layers
    assert calls == ["groups[0].layers[0]", "groups[0].layers[1]", "groups[0].layers[2]"]
    assert [x.name for x in layers] == [f"l{i}" for i in range(3000)] + ["m"]
    assert layers[3] == S.FullAttentionSpec("l3", 16, 2, 64, "bfloat16")
    assert layers[5] == S.SlidingWindowSpec("l5", 16, 2, 64, "bfloat16", window=32)
