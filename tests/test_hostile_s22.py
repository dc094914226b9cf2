"""Hostile pass 22 (/tmp/h22): one regression test per fixed finding, each failing on the code before its
fix (0e8d53f). What vLLM 0.33 builds was shown by its own construction (tests/test_models_hybrid_vllm.py's
driver): Jamba's layers take hidden_size // heads whatever head_dim says (81,920 B a block where kvlayout
planned 40,960 at head_dim 16); Gemma 2 / 3 with a null window build full attention only."""

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


def test_h1_jamba_head_dim_that_agrees_is_planned_as_vllm_builds_it() -> None:
    cases = {
        f"{name}-{kv}": {"config": cfg, "tp": 1, "kv_cache_dtype": kv}
        for name, cfg in (("absent", JAMBA), ("written", {**JAMBA, "head_dim": 32}))
        for kv in ("auto", "fp8")
    }
    cases.update({
        f"{name}-null-tp{tp}-{kv}": {
            "config": {**cfg, "sliding_window": None}, "tp": tp, "kv_cache_dtype": kv, "gpu_backend": True,
        }
        for name, cfg in (("gemma2", GEMMA2), ("gemma3", GEMMA3))
        for tp in (1, 2)
        for kv in ("auto", "fp8")
    })
    answers = vllm_answers(cases)
    for cid, case in cases.items():
        got, want = _kvlayout(case), answers[cid]
        assert "error" not in want, (cid, want)
        for key in ("block_size", "layers", "blocks", "windows", "groups", "bytes_per_block"):
            assert got[key] == want[key], (cid, key, got[key], want[key])
    assert answers["gemma2-null-tp1-auto"]["bytes_per_block"] == 4 * 16 * 4 * 64 * 2 * 2  # four full layers


@pytest.mark.parametrize("cfg", [GEMMA2, GEMMA3], ids=["gemma2", "gemma3"])
def test_l1_gemma_null_window_is_full_attention(cfg: dict[str, Any]) -> None:
    """L1 (LOW): ``"sliding_window": null`` was refused as missing; vLLM's layers pass the null window
    (full attention on every layer). An absent window is still named (the json reader has no default)."""
    ms = M.from_config({**cfg, "sliding_window": None}, reader="json")
    assert isinstance(ms, M.ModelSpec)
    assert set(ms.kinds.values()) == {"full"} and len(ms.spec.groups) == 1
    with pytest.raises(SpecError, match=r"sliding_window"):
        M.from_config(cfg, reader="json")
