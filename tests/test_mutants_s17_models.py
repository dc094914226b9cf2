"""kvlayout.models, session 17's survivors: what each reader says and plans on the paths the earlier
tests did not take (a remote-code wrapper read through transformers, a transformers class that does not
validate RoPE, Step 3's written null head_dim, Kimi-K2.5 on tpu-inference, tpu-inference options,
the IndexCache pattern's type, the refusal of an architecture served through the Transformers backend)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.config import MissingField
from kvlayout.models.families import FAMILIES, TRANSFORMERS_BACKEND, refusal, transformers_backend_coverage

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers (kvlayout[models]) absent"
)


def _fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    return data


#: Kimi-K2.5's config.json in its structure, small (tests/test_models_backend_vllm.py's KIMI_K25)
KIMI_K25: dict[str, Any] = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "kv_lora_rank": 64,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 64, "v_head_dim": 64, "q_lora_rank": 64,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "moe_intermediate_size": 128, "intermediate_size": 512,
        "vocab_size": 1024,
        "max_position_embeddings": 4096, "dtype": "bfloat16",
    },
    "vision_config": {"model_type": "kimi_k25_vision", "num_hidden_layers": 1, "hidden_size": 64,
                      "num_attention_heads": 4, "intermediate_size": 128},
    "projection_hidden_size": 64,
}

#: GPT-2 as tests/test_models_generic.py's harness writes it (small)
GPT2: dict[str, Any] = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 8, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "activation_function": "gelu",
}


@needs_transformers
def test_a_text_config_read_as_written_by_the_transformers_reader_gives_no_hint() -> None:
    """No model_type at the top: the transformers reader reads the wrapper as written (no class built)
    and no reader is left to try, in the text config too: a field it leaves out is refused plainly,
    not as a MissingField that sends the auto reader to transformers again."""
    cfg = copy.deepcopy(KIMI_K25)
    del cfg["model_type"]
    cfg["text_config"]["model_type"] = "deepseek_v3"
    del cfg["text_config"]["num_attention_heads"]
    with pytest.raises(SpecError) as e:
        M.from_config(cfg, reader="transformers")
    assert type(e.value) is SpecError
    assert str(e.value) == "config.text_config.num_attention_heads = None: missing; the query heads"
    with pytest.raises(MissingField) as m:  # read as written by the json reader: the hint is given
        M.from_config(cfg, reader="json")
    assert str(m.value).endswith("; reader='transformers' fills the config class's defaults, as vLLM does")


@needs_transformers
def test_a_class_that_does_not_validate_rope_takes_an_odd_head_dim() -> None:
    """GPT2Config keeps a written head_dim and rope_theta without validating RoPE (GPT-2 has none):
    the transformers reader, which built the config with that class, plans it (head size hidden //
    heads, as vLLM's GPT-2 attention); nothing of the class's is checked again."""
    cfg = {**GPT2, "head_dim": 129, "rope_theta": 10000.0}
    ms = M.from_config(cfg, reader="transformers")
    assert isinstance(ms, M.ModelSpec)
    assert {x.head_size for _, x in ms.spec.layers} == {32}
    assert "read through transformers' GPT2Config" in ms.notes


def test_the_rope_parameters_factor_is_the_one_read() -> None:
    """A partial_rotary_factor inside rope_parameters is the one transformers reads (over a top-level one)."""
    llama = _fixture("llama")
    llama.pop("rope_scaling", None)
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    full = {**llama, "head_dim": 129, "partial_rotary_factor": 0.5,
            "rope_parameters": {**rope, "partial_rotary_factor": 1.0}}
    with pytest.raises(SpecError) as e:
        M.from_config(full, reader="json")
    assert e.value.field == "config.head_dim" and e.value.value == 129
    assert "(partial_rotary_factor 1.0)" in str(e.value)


def test_step3_takes_its_default_head_dim_where_null_is_written() -> None:
    """vLLM's Step3TextConfig has head_dim 256: a null written is read as left out (not hidden // heads)."""
    cfg = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
           "torch_dtype": "bfloat16", "architectures": ["Step3TextForCausalLM"], "model_type": "step3_text",
           "head_dim": None}
    for reader in ("json", "auto"):
        ms = M.from_config(cfg, reader=reader)
        assert isinstance(ms, M.ModelSpec)
        assert {x.head_size for _, x in ms.spec.layers} == {256}, reader


def test_tpu_inference_refuses_kimi_k25_as_multimodal() -> None:
    with pytest.raises(SpecError) as e:
        M.from_config(copy.deepcopy(KIMI_K25), engine="tpu-inference", reader="json")
    assert str(e.value) == (
        "engine = 'tpu-inference': tpu-inference's arrays for the multimodal KimiK25ForConditionalGeneration "
        "are not checked against its code (vLLM's are: plan with engine vllm)"
    )
    assert e.value.field == "engine" and e.value.value == "tpu-inference"


def test_an_unknown_tpu_inference_option_lists_the_valid_ones() -> None:
    with pytest.raises(SpecError) as e:
        M.from_config(_fixture("llama"), engine="tpu-inference", nope=1)
    valid = (
        "tp, dtype, kv_cache_dtype, block_size, num_blocks, mamba_ssm_cache_dtype, reader, dp, dcp, "
        "model_impl, max_model_len, max_num_seqs, mla_transpose_kv_cache, mla_kv_packing_size, batched_rpa"
    )
    assert str(e.value) == f"nope = 1: not an option of engine tpu-inference (valid: {valid})"


@pytest.mark.parametrize("bad", [5, {"F": 1}, 2.5])
def test_an_index_topk_pattern_of_another_type_is_refused(bad: Any) -> None:
    with pytest.raises(SpecError) as e:
        M.from_config({**_fixture("deepseek_v32"), "index_topk_pattern": bad}, reader="json")
    assert str(e.value) == f"config.index_topk_pattern = {bad!r}: must be a string of F and S per layer"


def test_an_architecture_of_the_transformers_backend_is_refused_naming_it() -> None:
    arch = "NanbeigeForCausalLM"  # served through the Transformers backend, not planned
    assert arch in TRANSFORMERS_BACKEND and arch not in FAMILIES
    assert "(sliding-window, module transformers: its Transformers modeling backend)" in refusal(arch)
    with pytest.raises(SpecError) as e:
        M.from_config({**_fixture("llama"), "architectures": [arch]}, reader="json")
    assert "module transformers: its Transformers modeling backend); kvlayout refuses it" in str(e.value)
    assert "module llama" not in refusal(arch)


def test_transformers_backend_coverage() -> None:
    planned, total = transformers_backend_coverage()
    assert total == len(TRANSFORMERS_BACKEND) and 0 < len(planned) < total
    assert list(planned) == sorted(planned)
    assert set(planned) == {a for a in TRANSFORMERS_BACKEND if a in FAMILIES}
    assert "Olmo3ForCausalLM" in planned and "NanbeigeForCausalLM" not in planned
