"""Vision-language models by vLLM 0.33's own model construction (issue 23): Qwen2-VL and Qwen2.5-VL (text
fields at the config's top, as published), Qwen3-VL and Qwen3-VL-MoE (a ``text_config``), LLaVA, LLaVA-NeXT,
LLaVA-OneVision and Mistral 3 (Mistral Small 3.1).

vLLM builds each one's language model under ``language_model``: the Qwen ones as a fixed text
architecture (Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM), the others as the text config's
own (its ``architectures``, else transformers' causal-LM class of its ``model_type``: Llama, Mistral,
Qwen2 here). Its cache is that architecture's, read from the text config, with layer names under
``language_model.``. The configs are small, in the shape of
the published ones (their M-RoPE sections fitted to the small head size; a vision tower of one block).
tests/test_models_hybrid_vllm.py's driver builds them (one subprocess: ModelConfig, the model class from
vLLM's registry constructed as rank 0 of tp N, every layer's ``get_kv_cache_spec``, vLLM's grouping and
bytes per block) at tp 1, 2 and 8 with a bf16 and an fp8 cache; kvlayout's plan, by both config
readers, must give the same layers, kinds, pages, block sizes, windows, groups and bytes per block.
vLLM's multimodal modules import torchvision (.vl-deps, requirements-vl.txt; the driver's
``_torchvision_without_ops`` says what is stubbed and why).
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from tests.test_models_hybrid_vllm import KV, TPS, each_agrees, vllm_answers
from tests.test_models_vl import CONFIGS, _config


def _cases() -> dict[str, dict[str, Any]]:
    return {
        f"{name}-tp{tp}-{kv}": {"config": _config(name), "tp": tp, "kv_cache_dtype": kv}
        for name in CONFIGS
        for tp in TPS
        for kv in KV
    }


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    return vllm_answers(_cases())


def test_qwen_vl_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    for case_id, case, _ in each_agrees(answers, _cases()):
        kv = None if case["kv_cache_dtype"] == "auto" else case["kv_cache_dtype"]
        read = M.from_config(case["config"], tp=case["tp"], kv_cache_dtype=kv, reader="transformers")
        assert isinstance(read, M.ModelSpec) and read.spec == M.from_config(
            case["config"], tp=case["tp"], kv_cache_dtype=kv
        ).spec, case_id


def test_qwen_vl_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """Pinned by hand: 2 layers x K and V x KV heads per rank x head size x 16 tokens x 2 B (bf16)."""
    expect = {
        # 2 KV heads of 32 (hidden 256 / 8 heads: Qwen2 ignores head_dim), replicated at tp 8
        "qwen2_vl-tp1-auto": 2 * 2 * 2 * 32 * 16 * 2,
        "qwen2_5_vl-tp2-auto": 2 * 2 * 1 * 32 * 16 * 2,
        "qwen2_5_vl-tp8-fp8": 2 * 2 * 1 * 32 * 16 * 1,
        "qwen2_5_vl_swa-tp1-auto": 2 * 2 * 4 * 32 * 16 * 2,
        "qwen3_vl-tp1-auto": 2 * 2 * 2 * 64 * 16 * 2,  # head_dim 64 from the text config
        "qwen3_vl_moe-tp2-auto": 2 * 2 * 2 * 64 * 16 * 2,
        "qwen3_vl_moe-tp8-auto": 2 * 2 * 1 * 64 * 16 * 2,
        "llava-tp1-auto": 2 * 2 * 2 * 32 * 16 * 2,  # float16
        "llava_next-tp2-fp8": 2 * 2 * 2 * 32 * 16 * 1,
        "mistral3-tp8-auto": 2 * 2 * 1 * 64 * 16 * 2,  # head_dim 64 (Mistral takes it)
    }
    assert {k: answers[k]["bytes_per_block"] for k in expect} == expect
    assert answers["qwen2_5_vl_swa-tp1-auto"]["windows"] == {}  # every layer full
    assert set(answers["mistral3_window-tp2-auto"]["windows"].values()) == {64}  # Mistral: every layer
    assert list(answers["qwen3_vl-tp1-auto"]["layers"]) == [
        f"language_model.model.layers.{i}.self_attn.attn" for i in range(2)
    ]
