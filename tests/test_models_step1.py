"""Step 1 (``Step1ForCausalLM``) by vLLM 0.33's own construction (issue 23): one ALiBi attention per layer
(``use_alibi_sqrt``: built only on TRITON_ATTN), KV heads ``num_attention_groups`` (else
``num_key_value_heads``; null read as 1), head size ``hidden_size // heads``, the engine's one window.

vLLM ships no config class for it (the checkpoint's is remote code): the driver's plain stand-in holds the
fields as written. The CPU backend refuses ``use_alibi_sqrt``: tests/triton_driver.py stands TRITON_ATTN in
for it (asserted), the backend the model needs on a GPU. Each small config is built as one rank of tp 1, 2
and 8 with a bf16 and an fp8 cache, and its layers, pages, blocks, windows, groups and bytes per block must
equal kvlayout's Hopper and Blackwell plans with ``attention_backend='TRITON_ATTN'``.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import step1
from tests import shared_answers

BASE: dict[str, Any] = {
    "architectures": ["Step1ForCausalLM"],
    "model_type": "step1",
    "auto_map": {"AutoConfig": "configuration_step1.Step1Config"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_attention_groups": 2,
    "num_key_value_heads": 8,  # not read: num_attention_groups is
    "head_dim": 64,  # not read: the head size is hidden_size // num_attention_heads (32)
    "num_hidden_layers": 2,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "groups": BASE,
    # no num_attention_groups: num_key_value_heads
    "kv_heads": {k: v for k, v in BASE.items() if k != "num_attention_groups"},
    # num_attention_groups written null: one KV head, num_key_value_heads not read
    "null_groups": {**BASE, "num_attention_groups": None},
    # the engine's one window on every layer; withheld where layer_types mixes kinds
    "window": {**BASE, "sliding_window": 128},
    "mixed_types": {**BASE, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"null_groups": (1, 8), "window": (1,), "mixed_types": (1,)}


def _cases() -> dict[str, dict[str, Any]]:
    return shared_answers.grid(CONFIGS, TPS, KVS, _TPS, stand_in=True, attention_backend="TRITON_ATTN")


shared_answers.register("triton", __name__, _cases())  # one driver run with the other files' cases


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.triton_driver import triton_answers

    return shared_answers.answers("triton", __name__, _cases(), triton_answers)


def _differences(answers: dict[str, dict[str, Any]]) -> set[str]:
    return shared_answers.differing(answers, _cases())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == set()


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """num_key_value_heads read before num_attention_groups differs wherever both are written."""

    def kv_first(cfg: Any) -> tuple[int, str]:
        if cfg.has("num_key_value_heads"):
            return cfg.req_int("num_key_value_heads", "the KV heads"), "num_key_value_heads"
        return right(cfg)

    right = step1._kv_total
    monkeypatch.setattr(step1, "_kv_total", kv_first)
    assert _differences(answers) == {"groups", "null_groups", "window", "mixed_types"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.self_attn.attn".format
    page = 2 * 32 * 2 * 16 * 2  # 2 KV heads (groups) of 32 (hidden 256 // 8 heads), K and V, 16 tokens, bf16
    g = answers["groups-tp1-auto"]
    assert g["layers"][name(0)] == ["FullAttentionSpec", page, page] and g["windows"] == {}
    assert g["groups"] == [[name(0), name(1)]] and g["bytes_per_block"] == 2 * page
    assert answers["kv_heads-tp1-auto"]["layers"][name(0)][1] == 4 * page  # 8 KV heads
    assert answers["null_groups-tp1-auto"]["layers"][name(0)][1] == page // 2  # one KV head
    assert answers["window-tp1-auto"]["windows"] == {name(0): 128, name(1): 128}
    assert answers["mixed_types-tp1-auto"]["windows"] == {}
    assert answers["groups-tp8-fp8"]["layers"][name(0)][1] == 1 * 32 * 2 * 16  # replicated to 8


def _refused(cfg: dict[str, Any], field: str, match: str, **kw: Any) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json", **kw)
    assert e.value.field == field, str(e.value)


def test_backends_and_refusals() -> None:
    """vLLM's own backend choice (FLASH_ATTN on Hopper, FLASHINFER on Blackwell), or another one named, is
    refused as vLLM refuses it (``use_alibi_sqrt``); fields are named."""
    for device, chosen in (("hopper", "FLASH_ATTN"), ("blackwell", "FLASHINFER")):
        _refused(BASE, "attention_backend", f"{chosen} .vLLM's choice on {device}.: .*use_alibi_sqrt",
                 device=device)
    _refused(BASE, "attention_backend", "FLASHINFER .named.", attention_backend="FLASHINFER")
    ms = M.from_config(BASE, attention_backend="TRITON_ATTN", block_size=32)
    assert isinstance(ms, M.ModelSpec) and ms.family == "step1" and ms.block_size == 32
    neither = {k: v for k, v in BASE.items() if k not in ("num_attention_groups", "num_key_value_heads")}
    _refused(neither, "config.num_attention_groups", "remote code", attention_backend="TRITON_ATTN")
    for bad in ("2", 2.5, True):
        _refused({**BASE, "num_attention_groups": bad}, "config.num_attention_groups", "must be an integer",
                 attention_backend="TRITON_ATTN")
    ms = M.from_config({**BASE, "num_attention_groups": 0}, attention_backend="TRITON_ATTN")
    assert isinstance(ms, M.ModelSpec) and any("reads it as 1 KV head" in n for n in ms.notes)
    _refused({**BASE, "num_attention_groups": 3}, "config.num_attention_groups", "not divisible by tp = 2",
             tp=2, attention_backend="TRITON_ATTN")
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    _refused({**BASE, "hidden_size": 4}, "config.hidden_size", "is 0")
    # pass 28: a string is read as its characters (tests/test_hostile_s28_models.py); a number is refused
    _refused({**BASE, "layer_types": 7}, "config.layer_types", "must be a list",
             attention_backend="TRITON_ATTN")
    with pytest.raises(SpecError, match="ALiBi layers") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
