"""Hostile pass 27 (/tmp/h27, a review of the day's new architectures): configs vLLM 0.33 refuses that
kvlayout planned, and one crash. Each test fails on the code before its fix (a96b4cd).

- Dory whose every layer is an MLP crashed (``min()`` of no layers, CLI exit 1); vLLM's ``DoryConfig``
  refuses it, and its RoPE checks (which kvlayout called irrelevant to the cache) refuse a config before
  any cache: an odd rotary part, a factor outside (0, 1], a missing attention type, non-default RoPE, a
  theta not above 0. Its strict field types refuse a 0 for a bool flag (``0 != False`` is false).
- Beam with tied embeddings: vLLM 0.33's ``BeamForCausalLM`` raises ``NotImplementedError``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from tests.test_models_beam import BASE as BEAM
from tests.test_models_dory import BASE as DORY

S, F, P = "sliding_attention", "full_attention", "mlp"


def _rope(**kw: Any) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": 10000.0, **kw}


#: name -> (config changes, the field kvlayout names where it refuses; None: both build it)
DORY_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "base": ({}, None),
    "all_mlp": ({"layer_types": [P] * 4}, "config.layer_types"),
    "all_mlp_rope": ({"layer_types": [P] * 4, "rope_parameters": {S: _rope()}}, "config.layer_types"),
    "odd_head": ({"head_dim": 33}, "config.rope_parameters.sliding_attention.partial_rotary_factor"),
    "factor_0.3": ({"rope_parameters": {S: _rope(partial_rotary_factor=0.3), F: _rope()}},
                   "config.rope_parameters.sliding_attention.partial_rotary_factor"),
    "factor_1.5": ({"rope_parameters": {S: _rope(partial_rotary_factor=1.5), F: _rope()}},
                   "config.rope_parameters.sliding_attention.partial_rotary_factor"),
    "factor_0.5": ({"rope_parameters": {S: _rope(partial_rotary_factor=0.5), F: _rope()}}, None),
    "no_full": ({"rope_parameters": {S: _rope()}}, "config.rope_parameters"),
    "flat": ({"rope_parameters": _rope()}, "config.rope_parameters"),
    "linear": ({"rope_parameters": {S: _rope(rope_type="linear", factor=2.0), F: _rope()}},
               "config.rope_parameters.sliding_attention"),
    "theta_neg": ({"rope_parameters": {S: _rope(rope_theta=-1), F: _rope()}},
                  "config.rope_parameters.sliding_attention"),
    "theta_left_out": ({"rope_parameters": {S: {"rope_type": "default"}, F: {}}}, None),
    "top_theta": ({"rope_theta": 7.0}, None),
    "tie_0": ({"tie_word_embeddings": 0}, "config.tie_word_embeddings"),
    "attention_bias_0": ({"attention_bias": 0}, "config.attention_bias"),
    "mlp_bias_0": ({"mlp_bias": 0}, "config.mlp_bias"),
}


def _kvlayout_field(cfg: dict[str, Any]) -> str | None:
    try:
        M.from_config(cfg, reader="json")
    except SpecError as e:
        return e.field
    return None


@pytest.mark.parametrize("name", sorted(DORY_CASES))
def test_dory_refuses_what_dory_config_refuses(name: str) -> None:
    """kvlayout refuses (naming the field) exactly the configs vLLM 0.33's own DoryConfig refuses."""
    changes, field = DORY_CASES[name]
    cfg = {**DORY, **changes}
    assert _kvlayout_field(cfg) == field
    pytest.importorskip("vllm")
    from vllm.transformers_utils.configs.dory import DoryConfig

    kwargs = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    try:
        DoryConfig(**kwargs)
        refused = False
    except Exception:  # noqa: BLE001 - huggingface_hub's validation error wraps the class's ValueError
        refused = True
    assert refused == (field is not None), name


def test_dory_all_mlp_cli_is_one_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvlayout.cli import main

    path = tmp_path / "dory.json"
    path.write_text(json.dumps({**DORY, "layer_types": [P] * 4}))
    assert main(["plan", "--config", str(path), "--reader", "json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.layer_types" in err


def test_beam_refuses_tied_embeddings() -> None:
    for tie in (True, 1):
        with pytest.raises(SpecError) as e:
            M.from_config({**BEAM, "tie_word_embeddings": tie}, reader="json")
        assert (e.value.field, e.value.value) == ("config.tie_word_embeddings", tie)
    assert M.from_config({**BEAM, "tie_word_embeddings": False}, reader="json").bytes_per_block > 0
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm is not installed")
    # the assumption: vLLM 0.33's BeamForCausalLM refuses them while it is built (read, not imported: the
    # model module needs a platform)
    source = (Path(spec.origin).parent / "models/beam/nvidia/model.py").read_text()
    assert "if config.tie_word_embeddings:" in source
    assert 'raise NotImplementedError("Beam requires tie_word_embeddings=False.")' in source


def test_triton_refuses_heads_below_32() -> None:
    """Step 1 and Rnj-1 build only on TRITON_ATTN, which takes head sizes of 32 and more
    (``supports_head_size``): heads of 16 were planned (pass 27 F1), and vLLM refuses them on a GPU (the
    stand-in raises vLLM's refusal where its backend class refuses the head size)."""
    from tests.test_models_rnj1 import BASE as RNJ1
    from tests.test_models_step1 import BASE as STEP1

    small = {"step1": {**STEP1, "hidden_size": 128}, "rnj1": {**RNJ1, "head_dim": 16}}
    for cfg in small.values():
        with pytest.raises(SpecError, match="head size 16 not supported") as e:
            M.from_config(cfg, reader="json", attention_backend="TRITON_ATTN")
        assert (e.value.field, e.value.value) == ("attention_backend", "TRITON_ATTN")
    pytest.importorskip("vllm")
    from tests.triton_driver import triton_answers

    case = {"tp": 1, "kv_cache_dtype": "auto", "stand_in": True, "attention_backend": "TRITON_ATTN"}
    answers = triton_answers({name: {**case, "config": cfg} for name, cfg in small.items()})
    for name in small:
        assert answers[name].get("error", "").startswith("ValueError: head size 16 not supported"), answers
