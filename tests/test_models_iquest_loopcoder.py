"""IQuest-Coder Loop (``IQuestLoopCoderForCausalLM``, model_type ``iquest_loopcoder``) by vLLM 0.33's own
construction (issue 23): ``loop_num`` attentions per decoder layer, loop j of layer i named
``model.layers.{j * num_hidden_layers + i}.self_attn.attn``, the first full, the later ones sliding over
``loop_window_size``.

vLLM ships no config class for the type (the checkpoint's is remote code, not fetched offline): the driver's
plain stand-in (``tests/test_models_hybrid_vllm.py``'s ``_stand_ins``) holds the fields as written. Each small
config is built as one rank of tp 1, 2 and 8 with a bf16 and an fp8 cache, and its layers, pages, blocks,
windows, groups and bytes per block must equal kvlayout's Hopper and Blackwell plans.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import iquest_loopcoder

BASE: dict[str, Any] = {
    "architectures": ["IQuestLoopCoderForCausalLM"],
    "model_type": "iquest_loopcoder",
    "auto_map": {"AutoConfig": "configuration_iquest_loopcoder.IQuestLoopCoderConfig"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "head_dim": 32,  # not read: the head size is hidden_size // num_attention_heads (64)
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "loop_num": 2,
    "loop_window_size": 64,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "two_loops": BASE,
    # three loops: two sliding layers per decoder layer
    "three_loops": {**BASE, "loop_num": 3, "loop_window_size": 32},
    # one loop: plain full attention
    "one_loop": {**BASE, "loop_num": 1},
    # 8 KV heads, split over the ranks
    "kv8": {**BASE, "num_key_value_heads": 8, "num_hidden_layers": 2},
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")


def _cases() -> dict[str, dict[str, Any]]:
    return {
        f"{name}-tp{tp}-{kv}": {
            "config": cfg,
            "tp": tp,
            "kv_cache_dtype": kv,
            "stand_in": True,
            "gpu_backend": True,
        }
        for name, cfg in CONFIGS.items()
        for tp in TPS
        for kv in KVS
    }


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return vllm_answers(_cases())


def _differences(answers: dict[str, dict[str, Any]]) -> list[str]:
    from tests.test_models_hybrid_vllm import differences

    return [case_id for case_id, _ in differences(answers, _cases())]


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == []


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loops named j + i * loop_num (not j * num_hidden_layers + i) differ from vLLM's layers."""

    def wrong(cfg: Any, n: int) -> list[tuple[int, int | None]]:
        loops = cfg.data["loop_num"]
        return [(i * loops + j, w) for (idx, w) in right(cfg, n) for i, j in [(idx % n, idx // n)]]

    right = iquest_loopcoder.loop_layers
    monkeypatch.setattr(iquest_loopcoder, "loop_layers", wrong)
    assert {c.split("-")[0] for c in _differences(answers)} == {"two_loops", "three_loops", "kv8"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.self_attn.attn".format
    page = 2 * 64 * 2 * 16 * 2  # 2 KV heads of 64 (hidden 512 // 8 heads), K and V, 16 tokens, bf16
    t = answers["two_loops-tp1-auto"]
    assert set(t["layers"]) == {name(i) for i in range(6)}
    assert t["layers"][name(0)] == ["FullAttentionSpec", page, page]
    assert t["windows"] == {name(i): 64 for i in (3, 4, 5)}
    # 3 full and 3 sliding layers: two groups of 3, a block holding 3 pages
    assert t["groups"] == [[name(0), name(1), name(2)], [name(3), name(4), name(5)]]
    assert t["bytes_per_block"] == 3 * page
    r = answers["three_loops-tp1-auto"]
    assert r["windows"] == {name(i): 32 for i in range(3, 9)}
    assert answers["one_loop-tp1-auto"]["windows"] == {}
    assert answers["kv8-tp8-fp8"]["layers"][name(0)][1] == 1 * 64 * 2 * 16


def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader="json")
    assert e.value.field == field, str(e.value)


def test_refusals_name_the_field() -> None:
    for key in ("loop_num", "loop_window_size", "num_key_value_heads", "num_attention_heads", "hidden_size"):
        for reader in ("json", "transformers"):
            cfg = {k: v for k, v in BASE.items() if k != key}
            with pytest.raises(SpecError, match="remote code") as e:
                M.from_config(cfg, reader=reader)
            assert e.value.field == f"config.{key}"
    for key in ("loop_num", "loop_window_size"):
        for bad in (0, -1, "2", 2.0, True):
            _refused({**BASE, key: bad}, f"config.{key}", "must be")
    _refused({**BASE, "sliding_window": 4096}, "config.sliding_window", "first loop")
    cfg = {**BASE, "dual_chunk_attention_config": {"chunk_size": 64}}
    _refused(cfg, "config.dual_chunk_attention_config", "first loop")
    kv3 = {**BASE, "num_key_value_heads": 3}
    _refused(kv3, "config.num_key_value_heads", "not divisible by tp = 2", tp=2)
    _refused(kv3, "config.num_key_value_heads", "query heads per rank")
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    _refused({**BASE, "hidden_size": 4}, "config.hidden_size", "is 0")
    with pytest.raises(SpecError, match="attention loops") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
