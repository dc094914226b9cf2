"""Beam (``BeamForCausalLM``, model_type ``beam``) by vLLM 0.33's own construction (issue 23): read through
vLLM's own ``BeamConfig`` (every layer sliding over 4,096 tokens where ``layer_types`` and
``sliding_window`` are left out, 4 KV heads, head size ``hidden_size // heads`` without ``head_dim``),
layer i sliding where ``layer_types[i]`` is ``sliding_attention``, every layer full where the window is
written null (``BeamModel`` clears the engine's window).

Each small config is built by tests/test_models_hybrid_vllm.py's driver as one rank of tp 1, 2 and 8 with a
bf16 and an fp8 cache, its layers moved to the GPU backend (the CPU's takes 32-token blocks), and its layers,
pages, blocks, windows, groups and bytes per block must equal kvlayout's Hopper and Blackwell plans.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import beam
from tests import shared_answers

S, F = "sliding_attention", "full_attention"
BASE: dict[str, Any] = {
    "architectures": ["BeamForCausalLM"],
    "model_type": "beam",
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "layer_types": [S, F, S],
    "sliding_window": 128,
    "mlp_layer_types": ["dense"] * 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
}
_DEFAULTED = ("layer_types", "sliding_window", "num_key_value_heads", "mlp_layer_types")
CONFIGS: dict[str, dict[str, Any]] = {
    "mixed": BASE,
    # BeamConfig's defaults: every layer sliding over 4,096 tokens, 4 KV heads, sparse MLPs
    "defaults": {k: v for k, v in BASE.items() if k not in _DEFAULTED},
    # head_dim written (not hidden_size // heads), 8 KV heads split over the ranks
    "head_dim": {**BASE, "head_dim": 64, "num_key_value_heads": 8, "layer_types": [F, S, S]},
    # a window written null: the sliding layers take the engine's window, which BeamModel cleared
    "null_window": {**BASE, "sliding_window": None},
    # a window of 0: vLLM's ModelConfig makes it null
    "zero_window": {**BASE, "sliding_window": 0},
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"zero_window": (1,)}


def _cases() -> dict[str, dict[str, Any]]:
    return shared_answers.grid(CONFIGS, TPS, KVS, _TPS, gpu_backend=True)


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
    """Every layer sliding (layer_types not read) differs where a layer is full; a null window read as
    the class's default differs where it is written null."""
    right = beam.windows

    def every_layer(cfg: Any, n: int) -> list[int | None]:
        w = next((x for x in right(cfg, n) if x is not None), None)
        return [w] * n

    monkeypatch.setattr(beam, "windows", every_layer)
    assert _differences(answers) == {"mixed", "head_dim"}
    monkeypatch.setattr(beam, "windows", right)

    def default_for_null(cfg: Any, n: int) -> list[int | None]:
        data = {k: v for k, v in cfg.data.items() if not (k == "sliding_window" and v is None)}
        return right(type(cfg)(data, cfg.path), n)

    monkeypatch.setattr(beam, "windows", default_for_null)
    assert _differences(answers) == {"null_window", "zero_window"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.self_attn.attn".format
    page = 2 * 32 * 2 * 16 * 2  # 2 KV heads of 32 (hidden 256 // 8 heads), K and V, 16 tokens, bf16
    m = answers["mixed-tp1-auto"]
    assert m["layers"][name(1)] == ["FullAttentionSpec", page, page]
    assert m["windows"] == {name(0): 128, name(2): 128}
    # 2 sliding layers and 1 full: 3 groups of one layer, overlaid (one page a block)
    assert m["groups"] == [[name(0)], [name(2)], [name(1)]] and m["bytes_per_block"] == page
    d = answers["defaults-tp1-auto"]
    assert d["windows"] == {name(i): 4096 for i in range(3)}
    assert d["layers"][name(0)][1] == 4 * 32 * 2 * 16 * 2  # BeamConfig's 4 KV heads
    assert answers["head_dim-tp8-fp8"]["layers"][name(0)][1] == 1 * 64 * 2 * 16
    assert answers["null_window-tp1-auto"]["windows"] == answers["zero_window-tp1-auto"]["windows"] == {}
    assert answers["mixed-tp8-auto"]["layers"][name(0)][1] == 1 * 32 * 2 * 16 * 2  # replicated to 8


def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader="json")
    assert e.value.field == field, str(e.value)


def test_reads_and_refusals() -> None:
    ms = M.from_config(CONFIGS["defaults"], reader="transformers")
    assert isinstance(ms, M.ModelSpec) and ms.family == "beam"
    assert any("BeamConfig's default, 4096" in n for n in ms.notes)
    _refused({**BASE, "layer_types": [S, F]}, "config.layer_types", "exactly one entry per layer")
    _refused({**BASE, "layer_types": [S, F, "chunked_attention"]}, "config.layer_types[2]", "one of")
    _refused({**BASE, "mlp_layer_types": ["dense"] * 2}, "config.mlp_layer_types", "exactly one entry")
    _refused({**BASE, "mlp_layer_types": ["dense", "moe", "dense"]}, "config.mlp_layer_types[1]", "one of")
    for bad in (-1, "128", 1.5):
        _refused({**BASE, "sliding_window": bad}, "config.sliding_window", "must be")
    _refused({**BASE, "head_dim": -1}, "config.head_dim", "at least 1")
    # a 0 is vLLM's `config.head_dim or hidden_size // heads` (BeamAttention): the derived head size
    derived = M.from_config(BASE, reader="json").spec
    assert M.from_config({**BASE, "head_dim": 0}, reader="json").spec == derived
    _refused({**BASE, "num_key_value_heads": None}, "config.num_key_value_heads", "missing")
    kv3 = {**BASE, "num_key_value_heads": 3}
    _refused(kv3, "config.num_key_value_heads", "not divisible by tp = 2", tp=2)
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    _refused({**BASE, "hidden_size": 4}, "config.hidden_size", "is 0")
    with pytest.raises(SpecError, match="per-layer windows") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
