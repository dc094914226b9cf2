"""Rules of vLLM 0.33 / transformers that kvlayout.models must keep, each pinned so that the wrong rule
fails (issue 23, items 4 and 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.spec import MambaSpec
from tests import json_reader as J

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"


def config(family: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / family / "config.json").read_text())
    data.update(changes)
    return data


def _ms(cfg: dict[str, Any], **kw: Any) -> M.ModelSpec:
    ms = J.from_config(cfg, **kw)
    assert isinstance(ms, M.ModelSpec)
    return ms


def test_nemotron_h_one_group_is_replicated_up_to_tp() -> None:
    # n_groups 1 at tp 16: vLLM replicates the group to every head shard (16 groups), so the conv state
    # is (4 - 1, (128 * 64 + 2 * 16 * 128) / 16) = (3, 768): 3 * 768 * 2 = 4,608 B, + the ssm state
    # (128 / 16, 64, 128) float32 = 262,144 B: 266,752 B per Mamba page
    ms = _ms(config("nemotron_h", n_groups=1), tp=16)
    states = {x.real_page for _, x in ms.spec.layers if isinstance(x, MambaSpec)}
    assert states == {266_752}


def test_nemotron_h_groups_not_divisible_by_tp_are_refused() -> None:
    # MambaMixer2 asserts n_groups % tp == 0 or n_groups == 1: 8 groups at tp 16, 2 at tp 4
    for groups, tp in ((8, 16), (2, 4)):
        with pytest.raises(SpecError) as e:
            J.from_config(config("nemotron_h", n_groups=groups), tp=tp)
        assert e.value.field == "config.n_groups"
    assert _ms(config("nemotron_h"), tp=8).tp == 8  # 8 groups at tp 8 divide


def test_kv_heads_at_least_tp_must_divide() -> None:
    # Llama with 12 KV heads at tp 8: vLLM refuses (it does not floor 12 // 8 = 1); 12 at tp 4 is 3 per rank
    # hidden 6144: LlamaConfig refuses heads that do not divide hidden_size (issue 25, sixteenth pass)
    cfg = config("llama", num_attention_heads=48, num_key_value_heads=12, hidden_size=6144)
    with pytest.raises(SpecError) as e:
        J.from_config(cfg, tp=8)
    assert e.value.field == "config.num_key_value_heads"
    ms = _ms(cfg, tp=4)
    assert {x.num_kv_heads for _, x in ms.spec.layers} == {3}  # type: ignore[attr-defined]


def test_deepseek_v4_padding_tie_goes_to_the_larger_chunk() -> None:
    # ratios [0, 4, 4, 4]: the balanced buckets repeat 4 (window) and 3, 3 (ratio-4 caches and states);
    # chunks 3 and 4 both pad 2 repeats, and vLLM takes the larger: groups swa 4, compressed 6 (3 c4 +
    # 3 indexer), c4_states 6, and 149,760 B per block
    cfg = config("deepseek_v4", num_hidden_layers=4, compress_ratios=[0, 4, 4, 4])
    ms = _ms(cfg)
    sizes = [(g.name, len(g.layers)) for g in ms.spec.groups]
    assert sizes == [("swa", 4), ("compressed", 6), ("c4_states", 6)]
    assert ms.bytes_per_block == 149_760


def test_configs_vllm_or_transformers_refuse() -> None:
    bad = [
        (config("jamba", attn_layer_offset=8), "config.attn_layer_offset"),  # offset >= period 8
        (config("jamba", attn_layer_offset=9), "config.attn_layer_offset"),
        (config("gemma3"), None),  # placeholder replaced below
    ]
    gemma = config("gemma3")
    text = gemma["text_config"]
    n = text["num_hidden_layers"]
    types = ["sliding_attention"] * (n + 1)  # one more than num_hidden_layers: transformers refuses
    bad[2] = ({**gemma, "text_config": {**text, "layer_types": types}}, "config.text_config.layer_types")
    bad.append((config("llama", num_hidden_layers=10_001), "config.num_hidden_layers"))
    bad.append((config("llama", num_hidden_layers=10**9), "config.num_hidden_layers"))
    for cfg, field in bad:
        with pytest.raises(SpecError) as e:
            J.from_config(cfg)
        assert e.value.field == field
    assert len(_ms(config("llama", num_hidden_layers=1_000)).spec.layers) == 1_000


# --------------------------------------------------------------------------- reading configs as vLLM does
def test_no_torch_dtype_is_bfloat16_as_in_vllm() -> None:
    # gpt-oss's published config.json has none: vLLM's dtype auto (no safetensors to read) is bfloat16
    cfg = config("gpt_oss")
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    ms = _ms(cfg)
    assert ms.dtype == "bfloat16" and any("no torch_dtype" in x for x in ms.notes)


def test_transformers_reader_fills_gemma3_text_config_defaults() -> None:
    cfg = config("gemma3")
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim"):
        cfg["text_config"].pop(key)
    with pytest.raises(SpecError) as e:  # read as written: the field is missing
        J.from_config(cfg)
    assert e.value.field == "config.text_config.num_attention_heads"
    assert "reader='transformers' fills the config class's defaults" in str(e.value)
    ms = _ms(cfg, reader="transformers")  # Gemma3TextConfig: 8 heads, 4 KV heads, head_dim 256
    assert {x.page for _, x in ms.spec.layers} == {2 * 16 * 4 * 256 * 2}
    assert any("Gemma3Config" in x for x in ms.notes)


def test_transformers_reader_agrees_on_every_fixture_and_refuses_what_it_refuses() -> None:
    for path in sorted(FIXTURES.glob("*/config.json")):
        for kw in ({}, {"tp": 2}, {"kv_cache_dtype": "fp8"}):
            a, b = (
                _ms(json.loads(path.read_text()), **kw),
                _ms(json.loads(path.read_text()), reader="transformers", **kw),
            )
            assert (a.bytes_per_block, a.block_size) == (b.bytes_per_block, b.block_size), (path, kw)
            assert [[x.name for x in g.layers] for g in a.spec.groups] == [
                [x.name for x in g.layers] for g in b.spec.groups
            ]
    with pytest.raises(SpecError) as e:  # transformers' layer_types validation
        J.from_config(config("gpt_oss", layer_types=["full_attention"]), reader="transformers")
    assert e.value.field == "config"
    with pytest.raises(SpecError) as e:
        J.from_config(config("llama", num_hidden_layers=10**9), reader="transformers")
    assert e.value.field == "config.num_hidden_layers"
    with pytest.raises(SpecError) as e:
        J.from_config(config("llama"), reader="hf")
    assert e.value.field == "reader"
