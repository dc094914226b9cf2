"""Issue 25's tenth hostile pass (2026-12-06, a reviewer who did not write the fixes), on the default
``auto`` reader, the vision-language wrappers and groups_joined: one regression test per finding fixed.

- High, a plan unlike vLLM's cache: GLM-4 MoE Lite's ``head_dim`` is transformers' alias of its
  ``qk_rope_head_dim``; the json (and auto) reader planned the written ``qk_rope_head_dim``
  (tests/test_models_aliases.py).
- Medium, unbounded: read through transformers, Cohere2-MoE's ``first_k_dense_replace = -30,000,000``
  made its config class build a 30-million-item list (115 s, 879 MB).
- Medium, traceback: a LLaVA whose text config names Llama 4's multimodal class raised KeyError (exit 1).
- Low: transformers' logger wrote a second stderr line beside the command line's one-line error; a
  LLaVA whose text config names another multimodal wrapper (Gemma 3, Qwen2-VL) was planned as text.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.cli import main
from kvlayout.errors import SpecError

_LLAVA_TEXT: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("inner", "model_type"),
    [
        ("Llama4ForConditionalGeneration", "llama4_text"),
        ("Gemma3ForConditionalGeneration", "gemma3_text"),
        ("Qwen2VLForConditionalGeneration", "qwen2_vl"),
        ("LlavaForConditionalGeneration", "llava"),
    ],
)
def test_a_multimodal_language_model_inside_llava_is_refused(
    inner: str, model_type: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": {"architectures": [inner], "model_type": model_type, **_LLAVA_TEXT},
    }
    with pytest.raises(SpecError) as e:
        M.from_config(cfg, reader="json")
    assert e.value.field == "config.text_config.architectures[0]" and e.value.value == inner
    assert str(e.value) == (
        f"config.text_config.architectures[0] = {inner!r}: LlavaForConditionalGeneration's language model "
        f"must be a causal LM, not the multimodal architecture {inner}"
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["plan", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "must be a causal LM" in err


_COHERE2_MOE: dict[str, Any] = {
    "architectures": ["Cohere2MoeForCausalLM"],
    "model_type": "cohere2_moe",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("first_k_dense_replace", -30_000_000, "-30000000"),
        ("num_mtp_layers", 60_000_000, "60000000"),
        ("first_k_dense_replace", 2**20 + 1, "1048577"),
        ("mlp_layer_types", ["dense"] * 10_001, "'a list of 10,001 items'"),
    ],
)
def test_what_transformers_is_handed_is_bounded(field: str, value: Any, shown: str) -> None:
    """Refused before transformers is imported (the bound does not need it): within a second."""
    cfg = {**_COHERE2_MOE, field: value}
    t0 = time.perf_counter()
    for reader in ("transformers", "auto"):  # auto: layer_types is missing, so it reads through transformers
        with pytest.raises(SpecError) as e:
            M.from_config(dict(cfg), reader=reader)
        assert e.value.field == f"config.{field}"
        assert str(e.value).startswith(f"config.{field} = {shown}: read through transformers, ")
    assert time.perf_counter() - t0 < 2.0
    # nested objects and lists are walked, with the field named by its path
    with pytest.raises(SpecError, match=r"^config\.text_config\.rope_parameters\.x\[1\] = -2000000: "):
        M.from_config(
            {**_COHERE2_MOE, "text_config": {"rope_parameters": {"x": [1, -2_000_000]}}},
            reader="transformers",
        )


def test_large_integers_of_known_kinds_still_read() -> None:
    """Token ids, vocabularies, positions, lengths and rope thetas may be large."""
    pytest.importorskip("transformers")
    cfg = json.loads(Path("tests/fixtures/models/llama/config.json").read_text())
    big = {
        "max_position_embeddings": 10_485_760,
        "rope_theta": 50_000_000,
        "vocab_size": 2_000_000,
        "pad_token_id": 1_999_999,
        "model_max_length": 10_485_760,
    }
    ms = M.from_config({**cfg, **big}, reader="transformers")
    assert ms.spec == M.from_config(cfg, reader="transformers").spec


def test_transformers_warnings_are_notes_not_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    cfg = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "layer_types": ["full_attention", "sliding_attention"],
        "sliding_window": 64,
        "num_key_value_heads": 3,
        "torch_dtype": "bfloat16",
    }
    import logging

    import transformers  # noqa: F401 - its logging patches Logger.warning_once, kept once per process

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    clear = logging.Logger.warning_once.cache_clear  # type: ignore[attr-defined]
    clear()
    assert main(["plan", "--config", str(path), "--tp", "2"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "not divisible by tp = 2" in err, err
    cfg["num_key_value_heads"] = 4
    path.write_text(json.dumps(cfg))
    clear()
    assert main(["plan", "--config", str(path), "--tp", "2"]) == 0
    out, err = capsys.readouterr()
    assert not err and "note: transformers: Detected Mistral model with layer_types" in out, (out, err)
