"""Hostile pass 22 (/tmp/h22) and the audit of each family's window and head-size fields against vLLM 0.33's
model code (/tmp/audit) that followed it: regression tests, each failing on the code before its fix (0e8d53f).
What vLLM builds is its own construction (tests/test_models_hybrid_vllm.py's driver), in one batched call:
Jamba's layers take hidden_size // heads whatever head_dim says (81,920 B a block where kvlayout planned
40,960 at head_dim 16); a written null window is full attention (Gemma 2 / 3, Llama's and Mistral's
layer_types, GPT-OSS, Qwen2 / Qwen3); GPT-OSS slides on its even layers, not by layer_types; Qwen2 / Qwen3 /
Qwen3-MoE take one engine window, which use_sliding_window false or mixed layer_types withhold; Nemotron-H's
attention slides when sliding_window is written."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from tests.test_models_hybrid_vllm import _BASE, _kvlayout, vllm_answers

JAMBA = {
    **_BASE, "architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
    "attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1, "expert_layer_period": 2,
    "num_experts": 2, "num_experts_per_tok": 1, "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_dt_rank": 16,
    "mamba_expand": 2,
}
GEMMA2 = {
    **_BASE, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "intermediate_size": 1024, "query_pre_attn_scalar": 64,
}
GEMMA3 = {
    **GEMMA2, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "sliding_window_pattern": 2,
}


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_h1_jamba_head_dim_that_differs_is_refused(head_dim: int) -> None:
    """H1 (HIGH): a written head_dim was taken as the layers' head size; vLLM's layers use 256 // 8 = 32 and
    only its block alignment reads head_dim (as Granite 4.0-H's, LFM2's, OLMo hybrid's: refused by name)."""
    said = rf"^config\.head_dim = {head_dim}: vLLM's layers use hidden_size // num_attention_heads = 32"
    with pytest.raises(SpecError, match=said):
        M.from_config({**JAMBA, "head_dim": head_dim}, reader="json")


S, F = "sliding_attention", "full_attention"
GPT_OSS = {
    **_BASE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "num_local_experts": 4, "experts_per_token": 2, "num_experts_per_tok": 2, "intermediate_size": 256,
    "sliding_window": 128, "layer_types": [S, F, S, F], "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 4096},
}
QWEN2 = {
    **_BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
    "use_sliding_window": False, "sliding_window": 128, "max_window_layers": 0,
}
QWEN3 = {**QWEN2, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 64}
QWEN3_MOE = {
    **QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 128,
}
MOE_ON = {**QWEN3_MOE, "use_sliding_window": True}
LLAMA = {
    **_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
}
NEMOTRON_H = {
    **_BASE, "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 256,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
    "hybrid_override_pattern": "M-M*M-M*", "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 1,
    "ssm_state_size": 16, "conv_kernel": 4, "intermediate_size": 512, "expand": 1,
}
#: case name -> (config, tp sizes); each at bf16 and fp8, on the GPU's attention backend
CASES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "jamba_head_dim_absent": (JAMBA, (1,)),
    "jamba_head_dim_agrees": ({**JAMBA, "head_dim": 32}, (1,)),
    "gemma2_null_window": ({**GEMMA2, "sliding_window": None}, (1, 2)),
    "gemma3_null_window": ({**GEMMA3, "sliding_window": None}, (1,)),
    "gpt_oss_types_swapped": ({**GPT_OSS, "layer_types": [F, S, F, S]}, (1,)),
    "gpt_oss_types_all_full": ({**GPT_OSS, "layer_types": [F] * 4}, (1,)),
    "gpt_oss_null_window": ({**GPT_OSS, "sliding_window": None}, (1,)),
    "qwen2_types_sliding_flag_off": ({**QWEN2, "layer_types": [S] * 4}, (1,)),
    "qwen2_null_window_flag_on": ({**QWEN2, "use_sliding_window": True, "sliding_window": None}, (1,)),
    "qwen3_types_sliding_flag_off": ({**QWEN3, "layer_types": [S] * 4}, (1,)),
    "qwen3_null_window_flag_on": ({**QWEN3, "use_sliding_window": True, "sliding_window": None}, (1,)),
    "qwen3_moe_types_mixed_flag_on": ({**MOE_ON, "layer_types": [S, F, S, F]}, (1,)),
    "qwen3_moe_types_sliding_flag_off": ({**QWEN3_MOE, "layer_types": [S] * 4}, (1,)),
    "qwen3_moe_types_sliding_flag_on": ({**MOE_ON, "layer_types": [S] * 4}, (1,)),
    "llama_types_null_window": ({**LLAMA, "layer_types": [S, F, S, F], "sliding_window": None}, (1,)),
    "mistral_types_null_window": (
        {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": None,
         "layer_types": [S, F, S, F]}, (1,),
    ),
    "nemotron_h_window": ({**NEMOTRON_H, "sliding_window": 128}, (1, 2)),
    "nemotron_h_no_window": (NEMOTRON_H, (1,)),
}


def test_each_fixed_rule_is_vllms_construction() -> None:
    """Every case above plans as vLLM 0.33 builds it: groups, kinds, pages, blocks, windows, bytes a block."""
    cases = {
        f"{name}-tp{tp}-{kv}": {"config": cfg, "tp": tp, "kv_cache_dtype": kv, "gpu_backend": True}
        for name, (cfg, tps) in CASES.items()
        for tp in tps
        for kv in ("auto", "fp8")
    }
    answers = vllm_answers(cases)
    for cid, case in cases.items():
        got, want = _kvlayout(case), answers[cid]
        assert "error" not in want, (cid, want)
        for key in ("block_size", "layers", "blocks", "windows", "groups", "bytes_per_block"):
            assert got[key] == want[key], (cid, key, got[key], want[key])
    # what the old rules got wrong, in vLLM's own terms
    assert answers["gemma2_null_window-tp1-auto"]["bytes_per_block"] == 4 * 16 * 4 * 64 * 2 * 2  # all full
    gpt = answers["gpt_oss_types_all_full-tp1-auto"]
    assert sorted(gpt["windows"]) == ["model.layers.0.attn.attn", "model.layers.2.attn.attn"]
    assert answers["qwen3_moe_types_mixed_flag_on-tp1-auto"]["windows"] == {}
    assert answers["qwen3_moe_types_sliding_flag_on-tp1-auto"]["windows"]  # the flag and all-sliding types
    assert answers["qwen2_types_sliding_flag_off-tp1-auto"]["windows"] == {}
    assert answers["nemotron_h_window-tp1-auto"]["windows"] == {
        "model.layers.3.mixer.attn": 128, "model.layers.7.mixer.attn": 128,
    }


@pytest.mark.parametrize("cfg", [GEMMA2, GEMMA3], ids=["gemma2", "gemma3"])
def test_l1_gemma_null_window_is_full_attention(cfg: dict[str, Any]) -> None:
    """L1 (LOW): ``"sliding_window": null`` was refused as missing; vLLM's layers pass the null window
    (full attention on every layer). An absent window is still named (the json reader has no default)."""
    ms = M.from_config({**cfg, "sliding_window": None}, reader="json")
    assert isinstance(ms, M.ModelSpec)
    assert set(ms.kinds.values()) == {"full"} and len(ms.spec.groups) == 1
    with pytest.raises(SpecError, match=r"sliding_window"):
        M.from_config(cfg, reader="json")


def test_gpt_oss_with_fewer_kv_heads_than_tp_is_refused() -> None:
    """Audit: GptOssAttention takes ``num_key_value_heads // tp`` KV heads, not replicated, so vLLM fails
    at tp 4 with 2 KV heads (ZeroDivisionError in its construction); kvlayout planned one head per rank."""
    assert M.from_config(GPT_OSS, tp=2, reader="json").bytes_per_block == 8_192
    said = r"^config\.num_key_value_heads = 2: fewer than tp = 4: vLLM.s GptOss"
    with pytest.raises(SpecError, match=said):
        M.from_config(GPT_OSS, tp=4, reader="json")
