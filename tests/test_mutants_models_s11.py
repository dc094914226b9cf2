"""Survivors of the ``models`` mutation run at 7ae730f (issue 25: bench/results/mutation.md, 88 left): the
family rule of MiMo-V2, Gemma 4 and Gemma 3n; the LLaVA-style wrappers' text architecture (a bad text
``architectures``, a refused language model, a generic one); Qwen3-VL's engine window; ``build``'s refusal
of a stray ``text_config``, its reading of ``sliding_window`` 0 and its context; tpu-inference's refusals
of DeepSeek-V3.2/V4, Gemma 4, MiMo-V2, Gemma 3n and the vision-language wrappers. Each refusal is pinned
by its whole message, field and value. Fast: in-process, small configs, the json reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.attention import attention_family, layer_types
from kvlayout.models.config import Config
from kvlayout.models.deepseek_v4 import dsv4_family
from kvlayout.models.families import family_rule
from kvlayout.models.gemma3n import gemma3n_family
from kvlayout.models.gemma4 import gemma4_family
from kvlayout.models.hybrid import hybrid_family
from kvlayout.models.mimo_v2 import mimo_v2_family
from kvlayout.models.mla import mla_family
from tests import json_reader as J
from tests.test_models_gemma3n import G3N, GEMMA3N
from tests.test_models_gemma4 import _BASE, G4, GEMMA4
from tests.test_models_mimo_v2 import FLASH
from tests.test_models_vl import CONFIGS, _config

_BACKEND = "first valid attention backend on hopper in vLLM's priority list"


def _refusal(config: dict[str, Any], **kw: Any) -> tuple[Any, Any, str]:
    """The field, value and whole message of the SpecError planning ``config`` raises."""
    with pytest.raises(SpecError) as e:
        J.from_config(config, **kw)
    return e.value.field, e.value.value, str(e.value)


def _plan(config: dict[str, Any], **kw: Any) -> M.ModelSpec:
    ms = J.from_config(config, **kw)
    assert isinstance(ms, M.ModelSpec)
    return ms


# --------------------------------------------------------------------------- family_rule
def test_each_family_takes_its_own_rule() -> None:
    """MiMo-V2, Gemma 4 and Gemma 3n have rules of their own; an unnamed family is a hybrid's."""
    assert family_rule("mimo_v2") is mimo_v2_family
    assert family_rule("gemma4") is gemma4_family
    assert family_rule("gemma3n") is gemma3n_family
    assert family_rule("deepseek_v4") is dsv4_family
    assert family_rule("llama") is attention_family and family_rule("generic_mla") is mla_family
    assert family_rule("jamba") is hybrid_family
    # and through the public entry (the bytes per block of tests/test_models_{mimo_v2,gemma4,gemma3n}.py)
    for cfg, family, groups, row in ((FLASH, "mimo_v2", 4, 122880), (G4, "gemma4", 4, 32768),
                                     (G3N, "gemma3n", 6, 8192)):
        ms = _plan(cfg)
        assert (ms.family, len(ms.spec.groups), ms.bytes_per_block) == (family, groups, row)
        assert set(ms.kinds.values()) == {"full", "sliding"}


# --------------------------------------------------------------------------- text_architecture
def test_a_wrappers_text_architectures_must_be_a_list_of_class_names() -> None:
    base = _config("llava")
    text = base["text_config"]
    for archs in ([], [5], [None], "LlamaForCausalLM"):
        field, value, msg = _refusal({**base, "text_config": {**text, "architectures": archs}})
        assert (field, value) == ("config.text_config.architectures", archs)
        assert msg == f"config.text_config.architectures = {archs!r}: must be a non-empty list of class names"


def test_a_wrappers_language_model_refusal_whole_message() -> None:
    base = _config("llava")
    text = base["text_config"]
    for inner in ("JambaForCausalLM", "DeepseekV2ForCausalLM", "NoSuchForCausalLM"):
        field, value, msg = _refusal({**base, "text_config": {**text, "architectures": [inner]}})
        assert (field, value) == ("config.text_config.architectures[0]", inner)
        assert msg == (
            f"config.text_config.architectures[0] = {inner!r}: LlavaForConditionalGeneration's language "
            f"model ({inner}) must be an attention architecture kvlayout reads (hybrid, MLA and other "
            "wrapped models are not checked against vLLM)"
        )


def test_a_wrapper_of_a_generic_text_model_reads_its_variation_and_names() -> None:
    """A LLaVA whose text config's model_type is gemma builds GemmaForCausalLM (generic rules): its layer
    names, tail and note are the text architecture's, found through the context's text_arch."""
    base = _config("llava")
    text = {k: v for k, v in base["text_config"].items() if k != "architectures"}
    # GemmaConfig fills head_dim 256 where the text config leaves it out (as vLLM reads it); Granite: generic
    gemma = (
        "config.text_config.head_dim left out: GemmaConfig's default, 256 (transformers), as vLLM reads it",
    )
    for model_type, arch, family, more in (("gemma", "GemmaForCausalLM", "generic", gemma),
                                           ("granite", "GraniteForCausalLM", "generic_sw", ())):
        ms = _plan({**base, "text_config": {**text, "model_type": model_type}})
        assert (ms.architecture, ms.family) == ("LlavaForConditionalGeneration", family)
        assert ms.notes == (f"the language model is {arch}, built as language_model", *more)
        assert ms.kinds == {f"language_model.model.layers.{i}.self_attn.attn": "full" for i in range(2)}
        assert (ms.attention_backend, ms.backend_reason) == ("FLASH_ATTN", _BACKEND)


# --------------------------------------------------------------------------- layer_types
def test_qwen3_vl_takes_the_engines_one_window() -> None:
    """Qwen3-VL's text config has no use_sliding_window: a written window slides every layer."""
    cfg = Config({"sliding_window": 64}, "config")
    assert layer_types(cfg, "qwen3_vl", 3) == ["sliding"] * 3
    assert layer_types(Config({}, "config"), "qwen3_vl", 3) == ["full"] * 3
    assert layer_types(cfg, "generic", 3) == ["sliding"] * 3
    for name in ("qwen3_vl_window", "qwen3_vl_moe_window"):
        ms = _plan(_config(name))
        assert set(ms.kinds.values()) == {"sliding"} and len(ms.kinds) == 2
        assert {x.window for _, x in ms.spec.layers} == {64}  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- build
def test_a_text_config_beside_a_text_architecture_is_refused() -> None:
    llama = dict(_config("llava")["text_config"])
    for tc in ({}, {"num_attention_heads": 8}):
        field, value, msg = _refusal({**llama, "text_config": tc})
        assert (field, value) == ("config.text_config", "an object")
        assert msg == (
            "config.text_config = 'an object': LlamaForCausalLM's config nests no text model: vLLM 0.33 "
            "refuses a config that writes one (get_hf_text_config: no num_attention_heads); remove it or "
            "name the multimodal architecture"
        )


def test_a_sliding_window_of_0_is_no_window() -> None:
    mistral = {**_config("llava")["text_config"], "architectures": ["MistralForCausalLM"],
               "model_type": "mistral"}
    ms = _plan({**mistral, "sliding_window": 0})
    assert ms.notes == ("sliding_window 0: vLLM reads it as no window",)
    assert ms.kinds == {f"model.layers.{i}.self_attn.attn": "full" for i in range(2)}
    assert ms.backend_reason == _BACKEND
    # 1 is a window, false is no integer (neither is read as 0)
    ms = _plan({**mistral, "sliding_window": 1})
    assert ms.notes == () and set(ms.kinds.values()) == {"sliding"}
    field, value, msg = _refusal({**mistral, "sliding_window": False})
    assert (field, value) == ("config.sliding_window", False)
    assert msg == "config.sliding_window = False: must be an integer"
    # in a wrapper's text config too
    wrapper = _config("mistral3")
    ms = _plan({**wrapper, "text_config": {**wrapper["text_config"], "sliding_window": 0}})
    assert ms.notes == (
        "sliding_window 0: vLLM reads it as no window",
        "the language model is MistralForCausalLM, built as language_model",
    )
    assert set(ms.kinds.values()) == {"full"}


# --------------------------------------------------------------------------- tpu_inference_from_config
def _tpu_refusal(config: dict[str, Any], why: str, block_sizes: tuple[int | None, ...] = (None, 16)) -> None:
    for block_size in block_sizes:
        field, value, msg = _refusal(config, engine="tpu-inference", block_size=block_size)
        assert (field, value) == ("engine", "tpu-inference")
        assert msg == f"engine = 'tpu-inference': {why}"


def test_tpu_inference_refuses_layers_of_different_shapes() -> None:
    g4w = {**_BASE, "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
           "text_config": {k: v for k, v in GEMMA4.items() if k != "architectures"}}
    for arch, cfg in (("Gemma4ForCausalLM", G4), ("Gemma4ForConditionalGeneration", g4w),
                      ("MiMoV2FlashForCausalLM", FLASH)):
        _tpu_refusal(cfg, (
            f"tpu-inference's arrays for {arch}'s layers of different shapes are not modeled (vLLM unifies "
            "their pages; what tpu-inference allocates for them is not read here)"
        ))


def test_tpu_inference_refuses_gemma3n() -> None:
    g3nw = {**_BASE, "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
            "text_config": {k: v for k, v in GEMMA3N.items() if k != "architectures"}}
    for cfg in (G3N, g3nw):
        _tpu_refusal(cfg, "tpu-inference's arrays for Gemma 3n's layers that read earlier layers' caches are "
                          "not modeled")


def test_tpu_inference_refuses_vision_language_wrappers() -> None:
    for name in CONFIGS:
        arch = CONFIGS[name]["architectures"][0]
        _tpu_refusal(_config(name), (
            f"tpu-inference's arrays for the multimodal {arch} are not checked against its code (vLLM's are: "
            "plan with engine vllm)"
        ))


def test_tpu_inference_refuses_deepseek_indexers() -> None:
    fixture = Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json"
    v4 = json.loads(fixture.read_text())
    v32 = {**v4, "architectures": ["DeepseekV3ForCausalLM"], "index_topk": 64, "kv_lora_rank": 512}
    why = (
        "tpu-inference's arrays for the DeepSeek-V3.2/V4 indexer, window and compressed caches are not "
        "modeled"
    )
    for cfg in (v4, v32):
        _tpu_refusal(cfg, why, (None, 256))
