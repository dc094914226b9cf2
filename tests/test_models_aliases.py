"""transformers' config aliases in kvlayout's json reader (issue 25, tenth pass): a config.json that writes
an alias beside its target is read as transformers reads it (the alias wins), hence as vLLM 0.33 does.
GLM-4 MoE Lite's ``head_dim`` is its ``qk_rope_head_dim``: planned from the written ``qk_rope_head_dim``,
the MLA row was 576 elements where vLLM's holds 640, a block stride 10% short."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.config import written_aliases
from kvlayout.models.config_aliases import ALIASES, DEFAULTS, NOT_NULL, TEXT_TYPES, VLLM_TYPES

ROOT = Path(__file__).resolve().parents[1]
#: the model types whose null refusals and defaults the test checks against transformers (seconds each)
NULL_TYPES = (
    "mixtral", "mistral", "llama", "gemma2", "gemma3_text", "qwen3", "glm4_moe_lite", "qwen2",
    "nemotron_h", "zamba",
)
ONLY = ",".join(NULL_TYPES)
#: GLM-4.7-Flash's shape, small, with head_dim written unlike qk_rope_head_dim
GLM_LITE: dict[str, Any] = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 2,
    "hidden_size": 2048,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 192,
    "v_head_dim": 256,
    "q_lora_rank": 768,
    "head_dim": 128,
}


def test_the_table_is_transformers_own() -> None:
    pytest.importorskip("transformers")
    script = ROOT / "scripts" / "gen_config_aliases.py"
    if not script.exists():  # a staged copy of the tests without the scripts (scripts/mutation.sh)
        pytest.skip("scripts/gen_config_aliases.py is not beside these tests")
    proc = subprocess.run(
        # the aliases and text types whole, the null refusals of the model types below (all: a minute)
        [sys.executable, str(ROOT / "scripts" / "gen_config_aliases.py"), "--check", "--only", ONLY],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert ALIASES["glm4_moe_lite"] == {"head_dim": "qk_rope_head_dim"}
    assert NOT_NULL["mixtral"] == (
        "MixtralConfig", ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads")
    )
    assert "num_key_value_heads" not in NOT_NULL["llama"][1]  # LlamaConfig takes None and fills it
    assert TEXT_TYPES["gemma3"] == "gemma3_text"
    assert DEFAULTS["mistral"] == ("MistralConfig", {"num_key_value_heads": 8})
    assert DEFAULTS["nemotron_h"] == ("NemotronHConfig", {"num_key_value_heads": 8, "head_dim": 128})
    assert "llama" not in DEFAULTS  # LlamaConfig fills the generic rule's values
    # vLLM reads Beam with its own BeamConfig (4 KV heads; transformers' fills 8): the table is vLLM's
    assert "beam" in VLLM_TYPES and DEFAULTS["beam"] == ("BeamConfig", {"num_key_value_heads": 4})


@pytest.mark.parametrize("reader", ["json", "auto", "transformers"])
def test_glm4_moe_lite_head_dim_is_its_rope_part(reader: str) -> None:
    if reader == "transformers" and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    ms = M.from_config(dict(GLM_LITE), reader=reader, num_blocks=4)
    layer = ms.spec.groups[0].layers[0]
    assert layer.head_size == 512 + 128  # kv_lora_rank + the rope part head_dim sets
    assert ms.bytes_per_block == 2 * 16 * 640 * 2  # 2 layers of 16 tokens (FLASH_ATTN_MLA, bf16 on Hopper)
    if reader != "transformers":
        assert ms.notes[0] == (
            "config.head_dim is glm4_moe_lite's alias of qk_rope_head_dim in transformers: "
            "qk_rope_head_dim = 128 (written: 64), as vLLM reads it"
        )


def test_aliases_alone_equal_and_nested() -> None:
    notes: list[str] = []
    # equal values: nothing to say; a config without the alias: unchanged
    same = {**GLM_LITE, "head_dim": 64}
    assert written_aliases(same, notes) == same and notes == []
    # the alias alone sets its target; a text_config is read by its own model type
    alone = {k: v for k, v in GLM_LITE.items() if k != "qk_rope_head_dim"}
    out = written_aliases({"model_type": "wrapper", "text_config": alone}, notes)
    assert out["text_config"]["qk_rope_head_dim"] == 128 and out["model_type"] == "wrapper"
    assert notes == [
        "config.text_config.head_dim is glm4_moe_lite's alias of qk_rope_head_dim in transformers: "
        "qk_rope_head_dim = 128, as vLLM reads it"
    ]
    # a null alias is not written; an unknown or non-string model type has no aliases
    for data in (
        {**GLM_LITE, "head_dim": None},
        {**GLM_LITE, "model_type": "llama"},
        {**GLM_LITE, "model_type": 3},
    ):
        notes.clear()
        assert written_aliases(data, notes) == data and notes == []


MIXTRAL: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "intermediate_size": 512,
}


@pytest.mark.parametrize("reader", ["json", "auto", "transformers"])
def test_a_null_the_class_refuses_is_refused_naming_the_field(reader: str) -> None:
    """Mixtral's ``num_key_value_heads: null``: transformers' strict MixtralConfig refuses it, so vLLM 0.33
    refuses the config; the json reader read it as absent (8 KV heads, 4x the bytes the field meant)."""
    if reader == "transformers" and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    with pytest.raises(SpecError) as e:
        M.from_config({**MIXTRAL, "num_key_value_heads": None}, reader=reader, num_blocks=4)
    if reader == "transformers":
        assert "transformers refuses it" in str(e.value) and "num_key_value_heads" in str(e.value)
    else:
        assert e.value.field == "config.num_key_value_heads"
        assert str(e.value) == (
            "config.num_key_value_heads = None: transformers' MixtralConfig refuses null for it, and so vLLM "
            "0.33 refuses the config: write a value, or leave the field out for the class default"
        )


@pytest.mark.parametrize("reader", ["json", "auto", "transformers"])
def test_a_null_the_class_fills_is_read_as_absent(reader: str) -> None:
    """LlamaConfig takes ``num_key_value_heads: null`` and fills it with the heads: every reader plans so."""
    if reader == "transformers" and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    llama = {**MIXTRAL, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    llama["num_key_value_heads"] = None
    ms = M.from_config(llama, reader=reader, num_blocks=4)
    assert [layer.num_kv_heads for layer in ms.spec.groups[0].layers] == [8, 8]


def test_a_text_config_without_model_type_is_read_as_its_parents_text_class() -> None:
    """Gemma 3's text_config written without model_type is transformers' Gemma3TextConfig: its null head_dim
    is refused there, and an alias of that class applies."""
    gemma = {"model_type": "gemma3", "text_config": {"head_dim": None, "num_hidden_layers": 2}}
    with pytest.raises(SpecError) as e:
        written_aliases(gemma, [])
    assert e.value.field == "config.text_config.head_dim"
    assert "Gemma3TextConfig" in str(e.value)
    # a text_config with its own model type is read by that type; an unknown parent's, as written
    own = {"model_type": "llama", "head_dim": None}
    assert written_aliases({"model_type": "gemma3", "text_config": own}, [])["text_config"] == own
    assert written_aliases({"model_type": "nope", "text_config": {"head_dim": None}}, [])
