"""DeepSeek-V3.2's IndexCache schedule, planned as vLLM 0.33 builds it (issue 23; hostile pass 13, F1).

With ``index_topk_freq`` > 1 or an ``index_topk_pattern``, vLLM 0.33 builds the indexer, and so its cache,
only on the layers the schedule runs an indexer on (``DeepseekV2MLAAttention``); the other layers reuse an
earlier layer's top-k. Every layer keeps its latent cache, and all of them stay one group (one block size,
one kind of spec: ``UniformTypeKVCacheSpecs``). Ground truth: vLLM's own construction of small configs in
the published shape on the CPU (tests/test_models_hybrid_vllm.py's driver, with the sparse backend stood in
for: tests/driver.py ``cpu_sparse_mla``), its grouping and bytes per block, at bf16 and fp8 (``fp8_ds_mla``).
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from tests.test_models_hybrid_vllm import _BASE, each_agrees, vllm_answers

#: deepseek-ai/DeepSeek-V3.2's shape (its latent, RoPE and indexer heads), 6 layers, small elsewhere
V32: dict[str, Any] = {
    **_BASE,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "num_hidden_layers": 6,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "index_topk": 16,
    "index_head_dim": 128,
    "index_n_heads": 4,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 6,
    "rope_theta": 10000.0,
}
#: name -> the schedule's fields
SCHEDULES: dict[str, dict[str, Any]] = {
    "none": {},
    "freq2": {"index_topk_freq": 2},  # the default offset 2: layers 0, 1, 3, 5
    "freq4_offset0": {"index_topk_freq": 4, "index_skip_topk_offset": 0},  # 3 (0 has max(1, 0) = 1)
    "freq3_offset5": {"index_topk_freq": 3, "index_skip_topk_offset": 5},  # 0-4 and nothing after
    "pattern": {"index_topk_pattern": "FSSFSF"},
    "pattern_list_short": {"index_topk_pattern": ["F", "S", "S"], "index_topk_freq": 2},  # freq unread
}
#: the layers each schedule keeps an indexer on, worked out by hand from vLLM's rule
EXPECTED = {
    "none": [0, 1, 2, 3, 4, 5],
    "freq2": [0, 1, 3, 5],
    "freq4_offset0": [3],
    "freq3_offset5": [0, 1, 2, 3, 4],
    "pattern": [0, 3, 5],
    "pattern_list_short": [0, 3, 4, 5],
}


def _cases() -> dict[str, dict[str, Any]]:
    return {
        f"{name}-{kv}": {
            "config": {**V32, **extra}, "tp": 1, "kv_cache_dtype": kv, "block_size": 64,
            "attention_backend": "FLASHMLA_SPARSE",  # the backend the driver can build on a CPU
        }
        for name, extra in SCHEDULES.items()
        for kv in ("auto", "fp8")
    }


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    return vllm_answers(_cases())


def _indexed(layers: dict[str, Any]) -> list[int]:
    return sorted(int(name.split(".")[2]) for name in layers if name.endswith("indexer.k_cache"))


def test_schedules_equal_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    for case_id, _, got in each_agrees(answers, _cases()):
        assert _indexed(got["layers"]) == EXPECTED[case_id.rsplit("-", 1)[0]], case_id


def test_schedule_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers: a latent of
    (512 + 64) bf16 = 1,152 B a token (fp8_ds_mla: 656 B) on all 6 layers, and an indexer key of 128 + 4 B
    on the scheduled ones, in 64-token blocks, one group."""
    for name, layers in EXPECTED.items():
        for kv, latent in (("auto", 1_152), ("fp8", 656)):
            got = answers[f"{name}-{kv}"]
            assert len(got["groups"]) == 1 and len(got["groups"][0]) == 6 + len(layers)
            assert got["bytes_per_block"] == 64 * (6 * latent + len(layers) * 132), (name, kv)


def test_vllm_resolves_a_layer_outermost_layout(answers: dict[str, dict[str, Any]]) -> None:
    """No backend of these layers declares a layout, so vLLM resolves LBNHC and pads each layer's stride
    alone (FlashMLA sparse's whole 1,152 B token rows with a bf16 cache, which a 64-token page is): the
    bytes per block are the sum of the pages, as kvlayout plans them; a block-outermost layout would round
    the row of a scheduled model up (tests/test_models.py checks every layout)."""
    for case_id, got in answers.items():
        assert got["layout"] == "LBNHC", case_id


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True])
def test_a_bad_frequency_is_named(bad: object) -> None:
    with pytest.raises(SpecError, match=r"config\.index_topk_freq = "):
        M.from_config({**V32, "index_topk_freq": bad})


@pytest.mark.parametrize("bad", [1.5, "2", True])
def test_a_bad_offset_is_named(bad: object) -> None:
    with pytest.raises(SpecError, match=r"config\.index_skip_topk_offset = "):
        M.from_config({**V32, "index_topk_freq": 2, "index_skip_topk_offset": bad})


@pytest.mark.parametrize("bad", [7, {"0": "S"}])
def test_a_pattern_of_another_type_is_named(bad: object) -> None:
    with pytest.raises(SpecError, match=r"config\.index_topk_pattern = .*: must be a string of F and S"):
        M.from_config({**V32, "index_topk_pattern": bad})
