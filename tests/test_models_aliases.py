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
from kvlayout.models.config import written_aliases
from kvlayout.models.config_aliases import ALIASES

ROOT = Path(__file__).resolve().parents[1]
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
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_aliases.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert ALIASES["glm4_moe_lite"] == {"head_dim": "qk_rope_head_dim"}


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
