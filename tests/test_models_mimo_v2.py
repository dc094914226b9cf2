"""MiMo-V2's rules (kvlayout/models/mimo_v2.py) on the host; vLLM's own construction of the same configs
is tests/test_models_hybrid_vllm.py (mimo_v2_*, built from :data:`MIMO_V2_FLASH`)."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.spec import SlidingWindowSpec

#: what the harness adds to every config (tests/test_models_hybrid_vllm.py's _BASE)
_BASE: dict[str, Any] = {"torch_dtype": "bfloat16", "vocab_size": 1024, "max_position_embeddings": 4096}
# XiaomiMiMo/MiMo-V2-Flash's shape (48 layers: full at 0 and every 6th, 4 KV heads of 192 + 128; sliding
# 8 KV heads, window 128), smaller: the sliding page is twice the full one, so full layers take 32-token
# blocks; pattern as published (hybrid_layer_pattern), layer_types absent (vLLM does not read it)
MIMO_V2_FLASH: dict[str, Any] = {
    "architectures": ["MiMoV2FlashForCausalLM"],
    "model_type": "mimo_v2_flash",
    "hidden_size": 512,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 192,
    "v_head_dim": 128,
    "swa_num_attention_heads": 8,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 192,
    "swa_v_head_dim": 128,
    "sliding_window_size": 128,
    "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0],
    "layernorm_epsilon": 1e-5,
    "intermediate_size": 1024,
    "attention_chunk_size": 128,
}
FLASH: dict[str, Any] = {**_BASE, **MIMO_V2_FLASH}


def _plan(cfg: dict[str, Any], **kw: Any) -> M.ModelSpec:
    ms = M.from_config(cfg, **kw)
    assert isinstance(ms, M.ModelSpec)
    return ms


def test_pages_by_hand() -> None:
    """Full: 2 KV heads of 192 + 128 bf16 = 1,280 B a token; sliding 4 heads: 2,560 B. The full page
    doubles its block (32 tokens, 40,960 B) to meet the sliding one (16 tokens, 40,960 B)."""
    ms = _plan(FLASH)
    layers = dict((x.name, x) for _, x in ms.spec.layers)
    full, swa = layers["model.layers.0.self_attn.attn"], layers["model.layers.1.self_attn.attn"]
    assert (full.block_size, full.page, full.real_page) == (32, 40_960, 40_960)
    assert isinstance(swa, SlidingWindowSpec) and (swa.block_size, swa.page, swa.window) == (16, 40_960, 128)
    assert ms.block_size == 16 and ms.bytes_per_block == 3 * 40_960
    assert [g.name for g in ms.spec.groups] == ["full", "sliding.0", "sliding.1", "sliding.2"]
    assert any("32-token blocks" in n for n in ms.notes)


def test_padded_pages_by_hand() -> None:
    """Sliding V heads of 64: 4 heads of 256 = 2,048 B a token against the full 1,280 B; 32,768 B does
    not divide by 20,480 B, so the full page is padded (real 20,480 B) and keeps 16-token blocks."""
    ms = _plan({**FLASH, "swa_v_head_dim": 64})
    full = dict((x.name, x) for _, x in ms.spec.layers)["model.layers.0.self_attn.attn"]
    assert (full.block_size, full.real_page, full.page) == (16, 20_480, 32_768)
    assert any("padded to 32,768 B" in n for n in ms.notes)


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"hybrid_layer_pattern": [0, 2] + [0] * 10}, "config.hybrid_layer_pattern[1]", 2),
        ({"hybrid_layer_pattern": [0, 1]}, "config.hybrid_layer_pattern", "2 items"),
        ({"hybrid_layer_pattern": None}, "config.hybrid_layer_pattern", None),
        ({"sliding_window_size": None}, "config.sliding_window_size", None),
        ({"v_head_dim": None}, "config.v_head_dim", None),
        ({"swa_num_key_value_heads": 3}, "config.swa_num_key_value_heads", 3),
        ({"num_key_value_heads": 5}, "config.num_key_value_heads", 5),
        ({"num_attention_heads": 7}, "config.num_attention_heads", 7),
        ({"swa_head_dim": 0}, "config.swa_head_dim", 0),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], field: str, value: Any) -> None:
    with pytest.raises(SpecError) as e:
        _plan({**FLASH, **change}, tp=2)
    assert e.value.field == field and e.value.value == value, str(e.value)


def test_an_all_full_or_all_sliding_pattern_needs_only_its_fields() -> None:
    full = {k: v for k, v in FLASH.items() if not k.startswith("swa_") and k != "sliding_window_size"}
    ms = _plan({**full, "hybrid_layer_pattern": [0] * 12})
    assert [g.name for g in ms.spec.groups] == ["full"] and ms.notes[-1].startswith("V heads")
    slide = {k: v for k, v in FLASH.items() if k not in ("num_key_value_heads", "head_dim", "v_head_dim")}
    ms = _plan({**slide, "hybrid_layer_pattern": [1] * 12})
    assert {type(x) for _, x in ms.spec.layers} == {SlidingWindowSpec}


def test_the_attention_backend_is_refused_where_v_differs() -> None:
    with pytest.raises(SpecError) as e:
        _plan(FLASH, attention_backend="FLASHINFER")
    assert e.value.field == "attention_backend" and "DIFFKV" in str(e.value)
    same = {**FLASH, "v_head_dim": 192, "swa_v_head_dim": None, "swa_num_key_value_heads": 2}
    assert _plan(same, attention_backend="FLASH_ATTN").attention_backend == "FLASH_ATTN"
