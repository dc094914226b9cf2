"""MiMo-V2's rules (kvlayout/models/mimo_v2.py) on the host; vLLM's own construction of the same configs
is tests/test_models_hybrid_vllm.py (mimo_v2_*, built from :data:`MIMO_V2_FLASH`)."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.spec import SlidingWindowSpec
from tests import json_reader as J

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
    ms = J.from_config(cfg, **kw)
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


def _without(change: dict[str, Any]) -> dict[str, Any]:
    """FLASH changed, a field changed to None left out (transformers' class refuses some nulls, and the json
    reader with it: tests/test_models_aliases.py)."""
    return {k: v for k, v in {**FLASH, **change}.items() if v is not None}


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
        _plan(_without(change), tp=2)
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


_HINT = "; reader='transformers' fills the config class's defaults, as vLLM does"


@pytest.mark.parametrize(
    ("change", "tp", "message"),
    [
        (
            {"hybrid_layer_pattern": [0, 2] + [0] * 10},
            1,
            "config.hybrid_layer_pattern[1] = 2: must be 0 (full) or 1 (sliding)",
        ),
        (
            {"hybrid_layer_pattern": None},
            1,
            "config.hybrid_layer_pattern = None: missing; 1 marks a sliding-window layer, 0 a full one"
            + _HINT,
        ),
        (
            {"sliding_window_size": None},
            1,
            "config.sliding_window_size = None: missing; the sliding layers' window" + _HINT,
        ),
        (
            {"v_head_dim": None},
            1,
            "config.v_head_dim = None: missing; a full-attention layer's V head size "
            "(MiMoV2FlashConfig's default is 128)" + _HINT,
        ),
        ({"swa_num_key_value_heads": 3}, 2, "config.swa_num_key_value_heads = 3: not divisible by tp = 2"),
        (
            {"swa_num_key_value_heads": 3},
            8,
            "config.swa_num_key_value_heads = 3: tp = 8 is not a multiple of it",
        ),
        ({"swa_num_attention_heads": 6}, 4, "config.swa_num_attention_heads = 6: not divisible by tp = 4"),
        (
            {"swa_num_attention_heads": None},
            1,
            "config.swa_num_attention_heads = None: missing; a sliding-window layer's query heads" + _HINT,
        ),
        (
            {"num_attention_heads": None},
            1,
            "config.num_attention_heads = None: missing; a full-attention layer's query heads" + _HINT,
        ),
        (
            {"swa_num_key_value_heads": None},
            1,
            "config.swa_num_key_value_heads = None: missing; a sliding-window layer's KV heads" + _HINT,
        ),
        (
            {"num_key_value_heads": None},
            1,
            "config.num_key_value_heads = None: missing; a full-attention layer's KV heads" + _HINT,
        ),
        (
            {"swa_head_dim": None},
            1,
            "config.swa_head_dim = None: missing; a sliding-window layer's K head size" + _HINT,
        ),
        (
            {"head_dim": None},
            1,
            "config.head_dim = None: missing; a full-attention layer's K head size" + _HINT,
        ),
    ],
)
def test_refusal_messages(change: dict[str, Any], tp: int, message: str) -> None:
    with pytest.raises(SpecError) as e:
        _plan(_without(change), tp=tp)
    assert str(e.value) == message


def test_backend_refusal_message_and_notes() -> None:
    with pytest.raises(SpecError) as e:
        _plan(FLASH, attention_backend="FLASHINFER")
    assert (
        str(e.value)
        == (
            "attention_backend = 'FLASHINFER': MiMo-V2's layers with V heads of another size run on vLLM's "
            "*_DIFFKV backends, not modeled"
        )
        and e.value.value == "FLASHINFER"
    )
    diffkv = (
        "V heads of another size than K: vLLM runs FLASH_ATTN_DIFFKV (TRITON_ATTN_DIFFKV without FA3), "
        "blocks as FlashAttention's"
    )
    unify = "vLLM 0.33 gives them 32-token blocks (unify_kv_cache_spec_page_size)"
    # one note per kind of page, however many layers share it (3 full layers here)
    assert _plan(FLASH).notes == (
        diffkv,
        f"full-attention pages of 20,480 B under the largest (40,960 B): {unify}",
    )
    # the sliding page the smaller one: 1 KV head of 320 against 2
    ms = _plan({**FLASH, "swa_num_key_value_heads": 1})
    assert ms.notes == (diffkv, f"sliding-attention pages of 10,240 B under the largest (20,480 B): {unify}")


def test_tp_replicates_kv_heads_and_the_cache_dtype_is_read() -> None:
    """tp 8: 2 full and 4 sliding KV heads each replicated to one a rank (vLLM's max(1, total // tp)):
    one page for both, 10,240 B bf16; an fp8 cache halves it."""
    ms = _plan(FLASH, tp=8)
    assert {(x.num_kv_heads, x.block_size, x.page) for _, x in ms.spec.layers} == {(1, 16, 10_240)}
    assert len(ms.notes) == 1  # the pages are one size: nothing unified
    fp8 = _plan(FLASH, tp=8, kv_cache_dtype="fp8")
    assert fp8.kv_cache_dtype == "float8_e4m3fn" and {x.page for _, x in fp8.spec.layers} == {5_120}


def test_v_heads_of_k_size_are_not_written() -> None:
    same = {**FLASH, "v_head_dim": 192, "swa_v_head_dim": None, "swa_num_key_value_heads": 2}
    ms = _plan(same)
    assert {x.head_size_v for _, x in ms.spec.layers} == {None} and ms.notes == ()
