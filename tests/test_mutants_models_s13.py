"""Tests for the models survivors of this session's mutation run (scripts/mutation.sh models at 6e1cfc1): the
default reader's fallback, the bounds on what transformers is handed, Step 3.5's and the model-type rule's
messages, a remote-code model type read as its parent class."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

import kvlayout.models.build as B
from kvlayout.errors import SpecError
from kvlayout.models.config import (
    MAX_CONFIG_LAYERS,
    MAX_TRANSFORMERS_INT,
    _bounded_for_transformers,
    written_aliases,
)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


def _build(cfg: dict[str, Any], **kw: Any) -> Any:
    return B.build(cfg, 1, None, None, None, 16, None, **{"device": "hopper", **kw})


def test_without_transformers_the_missing_field_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(B, "transformers_installed", lambda: False)
    cfg = {k: v for k, v in LLAMA.items() if k != "num_attention_heads"}
    with pytest.raises(B.MissingField) as e:
        _build(cfg, reader="auto")
    assert e.value.field == "config.num_attention_heads" and e.value.value is None
    assert str(e.value).startswith("config.num_attention_heads = None: missing; the query heads")
    assert str(e.value).endswith("; or install transformers: pip install 'kvlayout[models]'")


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_the_fallback_keeps_device_and_says_why_first() -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != "num_attention_heads"}  # LlamaConfig fills 32
    ms, c = _build(cfg, reader="auto", device="blackwell")
    note = (
        "config.json has no config.num_attention_heads: read through transformers' config class (reader auto)"
    )
    assert ms.notes[0] == note and c.notes[0] == note
    assert ms.device == "blackwell"


def test_the_bounds_on_what_transformers_is_handed() -> None:
    _bounded_for_transformers({"layer_types": ["full"] * MAX_CONFIG_LAYERS}, "config")  # at the bound
    with pytest.raises(SpecError) as e:
        _bounded_for_transformers({"layer_types": ["x"] * (MAX_CONFIG_LAYERS + 1)}, "config")
    assert e.value.field == "config.layer_types"
    _bounded_for_transformers({"first_k_dense_replace": MAX_TRANSFORMERS_INT}, "config")  # at the bound
    with pytest.raises(SpecError) as e:
        _bounded_for_transformers({"first_k_dense_replace": -MAX_TRANSFORMERS_INT - 1}, "config")
    assert str(e.value).endswith(
        f"read through transformers, an integer is at most {MAX_TRANSFORMERS_INT:,} in magnitude "
        "(its config class may build a list that long)"
    )
    # a token id in a list keeps its field's name: not bounded
    _bounded_for_transformers({"eos_token_id": [2**40, 2**41]}, "config")


def test_a_remote_code_type_is_read_as_its_parent_class() -> None:
    """MiMo's model type has Qwen2Config's null refusals and aliases."""
    with pytest.raises(SpecError) as e:
        written_aliases({"model_type": "mimo", "num_attention_heads": None}, [])
    assert e.value.field == "config.num_attention_heads" and "Qwen2Config" in str(e.value)


def test_step3p5_and_model_type_messages() -> None:
    from tests.test_models_cov_s13 import _plan

    arch, mt = "Step3p5ForCausalLM", "step3p5"
    types = {"sliding_window": 128, "layer_types": ["full_attention"] * 2}
    with pytest.raises(SpecError) as e:
        _plan(arch, mt, head_dim=64, **types)
    assert str(e.value).startswith(
        "config.num_attention_groups = None: missing; the KV heads of Step 3.5's layers"
    )
    with pytest.raises(SpecError) as e:
        _plan(arch, mt, tp=2, head_dim=64, num_attention_groups=3, **types)
    assert e.value.field == "config.num_attention_groups" and e.value.value == 3
    with pytest.raises(SpecError) as e:
        _plan("Step3TextForCausalLM", "step3")
    assert str(e.value) == (
        "config.model_type = 'step3': this rule is vLLM 0.33's attention for model_type 'step3_text' only "
        "(the model class builds another attention for other types)"
    )


def test_class_defaults_of_vllms_own_classes_and_of_wrappers() -> None:
    from kvlayout.models.config import Config

    beam = Config({"model_type": "beam"}, "config")
    assert beam.class_default("num_key_value_heads") == 4
    said = "config.num_key_value_heads left out: BeamConfig's default, 4 (vLLM), as vLLM reads it"
    assert beam.notes == [said]
    with pytest.raises(SpecError) as e:
        written_aliases({"model_type": "hyperclovax", "num_hidden_layers": None}, [])
    assert str(e.value).startswith("config.num_hidden_layers = None: vLLM's HyperCLOVAXConfig refuses null")
    # a wrapper that nests its text config: its own type (no row) is not read as the text class's
    nested = Config({"model_type": "gemma3", "text_config": {}}, "config")
    assert nested.class_default("num_key_value_heads") is None
    assert Config({"model_type": "gemma3"}, "config").class_default("num_key_value_heads") == 4


def test_step3p5_says_nothing_of_a_num_key_value_heads_not_written() -> None:
    from tests.test_models_cov_s13 import _plan

    types = {"sliding_window": 128, "layer_types": ["full_attention"] * 2}
    groups = {"num_attention_groups": 2, "num_key_value_heads": None}
    ms = _plan("Step3p5ForCausalLM", "step3p5", head_dim=64, **groups, **types)
    assert not any("ignored" in n for n in ms.notes)


def test_glm5_on_blackwell_with_auto_written() -> None:
    import kvlayout.models as M
    from tests.test_models_published_s13 import GLM_5

    with pytest.raises(SpecError, match="kv_cache_dtype fp8_e4m3 not supported"):
        kw = {"device": "blackwell", "attention_backend": "FLASHMLA_SPARSE", "kv_cache_dtype": "auto"}
        M.from_config(dict(GLM_5), **kw)
