"""openPangu Embedded and Pro-MoE-V2 (``PanguEmbeddedForCausalLM``, ``PanguProMoEV2ForCausalLM``) by vLLM
0.33's own construction (issue 23): standard attention (no MLA or sink fields written), layer i's window from
``interleaved_sliding_window`` (an integer, or a list at ``i % len``; a null entry the engine's window).

vLLM ships no config class for them (the checkpoints' are remote code): the driver's plain stand-in holds
the fields as written. Each small config is built by tests/test_models_hybrid_vllm.py's driver as one rank
of tp 1, 2 and 8 with a bf16 and an fp8 cache, its layers moved to the GPU backend (the CPU's takes 32-token
blocks), and its layers, pages, blocks, windows, groups and bytes per block must equal kvlayout's Hopper and
Blackwell plans.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import openpangu
from tests import shared_answers

EMBEDDED: dict[str, Any] = {
    "architectures": ["PanguEmbeddedForCausalLM"],
    "model_type": "pangu_embedded",
    "auto_map": {"AutoConfig": "configuration_openpangu_dense.PanguEmbeddedConfig"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
PROMOE: dict[str, Any] = {
    **EMBEDDED,
    "architectures": ["PanguProMoEV2ForCausalLM"],
    "model_type": "pangu_pro_moe_v2",
    "n_routed_experts": 8,
    "first_k_dense_replace": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "interleaved_sliding_window": [None, 64],
}
CONFIGS: dict[str, dict[str, Any]] = {
    # the published openPangu-Embedded-7B's shape: no window, head size hidden_size // heads
    "embedded": EMBEDDED,
    # windows by layer i % 3: 64, the engine's (none), 32, 64
    "interleaved_list": {**EMBEDDED, "interleaved_sliding_window": [64, None, 32]},
    # one window for every layer; head_dim written; 8 KV heads split over the ranks
    "interleaved_int": {
        **EMBEDDED, "interleaved_sliding_window": 128, "head_dim": 64, "num_key_value_heads": 8,
    },
    # no interleaved_sliding_window: the engine's one window on every layer
    "engine_window": {**EMBEDDED, "sliding_window": 128},
    # Pro-MoE-V2: layer 0 dense, the others MoE; full and sliding layers alternating
    "promoe": PROMOE,
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"interleaved_list": (1, 8), "engine_window": (1,)}


def _cases() -> dict[str, dict[str, Any]]:
    return shared_answers.grid(CONFIGS, TPS, KVS, _TPS, stand_in=True, gpu_backend=True)


shared_answers.register("hybrid", __name__, _cases())  # one driver run with the other files' cases


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return shared_answers.answers("hybrid", __name__, _cases(), vllm_answers)


def _differences(answers: dict[str, dict[str, Any]]) -> set[str]:
    return shared_answers.differing(answers, _cases())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == set()


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list taken at layer i (none past its end), not at i % its length, differs where it is shorter
    than the layers."""
    right = openpangu.windows

    def by_index(cfg: Any, n: int) -> list[int | None]:
        raw = cfg.data.get("interleaved_sliding_window")
        if not isinstance(raw, list):
            return right(cfg, n)
        return [raw[i] if i < len(raw) else None for i in range(n)]

    monkeypatch.setattr(openpangu, "windows", by_index)
    assert _differences(answers) == {"interleaved_list", "promoe"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.self_attn.attn".format
    page = 2 * 32 * 2 * 16 * 2  # 2 KV heads of 32 (hidden 256 // 8 heads), K and V, 16 tokens, bf16
    e = answers["embedded-tp1-auto"]
    assert e["layers"][name(0)] == ["FullAttentionSpec", page, page] and e["windows"] == {}
    assert e["groups"] == [[name(i) for i in range(4)]] and e["bytes_per_block"] == 4 * page
    assert answers["interleaved_list-tp1-auto"]["windows"] == {name(0): 64, name(2): 32, name(3): 64}
    i = answers["interleaved_int-tp8-fp8"]
    assert i["windows"] == {name(j): 128 for j in range(4)} and i["layers"][name(0)][1] == 64 * 2 * 16
    assert answers["engine_window-tp1-auto"]["windows"] == {name(j): 128 for j in range(4)}
    assert answers["promoe-tp1-auto"]["windows"] == {name(1): 64, name(3): 64}


def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader="json")
    assert e.value.field == field, str(e.value)


def test_refusals_name_the_field() -> None:
    mla = dict.fromkeys(openpangu.MLA_FIELDS, 64)
    _refused({**EMBEDDED, **mla}, "config.kv_lora_rank", "MLA attention")
    _refused({**EMBEDDED, "param_sink_number": 4}, "config.param_sink_number", "sink attention")
    _refused({**EMBEDDED, "param_sink_number": None}, "config.param_sink_number", "must be an integer")
    ms = M.from_config({**EMBEDDED, "param_sink_number": 0, **dict.fromkeys(openpangu.MLA_FIELDS[:3], 64)})
    assert isinstance(ms, M.ModelSpec) and ms.family == "openpangu"  # no sinks, not all MLA fields: standard
    _refused({**EMBEDDED, "is_causal": False}, "config.is_causal", "encoder-only")
    _refused({k: v for k, v in EMBEDDED.items() if k != "num_key_value_heads"}, "config.num_key_value_heads",
             "remote code")
    _refused({**PROMOE, "n_routed_experts": None}, "config.n_routed_experts", "needs a MoE layer")
    _refused({**PROMOE, "first_k_dense_replace": 4}, "config.n_routed_experts", "needs a MoE layer")
    no_dense = {k: v for k, v in PROMOE.items() if k != "first_k_dense_replace"}
    _refused(no_dense, "config.first_k_dense_replace", "missing")
    for bad in (None, [], "64"):  # pass 28: true is a window of 1, as vLLM builds it
        _refused({**EMBEDDED, "interleaved_sliding_window": bad}, "config.interleaved_sliding_window",
                 "integer or a non-empty list")
    _refused({**EMBEDDED, "interleaved_sliding_window": [64, 0]}, "config.interleaved_sliding_window[1]",
             "at least 1")
    _refused({**EMBEDDED, "interleaved_sliding_window": -1}, "config.interleaved_sliding_window", "least 1")
    # false: vLLM builds a window of 0 tokens (tests/test_hostile_s28_models.py); refused
    _refused({**EMBEDDED, "interleaved_sliding_window": False}, "config.interleaved_sliding_window",
             "least 1")
    # an entry no layer reads (index >= the layers) is not checked, as vLLM never reads it (pass 27)
    one = {**EMBEDDED, "num_hidden_layers": 1}
    ms = M.from_config({**one, "interleaved_sliding_window": [64, 0, "x"]}, reader="json")
    assert [x.window for _, x in ms.spec.layers] == [64]
    lots = {**EMBEDDED, "interleaved_sliding_window": [64, None, 32, 16] + [0] * 2_000_000}
    layers = M.from_config(lots, reader="json").spec.layers
    assert [getattr(x, "window", None) for _, x in layers] == [64, None, 32, 16]
    _refused({**EMBEDDED, "num_key_value_heads": 3}, "config.num_key_value_heads", "not divisible by tp = 2",
             tp=2)
    _refused(EMBEDDED, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    with pytest.raises(SpecError, match="per-layer windows") as e:
        M.spec_from_config(EMBEDDED, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
