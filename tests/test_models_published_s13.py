"""Published configs checked against vLLM 0.33's own construction (issue 23, a reviewer's differential of 19
published config.json files, 228 cases): MiMo-7B and GLM-5, the two it found planned unlike vLLM or
refused where vLLM serves them.

- MiMo-7B: vLLM's MiMoForCausalLM is its Qwen2ForCausalLM (models/mimo.py; the MTP weights dropped) and the
  checkpoint's remote-code MiMoConfig subclasses transformers' Qwen2Config, which drops the window when
  ``use_sliding_window`` is false: every layer full attention. kvlayout slid all 36 layers (window 32,768;
  the same bytes, another kind).
- GLM-5: vLLM 0.33 registers GlmMoeDsaForCausalLM as its DeepseekV32ForCausalLM (models/deepseek_v32), so its
  cache is DeepSeek-V3.2's; kvlayout refused it (its generic harness cannot build sparse attention on a
  CPU). vLLM's numbers (its ModelConfig and page logic on the same config): 64-token blocks, 6,409,728 B per
  block in bf16 and 3,933,696 in fp8_ds_mla, at tp 1, 2 and 8.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

import kvlayout.models as M

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
READERS = ["json", "auto"] + (["transformers"] if HAS_TRANSFORMERS else [])

#: XiaomiMiMo/MiMo-7B-Base's config.json, the fields that decide its cache (as published)
MIMO_7B: dict[str, Any] = {
    "architectures": ["MiMoForCausalLM"],
    "model_type": "mimo",
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "sliding_window": 32768,
    "max_window_layers": 32,
    "use_sliding_window": False,
    "num_nextn_predict_layers": 1,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("reader", READERS)
def test_mimo_is_qwen2_without_a_window_when_use_sliding_window_is_false(reader: str) -> None:
    ms = M.from_config(dict(MIMO_7B), reader=reader)
    assert ms.family == "qwen2" and set(ms.kinds.values()) == {"full"}
    assert list(ms.kinds)[0] == "model.layers.0.self_attn.attn" and len(ms.kinds) == 36
    assert ms.bytes_per_block == 36 * 16 * 2 * 8 * 128 * 2  # 2,359,296 B, vLLM's
    as_qwen2 = {**MIMO_7B, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    qwen2 = M.from_config(as_qwen2, reader=reader)
    assert (qwen2.kinds, qwen2.bytes_per_block) == (ms.kinds, ms.bytes_per_block)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_mimo_without_use_sliding_window_is_read_as_qwen2config() -> None:
    """Left out, use_sliding_window is Qwen2Config's default (false): the default reader asks transformers,
    which reads model_type mimo with its Qwen2Config (transformers has no mimo class)."""
    cfg = {k: v for k, v in MIMO_7B.items() if k != "use_sliding_window"}
    ms = M.from_config(cfg)
    assert set(ms.kinds.values()) == {"full"}
    assert "model_type 'mimo' read as transformers' 'qwen2' class (its own is a subclass)" in ms.notes
    windowed = M.from_config({**MIMO_7B, "use_sliding_window": True, "max_window_layers": 0})
    assert set(windowed.kinds.values()) == {"sliding"}


#: zai-org/GLM-5's config.json, the fields that decide its cache (as published)
GLM_5: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "dtype": "bfloat16",
    "num_hidden_layers": 78,
    "hidden_size": 6144,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "head_dim": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_topk": 2048,
    "first_k_dense_replace": 3,
    "n_routed_experts": 256,
}


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize(("kv", "want"), [(None, 6_409_728), ("fp8", 3_933_696)])
def test_glm5_is_deepseek_v32(tp: int, kv: str | None, want: int) -> None:
    ms = M.from_config(dict(GLM_5), tp=tp, kv_cache_dtype=kv)
    assert (ms.family, ms.block_size, ms.bytes_per_block) == ("deepseek_v32", 64, want)
    v32 = M.from_config({**GLM_5, "architectures": ["DeepseekV32ForCausalLM"]}, tp=tp, kv_cache_dtype=kv)
    assert (v32.kinds, v32.bytes_per_block) == (ms.kinds, ms.bytes_per_block)
