"""The architectures issue 23's thirteenth pass covers by vLLM 0.33's construction
(tests/test_models_generic.py), each with the values vLLM's layers gave there, and the stated
refusals. Each assertion fails on the rule it replaces: DeepSeek-MoE planned as MLA (its registry
kind), Step 3's text model with the written KV heads or ``hidden_size // heads``, Step 3.5 with
``num_key_value_heads`` or a window on every layer."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.families import BUILT_KINDS, built_kind
from kvlayout.models.registry_vllm import TEXT_GENERATION
from tests import json_reader as J

_BASE: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "torch_dtype": "bfloat16",
}


def _plan(arch: str, model_type: str, tp: int = 1, reader: str = "json", **fields: Any) -> M.ModelSpec:
    config = {k: v for k, v in {**_BASE, **fields}.items() if v is not None}
    ms = J.from_config({**config, "architectures": [arch], "model_type": model_type}, tp=tp, reader=reader)
    assert isinstance(ms, M.ModelSpec)
    return ms


def _rows(ms: M.ModelSpec) -> list[tuple[Any, ...]]:
    """(name, spec type, KV heads, head size, window) per layer."""
    return [
        (x.name, type(x).__name__, getattr(x, "num_kv_heads", 1), x.head_size, getattr(x, "window", None))
        for _, x in ms.spec.layers
    ]


def test_built_kinds_depart_from_the_registry() -> None:
    """The registry tables DeepSeek-MoE and Sarvam-MoE by their modules (MLA); vLLM builds plain
    attention for both. It tables LongCat-Flash-Lite as attention (its module names no attention class);
    vLLM builds LongCat-Flash's MLA layers for it. Every other architecture keeps its registry kind."""
    assert {a: TEXT_GENERATION[a][1] for a in BUILT_KINDS} == {
        "DeepseekForCausalLM": "mla",
        "SarvamMoEForCausalLM": "mla",
        "LongcatFlashNgramForCausalLM": "attention",
    }
    assert {a: built_kind(a) for a in BUILT_KINDS} == {
        "DeepseekForCausalLM": "attention",
        "SarvamMoEForCausalLM": "attention",
        "LongcatFlashNgramForCausalLM": "mla",
    }
    assert built_kind("SarvamMLAForCausalLM") == "mla" and built_kind("BloomForCausalLM") == "attention"


def test_deepseek_moe_is_plain_attention() -> None:
    """DeepSeek-MoE (model_type ``deepseek``): vLLM's DeepseekAttention, num_key_value_heads per rank,
    head size hidden_size // heads (a written head_dim ignored), no latent head; the engine's one
    window on every layer; another model_type or a written rswa_window is refused by name."""
    arch, mt = "DeepseekForCausalLM", "deepseek"
    ms = _plan(arch, mt, head_dim=64)
    assert ms.family == "generic"
    names = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
    assert _rows(ms) == [(n, "FullAttentionSpec", 2, 32, None) for n in names]
    assert {r[2] for r in _rows(_plan(arch, mt, tp=2))} == {1}
    window = _rows(_plan(arch, mt, sliding_window=128))
    assert window == [(n, "SlidingWindowSpec", 2, 32, 128) for n in names]
    # deepseek-ai/deepseek-moe-16b-base's shape: 16 KV heads of 128 (2048 / 16), 28 layers
    big = _plan(arch, mt, hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                num_hidden_layers=28)
    assert {r[1:] for r in _rows(big)} == {("FullAttentionSpec", 16, 128, None)} and len(_rows(big)) == 28
    with pytest.raises(SpecError, match=r"config\.model_type = 'deepseek_v2': this rule is vLLM"):
        _plan(arch, "deepseek_v2", kv_lora_rank=64, qk_rope_head_dim=16)
    with pytest.raises(SpecError, match=r"config\.rswa_window = 64: .*RSWAAttention"):
        _plan(arch, mt, rswa_window=64)


def test_step3_text_has_one_kv_head() -> None:
    """Step 3's text model: one KV head on every rank (Step3TextAttention, whatever the config writes),
    head_dim 256 unless written (vLLM's Step3TextConfig), under vLLM's ``.layers`` names (its
    Step3TextModel prefixes ``.layers`` to the empty top-level prefix); model_type step3_text only."""
    arch, mt = "Step3TextForCausalLM", "step3_text"
    names = [f".layers.{i}.self_attn.attn" for i in range(2)]
    for tp in (1, 2, 8):
        assert _rows(_plan(arch, mt, tp=tp)) == [(n, "FullAttentionSpec", 1, 256, None) for n in names]
    assert {r[3] for r in _rows(_plan(arch, mt, head_dim=64))} == {64}
    assert {r[3] for r in _rows(_plan(arch, mt, reader="transformers"))} == {256}
    with pytest.raises(SpecError, match=r"config\.model_type = 'step3': this rule"):
        _plan(arch, "step3")


def test_step3p5_kv_heads_and_windows() -> None:
    """Step 3.5: KV heads num_attention_groups, windows only on layer_types' sliding layers (vLLM clears
    the engine's one window); read as written, layer_types and num_attention_groups are required, and
    a num_key_value_heads unlike num_attention_groups is ignored, as vLLM's config class does."""
    arch, mt = "Step3p5ForCausalLM", "step3p5"
    types = {"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]}
    groups = {"num_attention_groups": 4, "num_key_value_heads": None}
    assert [r[1:] for r in _rows(_plan(arch, mt, head_dim=64, **groups, **types))] == [
        ("SlidingWindowSpec", 4, 64, 128),
        ("FullAttentionSpec", 4, 64, None),
    ]
    assert {r[2] for r in _rows(_plan(arch, mt, tp=8, head_dim=64, **groups, **types))} == {1}
    full = {"sliding_window": 128, "layer_types": ["full_attention"] * 2}
    assert {r[1] for r in _rows(_plan(arch, mt, head_dim=64, **groups, **full))} == {"FullAttentionSpec"}
    with pytest.raises(SpecError, match=r"config\.layer_types = None: missing"):
        _plan(arch, mt, head_dim=64, sliding_window=128, **groups)
    with pytest.raises(SpecError, match=r"config\.num_attention_groups = None: missing"):
        _plan(arch, mt, head_dim=64, **types)
    # both written and different: vLLM's Step3p7TextConfig sets num_key_value_heads to num_attention_groups
    both = _plan(arch, mt, head_dim=64, num_attention_groups=4, **types)
    assert {r[2] for r in _rows(both)} == {4}
    assert any(n.startswith("config.num_key_value_heads = 2 ignored: ") for n in both.notes)


def test_sarvam_moe_and_mla() -> None:
    """Sarvam-MoE is Bailing-MoE's plain attention (head_dim, num_key_value_heads per rank); Sarvam-MLA
    one latent head of kv_lora_rank + qk_rope_head_dim on every rank (its layers, not ModelConfig,
    which does not take model_type sarvam for MLA and divides num_key_value_heads)."""
    moe = _plan("SarvamMoEForCausalLM", "sarvam_moe", tp=2, head_dim=64)
    assert moe.family == "generic"
    assert {r[1:] for r in _rows(moe)} == {("FullAttentionSpec", 1, 64, None)}
    assert [r[0] for r in _rows(moe)] == [f"model.layers.{i}.attention.attn" for i in range(2)]
    mla = {"num_key_value_heads": 8, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32}
    for tp in (1, 8):
        ms = _plan("SarvamMLAForCausalLM", "sarvam_mla", tp=tp, **mla)
        assert ms.family == "generic_mla"
        assert {r[1:] for r in _rows(ms)} == {("MLASpec", 1, 80, None)}


@pytest.mark.parametrize(
    ("arch", "why"),
    [
        ("MuseGlimmerForCausalLM", "whose text model takes its config class's defaults"),
        ("NanbeigeForCausalLM", "serves it through its Transformers modeling backend"),
        ("HYV4ForCausalLM", "reads model_type 'hy_v4' with its own config class"),
        ("MiniMaxM3SparseForCausalLM", "vLLM's construction of a 2-layer config"),
    ],
)
def test_refusals_state_the_cause(arch: str, why: str) -> None:
    """An architecture whose cache rests on what kvlayout's rules do not read is refused with it."""
    with pytest.raises(SpecError, match=why):
        J.from_config({**_BASE, "architectures": [arch], "model_type": "x"})
