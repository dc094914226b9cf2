"""The architectures vLLM 0.33 serves through its Transformers modeling backend, and Kimi-K2.5, by vLLM's
own model construction (issue 23), at tp 1, 2 and 8 with a bf16 and an fp8 cache.

tests/test_models_generic.py decides which Transformers-backend architectures follow the generic rules
(their layers at tp 1, ModelConfig's KV heads at tp 2 and 8) and records them in
kvlayout/models/vllm_checked.py. Here each covered one is built again by tests/test_models_hybrid_vllm.py's
driver, as rank 0 of tp N with that cache dtype (the backend's ``Base`` reads the tp size from the
ParallelConfig, which the driver sets), and its layers go through vLLM's grouping: layer names, kinds,
pages, windows, groups and bytes per block must be kvlayout's, by both readers. The config of each is
the generic harness's ``layer_types`` variant (a sliding layer and a full one; GPT-BigCode's as
published, ``multi_query``). Standard attention takes 16-token blocks on Hopper and on Blackwell
(kvlayout.models.backends, checked against vLLM's backends in tests/test_models_backends.py), so the
one answer is compared with both devices' plans.

Kimi-K2.5 (``KimiK25ForConditionalGeneration``): vLLM builds its vision tower and, under
``language_model``, a DeepseekV2ForCausalLM from its ``text_config`` (a DeepSeek-V3 MLA config,
``model_type`` ``kimi_k2``). Its small config has the published one's structure; the block size of each
case is the MLA backend's that kvlayout resolves for the device and cache dtype (Hopper: 16 with bf16,
64 with fp8; Blackwell: 32), handed to vLLM's CacheConfig, as vLLM's GPU platform would set it.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from tests.test_models_hybrid_vllm import KV, TPS, _kvlayout, vllm_answers

#: Kimi-K2.5's config.json (moonshotai/Kimi-K2.5) in its structure, small: the text model a DeepSeek-V3
#: MLA config of 2 layers (its latent 64 + rope 16), the vision tower one block
KIMI_K25: dict[str, Any] = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 64,  # FlashInfer-MLA's sizes (64, 128, 192): vLLM picks it on Blackwell
        "v_head_dim": 64,
        "q_lora_rank": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 128,
        "intermediate_size": 512,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "dtype": "bfloat16",
    },
    "vision_config": {
        "model_type": "kimi_k25_vision",
        "num_hidden_layers": 1,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
    },
    "projection_hidden_size": 64,
}
DEVICES = ("hopper", "blackwell")


def _backend_configs() -> dict[str, dict[str, Any]]:
    """Architecture -> its config: the generic harness's (GPT-BigCode: as published, multi_query)."""
    from kvlayout.models.families import transformers_backend_coverage
    from tests.test_models_generic import TP_KEY, _configs, candidates

    model_types = candidates()
    out = {}
    for arch in transformers_backend_coverage()[0]:
        variants = _configs(arch, model_types[arch])
        config = variants.get("multi_query", variants["layer_types"])
        out[arch] = {k: v for k, v in config.items() if k != TP_KEY}
    return out


def _kimi_block(tp: int, kv: str, device: str) -> int:
    ms = M.from_config(KIMI_K25, tp=tp, kv_cache_dtype=None if kv == "auto" else kv, device=device)
    assert isinstance(ms, M.ModelSpec)
    return ms.block_size


def _cases() -> dict[str, dict[str, Any]]:
    cases = {
        f"{arch}-tp{tp}-{kv}": {"config": config, "tp": tp, "kv_cache_dtype": kv}
        for arch, config in _backend_configs().items()
        for tp in TPS
        for kv in KV
    }
    for tp in TPS:
        for kv in KV:
            for device in DEVICES:
                block = _kimi_block(tp, kv, device)
                cases[f"kimi_k25-tp{tp}-{kv}-{device}"] = {
                    "config": KIMI_K25, "tp": tp, "kv_cache_dtype": kv, "block_size": block, "device": device,
                }
    return cases


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    return vllm_answers(_cases())


def test_backend_and_kimi_equal_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    cases = _cases()
    assert set(answers) == set(cases)
    for case_id, case in cases.items():
        got = answers[case_id]
        assert "error" not in got, (case_id, got.get("error"))
        for device in (case["device"],) if "device" in case else DEVICES:
            mine = _kvlayout({**case, "device": device})
            assert mine == {k: got[k] for k in mine}, (case_id, device)
        kv = None if case["kv_cache_dtype"] == "auto" else case["kv_cache_dtype"]
        read = M.from_config(case["config"], tp=case["tp"], kv_cache_dtype=kv, reader="transformers")
        assert isinstance(read, M.ModelSpec) and read.spec == M.from_config(
            case["config"], tp=case["tp"], kv_cache_dtype=kv
        ).spec, case_id


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    # OLMo 3: 2 KV heads of 64 (head_dim written), K and V, 16 tokens, 2 B: 8,192 B pages; layer 0 slides
    olmo = answers["Olmo3ForCausalLM-tp1-auto"]
    assert olmo["layers"]["model.layers.0.self_attn.attn"] == ["SlidingWindowSpec", 8_192, 8_192]
    assert olmo["windows"] == {"model.layers.0.self_attn.attn": 128}
    # two groups of one layer each (sliding, full), which share one page a block; tp 8: the 2 KV heads
    # replicated, one a rank; fp8 halves it
    assert olmo["groups"] == [[f"model.layers.{i}.self_attn.attn"] for i in range(2)]
    assert answers["Olmo3ForCausalLM-tp8-fp8"]["bytes_per_block"] == 2 * 1 * 64 * 16 * 1
    # GPT-BigCode with multi_query: one KV head of 256 / 8 = 32 on every rank, named model.h.{i}.attn.attn
    big = answers["GPTBigCodeForCausalLM-tp2-auto"]
    assert big["layers"]["model.h.0.attn.attn"] == ["FullAttentionSpec", 2_048, 2_048]  # 2 x 32 x 16 x 2 B
    # Kimi-K2.5: one latent head of 64 + 16 per layer on every rank, 2 layers under language_model
    k = answers["kimi_k25-tp8-auto-hopper"]
    assert list(k["layers"]) == [f"language_model.model.layers.{i}.self_attn.attn" for i in range(2)]
    assert k["bytes_per_block"] == 2 * 80 * 16 * 2  # FLASH_ATTN_MLA's 16 tokens, bf16
    assert answers["kimi_k25-tp1-fp8-hopper"]["bytes_per_block"] == 2 * 80 * 64 * 1  # FlashMLA's 64, fp8
    assert answers["kimi_k25-tp2-auto-blackwell"]["bytes_per_block"] == 2 * 80 * 32 * 2  # FLASHINFER_MLA


def test_published_kimi_k25_shape() -> None:
    """moonshotai/Kimi-K2.5's text model (61 layers, kv_lora_rank 512, qk_rope_head_dim 64): one latent
    head of 576 per layer; on Hopper with a bf16 cache 61 x 576 x 16 tokens x 2 B per block."""
    text = {**KIMI_K25["text_config"], "num_hidden_layers": 61, "hidden_size": 7168,
            "num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 1536, "n_routed_experts": 384,
            "num_experts_per_tok": 8}
    config = {**KIMI_K25, "text_config": text}
    for reader in ("json", "transformers"):
        ms = M.from_config(config, reader=reader)
        assert isinstance(ms, M.ModelSpec) and ms.family == "deepseek_v3" and ms.block_size == 16
        assert len(ms.spec.layers) == 61 and ms.bytes_per_block == 61 * 576 * 16 * 2 == 1_124_352
    fp8 = M.from_config(config, tp=8, kv_cache_dtype="fp8")  # FlashMLA's 64-token blocks
    assert isinstance(fp8, M.ModelSpec) and fp8.bytes_per_block == 61 * 576 * 64 * 1
    bw = M.from_config(config, device="blackwell")  # FlashInfer-MLA's 32-token blocks
    assert isinstance(bw, M.ModelSpec) and bw.bytes_per_block == 61 * 576 * 32 * 2


def test_tpu_inference_refuses_them() -> None:
    """tpu-inference's arrays for these are not checked against its code: refused, naming why."""
    from kvlayout.errors import SpecError

    olmo = _backend_configs()["Olmo3ForCausalLM"]
    with pytest.raises(SpecError, match="which vLLM serves through its Transformers modeling backend"):
        M.from_config(olmo, engine="tpu-inference")
    with pytest.raises(SpecError, match="multimodal KimiK25ForConditionalGeneration"):
        M.from_config(KIMI_K25, engine="tpu-inference")
