"""Gemma 3n's rules (kvlayout/models/gemma3n.py) on the host; vLLM's own construction of the same configs
is tests/test_models_hybrid_vllm.py (gemma3n_*, built from :data:`GEMMA3N`)."""

from __future__ import annotations

from typing import Any

import pytest

from kvlayout.errors import SpecError
from kvlayout.spec import FullAttentionSpec, SlidingWindowSpec
from tests import json_reader as J
from tests.test_models_gemma4 import _BASE, _layers, _plan  # the harness's base fields, one plan helper

_S, _F = "sliding_attention", "full_attention"
# google/gemma-3n-E2B's shape, smaller: 2 KV heads of 256 there (here 64), every fifth layer full, the
# last layers (10 of 30 there, 4 of 10 here) reading the caches of layers first - 2 (sliding) and
# first - 1 (full); per-layer inputs of their own small vocabulary
GEMMA3N: dict[str, Any] = {
    "architectures": ["Gemma3nForCausalLM"],
    "model_type": "gemma3n_text",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 10,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "sliding_window": 128,
    "num_kv_shared_layers": 4,
    "layer_types": [_S, _S, _S, _S, _F] * 2,
    "hidden_size_per_layer_input": 64,
    "vocab_size_per_layer_input": 1024,
    "laurel_rank": 16,
}
G3N: dict[str, Any] = {**_BASE, **GEMMA3N}


def test_shared_layers_keep_no_cache_and_the_rest_follow_layer_types() -> None:
    ms = _plan(G3N)
    layers = _layers(ms)
    assert sorted(layers) == [f"model.layers.{i}.self_attn.attn" for i in range(6)]
    kinds = {n: type(x) for n, x in layers.items()}
    assert kinds["model.layers.4.self_attn.attn"] is FullAttentionSpec
    assert all(kinds[f"model.layers.{i}.self_attn.attn"] is SlidingWindowSpec for i in (0, 1, 2, 3, 5))
    s = layers["model.layers.5.self_attn.attn"]
    assert (s.num_kv_heads, s.head_size, s.window, s.block_size) == (2, 64, 128, 16)
    assert s.page == 2 * 2 * 64 * 2 * 16  # K and V, bf16, 16 tokens
    assert any("4 layers read earlier" in n for n in ms.notes)


def test_the_last_layer_is_left_as_written() -> None:
    """Gemma 4's class makes the last layer full; Gemma 3n's does not."""
    cfg = {**G3N, "num_kv_shared_layers": 0, "layer_types": [_S] * 10}
    assert {type(x) for _, x in _plan(cfg).spec.layers} == {SlidingWindowSpec}
    assert not any("last layer" in n for n in _plan(cfg).notes)


@pytest.mark.parametrize(
    ("shared", "types", "kept"),
    [
        (0, [_S, _S, _S, _S, _F] * 2, list(range(10))),
        (10, [_S, _S, _S, _S, _F] * 2, list(range(10))),  # first = 0: no target index is >= 0
        (9, [_F, _S, _S, _S, _F] * 2, [0, 1, 2, 3, 6, 7, 8]),  # first = 1: full ones share layer 0
        (8, [_S] * 10, [0, 1]),  # first = 2: sliding ones share layer 0
        (1, [_S] * 9 + [_F], list(range(9))),  # the shared full layer reads layer 8 (sliding)
    ],
)
def test_sharing_targets_are_fixed_offsets(shared: int, types: list[str], kept: list[int]) -> None:
    ms = _plan({**G3N, "num_kv_shared_layers": shared, "layer_types": types})
    got = sorted(int(x.name.split(".")[2]) for _, x in ms.spec.layers)
    assert got == kept


def test_kv_heads_per_rank_and_tp_checks() -> None:
    assert {x.num_kv_heads for _, x in _plan(G3N, tp=2).spec.layers} == {1}
    assert {x.num_kv_heads for _, x in _plan(G3N, tp=8).spec.layers} == {1}  # replicated
    with pytest.raises(SpecError, match="num_key_value_heads") as e:
        _plan({**G3N, "num_key_value_heads": 3, "num_attention_heads": 12}, tp=2)
    assert e.value.value == 3
    with pytest.raises(SpecError, match="num_attention_heads"):
        _plan(G3N, tp=16)


def test_json_reader_asks_for_what_the_class_defaults() -> None:
    for key in ("num_kv_shared_layers", "layer_types"):
        cfg = {k: v for k, v in G3N.items() if k != key}
        with pytest.raises(SpecError, match=f"{key} = None: missing.*reader='transformers'"):
            _plan(cfg)
    # transformers' Gemma3nTextConfig: every fifth layer full, 15 shared layers (of 20 here)
    cfg = {k: v for k, v in G3N.items() if k not in ("num_kv_shared_layers", "layer_types")}
    ms = _plan({**cfg, "num_hidden_layers": 20}, reader="transformers")
    got = {int(x.name.split(".")[2]): type(x).__name__ for _, x in ms.spec.layers}
    assert got == {i: "FullAttentionSpec" if i == 4 else "SlidingWindowSpec" for i in range(5)}


def test_bad_values_are_named() -> None:
    with pytest.raises(SpecError, match="num_kv_shared_layers") as e:
        _plan({**G3N, "num_kv_shared_layers": 11})
    assert e.value.value == 11
    with pytest.raises(SpecError, match=r"layer_types\[2\]"):
        _plan({**G3N, "layer_types": [_S, _S, "chunked_attention", _S, _F] * 2})
    with pytest.raises(SpecError, match="sliding_window"):
        _plan({k: v for k, v in G3N.items() if k != "sliding_window"})
    # no sliding layer keeps a cache: no window needed
    cfg = {k: v for k, v in G3N.items() if k != "sliding_window"}
    assert _plan({**cfg, "layer_types": [_F] * 10})


def test_the_multimodal_wrapper_reads_its_text_config() -> None:
    text = {k: v for k, v in GEMMA3N.items() if k != "architectures"}
    cfg = {**_BASE, "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
           "text_config": text}
    names = [x.name for _, x in _plan(cfg).spec.layers]
    assert names[0] == "language_model.model.layers.0.self_attn.attn" and len(names) == 6


def test_tpu_inference_refuses_it_by_name() -> None:
    with pytest.raises(SpecError, match="Gemma 3n") as e:
        J.spec_from_config(G3N, engine="tpu-inference")
    assert e.value.field == "engine"


def test_refusals_name_field_value_and_why() -> None:
    """The full messages (mutation testing: each why and field is what a user reads)."""
    def msg(cfg: dict[str, Any], **kw: Any) -> str:
        with pytest.raises(SpecError) as e:
            _plan(cfg, **kw)
        return str(e.value)

    hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
    drop = {k: v for k, v in G3N.items() if k != "num_kv_shared_layers"}
    assert msg(drop) == (
        "config.num_kv_shared_layers = None: missing; the last layers reading earlier caches "
        "(Gemma3nTextConfig's default is 15)" + hint
    )
    assert msg({**G3N, "num_kv_shared_layers": 11}) == (
        "config.num_kv_shared_layers = 11: must be at most num_hidden_layers (10)"
    )
    drop = {k: v for k, v in G3N.items() if k != "layer_types"}
    want = "config.layer_types = None: missing; Gemma 3n names its sliding and full layers there"
    assert msg(drop) == want + hint
    for key, why in (
        ("num_attention_heads", "the query heads"),
        ("head_dim", "every layer's head size"),
        ("num_key_value_heads", "every layer's KV heads"),
        ("sliding_window", "the sliding layers' window"),
    ):
        drop = {k: v for k, v in G3N.items() if k != key}
        assert msg(drop) == f"config.{key} = None: missing; {why}" + hint
    assert msg(G3N, tp=16) == "config.num_attention_heads = 8: not divisible by tp = 16"
    assert msg({**G3N, "num_key_value_heads": 3, "num_attention_heads": 12}, tp=2) == (
        "config.num_key_value_heads = 3: not divisible by tp = 2"
    )


def test_kinds_dtype_backend_and_notes() -> None:
    ms = _plan(G3N, kv_cache_dtype="fp8")  # Hopper: FLASH_ATTN's 16 tokens (an MLA backend's would be 64)
    assert ms.kv_cache_dtype == "float8_e4m3fn" and {x.dtype for _, x in ms.spec.layers} == {"float8_e4m3fn"}
    assert (ms.block_size, ms.attention_backend) == (16, "FLASH_ATTN")
    assert {n: k for n, k in ms.kinds.items()} == {
        f"model.layers.{i}.self_attn.attn": ("full" if i == 4 else "sliding") for i in range(6)
    }
    assert [g.name for g in ms.spec.groups][-1] == "full"
    assert not any("earlier" in n for n in _plan({**G3N, "num_kv_shared_layers": 0}).notes)
