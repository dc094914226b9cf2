"""Issue 25, sixteenth pass (F2, F3, F5): configs vLLM 0.33 refuses, the class model_type selects, and
FlashAttention's fp8 cache on Ampere. Ground truth is the installed vLLM 0.33.0 and transformers 5.20.2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout import SpecError
from kvlayout.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
LLAMA_PATH = str(FIXTURES / "llama" / "config.json")


def _llama() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(LLAMA_PATH).read_text())
    return data


# --------------------------------------------------------------------------- F5: FLASH_ATTN fp8 on Ampere
@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3"])
def test_ampere_fp8_cache_takes_the_next_backend(kv: str) -> None:
    """vLLM 0.33 on SM80 runs FlashAttention 2 (fa_utils.get_flash_attn_version), which takes no fp8 cache
    (flash_attn_supports_kv_cache_dtype: FA3 on SM90, FA4 on SM100): the priority list's next backend,
    FLASHINFER, is chosen (platforms/cuda.py, _get_backend_priorities), and the reason says why."""
    ms = M.from_config(_llama(), device="ampere", kv_cache_dtype=kv)
    assert ms.attention_backend == "FLASHINFER"
    assert "skipped FLASH_ATTN" in ms.backend_reason and "FlashAttention 2" in ms.backend_reason
    assert ms.block_size == 16
    # a bf16 cache on Ampere, and fp8 on Hopper, are still FlashAttention's
    assert M.from_config(_llama(), device="ampere").attention_backend == "FLASH_ATTN"
    assert M.from_config(_llama(), device="hopper", kv_cache_dtype=kv).attention_backend == "FLASH_ATTN"


def test_ampere_fp8_cache_refuses_flash_attn_by_name() -> None:
    with pytest.raises(SpecError) as e:
        M.from_config(_llama(), device="ampere", kv_cache_dtype="fp8", attention_backend="FLASH_ATTN")
    assert e.value.field == "attention_backend"
    assert "vLLM refuses it on ampere" in str(e.value) and "fp8" in str(e.value)
    # FA4 on Blackwell takes it
    ms = M.from_config(_llama(), device="blackwell", kv_cache_dtype="fp8", attention_backend="FLASH_ATTN")
    assert ms.attention_backend == "FLASH_ATTN"


def test_ampere_fp8_flash_attn_cli_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--config", LLAMA_PATH, "--device", "ampere", "--kv-cache-dtype", "fp8"]
    rc = main([*argv, "--attention-backend", "FLASH_ATTN"])
    out, err = capsys.readouterr()
    assert rc == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "attention_backend = 'FLASH_ATTN'" in err and "FlashAttention 2" in err
    assert main(argv) == 0
    out, _ = capsys.readouterr()
    assert "attention backend FLASHINFER on ampere" in out


# --------------------------------------------------------------------------- F2: what vLLM refuses at load
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers (kvlayout[models]) absent")


@pytest.mark.parametrize("reader", ["auto", "json"])
def test_heads_that_do_not_divide_hidden_are_refused(reader: str) -> None:
    """LlamaConfig.validate_architecture refuses hidden_size 4096 with 7 heads (head_dim written or not):
    vLLM 0.33 reads config.json through it and fails; the readers named the field nowhere and planned it."""
    for head_dim in (None, 128):
        cfg = {**_llama(), "num_attention_heads": 7, "num_key_value_heads": 7}
        if head_dim is not None:
            cfg["head_dim"] = head_dim
        with pytest.raises(SpecError) as e:
            M.from_config(cfg, reader=reader)
        assert e.value.field == "config.num_attention_heads" and e.value.value == 7
        assert "hidden_size = 4096" in str(e.value)


@pytest.mark.parametrize("reader", ["auto", "json"])
def test_an_odd_rotary_head_dim_is_refused(reader: str) -> None:
    """transformers' validate_rope (modeling_rope_utils): "RoPE requires an even rotary dimension" for an
    odd head_dim above 4 fully rotated; 3 and an odd head partly rotated pass, as there."""
    with pytest.raises(SpecError) as e:
        M.from_config({**_llama(), "head_dim": 129}, reader=reader)
    assert e.value.field == "config.head_dim" and e.value.value == 129 and "even rotary" in str(e.value)
    mistral = json.loads((FIXTURES / "mistral" / "config.json").read_text())
    assert M.from_config({**mistral, "head_dim": 3}, reader=reader).spec.groups
    if reader == "json":  # the partial factor, as transformers reads it (auto: transformers' own check)
        assert M.from_config({**mistral, "head_dim": 129, "partial_rotary_factor": 0.5}, reader=reader)


@pytest.mark.parametrize("reader", ["auto", "json", "transformers"])
def test_a_mistyped_model_type_is_refused(reader: str) -> None:
    """vLLM 0.33 picks the config class by model_type (HFConfigParser.parse -> AutoConfig.from_pretrained:
    "Unrecognized model ... Should have a `model_type` key"); the readers planned it by the architecture."""
    if reader == "transformers" and not HAS_TRANSFORMERS:
        pytest.skip("transformers absent")
    for value in (None, 7, "", ["llama"]):
        cfg = {**_llama(), "model_type": value}
        with pytest.raises(SpecError) as e:
            M.from_config(cfg, reader=reader)
        assert e.value.field == "config.model_type" and e.value.value == value


@needs_transformers
@pytest.mark.parametrize("reader", ["auto", "transformers"])
def test_an_unknown_model_type_is_refused_unless_remote_code(reader: str) -> None:
    with pytest.raises(SpecError) as e:
        M.from_config({**_llama(), "model_type": "no_such_model"}, reader=reader)
    assert e.value.field == "config.model_type" and "AutoConfig refuses it" in str(e.value)
    remote = {**_llama(), "model_type": "no_such_model", "auto_map": {"AutoConfig": "x.Config"}}
    assert M.from_config(remote, reader=reader).spec.groups  # remote code: read as written


@needs_transformers
@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("hidden_act", None, "config.hidden_act"),
        ("tie_word_embeddings", 0, "config.tie_word_embeddings"),
        ("initializer_range", 7, "config.initializer_range"),
        ("eos_token_id", {"a": 1}, "config.eos_token_id"),
        ("rope_scaling", [1], "config.rope_scaling"),
    ],
)
def test_the_default_reader_refuses_what_transformers_strict_class_refuses(
    key: str, value: object, field: str
) -> None:
    """Fields of the wrong type (a bool where an int is, a list where a dict is) fail LlamaConfig's strict
    validation, hence vLLM's load: the default reader runs that class, and the error is kvlayout's one
    line naming the field written (rope_scaling, which the class reads as rope_parameters) and its value."""
    cfg = {**_llama(), key: value}
    with pytest.raises(SpecError) as e:
        M.from_config(cfg)
    assert e.value.field == field and e.value.value == value
    assert "LlamaConfig" in str(e.value) and "\n" not in str(e.value)


@needs_transformers
def test_heads_divide_hidden_table_is_transformers_own() -> None:
    """HEADS_DIVIDE_HIDDEN is what the installed transformers' classes refuse (hidden 4096, 7 heads, head_dim
    128), for the types listed and for the fixtures' types not listed."""
    from transformers import CONFIG_MAPPING

    from kvlayout.models.config import HEADS_DIVIDE_HIDDEN

    probe = {"hidden_size": 4096, "num_attention_heads": 7, "head_dim": 128, "num_key_value_heads": 7}
    others = ("mistral", "qwen2", "qwen3", "gpt_oss", "jamba", "qwen3_next")
    for mt in (*sorted(HEADS_DIVIDE_HIDDEN), *others):
        try:
            CONFIG_MAPPING[mt].from_dict(dict(probe))
            refused = False
        except Exception as e:  # noqa: BLE001  # the class's own refusal, of any kind
            refused = "multiple of the number of attention heads" in str(e)
        assert refused == (mt in HEADS_DIVIDE_HIDDEN), mt


# --------------------------------------------------------------------------- F3: the class model_type selects
def test_a_model_type_unlike_the_architecture_is_read_by_its_class() -> None:
    """A Llama config with "model_type": "mistral": AutoConfig (hence vLLM 0.33's HFConfigParser) builds
    MistralConfig, whose sliding_window default is 4096 where config.json leaves it out, and vLLM builds
    LlamaForCausalLM with it (every layer takes the engine's one window). The readers read it as Llama:
    no window."""
    cfg = {**_llama(), "model_type": "mistral"}
    assert "sliding_window" not in cfg
    if HAS_TRANSFORMERS:
        auto = M.from_config(cfg)
        layers = [layer for g in auto.spec.groups if not isinstance(g, str) for layer in g.layers]
        assert {getattr(layer, "window", None) for layer in layers} == {4096} and len(layers) == 32
        assert "model_type = 'mistral' is another architecture's" in auto.notes[0]
        assert auto.spec == M.from_config(cfg, reader="transformers").spec
    with pytest.raises(SpecError) as e:
        M.from_config(cfg, reader="json")
    assert e.value.field == "config.model_type" and e.value.value == "mistral"
    assert "LlamaForCausalLM's own model_type is 'llama'" in str(e.value)
    # its own type, or a type kvlayout has no class rule for, as before
    assert M.from_config(_llama(), reader="json").spec.groups
