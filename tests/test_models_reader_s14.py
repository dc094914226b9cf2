"""The transformers reader reads a config with the class vLLM 0.33 reads it with (issue 25, left from the
eleventh pass): transformers' class for a model type transformers maps, the transformers class vLLM's
registry names for one of vLLM's types (``deepseek_v32`` and ``kimi_k2``: ``DeepseekV3Config``), and
as written, with that class's defaults from kvlayout's table, for a type vLLM reads with its own class."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.config import MissingField, through_transformers
from kvlayout.models.config_aliases import VLLM_TRANSFORMERS_CLASSES, VLLM_TYPES

_BASE: dict[str, Any] = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8}
_V32 = {
    **_BASE,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "torch_dtype": "bfloat16",
    "index_head_dim": 128,
    "index_n_heads": 4,
}


def test_the_table_names_transformers_classes_of_vllm_types_only() -> None:
    assert set(VLLM_TRANSFORMERS_CLASSES) <= VLLM_TYPES
    assert VLLM_TRANSFORMERS_CLASSES["deepseek_v32"] == VLLM_TRANSFORMERS_CLASSES["kimi_k2"] == "deepseek_v3"


def test_a_vllm_type_is_read_with_the_transformers_class_vllm_names() -> None:
    """DeepSeek-V3.2 as vLLM 0.33 reads it: DeepseekV3Config (512 + 64 latent where left out), under the
    model type written. transformers' own DeepseekV32Config filled index_topk (2,048), and kvlayout planned
    an indexer where vLLM's config hook asserts index_topk is written."""
    pytest.importorskip("transformers")
    notes: list[str] = []
    data, built = through_transformers({**_V32, "index_topk": 64}, notes)
    assert built and data["model_type"] == "deepseek_v32"
    assert (data["kv_lora_rank"], data["qk_rope_head_dim"]) == (512, 64)
    assert (
        notes[-1]
        == "read through transformers' DeepseekV3Config, the class vLLM 0.33 reads 'deepseek_v32' with"
    )
    for reader in ("auto", "transformers"):
        ms = M.from_config({**_V32, "index_topk": 64}, reader=reader)
        assert isinstance(ms, M.ModelSpec)
        assert sorted({x.head_size for _, x in ms.spec.layers}) == [132, 576]
    for reader in ("auto", "transformers"):  # vLLM asserts index_topk: refused, not an indexer planned
        with pytest.raises(SpecError, match=r"config\.index_topk = None: missing; vLLM 0.33 asserts it") as e:
            M.from_config(_V32, reader=reader)
        assert not isinstance(e.value, MissingField)  # no reader left to try
    latent = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    with pytest.raises(MissingField, match=r"config\.index_topk = None: missing; .*reader='transformers'"):
        M.from_config({**_V32, **latent}, reader="json")


def test_a_type_vllm_reads_with_its_own_class_is_read_as_written() -> None:
    """Beam: vLLM's BeamConfig fills 4 KV heads where transformers' fills 8; the transformers reader no
    longer builds it with transformers' class, but reads it as the json reader does."""
    pytest.importorskip("transformers")
    assert "beam" in VLLM_TYPES and "beam" not in VLLM_TRANSFORMERS_CLASSES
    notes: list[str] = []
    written = {**_BASE, "model_type": "beam"}
    data, built = through_transformers(written, notes)
    assert not built and data == written
    assert notes == [
        "model_type 'beam': vLLM 0.33 reads it with its own config class, not transformers': read as written"
    ]


def test_a_missing_field_of_an_own_class_type_is_refused_without_a_fallback() -> None:
    """Step 3's text model (vLLM's Step3TextConfig): a field left out that kvlayout's table does not fill is
    refused under every reader, naming vLLM's own class, and auto does not send it to transformers."""
    cfg = {
        **_BASE,
        "architectures": ["Step3TextForCausalLM"],
        "model_type": "step3_text",
        "torch_dtype": "bfloat16",
    }
    del cfg["num_attention_heads"]
    for reader in ("json", "auto", "transformers"):
        with pytest.raises(SpecError) as e:
            M.from_config(cfg, reader=reader)
        assert not isinstance(e.value, MissingField)
        assert str(e.value).startswith("config.num_attention_heads = None: missing; ")
        assert str(e.value).endswith(
            "vLLM 0.33 reads model_type 'step3_text' with its own config class: write it"
        )
    # complete, the transformers reader plans what the json reader plans, and says why it read as written
    full = {**cfg, "num_attention_heads": 8}
    by_json, by_tf = (M.from_config(full, reader=r) for r in ("json", "transformers"))
    assert by_json.spec == by_tf.spec and {x.head_size for _, x in by_tf.spec.layers} == {256}
    assert by_tf.notes == (
        "model_type 'step3_text': vLLM 0.33 reads it with its own config class, not transformers': "
        "read as written",
    )
    # a missing architectures is not a field a class fills: no own-class suffix
    with pytest.raises(SpecError) as e:
        M.from_config({k: v for k, v in full.items() if k != "architectures"}, reader="json")
    assert str(e.value).endswith("it names the model class the engine builds")
