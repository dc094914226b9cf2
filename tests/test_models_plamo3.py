"""PLaMo 3 (``Plamo3ForCausalLM``, model_type ``plamo3``) by vLLM 0.33's own construction (issue 23): layer
i's window is ``interleaved_sliding_window[i]`` (null: full attention where ``layer_types`` mixes kinds).

The config class is the checkpoints' remote code (not fetched offline): the driver's plain stand-in holds
the fields as written (``tests/test_models_hybrid_vllm.py``'s ``_stand_ins``, which asserts that neither
transformers nor vLLM has a class for the type), and kvlayout reads them as written too, so both lists the
remote class derives are written here. Each small config is built as one rank of tp 1, 2 and 8 with a bf16
and an fp8 cache (layers on the backend a Hopper GPU picks), and its layers, pages, blocks, windows, groups
and bytes per block must equal kvlayout's Hopper and Blackwell plans.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError

SLIDING, FULL = "sliding_attention", "full_attention"
BASE: dict[str, Any] = {
    "architectures": ["Plamo3ForCausalLM"],
    "model_type": "plamo3",
    "auto_map": {"AutoConfig": "configuration_plamo3.Plamo3Config"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "rms_norm_eps": 1e-6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rope_local_theta": 10000.0,
    "num_hidden_layers": 8,
    # the published shape: sliding layers with every fourth full (window 64 here)
    "layer_types": [SLIDING, SLIDING, SLIDING, FULL] * 2,
    "interleaved_sliding_window": [64, 64, 64, None] * 2,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "pattern": BASE,
    # two window sizes: a group of their own each
    "two_windows": {**BASE, "interleaved_sliding_window": [64, 32, 64, None, 64, 32, 64, None]},
    # every layer full (each entry null, layer_types mixed: no engine window)
    "all_full": {**BASE, "interleaved_sliding_window": [None] * 8},
    # every layer sliding with one window, written in every entry: one group
    "all_sliding": {**BASE, "layer_types": [SLIDING] * 8, "interleaved_sliding_window": [64] * 8},
    # 8 KV heads, split over the ranks (2 KV heads replicate at tp 8)
    "kv8": {**BASE, "num_key_value_heads": 8, "head_dim": 64},
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


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    from tests.test_models_hybrid_vllm import differences

    assert set(answers) == set(_cases())
    assert differences(answers, _cases()) == []


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    page = 2 * 128 * 2 * 16 * 2  # 2 KV heads of 128, K and V, 16 tokens, bf16
    name = "model.layers.layers.{}.mixer.attn".format
    p = answers["pattern-tp1-auto"]
    assert p["layers"][name(3)] == ["FullAttentionSpec", page, page]
    assert p["windows"] == {name(i): 64 for i in (0, 1, 2, 4, 5, 6)}
    # 6 sliding layers and 2 full: groups of 2 (the fewer), the sliding ones every third layer
    assert p["groups"] == [[name(0), name(4)], [name(1), name(5)], [name(2), name(6)], [name(3), name(7)]]
    assert p["bytes_per_block"] == 2 * page
    t = answers["two_windows-tp1-auto"]  # windows 64 (4 layers), 32 (2), full (2): groups of 2
    assert t["groups"] == [[name(0), name(4)], [name(2), name(6)], [name(1), name(5)], [name(3), name(7)]]
    assert answers["all_full-tp2-fp8"]["windows"] == {} and len(answers["all_full-tp2-fp8"]["groups"]) == 1
    assert answers["all_full-tp2-fp8"]["bytes_per_block"] == 8 * 1 * 128 * 2 * 16
    s = answers["all_sliding-tp1-auto"]
    assert len(s["groups"]) == 1 and s["bytes_per_block"] == 8 * page
    # 8 KV heads of 64 at tp 8: one a rank
    assert answers["kv8-tp8-auto"]["layers"][name(0)][1] == 1 * 64 * 2 * 16 * 2


def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader="json")
    assert e.value.field == field, str(e.value)


def test_refusals_name_the_field() -> None:
    for key in ("interleaved_sliding_window", "layer_types"):
        cfg = {k: v for k, v in BASE.items() if k != key}
        _refused(cfg, f"config.{key}", "remote-code Plamo3Config derives it")
        _refused({**BASE, key: "x"}, f"config.{key}", "must be a list")
        _refused({**BASE, key: BASE[key][:7]}, f"config.{key}", r"one entry per layer \(8\)")
    for bad in (0, -1, "64", 64.0, True):
        cfg = {**BASE, "interleaved_sliding_window": [64, bad, 64, None] * 2}
        _refused(cfg, "config.interleaved_sliding_window[1]", "at least 1 token")
    _refused({**BASE, "layer_types": [SLIDING, 3] * 4}, "config.layer_types[1]", "must be a string")
    # a null entry where every layer type slides would take the remote class's sliding_window
    cfg = {**BASE, "layer_types": [SLIDING] * 8}
    _refused(cfg, "config.interleaved_sliding_window[3]", "engine's")
    for key in ("head_dim", "num_key_value_heads", "num_attention_heads"):
        cfg = {k: v for k, v in BASE.items() if k != key}
        with pytest.raises(SpecError) as e:
            M.from_config(cfg, reader="json")
        assert e.value.field == f"config.{key}"
    _refused(
        {**BASE, "num_key_value_heads": 3}, "config.num_key_value_heads", "not divisible by tp = 2", tp=2
    )
    _refused({**BASE, "num_key_value_heads": 3}, "config.num_key_value_heads", "query heads per rank")
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    with pytest.raises(SpecError, match="per-layer windows") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"


def test_longer_lists_are_read_by_layer() -> None:
    """vLLM indexes both lists by layer: entries past the last layer are not read."""
    ms = M.from_config({**BASE, "interleaved_sliding_window": [*BASE["interleaved_sliding_window"], 0]})
    assert ms.bytes_per_block == 2 * 2 * 128 * 2 * 16 * 2
