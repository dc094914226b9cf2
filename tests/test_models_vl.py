"""Vision-language wrappers on the host (issue 23): each read as its text architecture, the text config's
architecture resolved as vLLM 0.33 resolves it, and every refusal by field. Fast (no vLLM process: the
construction itself is tests/test_models_vl_vllm.py, of the configs here); in the ``models``
mutation selection."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.families import MULTIMODAL, QWEN_VL
from tests import json_reader as J

TPS = (1, 2, 8)
#: what a config whose text fields sit at its top adds (tests/test_models_hybrid_vllm.py's base)
_BASE: dict[str, Any] = {"torch_dtype": "bfloat16", "vocab_size": 1024, "max_position_embeddings": 4096}

_TEXT: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}
#: Qwen2.5-VL's vision tower, one block (vLLM's model builds it; it holds no KV cache)
_VISION_25 = {"depth": 1, "hidden_size": 64, "out_hidden_size": 256, "num_heads": 8, "intermediate_size": 128,
              "fullatt_block_indexes": [0], "hidden_act": "silu"}
_MROPE_3 = {"mrope_interleaved": True, "mrope_section": [12, 10, 10], "rope_type": "default"}
_VISION_3 = {"depth": 1, "hidden_size": 64, "out_hidden_size": 256, "num_heads": 8, "intermediate_size": 128,
             "deepstack_visual_indexes": [], "num_position_embeddings": 64}

#: name -> config in the shape of the published one (Qwen2-VL-7B-Instruct, Qwen2.5-VL-7B-Instruct,
#: Qwen3-VL-8B-Instruct, Qwen3-VL-30B-A3B-Instruct), small
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2_vl": {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        **_TEXT,
        "max_window_layers": 2,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        # quick_gelu (the class default) has no CPU kernel in vLLM; the vision tower holds no cache
        "vision_config": {"depth": 1, "embed_dim": 64, "hidden_size": 256, "num_heads": 8,
                          "hidden_act": "gelu"},
    },
    "qwen2_5_vl": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **_TEXT,
        "max_window_layers": 2,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "vision_config": _VISION_25,
    },
    # use_sliding_window with max_window_layers = num_hidden_layers: Qwen2's rule leaves every layer full
    "qwen2_5_vl_swa": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **_TEXT,
        "num_key_value_heads": 4,
        "max_window_layers": 2,
        "sliding_window": 64,
        "use_sliding_window": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "vision_config": _VISION_25,
    },
    "qwen3_vl": {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": {
            **_TEXT,
            "model_type": "qwen3_vl_text",
            "head_dim": 64,
            "dtype": "bfloat16",
            "rope_scaling": _MROPE_3,
        },
        "vision_config": _VISION_3,
    },
    "qwen3_vl_moe": {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "model_type": "qwen3_vl_moe",
        "text_config": {
            **_TEXT,
            "model_type": "qwen3_vl_moe_text",
            "head_dim": 64,
            "num_key_value_heads": 4,
            "dtype": "bfloat16",
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            "rope_scaling": _MROPE_3,
        },
        "vision_config": _VISION_3,
    },
}
#: vision towers of one block (8 heads: the tower is split over tp 8 too)
_CLIP = {"model_type": "clip_vision_model", "hidden_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 8, "intermediate_size": 128, "image_size": 224, "patch_size": 14,
         "projection_dim": 64}
_SIGLIP = {"model_type": "siglip_vision_model", "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 8, "intermediate_size": 128, "image_size": 384, "patch_size": 14}
_PIXTRAL = {"model_type": "pixtral", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 8,
            "intermediate_size": 128, "head_dim": 8, "image_size": 224, "patch_size": 16}
_SMALL = {**_TEXT, "vocab_size": 1024, "max_position_embeddings": 4096}
# llava-1.5 (its text config names LlamaForCausalLM), llava-v1.6-mistral (model_type mistral, no
# architectures), llava-onevision-qwen2 (qwen2), Mistral-Small-3.1 (mistral, head_dim, no window; and
# with one)
CONFIGS["llava"] = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "torch_dtype": "float16",
    "text_config": {**_SMALL, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "torch_dtype": "float16"},
    "vision_config": _CLIP,
    "image_token_index": 10,
    "projector_hidden_act": "gelu",
}
CONFIGS["llava_next"] = {
    "architectures": ["LlavaNextForConditionalGeneration"],
    "model_type": "llava_next",
    "torch_dtype": "bfloat16",
    "text_config": {**_SMALL, "model_type": "mistral", "num_key_value_heads": 4, "sliding_window": None},
    "vision_config": _CLIP,
    "image_token_index": 10,
}
CONFIGS["llava_onevision"] = {
    "architectures": ["LlavaOnevisionForConditionalGeneration"],
    "model_type": "llava_onevision",
    "torch_dtype": "bfloat16",
    "text_config": {**_SMALL, "model_type": "qwen2", "use_sliding_window": False, "sliding_window": 4096,
                    "max_window_layers": 2},
    "vision_config": _SIGLIP,
    "image_token_index": 10,
}
CONFIGS["mistral3"] = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "torch_dtype": "bfloat16",
    "text_config": {**_SMALL, "model_type": "mistral", "head_dim": 64, "sliding_window": None},
    "vision_config": _PIXTRAL,
    "image_token_index": 10,
    "spatial_merge_size": 2,
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": False,
}
CONFIGS["mistral3_window"] = {**CONFIGS["mistral3"], "text_config": {**CONFIGS["mistral3"]["text_config"],
                                                                     "sliding_window": 64}}
# Qwen3-VL's text config classes have no use_sliding_window: a written window is vLLM's engine window,
# on every layer (the dense one without the flag, the MoE one with it false)
CONFIGS["qwen3_vl_window"] = {**CONFIGS["qwen3_vl"], "text_config": {**CONFIGS["qwen3_vl"]["text_config"],
                                                                     "sliding_window": 64}}
CONFIGS["qwen3_vl_moe_window"] = {
    **CONFIGS["qwen3_vl_moe"],
    "text_config": {
        **CONFIGS["qwen3_vl_moe"]["text_config"], "sliding_window": 64, "use_sliding_window": False
    },
}


def _config(name: str) -> dict[str, Any]:
    cfg = CONFIGS[name]
    return {**({} if "text_config" in cfg else _BASE), "vocab_size": 1024, **cfg}


def test_qwen_vl_is_read_as_its_text_architecture() -> None:
    """The wrapper plans as its text architecture's config would, named under ``language_model.``."""
    pairs = {
        "qwen2_5_vl": ("Qwen2ForCausalLM", "qwen2"),
        "qwen3_vl": ("Qwen3ForCausalLM", "qwen3"),
        "qwen3_vl_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
        "llava": ("LlamaForCausalLM", "llama"),
        "llava_onevision": ("Qwen2ForCausalLM", "qwen2"),
        "mistral3_window": ("MistralForCausalLM", "mistral"),
    }
    for name, (text_arch, text_type) in pairs.items():
        cfg = _config(name)
        # Qwen3's own config class has use_sliding_window (false by default); Qwen3-VL's text classes do not
        text = {"use_sliding_window": False, **cfg.get("text_config", cfg), "architectures": [text_arch],
                "model_type": text_type}
        text.pop("text_config", None)
        text.pop("vision_config", None)
        for tp in TPS:
            wrapped, alone = J.from_config(cfg, tp=tp), J.from_config(text, tp=tp)
            assert isinstance(wrapped, M.ModelSpec) and isinstance(alone, M.ModelSpec)
            assert wrapped.bytes_per_block == alone.bytes_per_block and wrapped.block_size == alone.block_size
            assert [x.name for _, x in wrapped.spec.layers] == [
                f"language_model.{x.name}" for _, x in alone.spec.layers
            ]
    assert set(QWEN_VL) <= set(MULTIMODAL) <= set(M.ARCHITECTURES)


def test_qwen_vl_is_refused_for_tpu_inference() -> None:
    with pytest.raises(SpecError, match="tpu-inference's arrays for the multimodal Qwen2_5_VL") as e:
        J.from_config(_config("qwen2_5_vl"), engine="tpu-inference")
    assert (e.value.field, e.value.value) == ("engine", "tpu-inference")


def test_a_text_config_model_type_names_transformers_causal_lm_class() -> None:
    """CAUSAL_LM_TYPES is transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES on its types, each an attention
    architecture kvlayout reads."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as NAMES

    from kvlayout.models.attention import CAUSAL_LM_TYPES
    from kvlayout.models.families import ATTENTION_FAMILIES, FAMILIES

    assert {t: NAMES[t] for t in CAUSAL_LM_TYPES} == dict(CAUSAL_LM_TYPES)
    assert all(FAMILIES[a] in ATTENTION_FAMILIES for a in CAUSAL_LM_TYPES.values())


def _refused(config: dict[str, Any], field: str, value: Any, message: str) -> None:
    with pytest.raises(SpecError) as e:
        J.from_config(config)
    assert (e.value.field, e.value.value) == (field, value)
    assert message in str(e.value)


def test_a_wrappers_language_model_is_refused_unless_an_attention_architecture() -> None:
    base = _config("mistral3")
    text = base["text_config"]
    _refused({k: v for k, v in base.items() if k != "text_config"}, "config.text_config", None,
             "Mistral3ForConditionalGeneration builds its language model from it")
    _refused({**base, "text_config": {**text, "model_type": "jamba"}}, "config.text_config.model_type",
             "jamba", "valid: llama, mistral, qwen2")
    _refused({**base, "text_config": {k: v for k, v in text.items() if k != "model_type"}},
             "config.text_config.model_type", None, "builds the causal-LM class of this model type")
    _refused({**base, "text_config": {**text, "architectures": "LlamaForCausalLM"}},
             "config.text_config.architectures", "LlamaForCausalLM",
             "must be a non-empty list of class names")
    for inner in ("JambaForCausalLM", "DeepseekV2ForCausalLM", "NoSuchForCausalLM"):
        _refused({**base, "text_config": {**text, "architectures": [inner]}},
                 "config.text_config.architectures[0]", inner,
                 f"language model ({inner}) must be an attention architecture kvlayout reads")
    # the text config's architectures beat its model_type (vLLM's with_hf_config)
    ms = J.from_config({**base, "text_config": {**text, "architectures": ["LlamaForCausalLM"]}})
    assert isinstance(ms, M.ModelSpec) and ms.family == "llama"
    assert "the language model is LlamaForCausalLM, built as language_model" in ms.notes
