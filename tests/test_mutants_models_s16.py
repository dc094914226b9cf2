"""Exact messages, fields and values of kvlayout.models' sixteenth-pass code (the transformers check, the
KV heads' variations, tpu-inference's refusals), pinned so that mutation testing (scripts/mutation.sh
models) tells each mutated line from the original."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import build as B
from kvlayout.models import config as C
from kvlayout.models.config import Config, MissingField

BASE: dict[str, Any] = {
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "max_position_embeddings": 1024,
}
OWN = "vLLM 0.33 reads model_type 'chatglm' with its own config class: write it"
HINT = "reader='transformers' fills the config class's defaults, as vLLM does"


def _err(f: Any) -> tuple[str, str, Any, str]:
    with pytest.raises(SpecError) as e:
        f()
    return type(e.value).__name__, str(e.value), e.value.field, e.value.value


def _rows(config: dict[str, Any], reader: str = "json") -> list[tuple[int, int]]:
    ms = M.from_config(config, reader=reader)
    return [(x.num_kv_heads, x.head_size) for _, x in ms.spec.layers]


# ---- Config.missing


def test_missing_own_class_of_vllm() -> None:
    e = Config({"model_type": "chatglm"}, "config").missing("num_layers", "why")
    assert type(e) is SpecError
    assert (str(e), e.field, e.value) == (
        f"config.num_layers = None: missing; why; {OWN}",
        "config.num_layers",
        None,
    )
    e = Config({}, "config", model_type="chatglm").missing("x", "why")
    assert str(e) == f"config.x = None: missing; why; {OWN}"
    # architectures is read by no config class: no hint, whatever the type
    e = Config({"model_type": "chatglm"}, "config").missing("architectures", "why")
    assert (type(e), str(e), e.field) == (
        SpecError,
        "config.architectures = None: missing; why",
        "config.architectures",
    )
    e = Config({"model_type": "llama"}, "config").missing("architectures", "why")
    assert (type(e), str(e)) == (SpecError, "config.architectures = None: missing; why")
    # a type vLLM reads with transformers' class under another name: the hint
    e = Config({"model_type": "deepseek_v32"}, "config").missing("x", "why")
    assert (type(e), str(e), e.field) == (MissingField, f"config.x = None: missing; why; {HINT}", "config.x")
    e = Config({"model_type": "llama"}, "config", final=True).missing("x", "why")
    assert (type(e), str(e)) == (SpecError, "config.x = None: missing; why")


# ---- through_transformers, check_model_type, check_with_transformers, written_aliases


def test_through_transformers_read_as_written() -> None:
    notes: list[str] = []
    assert C.through_transformers({"model_type": 3}, notes) == ({"model_type": 3}, False)
    assert notes == ["model_type 3 is not a transformers config class: read as written"]
    notes = []
    out = C.through_transformers(
        {"model_type": "chatglm", "num_layers": 2, "multi_query_group_num": 2}, notes
    )
    assert out == (
        {
            "model_type": "chatglm",
            "num_layers": 2,
            "multi_query_group_num": 2,
            "num_hidden_layers": 2,
            "n_head_kv": 2,
        },
        False,
    )
    assert notes == [
        "model_type 'chatglm': vLLM 0.33 reads it with its own config class, not transformers': "
        "read as written"
    ]
    notes = []
    remote = {"model_type": "nosuch", "auto_map": {"AutoConfig": "a.B"}}
    assert C.through_transformers(remote, notes) == (remote, False)
    assert notes == ["model_type 'nosuch' is not a transformers config class: read as written"]


def test_written_aliases_of_vllm_class() -> None:
    notes: list[str] = []
    out = C.written_aliases({"model_type": "chatglm", "n_head_kv": 4, "multi_query_group_num": 2}, notes)
    assert out == {"model_type": "chatglm", "n_head_kv": 4, "multi_query_group_num": 4}
    assert notes == [
        "config.n_head_kv is chatglm's alias of multi_query_group_num in transformers: "
        "multi_query_group_num = 4 (written: 2), as vLLM reads it"
    ]
    # a null alias left out reads as not written
    out = C.written_aliases({"model_type": "chatglm", "num_layers": 2}, [])
    assert out == {"model_type": "chatglm", "num_layers": 2, "num_hidden_layers": 2}


def test_through_transformers_unknown_type() -> None:
    notes: list[str] = []
    why = (
        "no transformers config class has this model_type, and config.json names no remote code "
        "(auto_map.AutoConfig): vLLM 0.33's AutoConfig refuses it"
    )
    assert _err(lambda: C.through_transformers({"model_type": "nosuch"}, notes)) == (
        "SpecError",
        f"config.model_type = 'nosuch': {why}",
        "config.model_type",
        "nosuch",
    )
    assert notes == []


def test_through_transformers_classes() -> None:
    notes: list[str] = []
    data = {"model_type": "mimo", "hidden_size": 64, "num_attention_heads": 4}
    out, done = C.through_transformers(data, notes)
    assert done is True and out["model_type"] == "qwen2"
    assert notes == [
        "model_type 'mimo' read as transformers' 'qwen2' class (its own is a subclass)",
        "read through transformers' Qwen2Config",
    ]
    notes = []
    out, done = C.through_transformers(
        {"model_type": "deepseek_v32", "hidden_size": 64, "num_attention_heads": 4}, notes
    )
    assert done is True and out["model_type"] == "deepseek_v32"
    assert notes == [
        "read through transformers' DeepseekV3Config, the class vLLM 0.33 reads 'deepseek_v32' with"
    ]


def test_through_transformers_keeps_nested_dicts() -> None:
    data = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "text_config": {"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}},
    }
    before = copy.deepcopy(data)
    C.through_transformers(data, [])
    assert data == before


def test_check_model_type() -> None:
    why = "vLLM 0.33 picks the config class by it (AutoConfig): a non-empty string, e.g. 'llama'"
    assert _err(lambda: C.check_model_type({"model_type": ""})) == (
        "SpecError",
        f"config.model_type = '': {why}",
        "config.model_type",
        "",
    )
    assert C.check_model_type({"model_type": "", "auto_map": {"AutoConfig": "a.B"}}) is None
    assert C.check_model_type({}) is None


def test_check_with_transformers_too_large() -> None:
    big = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "layer_list": [0] * 10**6}
    said = C.check_with_transformers(big)  # the json reader's checks stand, and a note says so
    assert said is not None
    assert said.startswith("transformers' check of the config left out: config.layer_list")
    assert (
        C.check_with_transformers({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
        is None
    )


# ---- _transformers_refusal


class _Cls:
    attribute_map = {"other": "zzz", "absent": "hidden", "n_embd": "hidden"}


class _Bare:
    pass


WHOSE = "transformers refuses it ({}, vLLM 0.33's class for model_type 'm')"


def test_transformers_refusal_plain() -> None:
    e = C._transformers_refusal({}, _Bare, "m", ValueError(""))
    assert (str(e), e.field, e.value) == (f"config = 'm': {WHOSE.format('_Bare')}: ValueError", "config", "m")
    e = C._transformers_refusal({}, _Bare, "m", ValueError("a\n\n  b   c "))
    assert str(e) == f"config = 'm': {WHOSE.format('_Bare')}: b c"


def test_transformers_refusal_fields() -> None:
    err = ValueError("Validation error for field 'hidden'\nbad value")
    data = {"other": 1, "n_embd": 7}
    e = C._transformers_refusal(data, _Cls, "m", err)
    assert (str(e), e.field, e.value) == (
        f"config.n_embd = 7: {WHOSE.format('_Cls')}: bad value",
        "config.n_embd",
        7,
    )
    e = C._transformers_refusal({"hidden": 3, "n_embd": 7}, _Cls, "m", err)
    assert (e.field, e.value) == ("config.hidden", 3)
    # not written: named as transformers builds it
    e = C._transformers_refusal({"other": 1, "rope_theta": 2}, _Bare, "m", err)
    assert (str(e), e.field, e.value) == (
        f"config.hidden = 'as transformers builds it': {WHOSE.format('_Bare')}: bad value",
        "config.hidden",
        "as transformers builds it",
    )
    rope = ValueError("Validation error for field 'rope_parameters'\nbad rope")
    e = C._transformers_refusal({"rope_theta": 2}, _Bare, "m", rope)
    assert (str(e), e.field, e.value) == (
        f"config.rope_theta = 2: {WHOSE.format('_Bare')}: bad rope",
        "config.rope_theta",
        2,
    )
    e = C._transformers_refusal({"rope_scaling": 1, "rope_theta": 2}, _Cls, "m", rope)
    assert e.field == "config.rope_scaling"


def test_transformers_refusal_long_cause() -> None:
    for n, shown in ((300, "x" * 300), (301, "x" * 300 + "..."), (302, "x" * 300 + "...")):
        err = ValueError("Validation error for field 'n_embd'\n" + "x" * n)
        e = C._transformers_refusal({"n_embd": 1}, _Bare, "m", err)
        assert str(e) == f"config.n_embd = 1: {WHOSE.format('_Bare')}: {shown}"


# ---- _class_of_model_type and build's notes


MISTRAL = (
    "config.model_type = 'mistral': LlamaForCausalLM's own model_type is 'llama': vLLM 0.33 builds "
    "LlamaForCausalLM with the config class of 'mistral' (MistralForCausalLM's), whose defaults fill what "
    "config.json leaves out"
)


def test_class_of_model_type() -> None:
    top = Config({"model_type": "mistral"}, "config")
    hint = "; reader='transformers' (or the default, auto) reads it through that class, as vLLM does"
    assert _err(lambda: B._class_of_model_type(top, "LlamaForCausalLM")) == (
        "OtherClass",
        MISTRAL + hint,
        "config.model_type",
        "mistral",
    )
    final = Config({"model_type": "mistral"}, "config", final=True)
    assert _err(lambda: B._class_of_model_type(final, "LlamaForCausalLM")) == (
        "SpecError",
        MISTRAL,
        "config.model_type",
        "mistral",
    )
    assert B._class_of_model_type(top, "FooForCausalLM") is None


def test_build_notes_and_final() -> None:
    ms = M.from_config(
        {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "mistral"}, reader="auto"
    )
    assert ms.notes[:2] == (
        "config.model_type = 'mistral' is another architecture's: read through that transformers config "
        "class, "
        "as vLLM 0.33 reads it (reader auto)",
        "read through transformers' MistralConfig",
    )
    # read through transformers but not completed (no model_type): no hint
    short = {k: v for k, v in BASE.items() if k != "num_attention_heads"}
    assert _err(
        lambda: M.from_config({**short, "architectures": ["LlamaForCausalLM"]}, reader="transformers")
    ) == (
        "SpecError",
        "config.num_attention_heads = None: missing; the query heads",
        "config.num_attention_heads",
        None,
    )
    db = {**BASE, "architectures": ["DbrxForCausalLM"], "attn_config": {}}
    assert _err(lambda: M.from_config(db, reader="transformers")) == (
        "SpecError",
        "config.attn_config.kv_n_heads = None: missing; DBRX's KV heads",
        "config.attn_config.kv_n_heads",
        None,
    )


# ---- _kv_total, read_attention, _check_as_transformers


def test_bigcode_kv_heads() -> None:
    bc = {**BASE, "architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode"}
    assert _rows({**bc, "multi_query": True}) == [(1, 32)] * 2
    assert _rows({**bc, "multi_query": False}) == [(8, 32)] * 2
    assert _rows({**bc, "multi_query": True, "num_key_value_heads": 4}) == [(4, 32)] * 2
    assert _err(lambda: M.from_config(bc, reader="json")) == (
        "MissingField",
        "config.multi_query = None: missing; GPT-BigCode's KV heads without num_key_value_heads; " + HINT,
        "config.multi_query",
        None,
    )


def test_head_dim_required() -> None:
    hy = {**BASE, "architectures": ["HunYuanDenseV1ForCausalLM"], "model_type": "hunyuan_v1_dense"}
    why = "missing; this model's attention reads it and its config class has no default"
    assert _err(lambda: M.from_config(hy, reader="json")) == (
        "SpecError",
        f"config.head_dim = None: {why}",
        "config.head_dim",
        None,
    )
    assert _rows({**hy, "head_dim": 48}) == [(8, 48)] * 2


ODD = (
    "config.head_dim = 5: odd, and RoPE rotates all of it (partial_rotary_factor {}): transformers refuses "
    "it (validate_rope: RoPE requires an even rotary dimension), and vLLM 0.33 reads the config through it"
)


def _check(data: dict[str, Any], heads: int = 4, completed: bool = False) -> None:
    from kvlayout.models.attention import _check_as_transformers

    _check_as_transformers(Config(data, "config", completed=completed), heads)


def test_check_as_transformers_hidden() -> None:
    assert _err(lambda: _check({"model_type": "llama", "hidden_size": 66})) == (
        "SpecError",
        "config.num_attention_heads = 4: does not divide hidden_size = 66: transformers' config class for "
        "'llama' refuses it (validate_architecture), and vLLM 0.33 reads the config through it",
        "config.num_attention_heads",
        4,
    )
    _check({"model_type": "llama", "hidden_size": 66}, completed=True)
    _check({"model_type": "gpt2", "hidden_size": 66})
    _check({"head_dim": 5, "rope_theta": 1.0})  # no model_type: no class


def test_check_as_transformers_rope() -> None:
    for rope in (
        {"rope_theta": 1.0},
        {"rope_parameters": {"rope_type": "default"}},
        {"rope_scaling": {"a": 1}},
    ):
        assert _err(lambda r=rope: _check({"model_type": "llama", "head_dim": 5, **r})) == (
            "SpecError",
            ODD.format(1.0),
            "config.head_dim",
            5,
        )
    _check({"model_type": "llama", "head_dim": 5, "rope_scaling": {"partial_rotary_factor": 0.5}})
    _check({"model_type": "llama", "head_dim": 5, "rope_theta": 1.0, "partial_rotary_factor": "x"})
    _check({"model_type": "llama", "head_dim": 5})
    assert _err(
        lambda: _check({"model_type": "llama", "head_dim": 5, "rope_theta": 1, "partial_rotary_factor": 1.1})
    )[1] == ODD.format(1.1)


# ---- tpu_inference_from_config


def test_tpu_inference_refuses_transformers_backend() -> None:
    from kvlayout.models.tpu_inference import tpu_inference_from_config

    cfg = {**BASE, "architectures": ["ArceeForCausalLM"], "model_type": "arcee", "num_key_value_heads": 8}
    why = (
        "tpu-inference's arrays for ArceeForCausalLM, which vLLM serves through its Transformers modeling "
        "backend, are not checked against its code (vLLM's are: plan with engine vllm)"
    )
    assert _err(lambda: tpu_inference_from_config(cfg, reader="json")) == (
        "SpecError",
        f"engine = 'tpu-inference': {why}",
        "engine",
        "tpu-inference",
    )


def test_through_transformers_notes_aliases() -> None:
    notes: list[str] = []
    out, done = C.through_transformers({"model_type": "chatglm", "n_head_kv": 4}, notes)
    assert (out["multi_query_group_num"], done, len(notes)) == (4, False, 2)
    assert notes[1].startswith("config.n_head_kv is chatglm's alias of multi_query_group_num")
