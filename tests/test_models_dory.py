"""Dory (``DoryForCausalLM``, model_type ``dory``) by vLLM 0.33's own construction (issue 23): read through
vLLM's own ``DoryConfig``; each layer attention or an MLP, the recurrent layers' loops each a cache of their
own (``per_loop``), loop j of layer i named ``backbone.layers.{j * num_hidden_layers + i}.mixer.attn``.

Each small config is built by tests/test_models_hybrid_vllm.py's driver at tp 1 (vLLM's Dory takes no
other) with a bf16 and an fp8 cache, its layers moved to the GPU backend (the CPU's takes 32-token blocks),
and its layers, pages, blocks, windows, groups and bytes per block must equal kvlayout's Hopper and
Blackwell plans; at tp 2 vLLM's construction and kvlayout's plan both refuse.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import dory
from tests import shared_answers

S, F, P = "sliding_attention", "full_attention", "mlp"
BASE: dict[str, Any] = {
    "architectures": ["DoryForCausalLM"],
    "model_type": "dory",
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 4,
    "sliding_window": 64,
    "layer_types": [S, P, F, P],
    "n_output_layers": 2,  # layers 0 and 1 recurrent
    "n_recurrent_loops": 2,
}
_DEFAULTED = ("num_key_value_heads", "head_dim", "sliding_window", "layer_types", "n_output_layers",
              "n_recurrent_loops")
CONFIGS: dict[str, dict[str, Any]] = {
    "loops": BASE,
    # DoryConfig's defaults: sliding and MLP layers alternating, 4 KV heads of 256, a 1,024-token window
    "defaults": {k: v for k, v in BASE.items() if k not in _DEFAULTED},
    # one cache per attention, overwritten by each loop
    "last_loop": {**BASE, "recurrent_kv_cache_mode": "last_loop"},
    # an input layer, then three recurrent layers run three times
    "input_layer": {**BASE, "layer_types": [F, S, P, S], "n_input_layers": 1, "n_output_layers": 0,
                    "n_recurrent_loops": 3},
}
KVS = ("auto", "fp8")


def _cases() -> dict[str, dict[str, Any]]:
    cases = {
        f"{name}-tp1-{kv}": {"config": cfg, "tp": 1, "kv_cache_dtype": kv, "gpu_backend": True}
        for name, cfg in CONFIGS.items()
        for kv in KVS
    }
    cases["loops-tp2-auto"] = {**cases["loops-tp1-auto"], "tp": 2}
    return cases


def _built() -> dict[str, dict[str, Any]]:
    return {k: c for k, c in _cases().items() if c["tp"] == 1}


shared_answers.register("hybrid", __name__, _cases())  # one driver run with the other files' cases


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return shared_answers.answers("hybrid", __name__, _cases(), vllm_answers)


def _differences(answers: dict[str, dict[str, Any]]) -> set[str]:
    return shared_answers.differing({k: answers[k] for k in _built()}, _built())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == set()


def test_tp2_fails_both(answers: dict[str, dict[str, Any]]) -> None:
    assert "tensor_parallel_size=1 only" in answers["loops-tp2-auto"]["error"]
    with pytest.raises(SpecError, match="tensor_parallel_size 1 only") as e:
        M.from_config(BASE, tp=2)
    assert e.value.field == "tp"


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loops numbered i * loops + j (not j * num_hidden_layers + i) differ wherever loops are written."""
    right = dory.attention_layers

    def by_layer(cfg: Any, n: int, types: list[str]) -> list[tuple[int, str]]:
        loops = cfg.data.get("n_recurrent_loops", 1)
        return [((idx % n) * loops + idx // n, t) for idx, t in right(cfg, n, types)]

    monkeypatch.setattr(dory, "attention_layers", by_layer)
    assert _differences(answers) == {"loops", "input_layer", "last_loop"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "backbone.layers.{}.mixer.attn".format
    page = 2 * 32 * 2 * 16 * 2  # 2 KV heads of 32, K and V, 16 tokens, bf16
    lo = answers["loops-tp1-auto"]
    # layer 0 recurrent (2 loops: 0 and 4), layer 2 an output layer, layers 1 and 3 MLPs
    assert list(lo["layers"]) == [name(0), name(4), name(2)]
    assert lo["layers"][name(2)] == ["FullAttentionSpec", page, page]
    assert lo["windows"] == {name(0): 64, name(4): 64} and lo["bytes_per_block"] == page
    d = answers["defaults-tp1-auto"]
    assert d["windows"] == {name(0): 1024, name(2): 1024}
    assert d["layers"][name(0)][1] == 4 * 256 * 2 * 16 * 2  # DoryConfig's 4 KV heads of 256
    assert list(answers["last_loop-tp1-auto"]["layers"]) == [name(0), name(2)]
    assert list(answers["input_layer-tp1-fp8"]["layers"]) == [name(i) for i in (0, 1, 5, 9, 3, 7, 11)]


def _refused(cfg: dict[str, Any], field: str, match: str) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json")
    assert e.value.field == field, str(e.value)


def test_reads_and_refusals() -> None:
    ms = M.from_config(CONFIGS["defaults"], reader="transformers")
    assert isinstance(ms, M.ModelSpec) and ms.family == "dory"
    assert any("DoryConfig's default, 1024" in n for n in ms.notes)
    _refused({**BASE, "layer_types": [S, P, F]}, "config.layer_types", "exactly one entry per layer")
    _refused({**BASE, "layer_types": [S, P, "chunked_attention", P]}, "config.layer_types[2]", "one of")
    _refused({**BASE, "n_output_layers": 5}, "config.n_recurrent_layers", "must be num_hidden_layers")
    _refused({**BASE, "n_recurrent_layers": 1}, "config.n_recurrent_layers", "must be num_hidden_layers")
    _refused({**BASE, "n_recurrent_loops": 0}, "config.n_recurrent_loops", "at least 1")
    _refused({**BASE, "n_recurrent_loops": 5000}, "config.n_recurrent_loops", "over 10,000")
    _refused({**BASE, "recurrent_kv_cache_mode": "shared"}, "config.recurrent_kv_cache_mode", "per_loop")
    _refused({**BASE, "num_key_value_heads": 3}, "config.num_key_value_heads", "does not divide")
    _refused({**BASE, "sliding_window": None}, "config.sliding_window", "missing")
    _refused({**BASE, "sliding_window": 0}, "config.sliding_window", "missing")  # ModelConfig: 0 is null
    for key, bad in (("attention_bias", True), ("mlp_bias", True), ("tie_word_embeddings", True),
                     ("hidden_act", "gelu"), ("initializer_range", 0)):
        _refused({**BASE, key: bad}, f"config.{key}", "Dory|DoryConfig")
    # n_recurrent_layers null: DoryConfig's (the layers between the input and output ones)
    same = M.from_config({**BASE, "n_recurrent_layers": None}, reader="json")
    assert isinstance(same, M.ModelSpec) and same.spec == M.from_config(BASE, reader="json").spec
    # a window written null is no refusal where no layer slides
    ms = M.from_config({**BASE, "layer_types": [F, P, F, P], "sliding_window": None}, reader="json")
    assert isinstance(ms, M.ModelSpec) and ms.bytes_per_block > 0
    with pytest.raises(SpecError, match="recurrent loops") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
