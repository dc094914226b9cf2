"""Rnj-1 (``Rnj1ForCausalLM``) by vLLM 0.33's own construction (issue 23): ``chunked_attention`` layers slide
over ``sliding_window`` (``chunk_lookback`` 1: which keys the kernel reads, not the cache), the others take
the engine's one window; every layer passes ``chunk_lookback``, which only TRITON_ATTN takes.

vLLM ships no config class for it (the checkpoint's is remote code): the driver's plain stand-in holds the
fields as written. The CPU backend's implementation takes no ``chunk_lookback``: tests/triton_driver.py
stands TRITON_ATTN in for it (asserted), the backend the model needs on a GPU. Each small config is built as
one rank of tp 1, 2 and 8 with a bf16 and an fp8 cache, and its layers, pages, blocks, windows, groups and
bytes per block must equal kvlayout's Hopper and Blackwell plans with ``attention_backend='TRITON_ATTN'``.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import rnj1
from tests import shared_answers

C, F, S = "chunked_attention", "full_attention", "sliding_attention"
BASE: dict[str, Any] = {
    "architectures": ["Rnj1ForCausalLM"],
    "model_type": "rnj1",
    "auto_map": {"AutoConfig": "configuration_rnj1.Rnj1Config"},
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 48,  # read (not hidden_size // heads = 32)
    "num_hidden_layers": 3,
    "layer_types": [C, F, C],
    "sliding_window": 64,
    "query_pre_attn_scalar": 48,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "chunked": BASE,
    # 8 KV heads, split over the ranks
    "kv8": {**BASE, "num_key_value_heads": 8, "layer_types": [F, C, C]},
    # every layer sliding_attention: none chunked, all take the engine's window
    "all_sliding": {**BASE, "layer_types": [S, S, S]},
    # a sliding_attention layer beside other kinds: the engine's window is withheld, it is full
    "mixed": {**BASE, "layer_types": [S, F, C]},
    # a null window: the chunked layers take the engine's, which is none
    "null_window": {**BASE, "sliding_window": None},
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"all_sliding": (1,), "mixed": (1,), "null_window": (1,)}


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
    """sliding_attention layers sliding by their own type (not the engine's window) differ where the types
    mix; chunked layers planned full (the lookback taken for no window) differ wherever one is chunked."""
    right = rnj1.windows

    def own_type(cfg: Any, n: int) -> list[int | None]:
        w = cfg.data.get("sliding_window")
        return [w if t == S else x for t, x in zip(cfg.data["layer_types"], right(cfg, n), strict=False)]

    monkeypatch.setattr(rnj1, "windows", own_type)
    assert _differences(answers) == {"mixed"}

    def chunked_full(cfg: Any, n: int) -> list[int | None]:
        return [None if t == C else x for t, x in zip(cfg.data["layer_types"], right(cfg, n), strict=False)]

    monkeypatch.setattr(rnj1, "windows", chunked_full)
    assert _differences(answers) == {"chunked", "kv8", "mixed"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.self_attn.attn".format
    page = 2 * 48 * 2 * 16 * 2  # 2 KV heads of head_dim 48, K and V, 16 tokens, bf16
    c = answers["chunked-tp1-auto"]
    assert c["layers"][name(0)] == ["SlidingWindowSpec", page, page]
    assert c["layers"][name(1)] == ["FullAttentionSpec", page, page]
    assert c["windows"] == {name(0): 64, name(2): 64}
    assert c["groups"] == [[name(0)], [name(2)], [name(1)]] and c["bytes_per_block"] == page
    assert answers["all_sliding-tp1-auto"]["windows"] == {name(i): 64 for i in range(3)}
    assert answers["mixed-tp1-auto"]["windows"] == {name(2): 64}
    assert answers["null_window-tp1-auto"]["windows"] == {}
    assert answers["kv8-tp8-fp8"]["layers"][name(0)][1] == 1 * 48 * 2 * 16


def _refused(cfg: dict[str, Any], field: str, match: str, **kw: Any) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json", **kw)
    assert e.value.field == field, str(e.value)


def test_backends_and_refusals() -> None:
    """vLLM's own backend choice, or another one named, is refused as vLLM refuses it (``chunk_lookback``);
    fields are named."""
    for device, chosen in (("hopper", "FLASH_ATTN"), ("blackwell", "FLASHINFER")):
        _refused(BASE, "attention_backend", f"{chosen} .vLLM's choice on {device}.: .*chunk_lookback",
                 device=device)
    _refused(BASE, "attention_backend", "FLASH_ATTN .named.", attention_backend="FLASH_ATTN")
    triton = {"attention_backend": "TRITON_ATTN"}
    for key in ("num_key_value_heads", "head_dim", "num_attention_heads", "layer_types"):
        for reader in ("json", "transformers"):
            cfg = {k: v for k, v in BASE.items() if k != key}
            with pytest.raises(SpecError, match="remote code") as e:
                M.from_config(cfg, reader=reader, **triton)
            assert e.value.field == f"config.{key}"
    _refused({**BASE, "layer_types": [C, F]}, "config.layer_types", "one entry per layer", **triton)
    # pass 28: a string as long as the layers is read by character; a shorter one vLLM indexes past
    _refused({**BASE, "layer_types": "ab"}, "config.layer_types", "must be a list", **triton)
    _refused({**BASE, "layer_types": [C, F, 3]}, "config.layer_types[2]", "must be a string", **triton)
    _refused({**BASE, "sliding_window": -1}, "config.sliding_window", "at least 1", **triton)
    _refused({**BASE, "num_key_value_heads": 3}, "config.num_key_value_heads", "not divisible by tp = 2",
             tp=2, **triton)
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3, **triton)
    with pytest.raises(SpecError, match="chunked layers") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
