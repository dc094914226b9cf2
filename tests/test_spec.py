"""Spec parsing, page arithmetic and every rejection path (GEOMETRY.md sections 1 and 4)."""

from __future__ import annotations

import copy
import json

import pytest

import kvlayout as K
from kvlayout.errors import SpecError

DSV4_JSON = {
    "version": 1,
    "num_blocks": 100,
    "layout": "packed",
    "groups": [
        {
            "name": "mla",
            "kernel_block_size": 256,
            "layers": [
                {
                    "name": "model.layers.0.self_attn",
                    "kind": "mla",
                    "block_size": 256,
                    "head_size": 512,
                    "cache_dtype": "fp8_ds_mla",
                    "compress_ratio": 4,
                    "alignment": 576,
                }
            ],
        }
    ],
}


def test_worked_example_page_arithmetic() -> None:
    spec = K.KVCacheSpec.from_dict(DSV4_JSON)
    layer = spec.groups[0].layers[0]
    assert isinstance(layer, K.MLASpec)
    assert layer.stored_tokens == 64
    assert layer.real_page == 37_376
    assert layer.page == 37_440 == 65 * 576
    assert layer.gap == 64


@pytest.mark.parametrize("name", sorted(K.PRESETS))
def test_json_round_trip_exact(name: str) -> None:
    spec = K.preset(name)
    text = spec.to_json()
    again = K.KVCacheSpec.from_json(text)
    assert again == spec
    assert json.loads(again.to_json()) == json.loads(text)


def test_json_round_trip_keeps_input_verbatim() -> None:
    assert K.KVCacheSpec.from_dict(DSV4_JSON).to_dict() == DSV4_JSON


def test_page_sizes_of_each_kind() -> None:
    full = K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    assert full.real_page == 2 * 16 * 8 * 128 * 2
    swa = K.SlidingWindowSpec(
        name="s", block_size=16, num_kv_heads=1, head_size=64, dtype="float32", window=128
    )
    assert swa.real_page == 2 * 16 * 64 * 4
    idx = K.MLASpec(name="i", block_size=256, head_size=132, dtype="uint8", compress_ratio=4, alignment=576)
    assert (idx.real_page, idx.page) == (8_448, 8_640)
    c128 = K.MLASpec(
        name="c", block_size=256, head_size=512, cache_dtype="fp8_ds_mla", compress_ratio=128, alignment=576
    )
    assert (c128.real_page, c128.page) == (1_168, 1_728)
    tb = K.MLASpec(name="t", block_size=8, head_size=512, dtype="bfloat16", token_bytes=12)
    assert tb.real_page == 96
    cd = K.MLASpec(name="d", block_size=8, head_size=16, cache_dtype="float16")
    assert cd.real_page == 8 * 16 * 2
    m = K.MambaSpec(name="m", state_bytes=1000, alignment=512)
    assert (m.real_page, m.page, m.zeroed) == (1000, 1024, False)


def _mut(path: list[object], value: object, delete: bool = False) -> dict:
    d = copy.deepcopy(DSV4_JSON)
    cur: object = d
    for p in path[:-1]:
        cur = cur[p]  # type: ignore[index]
    if delete:
        del cur[path[-1]]  # type: ignore[attr-defined]
    else:
        cur[path[-1]] = value  # type: ignore[index]
    return d


L0 = ["groups", 0, "layers", 0]


@pytest.mark.parametrize(
    "data, field, value",
    [
        (_mut([*L0, "kind"], "attention"), "kind", "attention"),
        (_mut([*L0, "cache_dtype"], "fp4"), "cache_dtype", "fp4"),
        (_mut([*L0, "block_size"], None, delete=True), "block_size", None),
        (_mut([*L0, "bogus"], 3), "bogus", 3),
        (_mut(["extra_top"], 1), "extra_top", 1),
        (_mut([*L0, "block_size"], "256"), "block_size", "256"),
        (_mut([*L0, "block_size"], 256.0), "block_size", 256.0),
        (_mut([*L0, "block_size"], True), "block_size", True),
        (_mut([*L0, "block_size"], -256), "block_size", -256),
        (_mut([*L0, "head_size"], 0), "head_size", 0),
        (_mut([*L0, "compress_ratio"], 3), "compress_ratio", 3),
        (_mut([*L0, "alignment"], 0), "alignment", 0),
        (_mut(["num_blocks"], -1), "num_blocks", -1),
        (_mut(["layout"], "interleaved"), "layout", "interleaved"),
        (_mut(["version"], 2), "version", 2),
        (_mut(["groups"], []), "groups", []),
        (_mut(["groups", 0, "layers"], []), "layers", []),
        (_mut(["groups", 0, "kernel_block_size"], 0), "kernel_block_size", 0),
    ],
)
def test_rejections_name_field_and_value(data: dict, field: str, value: object) -> None:
    with pytest.raises(SpecError) as ei:
        K.KVCacheSpec.from_dict(data)
    msg = str(ei.value)
    assert field in msg
    if value is not None:
        assert repr(value) in msg


def test_unknown_dtype_named() -> None:
    with pytest.raises(SpecError, match=r"dtype = 'float64'"):
        K.FullAttentionSpec(name="a", block_size=16, num_kv_heads=1, head_size=8, dtype="float64")


def test_page_not_multiple_of_4_rejected() -> None:
    with pytest.raises(SpecError, match=r"layer 'odd'.real_page = 30"):
        K.MambaSpec(name="odd", state_bytes=30)
    with pytest.raises(SpecError, match=r"layer 'odd2'.*multiple of 4"):
        K.MLASpec(name="odd2", block_size=3, head_size=1, dtype="uint8")
    with pytest.raises(SpecError, match=r"alignment = 6"):
        K.MambaSpec(name="a6", state_bytes=4, alignment=6)


def test_mla_needs_a_dtype() -> None:
    with pytest.raises(SpecError, match="needs dtype or cache_dtype"):
        K.MLASpec(name="x", block_size=4, head_size=4)


def test_duplicate_names_rejected() -> None:
    a = K.MambaSpec(name="dup", state_bytes=4)
    with pytest.raises(SpecError, match="duplicate layer name"):
        K.KVCacheSpec(num_blocks=1, layout="packed", groups=(K.GroupSpec("g", (a, a)),))
    with pytest.raises(SpecError, match="duplicate group name"):
        K.KVCacheSpec(
            num_blocks=1,
            layout="packed",
            groups=(K.GroupSpec("g", (a,)), K.GroupSpec("g", (K.MambaSpec(name="b", state_bytes=4),))),
        )


def test_bad_json_text() -> None:
    with pytest.raises(SpecError, match="not valid JSON"):
        K.KVCacheSpec.from_json("{nope")
