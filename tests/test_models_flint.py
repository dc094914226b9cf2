"""Flint (``FlintForCausalLM``, model_type ``flint``) by vLLM 0.33's own construction (issue 23): read through
vLLM's own ``FlintConfig`` (every layer full, a 513-token window, 4 KV heads of 128 where left out), layer i
sliding where ``layer_types[i]`` is ``sliding_attention``; built only on FlashInfer with a bfloat16 cache.

The CPU install has no ``flashinfer``: tests/flashinfer_driver.py stands it in (asserted) and puts the
FlashInfer backend in the CPU backend's place. Each small config is built as one rank of tp 1, 2 and 8 with
a bf16 cache, and its layers, pages, blocks, windows, groups and bytes per block must equal kvlayout's plans
with FLASHINFER on Hopper (named) and Blackwell (vLLM's choice there); an fp8 cache fails vLLM's
construction (FlintAttention's assertion) and is refused by kvlayout.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import flint
from tests import shared_answers

S, F = "sliding_attention", "full_attention"
BASE: dict[str, Any] = {
    "architectures": ["FlintForCausalLM"],
    "model_type": "flint",
    "torch_dtype": "bfloat16",
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 512,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 3,
    "layer_types": [S, F, S],
    "sliding_window": 65,
    "mlp_only_layers": [0, 1, 2],  # dense MLPs (the MoE holds no cache)
}
_DEFAULTED = ("layer_types", "sliding_window", "num_key_value_heads", "head_dim")
CONFIGS: dict[str, dict[str, Any]] = {
    "mixed": BASE,
    # FlintConfig's defaults: every layer full, 4 KV heads of 128
    "defaults": {k: v for k, v in BASE.items() if k not in _DEFAULTED},
    # every layer sliding over the class's 513 tokens
    "all_sliding": {k: v for k, v in {**BASE, "layer_types": [S, S, S]}.items() if k != "sliding_window"},
    # use_sliding_window false: no window, every layer full
    "windows_off": {**BASE, "use_sliding_window": False},
    # a null window: every layer full
    "null_window": {**BASE, "sliding_window": None},
}
TPS = (1, 2, 8)
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"all_sliding": (1,), "windows_off": (1,), "null_window": (1,)}


def _cases() -> dict[str, dict[str, Any]]:
    cases = {
        f"{name}-tp{tp}-auto": {
            "config": cfg, "tp": tp, "kv_cache_dtype": "auto", "attention_backend": "FLASHINFER",
        }
        for name, cfg in CONFIGS.items()
        for tp in _TPS.get(name, TPS)
    }
    cases["mixed-tp1-fp8"] = {**cases["mixed-tp1-auto"], "kv_cache_dtype": "fp8"}
    # heads of 32: FlashInfer takes 64, 128, 256 and 512 (its validate_configuration on a GPU)
    cases["head32-tp1-auto"] = {**cases["mixed-tp1-auto"], "config": {**BASE, "head_dim": 32}}
    return cases


def _built() -> dict[str, dict[str, Any]]:
    return {k: c for k, c in _cases().items() if c["kv_cache_dtype"] == "auto" and not k.startswith("head32")}


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.flashinfer_driver import flashinfer_answers

    return flashinfer_answers(_cases())


def _differences(answers: dict[str, dict[str, Any]]) -> set[str]:
    from tests.test_models_hybrid_vllm import differences

    built = {k: answers[k] for k in _built()}
    out = shared_answers.differing(built, _built())
    # Blackwell's own choice is FLASHINFER: the same plan with no backend named
    plain = {k: {**c, "attention_backend": None} for k, c in _built().items()}
    out |= {case_id.split("-")[0] for case_id, _ in differences(built, plain, ("blackwell",))}
    return out


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == set()


def test_fp8_fails_both(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's FlintAttention asserts an auto or bfloat16 cache; kvlayout refuses fp8, naming it."""
    assert answers["mixed-tp1-fp8"]["error"].startswith("AssertionError")
    with pytest.raises(SpecError, match="bfloat16 cache") as e:
        M.from_config(BASE, kv_cache_dtype="fp8", attention_backend="FLASHINFER")
    assert e.value.field == "kv_cache_dtype"


def test_head_size_flashinfer_refuses_fails_both(answers: dict[str, dict[str, Any]]) -> None:
    """Heads of 32: vLLM's FlashInfer refuses them (pass 27: planned before), and no other backend builds
    Flint; kvlayout refuses them, naming the backend, named or Blackwell's own choice."""
    assert answers["head32-tp1-auto"]["error"].startswith("ValueError: head size 32 not supported"), answers
    for kw in ({"attention_backend": "FLASHINFER"}, {"device": "blackwell"}):
        with pytest.raises(SpecError, match="head size 32 not supported") as e:
            M.from_config({**BASE, "head_dim": 32}, reader="json", **kw)
        assert (e.value.field, e.value.value) == ("attention_backend", "FLASHINFER")


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The class's default window (513) taken where use_sliding_window is false or the window null differs
    there; every layer sliding (layer_types not read) differs where a layer is full."""
    right = flint.windows

    def default_window(cfg: Any, n: int) -> list[int | None]:
        data = {k: v for k, v in cfg.data.items() if k not in ("use_sliding_window", "sliding_window")}
        data["sliding_window"] = cfg.data.get("sliding_window") or flint.SLIDING_WINDOW_DEFAULT
        return right(type(cfg)(data, cfg.path), n)

    monkeypatch.setattr(flint, "windows", default_window)
    assert _differences(answers) == {"windows_off", "null_window"}

    def every_layer(cfg: Any, n: int) -> list[int | None]:
        return [next((w for w in right(cfg, n) if w is not None), None)] * n

    monkeypatch.setattr(flint, "windows", every_layer)
    assert _differences(answers) == {"mixed"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    name = "model.layers.{}.self_attn.attn".format
    page = 2 * 64 * 2 * 16 * 2  # 2 KV heads of 64, K and V, 16 tokens, bf16
    m = answers["mixed-tp1-auto"]
    assert m["layers"][name(1)] == ["FullAttentionSpec", page, page]
    assert m["windows"] == {name(0): 65, name(2): 65}
    assert m["groups"] == [[name(0)], [name(2)], [name(1)]] and m["bytes_per_block"] == page
    d = answers["defaults-tp1-auto"]
    assert d["windows"] == {} and d["layers"][name(0)][1] == 4 * 128 * 2 * 16 * 2  # the class's 4 KV of 128
    assert answers["all_sliding-tp1-auto"]["windows"] == {name(i): 513 for i in range(3)}
    assert answers["windows_off-tp1-auto"]["windows"] == answers["null_window-tp1-auto"]["windows"] == {}
    assert answers["mixed-tp8-auto"]["layers"][name(0)][1] == page // 2  # replicated to 8


def _refused(cfg: dict[str, Any], field: str, match: str, **kw: Any) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json", **kw)
    assert e.value.field == field, str(e.value)


def test_backends_and_refusals() -> None:
    fi = {"attention_backend": "FLASHINFER"}
    _refused(BASE, "attention_backend", "FLASH_ATTN .vLLM's choice on hopper: it serves sinks.")
    triton = {"device": "blackwell", "attention_backend": "TRITON_ATTN"}
    _refused(BASE, "attention_backend", "TRITON_ATTN .named.", **triton)
    _refused(BASE, "device", "does not build Flint on ampere", device="ampere", **fi)
    _refused({**BASE, "torch_dtype": "float16"}, "dtype", "bfloat16 model", **fi)
    _refused(BASE, "dtype", "bfloat16 model", dtype="float32", **fi)
    ms = M.from_config(CONFIGS["defaults"], reader="transformers", device="blackwell")
    assert isinstance(ms, M.ModelSpec) and ms.family == "flint" and ms.attention_backend == "FLASHINFER"
    assert any("FlintConfig's default, 4" in n for n in ms.notes)
    _refused({**BASE, "layer_types": [S, F]}, "config.layer_types", "exactly one entry per layer", **fi)
    _refused({**BASE, "layer_types": [S, F, 1]}, "config.layer_types[2]", "must be a string", **fi)
    _refused({**BASE, "use_sliding_window": "yes"}, "config.use_sliding_window", "true or false", **fi)
    _refused({**BASE, "sliding_window": -1}, "config.sliding_window", "at least 1", **fi)
    _refused({**BASE, "head_dim": None}, "config.head_dim", "missing", **fi)
    _refused({**BASE, "num_key_value_heads": 3}, "config.num_key_value_heads", "not divisible by tp = 2",
             tp=2, **fi)
    _refused(BASE, "config.num_attention_heads", "not divisible by tp = 3", tp=3, **fi)
    with pytest.raises(SpecError, match="sink layers") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
