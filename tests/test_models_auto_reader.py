"""The default reader, ``auto`` (issue 23): a config as written where it names every field, through
transformers' config class only where it leaves one out (as vLLM reads it), saying so; without
transformers, the missing field's error names the extra to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.config import MissingField

LLAMA = "tests/fixtures/models/llama/config.json"

#: google/gemma-3-4b-it's config.json as published: its text_config leaves heads, KV heads and
#: head_dim to Gemma3TextConfig (8, 4, 256)
GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model"},
}


def _llama() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(LLAMA).read_text())
    return data


def test_a_missing_field_is_read_through_transformers_and_said() -> None:
    pytest.importorskip("transformers")
    with pytest.raises(MissingField, match=r"config\.text_config\.num_attention_heads = None: missing"):
        M.from_config(GEMMA3_4B, reader="json")
    for tp in (1, 2):
        auto = M.from_config(GEMMA3_4B, tp=tp)
        full = M.from_config(GEMMA3_4B, tp=tp, reader="transformers")
        assert auto.spec == full.spec and auto.bytes_per_block == full.bytes_per_block
        note = (
            "config.json has no config.text_config.num_attention_heads: read through transformers' config "
            "class (reader auto)"
        )
        assert auto.notes == (note, *full.notes)
    # Gemma3TextConfig's 4 KV heads of 256, bf16, 16-token blocks, tp 1; every sixth layer full (5 of 34):
    # vLLM's groups of at most 5 layers (29 sliding, 5 full), each block 5 pages
    auto = M.from_config(GEMMA3_4B)
    assert [len(g.layers) for g in auto.spec.groups if not isinstance(g, str)] == [5, 5, 5, 5, 5, 4, 5]
    assert auto.bytes_per_block == 5 * 2 * 16 * 4 * 256 * 2


def test_a_complete_config_is_read_as_written() -> None:
    """The same spec and notes as the json reader. The json reader never imports transformers (it takes
    seconds; kvlayout's CLI on a complete config must not need it); the default reader imports it, where
    installed, to run the class's validation, as vLLM does (issue 25, sixteenth pass, F2)."""
    for tp in (1, 2, 8):
        auto, json_ = M.from_config(LLAMA, tp=tp), M.from_config(LLAMA, tp=tp, reader="json")
        assert auto.spec == json_.spec and auto.notes == json_.notes
    code = (
        "import sys, kvlayout.models as M\n"
        f"M.from_config({LLAMA!r}, reader='json')\n"
        f"M.from_config({LLAMA!r}, engine='tpu-inference', block_size=16, reader='json')\n"
        "print('transformers' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_without_transformers_the_error_names_the_field_and_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _llama()
    del cfg["num_attention_heads"]
    monkeypatch.setitem(sys.modules, "transformers", None)  # find_spec gives None, import raises
    with pytest.raises(MissingField) as e:
        M.from_config(cfg)
    assert e.value.field == "config.num_attention_heads"
    assert str(e.value).startswith("config.num_attention_heads = None: missing")
    assert str(e.value).endswith("; or install transformers: pip install 'kvlayout[models]'")
    with pytest.raises(MissingField, match=r"kvlayout\[models\]"):
        M.from_config(cfg, engine="tpu-inference", block_size=16)


def test_what_no_default_supplies_is_still_an_error() -> None:
    """No architecture: refused as written (transformers has no class to read it with); a field its
    class has no default for: refused by the transformers reader, naming the field."""
    cfg = _llama()
    del cfg["architectures"]
    with pytest.raises(SpecError, match=r"^config\.architectures = None: missing") as e:
        M.from_config(cfg)
    assert not isinstance(e.value, MissingField)
    pytest.importorskip("transformers")
    cfg = _llama()
    del cfg["num_attention_heads"]
    cfg["num_key_value_heads"] = 3  # LlamaConfig's 32 heads: 3 KV heads cannot share them
    with pytest.raises(SpecError) as e2:
        M.from_config(cfg, tp=2)
    assert "num_key_value_heads" in str(e2.value) or "num_attention_heads" in str(e2.value), e2.value


def test_tpu_inference_reads_auto_too() -> None:
    pytest.importorskip("transformers")
    cfg = _llama()
    del cfg["num_attention_heads"], cfg["num_key_value_heads"]
    auto = M.from_config(cfg, engine="tpu-inference", block_size=16)
    full = M.from_config(cfg, engine="tpu-inference", block_size=16, reader="transformers")
    assert auto.spec == full.spec
    note = "config.json has no config.num_attention_heads: read through transformers'"
    assert auto.notes[0].startswith(note)


def test_readers_are_named() -> None:
    with pytest.raises(SpecError, match=r"^reader = 'yaml': valid: auto, json, transformers$"):
        M.from_config(LLAMA, reader="yaml")
