"""Gemma 4's rules (kvlayout/models/gemma4.py) on the host; vLLM's own construction of the same configs
is tests/test_models_hybrid_vllm.py (gemma4_*, built from :data:`GEMMA4` and :data:`GEMMA4_SHARED`)."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.spec import FullAttentionSpec, SlidingWindowSpec
from tests import json_reader as J

#: what the harness adds to every config (tests/test_models_hybrid_vllm.py's _BASE)
_BASE: dict[str, Any] = {"torch_dtype": "bfloat16", "vocab_size": 1024, "max_position_embeddings": 4096}
_S, _F = "sliding_attention", "full_attention"
# the large Gemma 4 models' shape, smaller: sliding layers 4 KV heads of 64, full layers (every 4th)
# attention_k_eq_v with 1 global KV head of global_head_dim 128; no layer shares a cache
GEMMA4: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "global_head_dim": 128,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "sliding_window": 128,
    "hidden_size_per_layer_input": 0,
    "layer_types": [_S, _S, _S, _F] * 2,
}
# the small (E) models' shape: one KV head, per-layer inputs, and the last 4 of 10 layers reading the
# caches of the last earlier layer of their type (num_kv_shared_layers)
GEMMA4_SHARED: dict[str, Any] = {
    **GEMMA4,
    "num_hidden_layers": 10,
    "num_key_value_heads": 1,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 4,
    "hidden_size_per_layer_input": 64,
    "vocab_size_per_layer_input": 1024,
    "layer_types": [_S, _S, _S, _S, _F] * 2,
}
G4: dict[str, Any] = {**_BASE, **GEMMA4}
E: dict[str, Any] = {**_BASE, **GEMMA4_SHARED}


def _plan(cfg: dict[str, Any], **kw: Any) -> M.ModelSpec:
    ms = J.from_config(cfg, **kw)
    assert isinstance(ms, M.ModelSpec)
    return ms


def _layers(ms: M.ModelSpec) -> dict[str, Any]:
    return {x.name: x for _, x in ms.spec.layers}


def test_pages_by_hand() -> None:
    """Sliding: 4 KV heads of 64 bf16 = 1,024 B a token; full: 1 head of 128 = 512 B. The full page
    (8,192 B in 16 tokens) doubles its block to meet the sliding one (16,384 B)."""
    ms = _plan(G4)
    lay = _layers(ms)
    swa, full = lay["model.layers.0.self_attn.attn"], lay["model.layers.3.self_attn.attn"]
    assert isinstance(swa, SlidingWindowSpec) and (swa.block_size, swa.page, swa.window) == (16, 16_384, 128)
    assert type(full) is FullAttentionSpec
    assert (full.block_size, full.page, full.head_size) == (32, 16_384, 128)
    assert [g.name for g in ms.spec.groups] == ["sliding.0", "sliding.1", "sliding.2", "full"]
    assert ms.bytes_per_block == 2 * 16_384 and ms.attention_backend == "TRITON_ATTN"  # groups overlay
    assert "head sizes 64, 128 differ" in ms.backend_reason


def test_shared_layers_keep_no_cache() -> None:
    """The last 4 of 10 layers read earlier caches: 6 layers in the spec, 5 sliding and 1 full, pages
    1 head x 64 x 2 x 2 B x 16 = 4,096 B (sliding) and 1 x 128: 8,192 B, the sliding block doubled."""
    ms = _plan(E)
    lay = _layers(ms)
    assert sorted(lay) == [f"model.layers.{i}.self_attn.attn" for i in range(6)]
    assert {(x.block_size, x.page) for n, x in lay.items() if not n.startswith("model.layers.4.")} == {
        (32, 8_192)
    }
    assert (lay["model.layers.4.self_attn.attn"].block_size, lay["model.layers.4.self_attn.attn"].page) == (
        16,
        8_192,
    )
    assert any("layers 6 to 9 read earlier layers' caches" in n for n in ms.notes)


def test_without_k_eq_v_the_full_layers_keep_the_kv_heads() -> None:
    ms = _plan({**G4, "attention_k_eq_v": False})
    full = _layers(ms)["model.layers.3.self_attn.attn"]
    assert (full.num_kv_heads, full.head_size, full.page) == (4, 128, 32_768)


def test_per_layer_config_wins_over_the_global_fields() -> None:
    """Written by transformers' to_dict (keys are strings): global_head_dim is then not read."""
    plc = {"3": {"head_dim": 32, "num_key_value_heads": 2}, "7": {"head_dim": 32, "num_key_value_heads": 2}}
    ms = _plan({**G4, "per_layer_config": plc, "global_head_dim": 999})
    full = _layers(ms)["model.layers.7.self_attn.attn"]
    assert (full.num_kv_heads, full.head_size) == (2, 32)


def test_the_transformers_reader_gives_the_same_cache() -> None:
    pytest.importorskip("transformers")
    for cfg in (G4, E, {**G4, "attention_k_eq_v": False}):
        a, b = _plan(cfg), _plan(cfg, reader="transformers")
        assert a.spec == b.spec and a.bytes_per_block == b.bytes_per_block


def test_the_last_layer_is_made_full_and_the_bidirectional_window_halved() -> None:
    ms = _plan({**G4, "layer_types": [_S, _S, _S, _F, _S, _S, _S, _S]})
    assert type(_layers(ms)["model.layers.7.self_attn.attn"]) is FullAttentionSpec
    assert any("makes the last layer full" in n for n in ms.notes)
    bidi = _plan({**G4, "use_bidirectional_attention": "all"})
    assert _layers(bidi)["model.layers.0.self_attn.attn"].window == 65  # 128 // 2 + 1
    vision = _plan({**G4, "use_bidirectional_attention": "vision"})
    assert _layers(vision)["model.layers.0.self_attn.attn"].window == 128


def test_one_head_size_takes_the_platforms_backend() -> None:
    same = {**G4, "global_head_dim": 64, "attention_k_eq_v": False}
    ms = _plan(same)
    assert ms.attention_backend == "FLASH_ATTN" and len({x.page for _, x in ms.spec.layers}) == 1
    assert _plan(same, attention_backend="TRITON_ATTN").attention_backend == "TRITON_ATTN"
    # one head size but pages of different KV heads, on Blackwell's FlashInfer: not modeled
    with pytest.raises(SpecError) as e:
        _plan({**G4, "global_head_dim": 64}, device="blackwell")
    assert e.value.field == "device" and "FLASHINFER" in str(e.value)


def test_the_multimodal_wrapper_names_the_language_model() -> None:
    wrapped = {**_BASE, "architectures": ["Gemma4ForConditionalGeneration"], "text_config": GEMMA4}
    names = list(_layers(_plan(wrapped)))
    assert names[0] == "language_model.model.layers.0.self_attn.attn" and len(names) == 8


@pytest.mark.parametrize(
    ("change", "tp", "field", "message"),
    [
        ({"layer_types": None}, 1, "config.layer_types", "missing; Gemma 4 names its sliding and full"),
        ({"layer_types": [_S] * 7}, 1, "config.layer_types", "needs exactly one item per layer (8)"),
        ({"layer_types": [_S, "chunked"] + [_F] * 6}, 1, "config.layer_types[1]", "valid: sliding_attention"),
        ({"global_head_dim": None}, 1, "config.global_head_dim", "missing; the full layers' head size"),
        ({"attention_k_eq_v": "yes"}, 1, "config.attention_k_eq_v", "must be true or false"),
        ({"num_key_value_heads": 3}, 1, "config.num_key_value_heads of layer 0", "not a multiple of 3"),
        ({"num_key_value_heads": 3}, 2, "config.num_key_value_heads of layer 0", "not divisible by tp = 2"),
        ({"num_attention_heads": 6}, 4, "config.num_attention_heads", "not divisible by tp = 4"),
        ({"num_kv_shared_layers": 9}, 1, "config.num_kv_shared_layers", "at most num_hidden_layers (8)"),
        ({"num_kv_shared_layers": 5}, 1, "config.num_kv_shared_layers", "and there is none"),
        ({"sliding_window": None}, 1, "config.sliding_window", "missing; the sliding layers' window"),
        ({"per_layer_config": [1]}, 1, "config.per_layer_config", "must be an object"),
        ({"per_layer_config": {"8": {}}}, 1, "config.per_layer_config key", "must be a layer index, 0 to 7"),
        ({"per_layer_config": {"x": {}}}, 1, "config.per_layer_config key", "must be a layer index"),
        ({"per_layer_config": {"3": 4}}, 1, "config.per_layer_config['3']", "must be an object"),
        (
            {"per_layer_config": {"3": {"head_dim": 0}}},
            1,
            "config.per_layer_config['3'].head_dim",
            "must be at least 1",
        ),
        (
            {"per_layer_config": {"3": {"head_dim": 32}}},
            1,
            "config.per_layer_config",
            "its full layers differ in head size or KV heads",
        ),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], tp: int, field: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        _plan(_without(change), tp=tp)
    assert e.value.field == field and message in str(e.value), str(e.value)


def _without(change: dict[str, Any]) -> dict[str, Any]:
    """G4 changed, a field changed to None left out (transformers' class refuses some nulls: below)."""
    return {k: v for k, v in {**G4, **change}.items() if v is not None}


def test_a_null_the_text_class_refuses_is_refused() -> None:
    """Gemma4TextConfig types its window and head sizes as ints (strict): a null is refused, as vLLM does."""
    for key in ("sliding_window", "head_dim", "num_key_value_heads"):
        with pytest.raises(SpecError) as e:
            _plan({**G4, key: None})
        assert e.value.field == f"config.{key}" and "Gemma4TextConfig refuses null for it" in str(e.value)


def test_the_attention_backend_is_refused_where_head_sizes_differ() -> None:
    with pytest.raises(SpecError) as e:
        _plan(G4, attention_backend="FLASH_ATTN")
    assert e.value.field == "attention_backend" and "Gemma4Config chooses the backend" in str(e.value)
    with pytest.raises(SpecError) as e:
        _plan(G4, block_size=24)
    assert e.value.field == "block_size" and "multiples of 16" in str(e.value)
    assert _plan(G4, block_size=32).block_size == 32


def test_tpu_inference_is_refused_by_name() -> None:
    with pytest.raises(SpecError) as e:
        J.spec_from_config(G4, engine="tpu-inference")
    assert e.value.field == "engine" and "Gemma4ForCausalLM's layers of different shapes" in str(e.value)


def test_shared_layers_are_checked_as_vllm_builds_them() -> None:
    """vLLM constructs every layer, the shared ones too: their KV heads must divide as any layer's."""
    plc = {"9": {"num_key_value_heads": 3}}
    with pytest.raises(SpecError) as e:
        _plan({**E, "per_layer_config": plc})
    assert e.value.field == "config.num_key_value_heads of layer 9" and e.value.value == 3


_HINT = "; reader='transformers' fills the config class's defaults, as vLLM does"
_TYPES = "valid: sliding_attention, full_attention"


@pytest.mark.parametrize(
    ("change", "tp", "field", "value", "message"),
    [
        ({"head_dim": None}, 1, "config.head_dim", None, "missing; the sliding layers' head size" + _HINT),
        (
            {"num_key_value_heads": None},
            1,
            "config.num_key_value_heads",
            None,
            "missing; the sliding layers' KV heads" + _HINT,
        ),
        ({"num_attention_heads": None}, 1, "config.num_attention_heads", None,
         "missing; the query heads" + _HINT),
        ({"num_attention_heads": 6}, 4, "config.num_attention_heads", 6, "not divisible by tp = 4"),
        ({"attention_k_eq_v": "yes"}, 1, "config.attention_k_eq_v", "yes", "must be true or false"),
        ({"layer_types": [_S, "x"] + [_F] * 6}, 1, "config.layer_types[1]", "x", _TYPES),
        (
            {"num_key_value_heads": 3},
            1,
            "config.num_key_value_heads of layer 0",
            3,
            "the 8 query heads per rank are not a multiple of 3",
        ),
        ({"num_key_value_heads": 3}, 2, "config.num_key_value_heads of layer 0", 3,
         "not divisible by tp = 2"),
        (
            {"num_key_value_heads": 3},
            8,
            "config.num_key_value_heads of layer 0",
            3,
            "tp = 8 is not a multiple of it",
        ),
        (
            {"num_kv_shared_layers": 8},
            1,
            "config.num_kv_shared_layers",
            8,
            "layer 0 (sliding) shares the cache of an earlier sliding layer, and there is none",
        ),
        (
            {"num_kv_shared_layers": 9},
            1,
            "config.num_kv_shared_layers",
            9,
            "must be at most num_hidden_layers (8)",
        ),
        (
            {"per_layer_config": [1]},
            1,
            "config.per_layer_config",
            [1],
            "must be an object: layer index -> that layer's fields",
        ),
        ({"per_layer_config": {"8": {}}}, 1, "config.per_layer_config key", "8",
         "must be a layer index, 0 to 7"),
        (
            {"per_layer_config": {"3": 4}},
            1,
            "config.per_layer_config['3']",
            4,
            "must be an object of the layer's fields",
        ),
        (
            {"per_layer_config": {"3": {"head_dim": 32}}},
            1,
            "config.per_layer_config",
            "per-layer shapes",
            "its full layers differ in head size or KV heads: vLLM merges such specs, not modeled",
        ),
        (
            {"per_layer_config": {"0": {"num_key_value_heads": 2}}},
            1,
            "config.per_layer_config",
            "per-layer shapes",
            "its sliding layers differ in head size or KV heads: vLLM merges such specs, not modeled",
        ),
    ],
)
def test_refusal_messages(change: dict[str, Any], tp: int, field: str, value: Any, message: str) -> None:
    with pytest.raises(SpecError) as e:
        _plan(_without(change), tp=tp)
    assert (e.value.field, e.value.value) == (field, value)
    assert str(e.value).endswith(f": {message}"), str(e.value)


def test_backend_refusal_messages_and_reason() -> None:
    with pytest.raises(SpecError) as e:
        _plan(G4, attention_backend="FLASH_ATTN")
    why = "Gemma 4's head sizes differ across layers: vLLM's Gemma4Config chooses the backend itself"
    assert str(e.value) == f"attention_backend = 'FLASH_ATTN': {why}" and e.value.value == "FLASH_ATTN"
    with pytest.raises(SpecError) as e:
        _plan(G4, block_size=24)
    assert str(e.value) == "block_size = 24: FlashAttention 4 and TRITON_ATTN take multiples of 16 tokens"
    with pytest.raises(SpecError) as e:
        _plan({**G4, "global_head_dim": 64}, device="blackwell")
    assert (e.value.field, e.value.value) == ("device", "blackwell")
    assert str(e.value).endswith(": pages differ on FLASHINFER, whose layout vLLM may pack block-outermost: "
                                 "not modeled for Gemma 4")
    assert _plan(G4).backend_reason == (
        "head sizes 64, 128 differ: vLLM's Gemma4Config runs FlashAttention 4 where available, else "
        "TRITON_ATTN; both take blocks in multiples of 16 tokens"
    )


def test_notes_exactly() -> None:
    unify = "vLLM 0.33 gives them 32-token blocks (unify_kv_cache_spec_page_size)"
    assert _plan(G4).notes == (f"full-attention pages of 8,192 B under the largest (16,384 B): {unify}",)
    last = _plan({**G4, "layer_types": [_S, _S, _S, _F, _S, _S, _S, _S]})
    forced = "layer 7 is written sliding_attention: Gemma4TextConfig makes the last layer full"
    assert last.notes[0] == forced
    assert [g.name for g in last.spec.groups] == ["sliding.0", "sliding.1", "sliding.2", "full"]
    assert last.kinds["model.layers.7.self_attn.attn"] == "full"
    other = _plan({**G4, "layer_types": [_S, _F, _S, _F, _S, _S, _F, _S]})  # the note reads the last one
    assert other.notes[0] == forced
    bidi = _plan({**G4, "use_bidirectional_attention": "all"})
    assert bidi.notes[0] == "use_bidirectional_attention 'all': the window is 65 (half plus one)"
    shared = _plan(E)
    assert shared.notes[0] == "layers 6 to 9 read earlier layers' caches (num_kv_shared_layers): no cache"
    assert len(_plan({**E, "num_kv_shared_layers": 0}).notes) == 1  # no shared layer: no such note


def test_per_layer_config_keys() -> None:
    """Layer 0 is a key; a key of nine characters is read (leading zeros), of ten refused unread (a
    5,000-digit key would break int())."""
    plc = {"0": {"num_key_value_heads": 4}, "000000003": {"head_dim": 128, "num_key_value_heads": 1}}
    plc["7"] = plc["000000003"]
    ms = _plan({**G4, "per_layer_config": plc})
    assert _layers(ms)["model.layers.3.self_attn.attn"].head_size == 128
    with pytest.raises(SpecError) as e:
        _plan({**G4, "per_layer_config": {"0000000003": {}}})
    assert (e.value.field, e.value.value) == ("config.per_layer_config key", "0000000003")


def test_k_eq_v_absent_is_false_and_tp_replicates() -> None:
    """Without attention_k_eq_v the full layers keep num_key_value_heads (the class default is false);
    tp 2 and 8 keep the full layer's one head (replicated), an fp8 cache halves every page."""
    no_flag = {k: v for k, v in G4.items() if k != "attention_k_eq_v"}
    assert _layers(_plan(no_flag))["model.layers.3.self_attn.attn"].num_kv_heads == 4
    for tp, (swa_heads, page) in {2: (2, 8_192), 8: (1, 8_192)}.items():
        lay = _layers(_plan(G4, tp=tp))
        assert lay["model.layers.0.self_attn.attn"].num_kv_heads == swa_heads
        assert lay["model.layers.3.self_attn.attn"].num_kv_heads == 1
        assert {x.page for x in lay.values()} == {page}
    fp8 = _plan(G4, kv_cache_dtype="fp8")
    assert fp8.kv_cache_dtype == "float8_e4m3fn" and {x.page for _, x in fp8.spec.layers} == {8_192}


def test_one_head_size_with_pages_that_differ_on_hopper() -> None:
    """One head size (64) but KV heads 4 and 1: FLASH_ATTN on Hopper, pages unified; on Blackwell with
    equal pages FlashInfer is fine."""
    ms = _plan({**G4, "global_head_dim": 64})
    assert ms.attention_backend == "FLASH_ATTN"
    assert _layers(ms)["model.layers.3.self_attn.attn"].block_size == 64  # 4,096 B pages made 16,384 B
    same = _plan({**G4, "global_head_dim": 64, "attention_k_eq_v": False}, device="blackwell")
    assert same.attention_backend == "FLASHINFER"


def test_per_layer_config_null_and_the_bidirectional_value() -> None:
    """Written null, per_layer_config is no entry: transformers then keeps every layer at head_dim (the
    global fields are not read); use_bidirectional_attention is all, vision or null."""
    for reader in ("json", "transformers"):
        if reader == "transformers":
            pytest.importorskip("transformers")
        ms = _plan({**G4, "per_layer_config": None}, reader=reader)
        assert {x.head_size for _, x in ms.spec.layers} == {64}, reader
    with pytest.raises(SpecError) as e:
        _plan({**G4, "use_bidirectional_attention": 5})
    assert str(e.value) == "config.use_bidirectional_attention = 5: valid: all, vision (or null)"


def test_kv_heads_refusal_names_the_layer() -> None:
    """Gemma 4's per-layer KV heads name their layer; Gemma 3n's one count names none."""
    with pytest.raises(SpecError) as e:
        _plan({**G4, "num_key_value_heads": 3, "num_attention_heads": 12}, tp=2)
    assert str(e.value) == "config.num_key_value_heads of layer 0 = 3: not divisible by tp = 2"
