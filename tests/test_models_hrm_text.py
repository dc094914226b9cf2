"""HRM-Text (``HrmTextForCausalLM``, model_type ``hrm_text``) by vLLM 0.33's own construction (issue 23): an L
and an H stack run in cycles, one attention (and cache) per (step, layer), named
``model.{L,H}_module.layers.{step * num_layers_per_stack + i}.self_attn.attn``; multi-head attention of
``head_dim`` (transformers' ``HrmTextConfig``: 128 where left out, 2 H and 3 L cycles).

Each small config is built by tests/test_models_hybrid_vllm.py's driver as one rank of tp 1, 2 and 8 with a
bf16 and an fp8 cache, its layers moved to the GPU backend (the CPU's takes 32-token blocks), and its
layers, pages, blocks, groups (members and order) and bytes per block must equal kvlayout's Hopper and
Blackwell plans.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import hrm_text
from tests import shared_answers

BASE: dict[str, Any] = {
    "architectures": ["HrmTextForCausalLM"],
    "model_type": "hrm_text",
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,  # not read: multi-head attention
    "num_hidden_layers": 2,  # the layers of each stack
    "H_cycles": 2,
    "L_cycles": 2,
    "head_dim": 32,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "base": BASE,
    # HrmTextConfig's defaults: 2 H cycles, 3 L cycles, head_dim 128
    "defaults": {k: v for k, v in BASE.items() if k not in ("H_cycles", "L_cycles", "head_dim")},
    # a saved config: num_layers_per_stack beside the rewritten total (2 * 2 * (2 + 1) = 12)
    "saved": {**BASE, "num_layers_per_stack": 2, "num_hidden_layers": 12},
    # the engine's one window: every attention slides (pass 27 left it refused)
    "window": {**BASE, "sliding_window": 64},
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"defaults": (1,), "saved": (1,), "window": (1, 2)}


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
    """Built step by step, then layer by layer (not layer by layer, then step by step), the names hold but
    the group's order differs wherever a stack has more than one layer."""
    right = hrm_text.attention_layers

    def by_step(cfg: Any) -> list[tuple[str, int]]:
        return sorted(right(cfg), key=lambda x: (x[0] == "H", x[1]))

    monkeypatch.setattr(hrm_text, "attention_layers", by_step)
    assert _differences(answers) == {"base", "defaults", "saved", "window"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    page = 8 * 32 * 2 * 16 * 2  # 8 KV heads (the query heads) of 32, K and V, 16 tokens, bf16
    b = answers["base-tp1-auto"]
    # 2 H cycles of 2 L steps and 1 H step: L at steps 0, 1, 3, 4; H at 2, 5; index step * 2 + i
    low = [f"model.L_module.layers.{s * 2 + i}.self_attn.attn" for i in (0, 1) for s in (0, 1, 3, 4)]
    high = [f"model.H_module.layers.{s * 2 + i}.self_attn.attn" for i in (0, 1) for s in (2, 5)]
    assert b["groups"] == [low + high] and b["bytes_per_block"] == 12 * page
    assert b["layers"][low[0]] == ["FullAttentionSpec", page, page]
    d = answers["defaults-tp1-auto"]
    assert len(d["layers"]) == 2 * 2 * (3 + 1) and d["layers"][low[0]][1] == 8 * 128 * 2 * 16 * 2
    assert answers["saved-tp1-auto"]["groups"] == b["groups"]
    assert answers["base-tp8-fp8"]["layers"][low[0]][1] == 1 * 32 * 2 * 16
    assert answers["window-tp1-auto"]["layers"][low[0]][0] == "SlidingWindowSpec"


def _refused(cfg: dict[str, Any], field: str, match: str, tp: int = 1, reader: str = "json") -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, tp=tp, reader=reader)
    assert e.value.field == field, str(e.value)


def test_reads_and_refusals() -> None:
    ms = M.from_config(CONFIGS["defaults"])  # the json reader asks for the cycles: read through transformers
    assert isinstance(ms, M.ModelSpec) and ms.family == "hrm_text" and len(ms.spec.layers) == 16
    for key in ("H_cycles", "L_cycles"):
        _refused({k: v for k, v in BASE.items() if k != key}, f"config.{key}", "missing")
    _refused({**BASE, "H_cycles": 0}, "config.H_cycles", "at least 1")
    _refused({**BASE, "hidden_size": 260}, "config.hidden_size", "not a multiple")
    slid = M.from_config({**BASE, "sliding_window": 128}, reader="json")
    assert {g.name for g in slid.spec.groups} == {"sliding"} and len(slid.spec.layers) == 12
    _refused({**BASE, "num_hidden_layers": 10_000}, "config.num_hidden_layers", "at most")
    _refused(CONFIGS["saved"] | {"num_layers_per_stack": 5_000}, "config.num_layers_per_stack", "at most")
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    with pytest.raises(SpecError, match="recurrent stacks") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
