"""Hostile pass of 2026-12-04, left items fixed on 2026-12-04 (issue 25): config integers past any
real size, float factors that overflow or round to nothing, empty groups, long names, Llama 4's null
``no_rope_layers``. Each refusal is one :class:`KVLayoutError` naming the field; nothing crashes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvlayout.cli import main
from kvlayout.errors import KVLayoutError, SpecError, bad_value
from kvlayout.models import from_config, summary

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "models"
_LFM2: dict[str, Any] = {
    "architectures": ["Lfm2ForCausalLM"],
    "model_type": "lfm2",
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "conv_dim": 768,
    "conv_L_cache": 3,
    "layer_types": ["conv", "full_attention"],
    "torch_dtype": "bfloat16",
}
_FALCON: dict[str, Any] = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 2,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 1.5,
}


def _configs() -> list[tuple[str, dict[str, Any]]]:
    out = [(p.parent.name, json.loads(p.read_text())) for p in sorted(FIXTURES.glob("*/config.json"))]
    return out + [("lfm2", _LFM2), ("falcon_h1", _FALCON)]


def _int_paths(d: dict[str, Any], pre: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k, v in d.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((*pre, k))
        elif isinstance(v, dict):
            out += _int_paths(v, (*pre, k))
    return out


def _with(cfg: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    out = json.loads(json.dumps(cfg))
    d = out
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return out


def test_a_huge_config_integer_is_refused_by_name_not_a_crash() -> None:
    """LFM2 with conv_dim = conv_L_cache = 10**2200 crashed the hybrid note's f-string (ValueError: the
    4,300-digit limit on printing an integer): traceback, exit 1. Config integers are capped at 2**53."""
    big = 10**2200
    with pytest.raises(SpecError) as e:
        from_config({**_LFM2, "conv_dim": big, "conv_L_cache": big})
    bits = f"{big.bit_length():,}"
    assert str(e.value) == f"config.conv_dim = <an integer of {bits} bits>: must be at most 2**53"
    with pytest.raises(SpecError) as e:
        from_config({**_LFM2, "conv_L_cache": 2**53 + 1})
    assert str(e.value) == f"config.conv_L_cache = {2**53 + 1}: must be at most 2**53"
    for kw, field in (({"tp": 2**53 + 1}, "tp"), ({"block_size": 2**53 + 1}, "block_size")):
        with pytest.raises(SpecError) as e:
            from_config(_LFM2, **kw)
        assert str(e.value) == f"{field} = {2**53 + 1}: must be a positive integer, at most 2**53"
    with pytest.raises(SpecError) as e:
        from_config(_LFM2, engine="tpu-inference", tp=2**53 + 1)
    assert str(e.value) == f"tp = {2**53 + 1}: must be a positive integer, at most 2**53"


def test_bad_value_shows_a_huge_integer_by_its_size() -> None:
    top = 2**256 - 1  # 256 bits (78 digits): shown by its repr
    assert str(bad_value(SpecError, "x", top, "why")) == f"x = {top}: why"
    assert str(bad_value(SpecError, "x", 2**256, "w")) == "x = <an integer of 257 bits>: w"
    assert str(bad_value(SpecError, "x", -(2**256), "w")) == "x = <an integer of 257 bits>: w"
    assert str(bad_value(SpecError, "x", 10**5000, "w")) == "x = <an integer of 16,610 bits>: w"


def test_falcon_h1_float_expand_overflow_and_underflow_are_refused() -> None:
    """mamba_expand * hidden_size over 1e308 raised OverflowError; 1e-300 gave an inner size of 0."""
    with pytest.raises(SpecError) as e:
        from_config({**_FALCON, "hidden_size": 10**400})
    assert e.value.field == "config.hidden_size"
    with pytest.raises(SpecError) as e:
        from_config({**_FALCON, "mamba_expand": 1e-300})
    assert str(e.value) == (
        "config.mamba_expand = 1e-300: mamba_expand * hidden_size = 1e-300 * 1024 is under 1 channel"
    )
    # 4 channels: read as written (FalconH1Config, hence the default reader with transformers, wants an int)
    assert from_config({**_FALCON, "mamba_expand": 4 / 1024}, reader="json").spec.num_blocks > 0


@pytest.mark.parametrize("name,cfg", _configs(), ids=[n for n, _ in _configs()])
def test_every_number_of_every_config_at_hostile_sizes_gives_an_answer_or_a_named_error(
    name: str, cfg: dict[str, Any]
) -> None:
    """Each number of each fixture config (and of LFM2, Falcon-H1) set to 2**53, 10**300,
    1e-300 and 0.5: a plan and its summary, or a KVLayoutError; never another exception."""
    for path in _int_paths(cfg):
        for value in (2**53, 10**300, 1e-300, 0.5):
            try:
                summary(from_config(_with(cfg, path, value), tp=2))
            except KVLayoutError as e:
                assert e.field, (path, value)


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvlayout", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


JAMBA = str(FIXTURES / "jamba" / "config.json")


def test_zero_a_group_that_is_never_zeroed_clears_nothing_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``zero --group mamba.0`` (a Mamba group: no rows) said "unknown group", exit 2; vLLM's zeroer and
    kvlayout's drop-in take it and clear nothing. A name that is no group still exits 2, listing both."""
    assert main(["zero", "--config", JAMBA, "--blocks", "1,3", "--group", "mamba.0", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["zeroed"], rep["zeroed_bytes"], rep["block_ids"], rep["group"]) == ([], 0, [1, 3], "mamba.0")
    assert rep["matches_contract"] is True and rep["total_bytes"] == 16 * 8 * 163_840
    assert main(["zero", "--config", JAMBA, "--blocks", "2", "--group", "mamba.6"]) == 0
    assert "group 'mamba.6' holds no zeroed layer" in capsys.readouterr().out
    for argv, msg in (
        (
            ["--group", "nope", "--blocks", "1"],
            "group = 'nope': unknown group; valid groups: 'full'; groups "
            "that zero nothing: " + ", ".join(f"'mamba.{i}'" for i in range(7)),
        ),
        (["--group", "mamba.0", "--blocks", "16"], "--blocks item '16': block 16 outside [0, 16)"),
    ):
        assert main(["zero", "--config", JAMBA, *argv]) == 2
        assert capsys.readouterr().err.strip() == f"kvlayout zero: error: {msg}"
    # a spec without empty groups lists only its groups
    assert main(["zero", "--preset", "dsv4-test", "--blocks", "1", "--group", "nope"]) == 2
    assert capsys.readouterr().err.strip().endswith("unknown group; valid groups: 'mla'")


def test_reader_transformers_refuses_what_it_can_before_importing_transformers() -> None:
    """``--reader transformers`` imported transformers (2.7-5.6 s, 410 MB) before refusing ``{}``."""
    code = (
        "import sys\nfrom kvlayout.errors import SpecError\nfrom kvlayout.models import from_config\n"
        "for cfg in ({}, {'architectures': ['NopeForCausalLM']}, {'architectures': ['LlamaForCausalLM']}):\n"
        "    try:\n        from_config(cfg, reader='transformers')\n"
        "    except SpecError as e:\n        print(e)\n"
        "print('transformers' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = res.stdout.splitlines()
    assert lines[0] == "config.architectures = None: missing; it names the model class the engine builds"
    assert lines[1].startswith("config.architectures[0] = 'NopeForCausalLM': ")
    assert lines[2] == "config.num_hidden_layers = None: missing; the number of decoder layers"  # no hint
    assert lines[3] == "False"


def test_a_50000_character_name_is_not_echoed_whole() -> None:
    """--backend, KVLAYOUT_BACKEND and KVLAYOUT_VLLM_MODE of 50,000 characters were echoed whole."""
    from kvlayout.integrations.vllm_plugin import PluginConfigError, mode_from_env

    big = "x" * 50_000
    for argv, env in (
        (["--backend", big], None),
        (["--backend", big + ":y"], None),
        (["--backend", "kvlayout:" + big], None),
        ([], {"KVLAYOUT_BACKEND": big}),
    ):
        res = _cli("zero", "--preset", "dsv4-test", "--blocks", "1", *argv, env=env)
        assert res.returncode == 2 and len(res.stderr) < 400 and "xxx..." in res.stderr, (argv, res.stderr)
    with pytest.raises(PluginConfigError) as e:
        mode_from_env({"KVLAYOUT_VLLM_MODE": big})
    assert (
        str(e.value)
        == f"Invalid value '{'x' * 76}... for KVLAYOUT_VLLM_MODE. Valid options: verify, replace, off"
    )


def test_llama4_null_no_rope_layers_takes_the_interval() -> None:
    """``no_rope_layers: null`` with an interval was refused read as written; transformers' Llama4TextConfig
    takes null as empty: a NoPE layer every ``no_rope_layer_interval`` layers."""
    base = {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "llama4_text",
        "torch_dtype": "bfloat16",
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "attention_chunk_size": 64,
        "no_rope_layer_interval": 2,
    }
    for marks in (None, []):
        ms = from_config({**base, "no_rope_layers": marks})
        assert list(ms.kinds.values()) == ["chunked", "full"] * 2  # type: ignore[union-attr]
    with pytest.raises(SpecError) as e:
        from_config({**base, "no_rope_layers": None, "no_rope_layer_interval": None}, reader="json")
    assert str(e.value).startswith("config.no_rope_layers = None: missing")
    if importlib.util.find_spec("transformers") is not None:  # the default reader asks transformers, as vLLM
        with pytest.raises(SpecError, match="transformers refuses it .*'no_rope_layer_interval'"):
            from_config({**base, "no_rope_layers": None, "no_rope_layer_interval": None})


def test_deepseek_v4_layers_are_bounded_and_a_model_spec_plans_once() -> None:
    """DeepSeek-V4 at the 10,000-layer bound (38,178 caches) took 2.9-4.3 s to plan and summarize: its
    bound is 2,500 layers (9,546 caches, about 0.5 s); a ModelSpec's layout is planned once, not per use."""
    cfg = json.loads((FIXTURES / "deepseek_v4" / "config.json").read_text())
    cfg["compress_ratios"] = (cfg["compress_ratios"] * 60)[:2501]
    ms = from_config({**cfg, "num_hidden_layers": 2500})
    assert len(ms.spec.layers) == 9546 and ms.layout is ms.layout  # type: ignore[union-attr]
    with pytest.raises(SpecError) as e:
        from_config({**cfg, "num_hidden_layers": 2501})
    assert str(e.value) == (
        "config.num_hidden_layers = 2501: must be at most 2,500 for DeepSeek-V4 (up to five caches a layer)"
    )
