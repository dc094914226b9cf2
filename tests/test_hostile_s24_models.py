"""Hostile pass 24's model findings (MF1-MF5, /tmp/h24), each checked against vLLM 0.33's own construction
(tests/test_models_hybrid_vllm.py's driver, one batched call) and failing on the code before the fix
(540c7b1): GPT-OSS whose layer_types are all sliding slides every layer (its odd layers take the engine's
window: 32,768 B a block at tp 1 where kvlayout planned 16,384); Qwen2-MoE with use_sliding_window and no
layer_types is full attention (its config class derives mixed types); Qwen3-MoE takes the engine's window
by layer_types' entries without reading them as kinds, and names an absent window with the flag on;
Cohere 2 with a null window on sliding layers is refused (vLLM's construction fails on ``None + 1``)."""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from tests.test_hostile_s22 import GPT_OSS, LLAMA, MOE_ON, QWEN2
from tests.test_models_hybrid_vllm import _kvlayout, vllm_answers

S, F = "sliding_attention", "full_attention"
QWEN2_MOE = {
    **QWEN2, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
    "use_sliding_window": True, "max_window_layers": 4,
}
COHERE2 = {
    **LLAMA, "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "sliding_window": None,
    "layer_types": [S, F, S, F],
}
#: case name -> (config, tp sizes): planned by both, equal
CASES: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "gpt_oss_types_all_sliding": ({**GPT_OSS, "layer_types": [S] * 4}, (1, 2)),
    "gpt_oss_types_alternate": (GPT_OSS, (1,)),
    "qwen2_moe_flag_no_types": (QWEN2_MOE, (1,)),
    "qwen2_moe_flag_types_sliding": ({**QWEN2_MOE, "layer_types": [S] * 4}, (1,)),
    "qwen3_moe_types_not_kinds": ({**MOE_ON, "layer_types": ["mamba"] * 4}, (1,)),
}


def test_each_rule_is_vllms_construction() -> None:
    """Each case plans as vLLM 0.33 builds it; Cohere 2's null window fails in vLLM and is refused here."""
    cases = {
        f"{name}-tp{tp}": {"config": cfg, "tp": tp, "kv_cache_dtype": "auto", "gpu_backend": True}
        for name, (cfg, tps) in CASES.items()
        for tp in tps
    }
    cohere = {"config": COHERE2, "tp": 1, "kv_cache_dtype": "auto", "gpu_backend": True}
    cases["cohere2_null_window-tp1"] = cohere
    answers = vllm_answers(cases)
    for cid, case in cases.items():
        if cid.startswith("cohere2"):
            continue
        got, want = _kvlayout(case), answers[cid]
        assert "error" not in want, (cid, want)
        for key in ("block_size", "layers", "blocks", "windows", "groups", "bytes_per_block"):
            assert got[key] == want[key], (cid, key, got[key], want[key])
    # what the old rules got wrong, in vLLM's own terms
    gpt = answers["gpt_oss_types_all_sliding-tp1"]
    assert len(gpt["windows"]) == 4 and gpt["bytes_per_block"] == 4 * 16 * 2 * 64 * 2 * 2
    # alternating: a sliding and a full group of two layers share two tensors (vLLM's hybrid grouping)
    assert answers["gpt_oss_types_alternate-tp1"]["bytes_per_block"] == 2 * 16 * 2 * 64 * 2 * 2
    assert answers["qwen2_moe_flag_no_types-tp1"]["windows"] == {}
    assert len(answers["qwen2_moe_flag_types_sliding-tp1"]["windows"]) == 4
    assert answers["qwen3_moe_types_not_kinds-tp1"]["windows"] == {}
    assert "error" in answers["cohere2_null_window-tp1"]
    with pytest.raises(SpecError) as e:
        M.from_config(COHERE2)
    assert e.value.field == "config.sliding_window" and e.value.value is None
    assert "its sliding layers take sliding_window + 1" in str(e.value)


def test_qwen3_moe_names_an_absent_window_read_as_written() -> None:
    """MF3: with use_sliding_window true and no sliding_window, the json reader planned full attention;
    vLLM reads Qwen3MoeConfig's 4,096 (what kvlayout's transformers reader takes)."""
    cfg = {k: v for k, v in MOE_ON.items() if k != "sliding_window"}
    with pytest.raises(SpecError) as e:
        M.from_config(cfg, reader="json")
    assert e.value.field == "config.sliding_window" and "use_sliding_window true" in str(e.value)
    off = {**cfg, "use_sliding_window": False}
    assert set(M.from_config(off, reader="json").kinds.values()) == {"full"}  # type: ignore[union-attr]
