"""Rules of kvlayout.models that decide bytes (KV heads per rank, head sizes, which layers slide, groups,
padding chunks, MLA rows), each value computed here from the config by the rule's formula (issue 25:
mutation coverage of kvlayout.models). Fast: the functions are called in-process on small configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models.attention import VARIATIONS, Variation, layer_types, read_attention, token_bytes
from kvlayout.models.config import Config
from kvlayout.models.grouping import _least_padding_chunk, vllm_groups, vllm_packed_groups
from kvlayout.spec import FullAttentionSpec, MLASpec
from tests import json_reader as J


def _cfg(**data: Any) -> Config:
    return Config(data, "config")


def _drop(cfg: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``cfg`` without ``keys``: a field left out (a null is refused where transformers' class refuses it)."""
    return {k: v for k, v in cfg.items() if k not in keys}


def _field(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(SpecError) as e:
        fn(*args, **kw)
    return str(e.value.field)


def test_kv_heads_per_rank_and_head_size_follow_vllm() -> None:
    # (query heads, KV heads, tp): per rank max(1, kv // tp); head size head_dim, else hidden // heads
    for heads, kv, tp in (
        (32, 8, 1),
        (32, 8, 2),
        (32, 8, 8),
        (32, 8, 16),
        (32, 8, 32),
        (48, 12, 4),
        (8, 1, 8),
    ):
        att = read_attention(_cfg(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=4096), tp)
        assert (att.heads, att.kv_heads, att.head_size) == (heads, max(1, kv // tp), 4096 // heads)
        att = read_attention(_cfg(num_attention_heads=heads, num_key_value_heads=kv, head_dim=96), tp)
        assert (att.kv_heads, att.head_size) == (max(1, kv // tp), 96)
        # no KV field: the query heads
        att = read_attention(_cfg(num_attention_heads=heads, head_dim=64), tp)
        assert att.kv_heads == max(1, heads // tp)
    # head_keys: the first written one wins; hidden // heads (floor) without any
    cfg = _cfg(num_attention_heads=6, num_key_value_heads=2, hidden_size=1000, a=40, b=50)
    assert read_attention(cfg, 1, head_keys=("a", "b")).head_size == 40
    assert read_attention(cfg, 1, head_keys=("c", "b")).head_size == 50
    assert read_attention(cfg, 1, head_keys=("c",)).head_size == 1000 // 6
    # head_dim ignored by a variation
    cfg = _cfg(num_attention_heads=8, num_key_value_heads=8, hidden_size=2048, head_dim=128)
    assert read_attention(cfg, 1, variation=Variation(head_dim=False)).head_size == 2048 // 8
    # the token: K plus V of the rank's heads
    att = read_attention(_cfg(num_attention_heads=32, num_key_value_heads=8, head_dim=128), 2)
    assert token_bytes(att, "bfloat16") == 2 * 4 * 128 * 2
    assert token_bytes(att, "float8_e4m3fn") == 2 * 4 * 128 * 1
    assert token_bytes(att, "float32") == 2 * 4 * 128 * 4


def test_kv_and_query_heads_that_tp_does_not_split_are_refused() -> None:
    ok = {"hidden_size": 4096}
    assert _field(read_attention, _cfg(num_attention_heads=30, num_key_value_heads=6, **ok), 4) == (
        "config.num_attention_heads"
    )
    # 12 KV heads at tp 8 (>= tp, not divisible); 3 at tp 4 (< tp, tp not a multiple)
    assert _field(read_attention, _cfg(num_attention_heads=48, num_key_value_heads=12, **ok), 8) == (
        "config.num_key_value_heads"
    )
    assert _field(read_attention, _cfg(num_attention_heads=48, num_key_value_heads=3, **ok), 16) == (
        "config.num_key_value_heads"
    )
    # the boundaries: kv == tp divides; kv 4 < tp 8 replicated; kv 2 < tp 8
    for kv, tp in ((8, 8), (4, 8), (2, 8), (1, 8), (16, 8)):
        assert read_attention(_cfg(num_attention_heads=64, num_key_value_heads=kv, **ok), tp).kv_heads == (
            max(1, kv // tp)
        )
    # the error names the field the KV heads came from
    assert (
        _field(read_attention, _cfg(num_attention_heads=48, num_kv_heads=12, **ok), 8)
        == "config.num_kv_heads"
    )
    assert _field(read_attention, _cfg(num_attention_heads=48, **ok), 32) == "config.num_attention_heads"
    with pytest.raises(SpecError) as e:
        read_attention(_cfg(num_attention_heads=48, num_key_value_heads=12, **ok), 8)
    assert "tp = 8" in str(e.value)
    # no head size at all: hidden_size is required
    assert _field(read_attention, _cfg(num_attention_heads=8), 1) == "config.hidden_size"


def test_kv_head_fields_first_found_and_conflicts() -> None:
    base = {"num_attention_heads": 64, "head_dim": 128}
    keys = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    for i, key in enumerate(keys):
        assert read_attention(_cfg(**base, **{key: 8}), 1).kv_heads == 8
        for later in keys[i + 1 :]:
            # the same value twice: fine; two values: the later field is refused, naming the first
            assert read_attention(_cfg(**base, **{key: 4, later: 4}), 2).kv_heads == 2
            with pytest.raises(SpecError) as e:
                read_attention(_cfg(**base, **{key: 4, later: 8}), 1)
            assert e.value.field == f"config.{later}" and e.value.value == 8
            assert f"differs from {key} = 4" in str(e.value)
    # three fields, the third differs
    assert _field(read_attention, _cfg(**base, n_head_kv=4, num_kv_heads=4, num_key_value_heads=2), 1) == (
        "config.num_key_value_heads"
    )


def test_kv_heads_of_the_named_variations() -> None:
    base = {"num_attention_heads": 16, "hidden_size": 2048, "head_dim": 64, "num_key_value_heads": 2}
    heads = VARIATIONS["BloomForCausalLM"]
    att = read_attention(_cfg(**base), 2, variation=heads)
    assert (att.kv_heads, att.head_size) == (16 // 2, 2048 // 16)
    glm = VARIATIONS["ChatGLMModel"]
    assert (
        read_attention(
            _cfg(**base, multi_query_attention=True, multi_query_group_num=4), 2, variation=glm
        ).kv_heads
        == 2
    )
    assert (
        read_attention(
            _cfg(**base, multi_query_attention=False, multi_query_group_num=4), 2, variation=glm
        ).kv_heads
        == 8
    )
    assert _field(read_attention, _cfg(**base), 1, variation=glm) == "config.multi_query_attention"
    assert _field(read_attention, _cfg(**base, multi_query_attention=True), 1, variation=glm) == (
        "config.multi_query_group_num"
    )
    # ChatGLM's group count at tp 8 is refused naming it
    assert (
        _field(
            read_attention,
            _cfg(**base, multi_query_attention=True, multi_query_group_num=6),
            4,
            variation=glm,
        )
        == "config.multi_query_group_num"
    )
    falcon = VARIATIONS["FalconForCausalLM"]
    f = {"new_decoder_architecture": True, "num_kv_heads": 8}
    assert read_attention(_cfg(**base, **f), 2, variation=falcon).kv_heads == 4
    assert (
        _field(
            read_attention,
            _cfg(**{**base, "num_attention_heads": 48}, new_decoder_architecture=True, num_kv_heads=12),
            8,
            variation=falcon,
        )
        == "config.num_kv_heads"
    )
    mq = {"new_decoder_architecture": False, "multi_query": True}
    assert read_attention(_cfg(**base, **mq), 4, variation=falcon).kv_heads == 1
    plain = {"new_decoder_architecture": False, "multi_query": False}
    assert read_attention(_cfg(**base, **plain), 4, variation=falcon).kv_heads == 16 // 4
    assert _field(read_attention, _cfg(**base), 1, variation=falcon) == "config.new_decoder_architecture"
    assert _field(read_attention, _cfg(**base, new_decoder_architecture=False), 1, variation=falcon) == (
        "config.multi_query"
    )
    assert _field(read_attention, _cfg(**base, new_decoder_architecture=True), 1, variation=falcon) == (
        "config.num_kv_heads"
    )


def test_which_layers_slide_per_family() -> None:
    n = 6
    full, sliding = ["full"] * n, ["sliding"] * n
    lt = ["sliding_attention", "full_attention"] * 3
    written = ["sliding", "full"] * 3
    # gemma2 alternates, gemma3 by its pattern, layer_types when written
    assert layer_types(_cfg(), "gemma2", n) == ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    for p in (1, 2, 3, 4):
        assert layer_types(_cfg(sliding_window_pattern=p), "gemma3", n) == [
            "full" if (i + 1) % p == 0 else "sliding" for i in range(n)
        ]
    assert _field(layer_types, _cfg(), "gemma3", n) == "config.sliding_window_pattern"
    for fam in ("gemma2", "gemma3", "llama", "mistral", "phi3"):
        assert layer_types(_cfg(layer_types=lt, sliding_window=4), fam, n) == written
        assert layer_types(_cfg(layer_types=lt[::-1], sliding_window=4), fam, n) == written[::-1]
    # GPT-OSS: even layers slide whatever layer_types say (GptOssAttention; audit after pass 22)
    for types in (None, lt[::-1], ["full_attention"] * n):
        kw = {} if types is None else {"layer_types": types}
        assert layer_types(_cfg(sliding_window=4, **kw), "gpt_oss", n) == written
    # Qwen3-MoE: one engine window, withheld by mixed layer_types
    on = {"sliding_window": 4, "use_sliding_window": True}
    assert layer_types(_cfg(layer_types=lt, **on), "qwen3_moe", n) == full
    assert layer_types(_cfg(layer_types=["sliding_attention"] * n, **on), "qwen3_moe", n) == sliding
    with pytest.raises(SpecError) as e:
        layer_types(_cfg(layer_types=[*lt[:-1], "chunked_attention"]), "gemma2", n)
    assert e.value.field == f"config.layer_types[{n - 1}]" and e.value.value == "chunked_attention"
    assert "sliding_attention, full_attention" in str(e.value)
    assert _field(layer_types, _cfg(layer_types=lt[:-1]), "gemma2", n) == "config.layer_types"
    # Qwen3-MoE: the one window only with use_sliding_window true; Phi-3: whenever written
    assert layer_types(_cfg(sliding_window=8, use_sliding_window=True), "qwen3_moe", n) == sliding
    assert layer_types(_cfg(sliding_window=8, use_sliding_window=False), "qwen3_moe", n) == full
    assert layer_types(_cfg(sliding_window=8, use_sliding_window=1), "qwen3_moe", n) == full
    # the flag with no window: named as read as written (the class's 4,096; pass 24); a null window: full
    assert _field(layer_types, _cfg(use_sliding_window=True), "qwen3_moe", n) == "config.sliding_window"
    assert layer_types(_cfg(use_sliding_window=True, sliding_window=None), "qwen3_moe", n) == full
    assert layer_types(_cfg(sliding_window=8), "phi3", n) == sliding
    assert layer_types(_cfg(), "phi3", n) == full
    # Mistral: sliding_window must be written; null is full attention
    assert layer_types(_cfg(sliding_window=4096), "mistral", n) == sliding
    assert layer_types(_cfg(sliding_window=None), "mistral", n) == full
    assert _field(layer_types, _cfg(), "mistral", n) == "config.sliding_window"
    # Llama: without layer_types LlamaAttention passes no window, so every layer takes the engine's one
    # (tests/test_models_vllm_truth.py, llama_sw); with them, the written ones
    assert layer_types(_cfg(sliding_window=8), "llama", n) == sliding
    assert layer_types(_cfg(), "llama", n) == full
    assert layer_types(_cfg(sliding_window=8, layer_types=["full_attention"] * n), "llama", n) == full


def test_qwen2_slides_only_when_every_layer_does() -> None:
    n = 4
    assert layer_types(_cfg(use_sliding_window=False, sliding_window=8), "qwen2", n) == ["full"] * n
    assert layer_types(_cfg(use_sliding_window=True, max_window_layers=0, sliding_window=8), "qwen3", n) == (
        ["sliding"] * n
    )
    # a window on some layers only: refused unless max_window_layers == n, which leaves every layer full
    for first in (1, 2, 3):
        with pytest.raises(SpecError) as e:
            layer_types(_cfg(use_sliding_window=True, max_window_layers=first), "qwen2", n)
        assert e.value.field == "config.max_window_layers" and e.value.value == first
        assert f"must equal {n}" in str(e.value)
    # max_window_layers == n: no layer slides (i >= n never), all full
    assert layer_types(_cfg(use_sliding_window=True, max_window_layers=n), "qwen2", n) == ["full"] * n
    assert layer_types(_cfg(use_sliding_window=True, max_window_layers=n + 3), "qwen2", n) == ["full"] * n
    assert _field(layer_types, _cfg(), "qwen2", n) == "config.use_sliding_window"
    assert _field(layer_types, _cfg(use_sliding_window=True), "qwen2", n) == "config.max_window_layers"
    # written layer_types: mixed refused unless max_window_layers == n (then full); uniform kept
    mixed = ["sliding_attention", "full_attention", "full_attention", "full_attention"]
    assert _field(layer_types, _cfg(layer_types=mixed, max_window_layers=3), "qwen2", n) == (
        "config.max_window_layers"
    )
    assert layer_types(_cfg(layer_types=mixed, max_window_layers=n), "qwen2", n) == ["full"] * n
    every = ["sliding_attention"] * n
    assert layer_types(_cfg(layer_types=every, use_sliding_window=True), "qwen2", n) == ["sliding"] * n
    assert layer_types(_cfg(layer_types=every, use_sliding_window=False), "qwen2", n) == ["full"] * n
    assert _field(layer_types, _cfg(layer_types=every), "qwen2", n) == "config.use_sliding_window"
    with pytest.raises(SpecError) as e:
        layer_types(_cfg(layer_types=mixed), "qwen2", n)
    assert e.value.field == "config.max_window_layers" and e.value.value is None


def test_generic_windows_and_variations() -> None:
    n = 4
    lt = ["sliding_attention", "full_attention"] * 2
    # generic: the engine's one window only when no layer_types or all slide
    assert layer_types(_cfg(sliding_window=8), "generic", n) == ["sliding"] * n
    assert layer_types(_cfg(), "generic", n) == ["full"] * n
    assert layer_types(_cfg(sliding_window=8, layer_types=lt), "generic", n) == ["full"] * n
    assert layer_types(_cfg(sliding_window=8, layer_types=["sliding_attention"] * n), "generic", n) == (
        ["sliding"] * n
    )
    assert layer_types(_cfg(layer_types=["sliding_attention"] * n), "generic", n) == ["full"] * n
    # generic_sw: per layer when written, else all when sliding_window is set
    assert layer_types(_cfg(sliding_window=8, layer_types=lt), "generic_sw", n) == ["sliding", "full"] * 2
    assert layer_types(_cfg(sliding_window=8), "generic_sw", n) == ["sliding"] * n
    assert layer_types(_cfg(), "generic_sw", n) == ["full"] * n
    # variations: none, engine, layer, window_flag, layer_types required
    sw = _cfg(sliding_window=8, layer_types=lt)
    assert layer_types(sw, "generic_sw", n, Variation(window="none")) == ["full"] * n
    assert layer_types(sw, "generic_sw", n, Variation(window="engine")) == ["full"] * n
    assert layer_types(sw, "generic", n, Variation(window="layer")) == ["sliding", "full"] * 2
    flag = Variation(window_flag="use_sliding_window")
    assert layer_types(_cfg(sliding_window=8, use_sliding_window=False), "generic", n, flag) == ["full"] * n
    assert layer_types(_cfg(sliding_window=8, use_sliding_window=True), "generic", n, flag) == ["sliding"] * n
    assert _field(layer_types, _cfg(sliding_window=8), "generic", n, flag) == "config.use_sliding_window"
    assert layer_types(_cfg(), "generic", n, flag) == ["full"] * n  # no window: the flag is not read
    need = Variation(layer_types=True)
    assert _field(layer_types, _cfg(sliding_window=8), "generic_sw", n, need) == "config.layer_types"
    assert layer_types(sw, "generic_sw", n, need) == ["sliding", "full"] * 2
    # a variation applies to the generic families only
    assert layer_types(_cfg(sliding_window=8), "phi3", n, Variation(window="none")) == ["sliding"] * n


def test_attention_family_pages_and_groups() -> None:
    # Gemma-2-like through from_config: 2 KV heads of 256 at tp 1; the window + 1 of Cohere 2
    cfg = {
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_size": 2304,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(cfg, tp=2, block_size=16)
    assert isinstance(ms, M.ModelSpec)
    layers = {x.name: x for _, x in ms.spec.layers}
    for i in range(6):
        x = layers[f"model.layers.{i}.self_attn.attn"]
        assert (x.num_kv_heads, x.head_size, x.block_size, x.dtype) == (2, 256, 16, "bfloat16")
        assert x.real_page == 16 * 2 * 2 * 256 * 2
        assert getattr(x, "window", None) == (4096 if i % 2 == 0 else None)
        assert ms.kinds[x.name] == ("sliding" if i % 2 == 0 else "full")
    cohere = {
        "architectures": ["Cohere2ForCausalLM"],
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 1024,
        "sliding_window": 100,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "torch_dtype": "float16",
    }
    ms = J.from_config(cohere, tp=1, block_size=32)
    assert isinstance(ms, M.ModelSpec)
    wins = [getattr(x, "window", None) for _, x in ms.spec.layers]
    assert sorted(w for w in wins if w) == [101, 101, 101]
    # 3 sliding, 1 full: size 1 (3 >= 1.5 * 1): the sliding kind splits into 3 groups of one layer
    assert sorted(len(g.layers) for g in ms.spec.groups) == [1, 1, 1, 1]


def _layers(kind: str, n: int) -> list[FullAttentionSpec]:
    return [
        FullAttentionSpec(name=f"{kind}{i}", block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
        for i in range(n)
    ]


def test_vllm_groups_split_by_the_fewest_layers() -> None:
    assert [g.name for g in vllm_groups([("full", _layers("f", 3))])] == ["full"]
    assert [g.name for g in vllm_groups([("full", _layers("f", 3)), ("x", [])])] == ["full"]
    for a, b in ((10, 30), (10, 14), (10, 15), (2, 3), (2, 5), (4, 4), (5, 12), (7, 3)):
        groups = vllm_groups([("full", _layers("f", a)), ("sliding", _layers("s", b))])
        size = min(a, b)
        if max(a, b) * 2 < size * 3:
            size = max(a, b)
        want = []
        for kind, count in (("full", a), ("sliding", b)):
            k = -(-count // size)
            names = [f"{kind[0]}{i}" for i in range(count)]
            want += [(kind if k == 1 else f"{kind}.{j}", names[j::k]) for j in range(k)]
        assert [(g.name, [x.name for x in g.layers]) for g in groups] == want, (a, b)
    # 10 and 15: 15 is not under 1.5 * 10, so size 10 and the sliding kind is two groups
    assert [len(g.layers) for g in vllm_groups([("f", _layers("f", 10)), ("s", _layers("s", 15))])] == [
        10,
        8,
        7,
    ]


def test_least_padding_chunk_prefers_the_larger_tie() -> None:
    def brute(values: list[int], lo: int) -> int:
        cands = range(lo, max(max(values), lo) + 1)
        pads = {d: sum(-x % d for x in values) for d in cands}
        least = min(pads.values())
        return max(d for d in cands if pads[d] == least)

    cases = ([3, 3, 4], [4, 3, 3], [1], [5], [6, 4], [2, 3, 5, 7], [8, 12], [9, 6, 3], [1, 1, 2])
    for values in cases:
        for lo in (1, 2, 3, 4, 9, 10):
            assert _least_padding_chunk(values, lo) == brute(values, lo), (values, lo)
    assert _least_padding_chunk([3, 3, 4], 3) == 4  # chunks 3 and 4 both pad 2: the larger


def _mla(name: str, head: int) -> MLASpec:
    return MLASpec(name=name, block_size=64, head_size=head, dtype="bfloat16")


def test_packed_groups_split_balanced_buckets_by_repeats() -> None:
    # bucket a: pages 512 and 256, 4 layers each, interleaved (balanced, mixed, 4 repeats);
    # bucket b: one page, 3 layers (balanced, 3 repeats); bucket c: 2 of one page + 1 of another
    layers: list[tuple[tuple[str, str, int, int | None], MLASpec]] = []
    for i in range(4):
        layers.append((("a", "mla", 64, None), _mla(f"a{i}x", 256)))
        layers.append((("a", "mla", 64, None), _mla(f"a{i}y", 128)))
    layers += [(("b", "mla", 64, 8), _mla(f"b{i}", 256)) for i in range(3)]
    layers += [(("c", "mla", 32, None), _mla(f"c{i}", 256 if i < 2 else 128)) for i in range(3)]
    groups = vllm_packed_groups(layers)
    # floor 4 (the mixed balanced bucket's repeats); chunk >= 4 padding [4, 3] least: 4 (pad 1) vs others
    per = _least_padding_chunk([4, 3], 4)
    assert per == 4
    got = [(g.name, [x.name for x in g.layers]) for g in groups]
    assert got == [
        ("a", [f"a{i}{s}" for i in range(4) for s in "xy"]),
        ("b", ["b0", "b1", "b2"]),
        ("c", ["c0", "c1", "c2"]),
    ]
    # the same bucket a with 6 repeats and a balanced bucket of 4 and 2 repeats: floor 6, chunk 6 ->
    # a is one group; with floor 2 (a smaller mixed bucket) the buckets split
    layers = []
    for i in range(2):
        layers.append((("m", "mla", 64, None), _mla(f"m{i}x", 256)))
        layers.append((("m", "mla", 64, None), _mla(f"m{i}y", 128)))
    layers += [(("s", "mla", 64, 4), _mla(f"s{i}", 256)) for i in range(6)]
    groups = vllm_packed_groups(layers)
    # repeats [2, 6], floor 2: chunk 2 pads 0, 3 pads 1+0, 6 pads 4+0... least padding, larger tie
    per = _least_padding_chunk([2, 6], 2)
    want = []
    for name, reps, pick in (("m", 2, lambda j: [f"m{j}x", f"m{j}y"]), ("s", 6, lambda j: [f"s{j}"])):
        k = -(-reps // per)
        if k == 1:
            want.append((name, [n for j in range(reps) for n in pick(j)]))
        else:
            want += [(f"{name}.{g}", [n for j in range(g, reps, k) for n in pick(j)]) for g in range(k)]
    assert [(g.name, [x.name for x in g.layers]) for g in groups] == want
    assert len(groups) == 1 + 3  # per 2: m whole, s in 3 groups of two repeats


def test_mla_rows_and_indexer() -> None:
    base = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 3,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "hidden_size": 2048,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(base, tp=4)
    assert isinstance(ms, M.ModelSpec)
    assert [g.name for g in ms.spec.groups] == ["mla"]
    for i, (_, x) in enumerate(ms.spec.layers):
        name = x.name
        assert name == f"model.layers.{i}.self_attn.attn" and ms.kinds[name] == "mla"
        assert x.head_size == 512 + 64 and x.real_page == x.block_size * (512 + 64) * 2
    assert _field(J.from_config, {**base, "num_attention_heads": 18}, tp=4) == "config.num_attention_heads"
    assert (
        _field(J.from_config, {k: v for k, v in base.items() if k != "kv_lora_rank"}) == "config.kv_lora_rank"
    )
    assert _field(J.from_config, {k: v for k, v in base.items() if k != "qk_rope_head_dim"}) == (
        "config.qk_rope_head_dim"
    )
    # V3.2 (index_topk written): an indexer per layer of index_head_dim + index_head_dim // 128 * 4 bytes
    v32 = {**base, "index_topk": 2048, "index_head_dim": 128}
    for kv_dtype in (None, "fp8"):
        ms = J.from_config(v32, tp=1, kv_cache_dtype=kv_dtype)
        assert isinstance(ms, M.ModelSpec) and ms.family == "deepseek_v32"
        names = [x.name for _, x in ms.spec.layers]
        assert names == [
            f"model.layers.{i}.self_attn.{t}" for i in range(3) for t in ("indexer.k_cache", "attn")
        ]
        for _, x in ms.spec.layers:
            name = x.name
            if "indexer" in name:
                assert ms.kinds[name] == "indexer"
                assert x.real_page == x.block_size * (128 + 128 // 128 * 4)
            else:
                assert ms.kinds[name] == "mla"
                row = 512 + 512 // 128 * 4 + 2 * 64 if kv_dtype else (512 + 64) * 2
                assert row == (656 if kv_dtype else 1152)
                assert x.real_page == x.block_size * row
        assert ms.kv_cache_dtype == ("fp8_ds_mla" if kv_dtype else "bfloat16")
    assert _field(J.from_config, {**base, "index_topk": 2048}) == "config.index_head_dim"


def test_backend_resolution_per_device_and_cache() -> None:
    from kvlayout.models.backends import BACKENDS, resolve

    def r(**kw: Any) -> tuple[str, int]:
        x = resolve(**kw)
        return x.backend.name, x.block_size

    # vLLM 0.33's priority lists (module docstring): the first backend that takes the cache
    assert r(mla=False, device="hopper", kv_cache_dtype="auto") == ("FLASH_ATTN", 16)
    assert r(mla=False, device="blackwell", kv_cache_dtype="auto") == ("FLASHINFER", 16)
    # FA2 on SM80 takes no fp8 cache: the next backend (issue 25, sixteenth pass, F5)
    assert r(mla=False, device="ampere", kv_cache_dtype="fp8") == ("FLASHINFER", 16)
    # fp8_e5m2: FLASH_ATTN does not take it, FLASHINFER does
    assert r(mla=False, device="hopper", kv_cache_dtype="fp8_e5m2") == ("FLASHINFER", 16)
    assert r(mla=True, device="hopper", kv_cache_dtype="auto") == ("FLASH_ATTN_MLA", 16)
    assert r(mla=True, device="hopper", kv_cache_dtype="fp8") == ("FLASHMLA", 64)
    assert r(mla=True, device="blackwell", kv_cache_dtype="auto", qk_nope_head_dim=128) == (
        "FLASHINFER_MLA",
        32,
    )
    assert r(mla=True, device="blackwell", kv_cache_dtype="fp8", qk_nope_head_dim=96) == ("CUTLASS_MLA", 128)
    assert r(mla=True, device="ampere", kv_cache_dtype="auto") == ("TRITON_MLA", 16)
    # a user block size rules backends out: 32 stays on FLASH_ATTN_MLA (multiple of 16); 64 on FLASHMLA fp8
    assert r(mla=True, device="hopper", kv_cache_dtype="auto", block_size=32) == ("FLASH_ATTN_MLA", 16)
    assert r(mla=True, device="hopper", kv_cache_dtype="fp8", block_size=128) == ("FLASHMLA", 64)
    assert r(mla=False, device="blackwell", kv_cache_dtype="auto", block_size=48) == ("FLASHINFER", 16)
    with pytest.raises(SpecError) as e:
        resolve(mla=True, device="hopper", kv_cache_dtype="fp8", block_size=8)
    # FLASHMLA takes fp8 at its own 64: the block size is the field no backend takes (hostile pass 13, F7)
    assert e.value.field == "block_size" and "block_size not supported" in str(e.value)
    assert "FLASHMLA: block_size not supported" in str(e.value) and "no vLLM MLA backend on hopper" in str(
        e.value
    )
    # sparse MLA: FLASH_ATTN_MLA_SPARSE (bf16) or FLASHMLA_SPARSE (fp8) on Hopper; named elsewhere
    assert r(mla=True, sparse=True, device="hopper", kv_cache_dtype="auto") == ("FLASH_ATTN_MLA_SPARSE", 64)
    assert r(mla=True, sparse=True, device="hopper", kv_cache_dtype="fp8") == ("FLASHMLA_SPARSE", 64)
    with pytest.raises(SpecError) as e:
        resolve(mla=True, sparse=True, device="hopper", kv_cache_dtype="fp8_e4m3")
    assert e.value.field == "kv_cache_dtype" and "sparse MLA" in str(e.value)
    assert "FLASH_ATTN_MLA_SPARSE: kv_cache_dtype fp8_e4m3 not supported" in str(e.value)
    assert "FLASH_ATTN_MLA:" not in str(e.value)  # non-sparse backends are not listed as skipped
    for dev in ("blackwell", "ampere"):
        assert _field(resolve, mla=True, sparse=True, device=dev, kv_cache_dtype="auto") == "device"
    x = resolve(
        mla=True, sparse=True, device="blackwell", kv_cache_dtype="auto", attention_backend="FLASHMLA_SPARSE"
    )
    assert (x.backend.name, x.block_size, x.reason) == (
        "FLASHMLA_SPARSE",
        64,
        "--attention-backend FLASHMLA_SPARSE",
    )
    # the reason names the skipped backends
    x = resolve(mla=True, device="hopper", kv_cache_dtype="fp8")
    assert x.reason == (
        "first valid MLA backend on hopper in vLLM's priority list "
        "(skipped FLASH_ATTN_MLA: kv_cache_dtype fp8 not supported)"
    )
    assert resolve(mla=False, device="hopper", kv_cache_dtype="auto").reason == (
        "first valid attention backend on hopper in vLLM's priority list"
    )
    # TRITON_MLA with an fp8 cache needs compute capability 8.9: refused on Ampere
    with pytest.raises(SpecError) as e:
        resolve(mla=True, device="ampere", kv_cache_dtype="fp8")
    assert e.value.field == "kv_cache_dtype" and "TRITON_MLA" in str(e.value) and "8.9" in str(e.value)
    with pytest.raises(SpecError) as e:
        resolve(mla=True, device="ampere", kv_cache_dtype="fp8", attention_backend="TRITON_MLA")
    assert e.value.value == "fp8"
    # a named backend: its preferred block, or a refusal saying why
    for name, dev, kv, bs in (
        ("FLASHINFER", "hopper", "auto", 16),
        ("TRITON_ATTN", "ampere", "fp8_e5m2", 16),
        ("CUTLASS_MLA", "blackwell", "auto", 128),
        ("FLASHMLA", "blackwell", "auto", 64),
        ("TRITON_MLA", "hopper", "fp8", 16),
    ):
        x = resolve(mla=BACKENDS[name].mla, device=dev, kv_cache_dtype=kv, attention_backend=name)
        assert (x.backend.name, x.block_size) == (name, bs)
    for kw, why in (
        (
            {"mla": False, "attention_backend": "FLASHMLA"},
            "valid for attention: FLASH_ATTN, FLASHINFER, TRITON_ATTN",
        ),
        ({"mla": True, "attention_backend": "NOPE"}, "valid for MLA: FLASH_ATTN_MLA, FLASHMLA"),
        ({"mla": True, "attention_backend": 3}, "valid for MLA"),
        (
            {"mla": True, "attention_backend": "CUTLASS_MLA"},
            "refuses it on hopper: compute capability not supported",
        ),
        (
            {"mla": True, "attention_backend": "FLASH_ATTN_MLA_SPARSE"},
            "refuses it on hopper: non-sparse not supported",
        ),
        ({"mla": True, "sparse": True, "attention_backend": "FLASHMLA"}, "sparse not supported"),
        (
            {"mla": False, "attention_backend": "FLASH_ATTN", "kv_cache_dtype": "fp8_e5m2"},
            "kv_cache_dtype fp8_e5m2",
        ),
        ({"mla": False, "attention_backend": "FLASHINFER", "block_size": 8}, "block_size not supported"),
    ):
        kw = {"device": "hopper", "kv_cache_dtype": "auto", **kw}
        with pytest.raises(SpecError) as e:
            resolve(**kw)
        assert e.value.field == "attention_backend" and why in str(e.value), (kw, str(e.value))
    with pytest.raises(SpecError) as e:
        resolve(
            mla=True,
            device="blackwell",
            kv_cache_dtype="auto",
            qk_nope_head_dim=96,
            attention_backend="FLASHINFER_MLA",
        )
    assert "qk_nope_head_dim 96 not in [64, 128, 192]" in str(e.value)
    assert "CUTLASS_MLA" not in "".join(n for n, b in BACKENDS.items() if b.mla is False)  # the table's kinds
    for bad in ("volta", None, 9):
        assert _field(resolve, mla=False, device=bad, kv_cache_dtype="auto") == "device"


def test_backend_block_sizes() -> None:
    from kvlayout.models.backends import BACKENDS

    want = {"FLASHINFER": 16, "FLASHMLA": 64, "FLASHINFER_MLA": 32, "CUTLASS_MLA": 128, "FLASH_ATTN": 16}
    for name, bs in want.items():
        assert BACKENDS[name].preferred_block_size() == bs
    fi = BACKENDS["FLASHINFER_MLA"]  # sizes 32 and 64
    assert [b for b in (16, 32, 48, 64, 96, 128) if fi.accepts(b)] == [32, 64, 96, 128]
    fa = BACKENDS["FLASH_ATTN"]  # MultipleOf(16)
    assert [b for b in (8, 16, 24, 32, 48) if fa.accepts(b)] == [16, 32, 48]
    # the sparse backends' stride alignment (whole token rows) is a no-op under the LBNHC vLLM resolves
    # for them: their pages carry none (tests/test_models.py compares the bytes per block with vLLM's)
    v32 = Path(__file__).parent / "fixtures" / "models" / "deepseek_v32" / "config.json"
    for kv in (None, "fp8"):
        for device in ("hopper", "blackwell"):
            ms = M.from_config(v32, kv_cache_dtype=kv, device=device, attention_backend="FLASHMLA_SPARSE")
            assert isinstance(ms, M.ModelSpec) and ms.block_size == 64
            assert all(getattr(x, "block_stride_alignment", None) is None for _, x in ms.spec.layers)


def _hybrid_block(state: int, per_token: int, given: int | None) -> int:
    """vLLM's hybrid alignment (kvlayout.models.hybrid docstring), written out here."""
    unit = max(16, given or 16)
    need = unit * -(-state // (unit * per_token))
    need = 16 * -(-need // 16)
    return max(given or 16, need)


def _check_hybrid(
    ms: Any, state: int, per_token: int, given: int | None, mamba: list[str], attn: list[str]
) -> None:
    assert isinstance(ms, M.ModelSpec)
    bs = _hybrid_block(state, per_token, given)
    page = bs * per_token
    assert ms.block_size == bs
    got = {x.name: x for _, x in ms.spec.layers}
    assert sorted(got) == sorted(mamba + attn)
    for name in attn:
        assert got[name].block_size == bs and got[name].real_page == page and ms.kinds[name] == "full"
    for name in mamba:
        x = got[name]
        assert x.state_bytes == state and x.page == page
        assert x.alignment == (page if page != state else None)
    assert f"hybrid: {bs}-token blocks; {page:,} B attention page >= {state:,} B Mamba state" in " ".join(
        ms.notes
    )
    assert f"(+{page - state:,} B padding)" in " ".join(ms.notes)


def test_hybrid_states_and_aligned_blocks() -> None:
    jamba = {
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 8,
        "attn_layer_period": 4,
        "attn_layer_offset": 2,
        "hidden_size": 512,
        "mamba_expand": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 16,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "torch_dtype": "bfloat16",
    }
    for tp, given, ssm in ((2, None, None), (1, 32, None), (2, 160, "float32"), (2, 64, "auto")):
        inner = 2 * 512 // tp
        state = 3 * inner * 2 + inner * 16 * {"float32": 4}.get(str(ssm), 2)
        per_token = 2 * max(1, 2 // tp) * (512 // 8) * 2
        ms = J.from_config(jamba, tp=tp, block_size=given, mamba_ssm_cache_dtype=ssm)
        attn = [f"model.layers.{i}.attn" for i in (2, 6)]
        mamba = [f"model.layers.{i}.mixer" for i in range(8) if i % 4 != 2]
        _check_hybrid(ms, state, per_token, given, mamba, attn)
        assert isinstance(ms, M.ModelSpec)
        raised = given is not None and given < _hybrid_block(state, per_token, given)
        assert any("raised to" in x for x in ms.notes) == raised
    assert _field(J.from_config, {**jamba, "attn_layer_offset": 4}) == "config.attn_layer_offset"
    assert _hybrid_block(1000, 100, None) == 16 and _hybrid_block(1700, 100, None) == 32
    assert _hybrid_block(5000, 100, 32) == 64  # unit 32: 32 * ceil(5000 / 3200)
    assert _hybrid_block(5000, 100, 48) == 96  # unit 48: 48 * 2 = 96, a multiple of 16
    assert _field(J.from_config, jamba, mamba_ssm_cache_dtype="fp8") == "mamba_ssm_cache_dtype"
    # 2 * 509 channels do not split over 4 ranks
    assert _field(J.from_config, {**jamba, "hidden_size": 509}, tp=4) == "config.mamba_expand"

    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 5,
        "hybrid_override_pattern": "M*-EM",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "head_dim": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 1024,  # head size 64 from head_dim (vLLM's NemotronHAttention reads it), not 1024 // 4
        "torch_dtype": "bfloat16",
    }
    for tp, groups, ssm_cfg in (
        (2, 2, None),
        (1, 2, "bfloat16"),
        (2, 1, None),
        (4, 4, "float16"),
        (1, 1, None),
    ):
        cfg = {**nem, "n_groups": groups, **({"mamba_ssm_cache_dtype": ssm_cfg} if ssm_cfg else {})}
        g = tp if groups % tp else groups
        conv = (8 * 16 + 2 * g * 32) // tp
        state = 3 * conv * 2 + (8 // tp) * 16 * 32 * (2 if ssm_cfg else 4)
        per_token = 2 * max(1, 2 // tp) * 64 * 2
        ms = J.from_config(cfg, tp=tp)
        _check_hybrid(
            ms,
            state,
            per_token,
            None,
            ["model.layers.0.mixer", "model.layers.4.mixer"],
            ["model.layers.1.mixer.attn"],
        )
    # the argument overrides the config's ssm dtype
    ms = J.from_config({**nem, "mamba_ssm_cache_dtype": "bfloat16"}, tp=1, mamba_ssm_cache_dtype="float32")
    _check_hybrid(
        ms,
        3 * 256 * 2 + 8 * 16 * 32 * 4,
        2 * 2 * 64 * 2,
        None,
        ["model.layers.0.mixer", "model.layers.4.mixer"],
        ["model.layers.1.mixer.attn"],
    )
    assert _field(J.from_config, {**nem, "mamba_ssm_cache_dtype": "int8"}) == "config.mamba_ssm_cache_dtype"
    for pattern in ("M*-E", "M*-EMM", "M*-EX"):
        assert (
            _field(J.from_config, {**nem, "hybrid_override_pattern": pattern})
            == "config.hybrid_override_pattern"
        )
    assert _field(J.from_config, {**nem, "n_groups": 3}, tp=2) == "config.n_groups"

    falcon = {
        "architectures": ["FalconH1ForCausalLM"],
        "num_hidden_layers": 2,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_d_ssm": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    for tp, d_ssm_keys in ((1, {}), (2, {}), (2, {"mamba_d_ssm": None, "mamba_expand": 0.5})):
        cfg = {**falcon, **d_ssm_keys}
        d_ssm = 128
        g = tp if 1 % tp else 1
        conv = (d_ssm + 2 * g * 16) // tp
        state = 3 * conv * 2 + (8 // tp) * 16 * 16 * 2
        per_token = 2 * max(1, 2 // tp) * 64 * 2
        ms = J.from_config(cfg, tp=tp)
        _check_hybrid(
            ms,
            state,
            per_token,
            None,
            ["model.2.mixer", "model.3.mixer"],
            ["model.layers.0.attn", "model.layers.1.attn"],
        )
    for bad in (0, -1, True, "2", 2000):
        assert (
            _field(J.from_config, {**falcon, "mamba_d_ssm": None, "mamba_expand": bad})
            == "config.mamba_expand"
        )
    ms = J.from_config({**falcon, "mamba_d_ssm": None, "mamba_expand": 1024, "hidden_size": 1}, tp=1)
    assert isinstance(ms, M.ModelSpec)
    assert _field(J.from_config, {**falcon, "mamba_n_groups": 3}, tp=2) == "config.mamba_n_groups"

    gdn = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 512,
        "torch_dtype": "bfloat16",
    }
    for arch, tp, extra, ssm_size in (
        ("Qwen3NextForCausalLM", 1, {}, 2),
        ("Qwen3NextForCausalLM", 2, {"mamba_ssm_dtype": "float32"}, 2),  # Qwen3-Next does not read it
        ("Qwen3_5ForCausalLM", 2, {"mamba_ssm_dtype": "float32"}, 4),
        ("Qwen3_5ForCausalLM", 1, {}, 2),
    ):
        cfg = {**gdn, "architectures": [arch], **extra}
        conv = (2 * 4 * 32 + 8 * 16) // tp
        state = 3 * conv * 2 + (8 // tp) * 32 * 16 * ssm_size
        per_token = 2 * max(1, 2 // tp) * 64 * 2
        ms = J.from_config(cfg, tp=tp)
        attn = [f"model.layers.{i}.self_attn.attn" for i in range(4) if (i + 1) % 2 == 0]
        mamba = [f"model.layers.{i}.linear_attn" for i in range(4) if (i + 1) % 2]
        _check_hybrid(ms, state, per_token, None, mamba, attn)
        assert isinstance(ms, M.ModelSpec) and {ms.kinds[x] for x in mamba} == {"gdn"}
    lt = ["linear_attention", "full_attention", "full_attention", "linear_attention"]
    ms = J.from_config({**gdn, "layer_types": lt, "full_attention_interval": None}, tp=1)
    assert isinstance(ms, M.ModelSpec)
    assert sorted(n for n, k in ms.kinds.items() if k == "full") == [
        "model.layers.1.self_attn.attn",
        "model.layers.2.self_attn.attn",
    ]
    with pytest.raises(SpecError) as e:
        J.from_config({**gdn, "layer_types": [*lt[:3], "sliding_attention"]})
    assert e.value.field == "config.layer_types[3]" and "linear_attention, full_attention" in str(e.value)
    assert _field(J.from_config, {**gdn, "full_attention_interval": None}) == "config.full_attention_interval"


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def test_deepseek_v4_pages_per_layer_kind() -> None:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json"
    base = json.loads(path.read_text())
    for head, rope, idx, ratios in ((512, 64, 128, [0, 4, 128]), (256, 64, 256, [4, 1, 128, 4])):
        cfg = {**base, "head_dim": head, "qk_rope_head_dim": rope, "index_head_dim": idx}
        cfg.update(num_hidden_layers=len(ratios), compress_ratios=ratios)
        ms = J.from_config(cfg, kv_cache_dtype="fp8" if head == 256 else None)
        assert isinstance(ms, M.ModelSpec) and ms.kv_cache_dtype == "fp8_ds_mla" and ms.block_size == 256
        nope = head - rope
        token = nope + 2 * rope + nope // 64 + 1  # fp8 NoPE, bf16 RoPE, scales, 1 pad
        assert (token == 584) == (head == 512)
        want: dict[str, tuple[int, int, str]] = {}  # name -> (block, real page, kind)
        for i, r in enumerate(ratios):
            a = f"model.layers.{i}.attn"
            want[f"{a}.swa_cache"] = (64, 64 * token, "swa")
            if r == 4:
                want[f"{a}.indexer.k_cache"] = (256, 256 // 4 * (idx + idx // 128 * 4), "c4_indexer")
                want[f"{a}.indexer.compressor.state_cache"] = (4, 4 * 2 * 2 * idx * 4, "c4_indexer_state")
            if r > 1:
                want[a] = (256, 256 // r * token, f"c{r}")
                coff = 2 if r == 4 else 1
                want[f"{a}.compressor.state_cache"] = (
                    {4: 4, 128: 8}[r],
                    {4: 4, 128: 8}[r] * 2 * coff * head * 4,
                    f"c{r}_state",
                )
        got = {x.name: x for _, x in ms.spec.layers}
        assert sorted(got) == sorted(want)
        for name, (block, real, kind) in want.items():
            x = got[name]
            assert (x.block_size, x.real_page, x.page, ms.kinds[name]) == (
                block,
                real,
                _round_up(real, 576),
                kind,
            ), name
        # every group holds one bucket's layers: the window caches, the compressed ones (with the indexers),
        # the ratio-4 states (both), the ratio-128 states
        bucket = {
            "swa": "swa",
            "c4_indexer": "compressed",
            "c4": "compressed",
            "c128": "compressed",
            "c4_state": "c4_states",
            "c4_indexer_state": "c4_states",
            "c128_state": "c128_states",
        }
        for g in ms.spec.groups:
            assert {bucket[ms.kinds[x.name]] for x in g.layers} == {g.name.split(".")[0]}
    # the fixture: vLLM's five groups and 1,002,240 B per block (tests/test_models.py checks against vLLM)
    ms = J.from_config(base)
    assert isinstance(ms, M.ModelSpec)
    assert [(g.name, len(g.layers)) for g in ms.spec.groups] == [
        ("swa.0", 22),
        ("swa.1", 21),
        ("compressed", 62),
        ("c4_states", 42),
        ("c128_states", 20),
    ]
    assert ms.bytes_per_block == 1_002_240
    # refusals, each naming its field
    small = {**base, "num_hidden_layers": 3, "compress_ratios": [0, 4, 128]}
    assert _field(J.from_config, small, kv_cache_dtype="bfloat16") == "kv_cache_dtype"
    assert J.from_config(small, kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_ds_mla"
    assert J.from_config(small, kv_cache_dtype="auto").kv_cache_dtype == "fp8_ds_mla"
    assert _field(J.from_config, {**small, "qk_rope_head_dim": 512}) == "config.qk_rope_head_dim"
    assert J.from_config({**small, "qk_rope_head_dim": 511}).block_size == 256
    assert _field(J.from_config, {**small, "num_attention_heads": 6}, tp=4) == "config.num_attention_heads"
    for bad in (2, 3, 8, 64, -4, -1):  # a negative ratio was taken as window only
        with pytest.raises(SpecError) as e:
            J.from_config({**small, "compress_ratios": [0, bad, 4]})
        assert e.value.field == "config.compress_ratios[1]" and e.value.value == bad
    assert _field(J.from_config, small, block_size=100) == "block_size"  # not a multiple of 4
    assert _field(J.from_config, small, block_size=64) == "block_size"  # not a multiple of 128
    assert J.from_config({**small, "compress_ratios": [0, 4, 4]}, block_size=64).block_size == 64
    assert J.from_config({**small, "compress_ratios": [0, 1, 0]}, block_size=6).block_size == 6
    assert _field(J.from_config, _drop(small, "index_head_dim")) == "config.index_head_dim"
    assert J.from_config({**_drop(small, "index_head_dim"), "compress_ratios": [0, 128, 1]}).block_size == 256
    assert _field(J.from_config, {**small, "sliding_window": None}) == "config.sliding_window"


def _pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def test_tpu_inference_page_size_and_array_pages() -> None:
    from kvlayout.models.tpu_inference import (
        TpuOptions,
        attention_array_page,
        default_page_size,
        mla_array_page,
    )

    for mml in (1, 100, 256, 2048, 4096, 8192, 8193, 32768, 131072, 1_000_000):
        for seqs in (1, 3, 256, 1024, 2**17):
            page = 16 if mml > 8192 else min(max(_pow2(mml) // 16, 16), 256)
            want = max(page, _pow2(-(-mml // (2**17 // seqs))))
            assert default_page_size(False, mml, seqs) == want, (mml, seqs)
            assert default_page_size(True, mml, seqs) == 1024
    assert default_page_size(False, 8193, 256) == 32 and default_page_size(False, 8192, 256) == 256
    # attention pages: heads padded to the shards, packed by 32 bits, head size 64 or a multiple of 128
    for kv, hs, dt, tp, dcp, page in (
        (8, 128, "bfloat16", 2, 1, 16),
        (2, 128, "bfloat16", 8, 1, 16),
        (2, 128, "float8_e4m3fn", 8, 1, 32),
        (2, 200, "float32", 8, 1, 16),
        (8, 64, "bfloat16", 2, 1, 16),
        (3, 64, "float8_e4m3fn", 1, 2, 64),
        (12, 80, "bfloat16", 4, 2, 16),
        (1, 256, "float16", 4, 1, 128),
        (6, 128, "bfloat16", 2, 1, 16),
    ):
        o = TpuOptions(tp=tp, dcp=dcp)
        for impl in ("flax_nnx", "vllm"):
            shards = tp * dcp if dcp > 1 and impl == "flax_nnx" else tp
            if (kv >= shards and kv % shards) or (kv < shards and shards % kv):
                assert _field(attention_array_page, kv, hs, dt, o, page, impl) == (
                    "tp * dcp" if shards != tp else "tp"
                )
                continue
            heads = max(kv, shards)
            shard = heads // tp
            pack = {"bfloat16": 2, "float16": 2, "float32": 1, "float8_e4m3fn": 4}[dt]
            if hs == 64:
                want_shape = (page * dcp, -(-shard // pack) * tp, pack, 128)
            else:
                want_shape = (page * dcp, -(-2 * shard // pack) * tp, pack, _round_up(hs, 128))
            assert attention_array_page(kv, hs, dt, o, page, impl) == want_shape, (kv, hs, dt, tp, dcp, impl)
    with pytest.raises(SpecError) as e:
        attention_array_page(12, 128, "bfloat16", TpuOptions(tp=8), 16, "vllm")
    assert "does not divide the 12 KV heads" in str(e.value) and e.value.value == 8
    with pytest.raises(SpecError) as e:
        attention_array_page(3, 128, "bfloat16", TpuOptions(tp=8), 16, "vllm")
    assert "is not a multiple of the 3 KV heads" in str(e.value)
    # MLA pages
    for rank, rope, dcp, k, page in ((512, 64, 1, 32, 1024), (500, 64, 2, 16, 40), (512, 200, 1, 32, 100)):
        o = TpuOptions(dcp=dcp, mla_kv_packing_size=k)
        head = _round_up(rank, 128) + _round_up(rope, 128)
        assert mla_array_page(rank, rope, o, page) == (-(-page * dcp // k), k, _round_up(head, 128))
        t = TpuOptions(dcp=dcp, mla_transpose_kv_cache=True)
        if page * dcp % 128:
            with pytest.raises(SpecError) as e:
                mla_array_page(rank, rope, t, page)
            assert (
                e.value.field == "block_size" and e.value.value == page and f"= {page * dcp})" in str(e.value)
            )
        else:
            assert mla_array_page(rank, rope, t, page) == (_round_up(rank, 128) + rope, page * dcp)
    assert mla_array_page(512, 64, TpuOptions(mla_transpose_kv_cache=True, dcp=2), 64) == (576, 128)


def test_tpu_inference_options_mesh_and_partition_specs() -> None:
    from kvlayout.models.tpu_inference import MESH_7, TpuOptions

    for kw, field in (
        ({"tp": 0}, "tp"),
        ({"dp": -1}, "dp"),
        ({"dcp": 1.5}, "dcp"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"mla_kv_packing_size": 0}, "mla_kv_packing_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": 2**17 + 1}, "max_num_seqs"),
        ({"model_impl": "torchax"}, "model_impl"),
        ({"mla_transpose_kv_cache": 1}, "mla_transpose_kv_cache"),
        ({"batched_rpa": "yes"}, "batched_rpa"),
    ):
        assert _field(TpuOptions, **kw) == field, kw
    assert TpuOptions(max_num_seqs=2**17, max_model_len=1).max_num_seqs == 2**17
    o = TpuOptions(tp=4, dp=2)
    assert o.mesh == {"data": 2, "model": 4} and not o.seven_axes
    assert o.pspec(True) == ("data", None) and o.pspec(False) == ("data", None, "model")
    assert o.head_shards("flax_nnx") == 4 and o.head_shards("vllm") == 4
    o = TpuOptions(tp=4, dp=2, dcp=2)
    assert o.mesh == {a: {"data": 2, "model": 4, "dcp": 2}.get(a, 1) for a in MESH_7} and list(
        o.mesh
    ) == list(MESH_7)
    batch, ctx, heads = ("data", "attn_dp", "attn_dp_expert"), ("pcp", "dcp"), ("model", "expert")
    assert o.pspec(True) == (batch, ctx) and o.pspec(False) == (batch, ctx, heads)
    assert o.head_shards("flax_nnx") == 8 and o.head_shards("vllm") == 4


def test_tpu_inference_arrays_of_a_config() -> None:
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 3,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_size": 2048,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(llama, engine="tpu-inference", tp=2, dp=2, num_blocks=4)
    assert isinstance(ms, M.NativeModelSpec) and ms.model_impl == "flax_nnx"
    page = min(max(4096 // 16, 16), 256)  # 256; the minimum page 4096 / 512 = 8 is smaller
    assert ms.block_size == page
    assert [x.name for x in ms.spec.leaves] == ["kv_caches[0]", "kv_caches[1]", "kv_caches[2]"]
    assert ms.shared_by == {f"kv_caches[{i}]": (f"layer.{i}",) for i in range(3)}
    for leaf in ms.spec.leaves:
        assert (
            leaf.shape == (4, page, 2 * 2 // 2 * 2, 2, 128)
            and leaf.dtype == "bfloat16"
            and leaf.group == "full"
        )
    assert ms.partition_specs == (("data", None, "model"),) * 3
    assert ms.mesh == {"data": 2, "model": 2}
    assert ms.layer_to_array() == {"layer.0": 0, "layer.1": 1, "layer.2": 2}
    assert ms.bytes_per_block == 3 * page * 4 * 2 * 128 * 2
    assert ms.blocks_per_gib == 2**30 // ms.bytes_per_block
    assert any("max_model_len 4,096 from max_position_embeddings" in x for x in ms.notes)
    assert any(x == "page size 256: tpu-inference's default for max_model_len 4,096" for x in ms.notes)
    ms = J.from_config(llama, engine="tpu-inference", max_model_len=100)
    assert isinstance(ms, M.NativeModelSpec) and ms.block_size == 16
    assert not any("from max_position_embeddings" in x for x in ms.notes)
    ms = J.from_config(llama, engine="tpu-inference", block_size=32, model_impl="vllm", num_blocks=0)
    assert isinstance(ms, M.NativeModelSpec) and ms.block_size == 32 and ms.model_impl == "vllm"
    assert [x.name for x in ms.spec.leaves] == ["kv_caches[0]", "kv_caches[1]", "kv_caches[2]"]
    assert ms.shared_by["kv_caches[1]"] == ("model.layers.1.self_attn.attn",)
    assert not any("page size" in x for x in ms.notes)
    assert _field(J.from_config, llama, engine="tpu-inference", dp=2, num_blocks=3) == "num_blocks"
    assert _field(J.from_config, llama, engine="tpu-inference", num_blocks=-1) == "num_blocks"
    assert _field(J.from_config, llama, engine="tpu-inference", num_blocks=True) in ("num_blocks",)
    nompe = {k: v for k, v in llama.items() if k != "max_position_embeddings"}
    assert _field(J.from_config, nompe, engine="tpu-inference") == "config.max_position_embeddings"
    # vLLM's groups share arrays: Gemma 2's 4 sliding and 4 full layers, two groups, 4 arrays of two layers
    gemma = {
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_size": 2304,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(gemma, engine="tpu-inference", block_size=16, tp=4)
    assert isinstance(ms, M.NativeModelSpec) and ms.model_impl == "vllm"
    assert len(ms.spec.leaves) == 4
    for j, leaf in enumerate(ms.spec.leaves):
        users = ms.shared_by[leaf.name]
        assert users == (f"model.layers.{2 * j}.self_attn.attn", f"model.layers.{2 * j + 1}.self_attn.attn")
        assert leaf.shape == (16, 16, -(-2 * 1 // 2) * 4, 2, 256)
        assert set(leaf.group) == {"sliding", "full"}
    # MLA: one latent array per layer, 1,024-token pages
    ds = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "hidden_size": 2048,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(ds, engine="tpu-inference", num_blocks=2)
    assert isinstance(ms, M.NativeModelSpec) and ms.block_size == 1024
    assert [x.shape for x in ms.spec.leaves] == [(2, 1024 // 32, 32, 640)] * 2
    assert ms.partition_specs == (("data", None),) * 2
    assert any(x == "page size 1024: tpu-inference's default" for x in ms.notes)
    v32 = {**ds, "index_topk": 64, "index_head_dim": 128}
    assert _field(J.from_config, v32, engine="tpu-inference") == "engine"


def test_config_reading_rules() -> None:
    from kvlayout.models.config import (
        check_kv_cache_dtype,
        check_tp,
        load_config,
        resolve_kv_dtype,
        resolve_model_dtype,
        text_config,
    )

    c = _cfg(a=3, b=0, s="x", t=True, n=None, lst=[1, 2, 3], names=["a", 1])
    assert c.field("a") == "config.a" and c.has("a") and not c.has("n") and not c.has("zz")
    assert c.req_int("a", "") == 3 and c.req_int("b", "", lo=0) == 0 and c.opt_int("n") is None
    assert c.opt_int("a", lo=3) == 3
    for key, kw, why in (
        ("b", {}, "must be at least 1"),
        ("a", {"lo": 4}, "must be at least 4"),
        ("s", {}, "must be an integer"),
        ("n", {}, "missing; because"),
    ):
        with pytest.raises(SpecError) as e:
            c.req_int(key, "because", **kw)
        assert e.value.field == f"config.{key}" and why in str(e.value)
    assert "reader='transformers' fills" in str(c.missing("x", "w"))
    assert "reader='transformers'" not in str(c.missing("architectures", "w"))
    assert "reader='transformers'" not in str(Config({}, "config", completed=True).missing("x", "w"))
    assert c.req_str("s", "") == "x" and _field(c.req_str, "a", "") == "config.a"
    assert _field(c.req_str, "n", "") == "config.n"
    assert c.req_bool("t", "") is True and _field(c.req_bool, "a", "") == "config.a"
    assert _field(c.req_bool, "zz", "") == "config.zz"
    assert c.req_list("lst", "", 2, int) == [1, 2] and c.req_list("lst", "", 3, int, exact=True) == [1, 2, 3]
    for args, kw, field in (
        (("lst", "", 4, int), {}, "config.lst"),
        (("lst", "", 2, int), {"exact": True}, "config.lst"),
        (("names", "", 2, str), {}, "config.names[1]"),
        (("a", "", 1, int), {}, "config.a"),
        (("n", "", 1, int), {}, "config.n"),
        (("lst", "", 1, str), {}, "config.lst[0]"),
    ):
        assert _field(c.req_list, *args, **kw) == field
    with pytest.raises(SpecError) as e:
        c.req_list("names", "", 2, str)
    assert "must be a string" in str(e.value)
    with pytest.raises(SpecError) as e:
        c.req_list("lst", "", 1, str)
    assert "must be a string" in str(e.value)
    with pytest.raises(SpecError) as e:
        _cfg(lst=[1, "x"]).req_list("lst", "", 2, int)
    assert "must be an integer" in str(e.value)
    # dtypes: the argument, else torch_dtype / dtype of the top then the text config; float32 runs bf16
    notes: list[str] = []
    top, text = _cfg(), _cfg(dtype="float16")
    assert resolve_model_dtype(top, text, None, notes) == "float16" and notes == []
    assert (  # both written: transformers keeps dtype (issue 25, eighth pass)
        resolve_model_dtype(_cfg(torch_dtype="float16", dtype="bfloat16"), text, "auto", notes) == "bfloat16"
    )
    assert resolve_model_dtype(_cfg(torch_dtype="float32"), text, None, notes) == "bfloat16"
    assert notes == ["float32 checkpoint: vLLM's dtype auto runs it in bfloat16"]
    assert resolve_model_dtype(top, _cfg(), None, notes) == "bfloat16" and "no torch_dtype" in notes[-1]
    assert resolve_model_dtype(_cfg(torch_dtype="float32"), text, "float32", []) == "float32"
    assert _field(resolve_model_dtype, top, text, "int8", []) == "dtype"
    assert _field(resolve_model_dtype, top, Config({"dtype": "half"}, "config.text_config"), None, []) == (
        "config.text_config.dtype"
    )
    assert (
        resolve_kv_dtype(None, "float16") == "float16" and resolve_kv_dtype("auto", "bfloat16") == "bfloat16"
    )
    assert resolve_kv_dtype("fp8", "bfloat16") == "float8_e4m3fn"
    assert resolve_kv_dtype("fp8_e5m2", "bfloat16") == "float8_e5m2"
    assert _field(resolve_kv_dtype, "int8", "bfloat16") == "kv_cache_dtype"
    assert check_kv_cache_dtype(None, "llama") is None and check_kv_cache_dtype("fp8", "llama") == "fp8"
    assert check_kv_cache_dtype("fp8_ds_mla", "deepseek_v32") == "fp8_ds_mla"
    assert check_kv_cache_dtype("fp8_ds_mla", "deepseek_v4") == "fp8_ds_mla"
    for bad, fam in (("fp8_ds_mla", "deepseek_v3"), (8, "llama"), ("int4", "deepseek_v4")):
        with pytest.raises(SpecError) as e:
            check_kv_cache_dtype(bad, fam)
        assert e.value.field == "kv_cache_dtype" and ("fp8_ds_mla" in str(e.value).split("valid: ")[1]) == (
            fam != "deepseek_v3" and fam != "llama"
        )
    assert check_tp(4) == 4 and all(_field(check_tp, x) == "tp" for x in (0, -1, 1.5, "2", True))
    assert text_config(_cfg(a=1)).path == "config"
    tc = text_config(Config({"text_config": {"a": 1}}, "config", completed=True))
    assert tc.path == "config.text_config" and tc.completed and tc.data == {"a": 1}
    assert _field(text_config, _cfg(text_config=[1])) == "config.text_config"
    assert load_config({"a": 1}) == {"a": 1} and _field(load_config, [1]) == "config"


def test_entry_points_refuse_what_does_not_apply() -> None:
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 1024,
        "torch_dtype": "bfloat16",
    }
    assert _field(J.from_config, llama, engine="sglang") == "engine"
    assert _field(J.from_config, llama, dp=2) == "dp"
    assert _field(J.from_config, llama, engine="tpu-inference", device="blackwell") == "device"
    # the flag given is named (was device = 'hopper', the default the user did not give)
    assert _field(J.from_config, llama, engine="tpu-inference", attention_backend="FLASHINFER") == (
        "attention_backend"
    )
    assert _field(
        J.from_config, llama, engine="tpu-inference", device="ampere", attention_backend="FLASHINFER"
    ) == "device"
    assert _field(J.from_config, llama, device="volta") == "device"
    assert _field(J.from_config, llama, reader="yaml") == "reader"
    assert _field(J.from_config, llama, tp=0) == "tp"
    assert _field(J.from_config, llama, block_size=0) == "block_size"
    assert _field(J.from_config, llama, block_size=2.5) == "block_size"
    assert _field(J.from_config, {**llama, "num_hidden_layers": 10_001}) == "config.num_hidden_layers"
    assert _field(J.from_config, {**llama, "architectures": None}) == "config.architectures"
    for bad in ([], "LlamaForCausalLM", [3]):
        assert _field(J.from_config, {**llama, "architectures": bad}) == "config.architectures"
    with pytest.raises(SpecError) as e:
        J.from_config({**llama, "architectures": ["NoSuchForCausalLM"]})
    assert e.value.field == "config.architectures[0]" and "unknown architecture" in str(e.value)
    assert "LlamaForCausalLM" in str(e.value)
    assert J.spec_from_config(llama, block_size=32).num_blocks == M.DEFAULT_NUM_BLOCKS
    assert J.spec_from_config(llama, num_blocks=3).num_blocks == 3
    native = J.spec_from_config(llama, engine="tpu-inference", num_blocks=2)
    assert [x.shape[0] for x in native.leaves] == [2, 2]
    ms = J.from_config(llama, block_size=32, device="ampere")
    assert isinstance(ms, M.ModelSpec)
    assert (ms.engine, ms.tp, ms.dtype, ms.block_size, ms.device, ms.attention_backend) == (
        "vllm",
        1,
        "bfloat16",
        32,
        "ampere",
        "FLASH_ATTN",
    )
    assert ms.backend_reason == "first valid attention backend on ampere in vLLM's priority list"
    assert ms.spec.layout == "packed" and ms.architecture == "LlamaForCausalLM" and ms.family == "llama"
    vlm = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {**llama, "sliding_window_pattern": 2, "sliding_window": 512},
    }
    ms = J.from_config(vlm)
    assert isinstance(ms, M.ModelSpec)
    assert sorted(ms.kinds) == [f"language_model.model.layers.{i}.self_attn.attn" for i in range(2)]
    ms = J.from_config(llama, engine="tpu-inference")
    assert isinstance(ms, M.NativeModelSpec) and ms.engine == "tpu-inference"


def test_refusal_reasons_and_coverage() -> None:
    from kvlayout.models.families import ARCHITECTURES, HYBRID_REFUSALS, family_rule, refusal
    from kvlayout.models.registry_vllm import TEXT_GENERATION, VLLM_VERSION
    from kvlayout.models.vllm_checked import NOT_GENERIC

    archs, total = M.vllm_coverage()
    assert total == len(TEXT_GENERATION) and list(archs) == sorted(
        a for a in TEXT_GENERATION if a in ARCHITECTURES
    )
    assert len(archs) < total
    for arch, (module, kind, *_) in TEXT_GENERATION.items():
        if arch in ARCHITECTURES:
            continue
        why = refusal(arch)
        assert why.startswith(
            f"vLLM {VLLM_VERSION} serves it ({kind}, module {module}); kvlayout refuses it: "
        )
        if arch in NOT_GENERIC:
            assert why.endswith(NOT_GENERIC[arch]) and "not shown to hold" in why
    assert refusal("Nope").startswith("unknown architecture (not one of vLLM")
    for arch, why in HYBRID_REFUSALS.items():  # each refused hybrid says what it would take to model it
        module, kind = TEXT_GENERATION[arch][:2]
        assert kind == "hybrid" and arch not in ARCHITECTURES
        head = f"vLLM {VLLM_VERSION} serves it (hybrid, module {module}); kvlayout refuses it: "
        assert refusal(arch) == head + why
    free = next(a for a, row in TEXT_GENERATION.items() if row[1] == "attention-free")
    assert refusal(free).endswith(
        "vLLM registers it attention-free; its layers' per-block states are not yet modeled"
    )
    names = {
        f: family_rule(f).__name__
        for f in (
            "llama", "generic_sw", "deepseek_v2", "generic_mla", "deepseek_v4", "jamba", "qwen3_5", "mamba",
            "mamba2",
        )
    }
    assert names == {
        "llama": "attention_family",
        "generic_sw": "attention_family",
        "deepseek_v2": "mla_family",
        "generic_mla": "mla_family",
        "deepseek_v4": "dsv4_family",
        "mamba": "mamba_only_family",
        "mamba2": "mamba_only_family",
        "jamba": "hybrid_family",
        "qwen3_5": "hybrid_family",
    }


def test_summaries_state_the_numbers() -> None:
    cfg = {
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "hidden_size": 512,
        "sliding_window": 64,
        "torch_dtype": "float32",
    }
    ms = J.from_config(cfg, tp=2, num_blocks=4)
    assert isinstance(ms, M.ModelSpec)
    page = 16 * 2 * 2 * 64 * 2
    text = M.summary(ms, proof=False)
    lines = text.splitlines()
    assert lines[0] == "Gemma2ForCausalLM (gemma2) on vllm, tp 2 (one rank's cache)"
    assert lines[1] == "dtype bfloat16, KV cache bfloat16, 16-token blocks, layout packed, 4 blocks"
    assert lines[2] == f"attention backend FLASH_ATTN on hopper: {ms.backend_reason}"
    assert lines[3] == "note: float32 checkpoint: vLLM's dtype auto runs it in bfloat16"
    # 2 sliding, 1 full: size 1, 2 >= 1.5: the sliding kind is two groups
    assert lines[4] == "3 groups, 3 layers (groups share block ids and overlay):"
    assert lines[5].split() == ["sliding.0", "1", "layers", f"{page:,}", "B", "per", "block", "sliding"]
    assert lines[8].split() == ["kind", "layers", "tokens", "real", "page", "B", "page", "B", "padding", "B"]
    assert lines[9].split() == ["sliding", "2", "16", f"{page:,}", f"{page:,}", "0"]
    assert lines[10].split() == ["full", "1", "16", f"{page:,}", f"{page:,}", "0"]
    # the three groups of one layer overlay: one page per block id
    assert lines[11] == f"bytes per block {page:,}; blocks per GiB {2**30 // page:,}"
    assert len(lines) == 12
    proved = M.summary(ms).splitlines()
    assert proved[:-1] == lines and proved[-1].startswith("zeroing table: ") and "SAFE" in proved[-1]
    one = J.from_config({**cfg, "num_hidden_layers": 1})
    assert isinstance(one, M.ModelSpec)
    assert "1 group, 1 layers" in M.summary(one, proof=False)
    nat = J.from_config(
        {**cfg, "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512},
        engine="tpu-inference",
        tp=2,
        num_blocks=2,
    )
    assert isinstance(nat, M.NativeModelSpec)
    lines = M.summary(nat, proof=False).splitlines()
    assert lines[0] == "LlamaForCausalLM (llama) on tpu-inference, tp 2 (the global arrays of the mesh)"
    assert (
        lines[1]
        == "dtype bfloat16, KV cache bfloat16, 32-token pages, 3 arrays of 2 pages (GEOMETRY.md section 9)"
    )
    assert "model implementation flax_nnx; mesh model=2 (global arrays, sharded)" in lines
    row = next(x for x in lines if x.startswith("  full "))
    leaf = nat.spec.leaves[0]
    assert row.split()[:3] == ["full", "3", "1"] and row.split()[-1] == f"{leaf.page_bytes:,}"
    assert lines[-1] == f"bytes per block {nat.bytes_per_block:,}; blocks per GiB {nat.blocks_per_gib:,}"
    assert M.summary(nat).splitlines()[-1].endswith("SAFE")
    one_dev = J.from_config(
        {**cfg, "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512}, engine="tpu-inference"
    )
    assert isinstance(one_dev, M.NativeModelSpec)
    assert "model implementation flax_nnx; mesh one device (global arrays, sharded)" in M.summary(
        one_dev, proof=False
    )


def test_generic_layer_names_heads_and_windows() -> None:
    bloom = {
        "architectures": ["BloomForCausalLM"],
        "n_layer": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_size": 1024,
        "torch_dtype": "float16",
    }
    ms = J.from_config(bloom, tp=2, block_size=16)
    assert isinstance(ms, M.ModelSpec) and ms.family == "generic"
    layers = [x for _, x in ms.spec.layers]
    assert [x.name for x in layers] == [
        "transformer.h.0.self_attention.attn",
        "transformer.h.1.self_attention.attn",
    ]
    # Bloom: KV heads are the query heads (num_key_value_heads ignored), head size hidden // heads
    assert {(x.num_kv_heads, x.head_size, x.dtype) for x in layers} == {(8 // 2, 1024 // 8, "float16")}
    exaone = {**bloom, "architectures": ["ExaoneForCausalLM"]}
    ms = J.from_config(exaone, block_size=16)
    assert isinstance(ms, M.ModelSpec)
    assert [x.name for _, x in ms.spec.layers] == [f"model.h.{i}.attn.attention.attn" for i in range(2)]
    assert {(x.num_kv_heads, x.head_size) for _, x in ms.spec.layers} == {(2, 32)}  # the generic rule
    # Falcon: never a window; Cohere: the engine's one window on every layer
    falcon = {
        **bloom,
        "architectures": ["FalconForCausalLM"],
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        "sliding_window": 64,
    }
    ms = J.from_config(falcon, block_size=16)
    assert isinstance(ms, M.ModelSpec) and set(ms.kinds.values()) == {"full"}
    assert {x.num_kv_heads for _, x in ms.spec.layers} == {2}
    lt = ["sliding_attention", "full_attention"]
    cohere = {**bloom, "architectures": ["CohereForCausalLM"], "sliding_window": 64, "layer_types": lt}
    ms = J.from_config(cohere, block_size=16)
    assert isinstance(ms, M.ModelSpec) and set(ms.kinds.values()) == {"full"}
    ms = J.from_config({**cohere, "layer_types": None}, block_size=16)
    assert isinstance(ms, M.ModelSpec) and set(ms.kinds.values()) == {"sliding"}
    assert {x.window for _, x in ms.spec.layers} == {64}  # type: ignore[attr-defined]
    # GPT-OSS names its attention attn.attn
    oss = {**bloom, "architectures": ["GptOssForCausalLM"], "sliding_window": 128, "layer_types": lt}
    ms = J.from_config(oss, block_size=16)
    assert isinstance(ms, M.ModelSpec)
    assert [x.name for _, x in ms.spec.layers] == ["model.layers.0.attn.attn", "model.layers.1.attn.attn"]
    # a generic MLA architecture: DeepSeek-V2's latent head under vLLM's names
    mla = {
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "kv_lora_rank": 256,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(mla, block_size=16, device="ampere")
    assert isinstance(ms, M.ModelSpec) and ms.family == "generic_mla"
    assert [(x.name, x.head_size, x.real_page) for _, x in ms.spec.layers] == [
        (f"model.layers.{i}.self_attn.attn", 256 + 32, 16 * (256 + 32) * 2) for i in range(2)
    ]


def test_build_without_a_cuda_device_takes_flash_blocks() -> None:
    from kvlayout.models.build import build

    ds = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "kv_lora_rank": 256,
        "qk_rope_head_dim": 32,
        "torch_dtype": "bfloat16",
    }
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    for cfg, bs in ((ds, 64), (llama, 16)):
        ms, c = build(cfg, 1, None, None, None, 4, None, device=None)
        assert (ms.block_size, ms.device, ms.attention_backend, ms.backend_reason) == (bs, "", "", "")
        assert c.resolved is None and ms.spec.num_blocks == 4
        ms, c = build(cfg, 1, None, None, None, 4, None, device="hopper")
        assert (
            ms.device == "hopper"
            and c.resolved is not None
            and ms.attention_backend == c.resolved.backend.name
        )
    assert _field(build, llama, 1, None, None, None, 4, None, device="tpu") == "device"


def test_tpu_inference_hybrid_uneven_groups_and_messages() -> None:
    gdn = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hidden_size": 512,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 2048,
    }
    # duplicate_shared_layers: one array per attention layer at tpu-inference's page (no hybrid alignment)
    for block in (None, 32):
        ms = J.from_config(gdn, engine="tpu-inference", block_size=block, num_blocks=2, max_model_len=2048)
        assert isinstance(ms, M.NativeModelSpec)
        page = 32 if block else min(max(2048 // 16, 16), 256)
        assert ms.block_size == page
        attn = ["model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"]
        assert [x.name for x in ms.spec.leaves] == attn
        assert [x.shape for x in ms.spec.leaves] == [(2, page, 2 * 2 // 2, 2, 128)] * 2
        assert ms.shared_by == {a: (a,) for a in attn}
        assert ms.groups is not None and sorted(x for v in ms.groups.values() for x in v) == attn
        assert all(v for v in ms.groups.values())
        assert ms.kinds["model.layers.0.linear_attn"] == "gdn"
        assert ms.notes[-1].startswith(
            "hybrid: one array per attention layer (named by layer: runner.kv_caches"
        )
        assert ms.notes[-1].endswith(
            "never zeroed by block id); not checked against tpu-inference's own code"
        )
        assert not any("raised to" in x or x.startswith("hybrid: ") and "token blocks" in x for x in ms.notes)
    # vLLM's groups of unequal length (3 sliding in two groups of 2 and 1, 2 full): arrays by position
    gemma = {
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 5,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_size": 1024,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"],
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(
        gemma, engine="tpu-inference", block_size=16, num_blocks=2, dtype="float16", kv_cache_dtype="fp8"
    )
    assert (
        isinstance(ms, M.NativeModelSpec) and ms.dtype == "float16" and ms.kv_cache_dtype == "float8_e4m3fn"
    )
    assert ms.groups == {
        "full": ("model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"),
        "sliding.0": ("model.layers.0.self_attn.attn", "model.layers.4.self_attn.attn"),
        "sliding.1": ("model.layers.2.self_attn.attn",),
    }
    assert [len(ms.shared_by[x.name]) for x in ms.spec.leaves] == [3, 2]
    assert ms.spec.leaves[1].group == ("sliding.0", "full")
    assert {x.dtype for x in ms.spec.leaves} == {"float8_e4m3fn"}
    assert [x.shape for x in ms.spec.leaves] == [(2, 16, 4 * 2 // 4, 4, 128)] * 2
    # the default page's build keeps the dtypes too
    ms = J.from_config(
        gemma, engine="tpu-inference", max_model_len=512, dtype="float16", kv_cache_dtype="fp8"
    )
    assert isinstance(ms, M.NativeModelSpec) and ms.block_size == 32 and ms.dtype == "float16"
    assert {x.dtype for x in ms.spec.leaves} == {"float8_e4m3fn"}
    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 2,
        "hybrid_override_pattern": "M*",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 1,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "attention_head_dim": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 256,
    }
    # the ssm dtype argument reaches vLLM's reading: a bad one is refused naming it
    for block in (None, 16):
        assert (
            _field(J.from_config, nem, engine="tpu-inference", block_size=block, mamba_ssm_cache_dtype="int8")
            == "mamba_ssm_cache_dtype"
        )
    with pytest.raises(SpecError) as e:
        J.from_config(gemma, engine="tpu-inference", dp=2, num_blocks=3)
    assert str(e.value) == "num_blocks = 3: must be a multiple of dp = 2: the data axis shards the pages"
    with pytest.raises(SpecError) as e:
        J.from_config(gemma, engine="tpu-inference", num_blocks=-1)
    assert str(e.value) == "num_blocks = -1: must be a non-negative integer"
    import json
    from pathlib import Path

    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json").read_text()
    )
    for cfg in (
        base,
        {**base, "architectures": ["DeepseekV3ForCausalLM"], "index_topk": 64, "kv_lora_rank": 512},
    ):
        with pytest.raises(SpecError) as e:
            J.from_config(cfg, engine="tpu-inference")
        assert str(e.value) == (
            "engine = 'tpu-inference': tpu-inference's arrays for the DeepSeek-V3.2/V4 indexer, window and "
            "compressed caches are not modeled"
        )
    assert _field(J.from_config, gemma, engine="tpu-inference", reader="yaml") == "reader"
    with pytest.raises(SpecError) as e:
        J.from_config({**gemma, "max_position_embeddings": None}, engine="tpu-inference")
    assert "tpu-inference's default page size follows max_model_len (or pass it)" in str(e.value)
    # MLA: every layer the kind mla, one group
    ds = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(ds, engine="tpu-inference", num_blocks=2, block_size=256, dp=2, tp=2)
    assert isinstance(ms, M.NativeModelSpec) and ms.block_size == 256
    assert ms.kinds == {"layer.0": "mla", "layer.1": "mla"} and ms.groups == {"mla": ("layer.0", "layer.1")}
    assert {x.group for x in ms.spec.leaves} == {"mla"}
    lines = M.summary(ms).splitlines()
    assert "model implementation flax_nnx; mesh data=2 x model=2 (global arrays, sharded)" in lines
    assert lines[-1] == "zeroing: 2 single-row tables (base 0, stride = span = page): SAFE"
    head = next(x for x in lines if x.lstrip().startswith("kind"))
    assert head.split() == ["kind", "arrays", "layers", "page", "shape", "dtype", "page", "B"]
    row = next(x for x in lines if x.startswith("  mla "))
    leaf = ms.spec.leaves[0]
    assert row.split() == ["mla", "2", "1", *str(leaf.page_shape).split(), "bfloat16", f"{leaf.page_bytes:,}"]
    assert (
        lines[1]
        == "dtype bfloat16, KV cache bfloat16, 256-token pages, 2 arrays of 2 pages (GEOMETRY.md section 9)"
    )


def test_refusal_messages_name_the_field_the_value_and_why() -> None:
    """The messages users read: ``field = value: why`` (the field and value are the contract)."""
    import json
    from pathlib import Path

    from kvlayout.models.families import refusal
    from kvlayout.models.tpu_inference import TpuOptions, _next_pow2, attention_array_page, default_page_size

    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json").read_text()
    )
    small = {**base, "num_hidden_layers": 3, "compress_ratios": [0, 4, 128]}
    hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
    cases = {
        "bool_type": lambda: Config({"a": 1}, "config").req_bool("a", "w"),
        "bool_missing": lambda: Config({}, "config").req_bool("a", "why"),
        "v4_heads": lambda: J.from_config({**small, "num_attention_heads": 6}, tp=4),
        "v4_kv": lambda: J.from_config(small, kv_cache_dtype="bfloat16"),
        "v4_head": lambda: J.from_config(_drop(small, "head_dim")),
        "v4_rope": lambda: J.from_config(_drop(small, "qk_rope_head_dim")),
        "v4_rope_big": lambda: J.from_config({**small, "qk_rope_head_dim": 512}),
        "v4_sw": lambda: J.from_config(_drop(small, "sliding_window")),
        "v4_ratios": lambda: J.from_config(_drop(small, "compress_ratios")),
        "v4_ratio_bad": lambda: J.from_config({**small, "compress_ratios": [0, 2, 4]}),
        "v4_block": lambda: J.from_config(small, block_size=64),
        "v4_idx": lambda: J.from_config(_drop(small, "index_head_dim")),
        "q2_flag": lambda: layer_types(Config({}, "config"), "qwen2", 4),
        "q2_mwl": lambda: layer_types(Config({"use_sliding_window": True}, "config"), "qwen2", 4),
        "q2_mwl0": lambda: layer_types(
            Config(
                {"layer_types": ["sliding_attention", "full_attention"] * 2, "max_window_layers": 0}, "config"
            ),
            "qwen2",
            4,
        ),
        "tpu_seqs": lambda: TpuOptions(max_num_seqs=2**17 + 1),
        "tpu_impl": lambda: TpuOptions(model_impl="x"),
        "tpu_bool": lambda: TpuOptions(batched_rpa=1),
        "tpu_pos": lambda: TpuOptions(tp=0),
        "tpu_heads": lambda: attention_array_page(3, 128, "bfloat16", TpuOptions(tp=8), 16, "vllm"),
        "tpu_heads2": lambda: attention_array_page(12, 128, "bfloat16", TpuOptions(tp=8), 16, "vllm"),
    }
    want = dict(
        [
            ("bool_type", "config.a = 1: must be true or false"),
            (
                "bool_missing",
                "config.a = None: missing; why" + hint,
            ),
            ("v4_heads", "config.num_attention_heads = 6: not divisible by tp = 4"),
            (
                "v4_kv",
                "kv_cache_dtype = 'bfloat16': DeepSeek-V4 has only an fp8 KV cache (fp8_ds_mla) in vLLM",
            ),
            (
                "v4_head",
                "config.head_dim = None: missing; the MLA head (NoPE + RoPE)" + hint,
            ),
            (
                "v4_rope",
                "config.qk_rope_head_dim = None: missing; the RoPE part of the MLA head" + hint,
            ),
            ("v4_rope_big", "config.qk_rope_head_dim = 512: must be below head_dim 512"),
            (
                "v4_sw",
                "config.sliding_window = None: missing; the window of every layer's sliding-window cache"
                + hint,
            ),
            (
                "v4_ratios",
                "config.compress_ratios = None: missing; one compression ratio per layer" + hint,
            ),
            ("v4_ratio_bad", "config.compress_ratios[1] = 2: valid: 0 or 1 (window only), 4, 128"),
            ("v4_block", "block_size = 64: must be a multiple of the compression ratio 128"),
            (
                "v4_idx",
                "config.index_head_dim = None: missing; the indexer key of ratio-4 layers" + hint,
            ),
            (
                "q2_flag",
                "config.use_sliding_window = None: missing; "
                "Qwen2/Qwen3 slide only when use_sliding_window is true" + hint,
            ),
            (
                "q2_mwl",
                "config.max_window_layers = None: missing; layers from max_window_layers on slide" + hint,
            ),
            (
                "q2_mwl0",
                "config.max_window_layers = 0: vLLM 0.33 refuses a sliding window on some layers only "
                "(Qwen2Model: must equal 4)",
            ),
            (
                "tpu_seqs",
                "max_num_seqs = 131073: at most 131,072: "
                "tpu-inference's minimum page divides by 2**17 // max_num_seqs",
            ),
            ("tpu_impl", "model_impl = 'x': valid: auto, flax_nnx, vllm"),
            ("tpu_bool", "batched_rpa = 1: must be True or False"),
            ("tpu_pos", "tp = 0: must be a positive integer, at most 2**53"),
            ("tpu_heads", "tp = 8: is not a multiple of the 3 KV heads (tpu-inference asserts it)"),
            ("tpu_heads2", "tp = 8: does not divide the 12 KV heads (tpu-inference asserts it)"),
        ]
    )
    assert sorted(cases) == sorted(want)
    for key, call in cases.items():
        with pytest.raises(SpecError) as e:
            call()  # key: the case
        assert str(e.value) == want[key], key
    assert refusal("Nope").endswith("; known: " + ", ".join(M.ARCHITECTURES))
    assert [_next_pow2(x) for x in (0, 1, 2, 3, 4, 5, 1000, 1024, 1025)] == [
        1,
        1,
        2,
        4,
        4,
        8,
        1024,
        1024,
        2048,
    ]
    # the minimum page: 2**20 // 2 // max_num_seqs // 4 tokens per request slot (here 131,072)
    assert default_page_size(False, 2_097_153, 1) == 32 and default_page_size(False, 2_097_152, 1) == 16


def test_summary_names_every_kind_of_a_group() -> None:
    import json
    from pathlib import Path

    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json").read_text()
    )
    ms = J.from_config({**base, "num_hidden_layers": 3, "compress_ratios": [0, 4, 128]})
    assert isinstance(ms, M.ModelSpec)
    lines = M.summary(ms, proof=False).splitlines()
    row = next(x for x in lines if x.startswith("  compressed "))
    assert row.split()[-1] == "c4_indexer+c4+c128"
    kinds = [
        x.split()[0]
        for x in lines[lines.index(next(x for x in lines if x.lstrip().startswith("kind"))) + 1 : -1]
    ]
    assert sorted(kinds) == sorted(
        ["c4_indexer", "c4_indexer_state", "swa", "c4", "c4_state", "c128", "c128_state"]
    )


def test_mla_backends_strides_and_messages() -> None:
    base = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "torch_dtype": "bfloat16",
    }
    v32 = {**base, "index_topk": 64, "index_head_dim": 128}
    # V3.2 on Hopper: bf16 on FLASH_ATTN_MLA_SPARSE, fp8 on FLASHMLA_SPARSE; on Blackwell FLASHMLA_SPARSE
    # fp8 keeps the 656 B row. Their stride rules (whole rows) need no alignment under vLLM's LBNHC.
    stride = None
    for kw, backend, row in (
        ({}, "FLASH_ATTN_MLA_SPARSE", (512 + 64) * 2),
        ({"kv_cache_dtype": "fp8"}, "FLASHMLA_SPARSE", 512 + 512 // 128 * 4 + 2 * 64),
        (
            {"kv_cache_dtype": "fp8", "device": "blackwell", "attention_backend": "FLASHMLA_SPARSE"},
            "FLASHMLA_SPARSE",
            656,
        ),
    ):
        ms = J.from_config(v32, **kw)
        assert isinstance(ms, M.ModelSpec) and ms.attention_backend == backend and ms.block_size == 64
        att = [x for _, x in ms.spec.layers if x.name.endswith("self_attn.attn")]
        idx = [x for _, x in ms.spec.layers if x.name.endswith("indexer.k_cache")]
        assert {(x.block_stride_alignment, x.real_page) for x in att} == {(stride, 64 * row)}
        assert {(x.block_stride_alignment, x.real_page, x.dtype) for x in idx} == {(None, 64 * 132, "uint8")}
    # qk_nope_head_dim decides Blackwell's MLA backend: FLASHINFER_MLA takes 64/128/192, else CUTLASS_MLA
    ms = J.from_config(base, device="blackwell")
    assert isinstance(ms, M.ModelSpec) and (ms.attention_backend, ms.block_size) == ("FLASHINFER_MLA", 32)
    no_nope = {k: v for k, v in base.items() if k != "qk_nope_head_dim"}
    ms = J.from_config(no_nope, device="blackwell")
    assert isinstance(ms, M.ModelSpec) and (ms.attention_backend, ms.block_size) == ("CUTLASS_MLA", 128)
    ms = J.from_config({**base, "qk_nope_head_dim": 0}, device="blackwell")
    assert isinstance(ms, M.ModelSpec) and ms.attention_backend == "CUTLASS_MLA"
    hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
    for cfg, msg in (
        (
            {**base, "num_attention_heads": None},
            "config.num_attention_heads = None: missing; the query heads",
        ),
        (
            {**base, "kv_lora_rank": None},
            "config.kv_lora_rank = None: missing; the MLA latent (head size kv_lora_rank + qk_rope_head_dim)",
        ),
        (
            {**base, "qk_rope_head_dim": None},
            "config.qk_rope_head_dim = None: missing; "
            "the MLA RoPE part (head size kv_lora_rank + qk_rope_head_dim)",
        ),
        (
            _drop(v32, "index_head_dim"),
            "config.index_head_dim = None: missing; "
            "the DeepSeek-V3.2 indexer key (index_head_dim + 4 B per 128)",
        ),
    ):
        with pytest.raises(SpecError) as e:
            J.from_config(cfg)
        assert str(e.value) == msg + hint
    with pytest.raises(SpecError) as e:
        J.from_config({**base, "num_attention_heads": 18}, tp=4)
    assert str(e.value) == "config.num_attention_heads = 18: not divisible by tp = 4"
    assert _field(J.from_config, {**base, "qk_nope_head_dim": -1}) == "config.qk_nope_head_dim"


def test_hybrid_refusal_messages() -> None:
    jamba = {
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 8,
        "attn_layer_period": 4,
        "attn_layer_offset": 2,
        "hidden_size": 512,
        "mamba_expand": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 16,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "torch_dtype": "bfloat16",
    }
    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 5,
        "hybrid_override_pattern": "M*-EM",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "attention_head_dim": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    falcon = {
        "architectures": ["FalconH1ForCausalLM"],
        "num_hidden_layers": 2,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_d_ssm": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    gdn = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 512,
        "torch_dtype": "bfloat16",
    }
    hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
    for cfg, key, why in (
        (jamba, "attn_layer_period", "layer i is attention when i % attn_layer_period == attn_layer_offset"),
        (jamba, "attn_layer_offset", "layer i is attention when i % attn_layer_period == attn_layer_offset"),
        (jamba, "mamba_expand", "the Mamba inner size is mamba_expand * hidden_size"),
        (jamba, "mamba_d_conv", "the Mamba conv state keeps mamba_d_conv - 1 steps"),
        (jamba, "mamba_d_state", "the Mamba ssm state size"),
        (nem, "hybrid_override_pattern", "one character per layer: M Mamba, * attention, - MLP, E MoE"),
        (nem, "mamba_num_heads", "the Mamba2 heads"),
        (nem, "mamba_head_dim", "the Mamba2 head size"),
        (nem, "n_groups", "the Mamba2 B/C groups"),
        (nem, "ssm_state_size", "the Mamba2 state size"),
        (nem, "conv_kernel", "the Mamba2 conv state keeps conv_kernel - 1 steps"),
        (falcon, "mamba_n_heads", "the Mamba2 heads"),
        (falcon, "mamba_d_head", "the Mamba2 head size"),
        (falcon, "mamba_n_groups", "the Mamba2 B/C groups"),
        (falcon, "mamba_d_state", "the Mamba2 state size"),
        (falcon, "mamba_d_conv", "the Mamba2 conv state keeps mamba_d_conv - 1 steps"),
        (
            gdn,
            "full_attention_interval",
            "layer i is full attention when (i + 1) % full_attention_interval == 0 (or give layer_types)",
        ),
        (gdn, "linear_num_key_heads", "the gated delta net key heads"),
        (gdn, "linear_num_value_heads", "the gated delta net value heads"),
        (gdn, "linear_key_head_dim", "the gated delta net key head size"),
        (gdn, "linear_value_head_dim", "the gated delta net value head size"),
        (gdn, "linear_conv_kernel_dim", "the conv state keeps linear_conv_kernel_dim - 1 steps"),
    ):
        with pytest.raises(SpecError) as e:
            J.from_config({**cfg, key: None})
        assert str(e.value) == f"config.{key} = None: missing; {why}{hint}"
    for cfg, change, kw, msg in (
        (
            jamba,
            {"attn_layer_offset": 4},
            {},
            "config.attn_layer_offset = 4: must be below attn_layer_period 4",
        ),
        (
            jamba,
            {},
            {"mamba_ssm_cache_dtype": "fp8"},
            "mamba_ssm_cache_dtype = 'fp8': valid: auto, bfloat16, float16, float32",
        ),
        (jamba, {"hidden_size": 509}, {"tp": 4}, "config.mamba_expand = 1018: not divisible by tp = 4"),
        (
            nem,
            {"hybrid_override_pattern": "M*-E"},
            {},
            "config.hybrid_override_pattern = 'M*-E': "
            "needs 5 characters (num_hidden_layers), each of M, *, -, E",
        ),
        (nem, {"n_groups": 3}, {"tp": 2}, "config.n_groups = 3: vLLM needs it divisible by tp = 2 (or 1)"),
        (
            nem,
            {"mamba_ssm_cache_dtype": "int8"},
            {},
            "config.mamba_ssm_cache_dtype = 'int8': valid: bfloat16, float16, float32",
        ),
        (
            falcon,
            {"mamba_d_ssm": None, "mamba_expand": 0},
            {},
            "config.mamba_expand = 0: must be a number in (0, 1024] (or give mamba_d_ssm)",
        ),
        (
            falcon,
            {"mamba_n_groups": 3},
            {"tp": 2},
            "config.mamba_n_groups = 3: vLLM needs it divisible by tp = 2 (or 1)",
        ),
        (falcon, {"mamba_n_heads": 6}, {"tp": 4}, "config.mamba_n_heads = 6: not divisible by tp = 4"),
        (
            gdn,
            {"layer_types": ["linear_attention", "full_attention", "x", "full_attention"]},
            {},
            "config.layer_types[2] = 'x': valid: linear_attention, full_attention",
        ),
        (
            gdn,
            {"linear_num_value_heads": 6},
            {"tp": 4},
            "config.linear_num_value_heads = 6: not divisible by tp = 4",
        ),
        (
            nem,
            {"mamba_num_heads": 6},
            {"tp": 4},
            "config.n_groups = 2: vLLM needs it divisible by tp = 4 (or 1)",
        ),
        (
            nem,
            {"mamba_num_heads": 6, "n_groups": 4},
            {"tp": 4},
            "config.mamba_num_heads = 6: not divisible by tp = 4",
        ),
    ):
        with pytest.raises(SpecError) as e:
            J.from_config({**cfg, **change}, **kw)
        assert str(e.value) == msg


class _FakeConfigClass:
    """A stand-in for a transformers config class (transformers takes ~12 s to import): defaults filled,
    one derived field, an attribute_map alias."""

    attribute_map = {"n_head": "num_attention_heads", 3: "x", "gone": "absent"}

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _FakeConfigClass:
        if d.get("bad"):
            raise ValueError("bad is not allowed")
        return cls(d)

    def to_dict(self) -> dict[str, Any]:
        out = {"num_attention_heads": 8, "head_dim": 64, "dropped": None, "n_head": None, **self.d}
        if "text_config" in self.d:
            out["text_config"] = {"filled": 1, "keep": None}
        out.pop("written_only", None)
        return out


def test_reader_transformers_logic_with_a_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from kvlayout.models.config import through_transformers

    fake = types.ModuleType("transformers")
    fake.CONFIG_MAPPING = {"fake": _FakeConfigClass}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    notes: list[str] = []
    data = {"model_type": "fake", "dropped": 5, "written_only": [1], "text_config": {"keep": 2, "more": 3}}
    out, built = through_transformers(data, notes)
    assert built
    assert out == {
        "model_type": "fake",
        "num_attention_heads": 8,
        "head_dim": 64,
        "dropped": 5,
        "written_only": [1],
        "n_head": 8,
        "text_config": {"filled": 1, "keep": 2, "more": 3},
    }
    assert notes == ["read through transformers' _FakeConfigClass"]
    # a model type that is not a string is read as written, with a note (build refuses it first); an unknown
    # one is refused as vLLM's AutoConfig refuses it, unless config.json names remote code (issue 25, pass 16)
    for mt, extra in (("other", {"auto_map": {"AutoConfig": "m.C"}}), (None, {}), (3, {})):
        notes = []
        written = {"model_type": mt, **extra}
        assert through_transformers(written, notes) == (written, False)
        assert notes == [f"model_type {mt!r} is not a transformers config class: read as written"]
    with pytest.raises(SpecError, match="AutoConfig refuses it") as e:
        through_transformers({"model_type": "other"}, [])
    assert e.value.field == "config.model_type"
    # a layer count out of range is refused before transformers builds per-layer lists
    for where, d in (
        ("config", {"num_hidden_layers": 10_001}),
        ("config", {"num_hidden_layers": -1}),
        ("config.text_config", {"text_config": {"num_hidden_layers": 10**9}}),
    ):
        with pytest.raises(SpecError) as e:
            through_transformers({"model_type": "fake", **d}, [])
        assert e.value.field == f"{where}.num_hidden_layers" and "must be between 0 and 10,000" in str(
            e.value
        )
    for n in (0, 10_000):
        made, _ = through_transformers({"model_type": "fake", "num_hidden_layers": n}, [])
        assert made["num_hidden_layers"] == n
    with pytest.raises(SpecError) as e:
        through_transformers({"model_type": "fake", "bad": True}, [])
    assert str(e.value) == (
        "config = 'fake': transformers refuses it (_FakeConfigClass, vLLM 0.33's class for model_type "
        "'fake'): bad is not allowed"
    )
    # no alias map, or a map that is not a mapping: nothing added
    monkeypatch.setattr(_FakeConfigClass, "attribute_map", None)
    assert "n_head" in through_transformers({"model_type": "fake"}, [])[0] and (
        through_transformers({"model_type": "fake"}, [])[0]["n_head"] is None
    )
    # without transformers: a clear refusal naming the reader
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SpecError) as e:
        through_transformers({"model_type": "fake"}, [])
    assert (
        str(e.value)
        == "reader = 'transformers': transformers is not installed: pip install 'kvlayout[models]'"
    )
    # from_config with the reader: the completed config reads no hint of transformers' defaults
    monkeypatch.setitem(sys.modules, "transformers", fake)
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "fake", "num_hidden_layers": 1}
    with pytest.raises(SpecError) as e:
        J.from_config({**llama, "num_hidden_layers": None}, reader="transformers")
    assert str(e.value) == "config.num_hidden_layers = None: missing; the number of decoder layers"
    ms = J.from_config({**llama, "torch_dtype": "bfloat16"}, reader="transformers")
    assert isinstance(ms, M.ModelSpec) and {x.head_size for _, x in ms.spec.layers} == {64}
    assert "read through transformers' _FakeConfigClass" in ms.notes


def test_which_mla_models_have_an_indexer_and_their_cache_dtypes() -> None:
    base = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "torch_dtype": "float16",
    }
    # V3.2 by architecture (vLLM asserts its index_topk), or any MLA config writing index_topk (V2 here)
    with pytest.raises(SpecError, match=r"config\.index_topk = None: missing; vLLM 0.33 asserts it"):
        J.from_config(base)
    base = {**base, "index_topk": 64}
    for cfg in (base, {**base, "architectures": ["DeepseekV2ForCausalLM"]}):
        ms = J.from_config(cfg)
        assert isinstance(ms, M.ModelSpec)
        assert sorted(set(ms.kinds.values())) == ["indexer", "mla"] and len(ms.spec.layers) == 4
    plain = {k: v for k, v in base.items() if k != "index_topk"}
    ms = J.from_config({**plain, "architectures": ["DeepseekV2ForCausalLM"]})
    assert isinstance(ms, M.ModelSpec) and set(ms.kinds.values()) == {"mla"}
    # the cache dtype is the model's (float16 here), with and without the indexer; an explicit bfloat16
    # beside it is refused as vLLM 0.33's VllmConfig refuses it (hostile pass 25, L3)
    for cfg in (base, {**plain, "architectures": ["DeepseekV2ForCausalLM"]}):
        for kv, want in (("float16", "float16"), (None, "float16"), ("auto", "float16")):
            ms = J.from_config(cfg, kv_cache_dtype=kv)
            assert isinstance(ms, M.ModelSpec) and ms.kv_cache_dtype == want
            assert {x.dtype for _, x in ms.spec.layers if ms.kinds[x.name] == "mla"} == {want}
        with pytest.raises(SpecError) as e:
            J.from_config(cfg, kv_cache_dtype="bfloat16")
        assert (e.value.field, e.value.value) == ("kv_cache_dtype", "bfloat16")
        assert "beside the model's dtype float16 (valid: auto or float16)" in str(e.value)


def test_jamba_offset_zero_and_state_kinds() -> None:
    jamba = {
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 4,
        "attn_layer_period": 2,
        "attn_layer_offset": 0,
        "hidden_size": 256,
        "mamba_expand": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(jamba)  # offset 0: layers 0 and 2 are attention
    assert isinstance(ms, M.ModelSpec)
    assert ms.kinds == {
        "model.layers.0.attn": "full",
        "model.layers.1.mixer": "mamba",
        "model.layers.2.attn": "full",
        "model.layers.3.mixer": "mamba",
    }


def test_hybrid_head_keys_cache_dtype_block_and_exact_state_page() -> None:
    jamba = {
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 2,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "hidden_size": 64,
        "mamba_expand": 1,
        "mamba_d_conv": 4,
        "mamba_d_state": 29,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,  # equal to hidden_size // heads, as vLLM's Jamba layers take it (pass 22)
        "torch_dtype": "bfloat16",
    }
    # state 64 * 3 * 2 + 64 * 29 * 2 = 4,096 B = 16 tokens * 256 B: the Mamba page needs no alignment
    ms = J.from_config(jamba)
    assert isinstance(ms, M.ModelSpec) and ms.block_size == 16 and ms.attention_backend == "FLASH_ATTN"
    mamba = next(x for _, x in ms.spec.layers if ms.kinds[x.name] == "mamba")
    assert (mamba.state_bytes, mamba.alignment, mamba.page) == (4096, None, 4096)
    assert ms.notes[-1].endswith("(+0 B padding)")
    # Jamba reads head_dim only (attention_head_dim is Nemotron-H's): without head_dim, hidden // heads
    ms = J.from_config({**jamba, "head_dim": None, "attention_head_dim": 16})
    assert isinstance(ms, M.ModelSpec)
    assert {x.head_size for _, x in ms.spec.layers if ms.kinds[x.name] == "full"} == {64 // 1}
    assert _field(J.from_config, {**jamba, "head_dim": 32}) == "config.head_dim"
    # the cache dtype: fp8 halves the attention token (128 B), so 32-token blocks hold the 4,096 B state
    ms = J.from_config(jamba, kv_cache_dtype="fp8")
    assert isinstance(ms, M.ModelSpec) and ms.block_size == 32 and ms.kv_cache_dtype == "float8_e4m3fn"
    # a block size no attention backend takes as such is realigned, not refused (vLLM's hybrid alignment)
    ms = J.from_config(jamba, block_size=40)
    assert isinstance(ms, M.ModelSpec) and ms.attention_backend == "FLASH_ATTN"
    assert ms.block_size == _hybrid_block(4096, 256, 40) == 48  # unit 40, rounded up to 16s
    ms = J.from_config(jamba, block_size=8)
    assert isinstance(ms, M.ModelSpec) and ms.block_size == 16
    assert "block_size 8 raised to 16: one attention page must hold a Mamba state" in ms.notes
    # the summary shows "-" tokens for the Mamba states
    lines = M.summary(ms, proof=False).splitlines()
    head = next(i for i, x in enumerate(lines) if x.lstrip().startswith("kind"))
    row = next(x for x in lines[head:] if x.startswith("  mamba "))
    assert row.split()[:3] == ["mamba", "1", "-"]


def test_packed_groups_without_a_mixed_bucket_stay_whole() -> None:
    import json
    from pathlib import Path

    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json").read_text()
    )
    # window caches (3 repeats), ratio-128 caches and states (2 each): no bucket mixes pages, so no split
    ms = J.from_config({**base, "num_hidden_layers": 3, "compress_ratios": [0, 128, 128]})
    assert isinstance(ms, M.ModelSpec)
    assert [(g.name, len(g.layers)) for g in ms.spec.groups] == [
        ("swa", 3),
        ("compressed", 2),
        ("c128_states", 2),
    ]


def test_native_summary_joins_the_kinds_sharing_an_array() -> None:
    gemma = {
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_size": 1024,
        "sliding_window": 64,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(gemma, engine="tpu-inference", block_size=16)
    assert isinstance(ms, M.NativeModelSpec)
    row = next(x for x in M.summary(ms, proof=False).splitlines() if "+" in x)
    assert row.split()[:3] == ["sliding+full", "1", "2"]


def test_deepseek_v4_token_row_off_the_default() -> None:
    import json
    from pathlib import Path

    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures" / "models" / "deepseek_v4" / "config.json").read_text()
    )
    # head 513, RoPE 64: 449 fp8 NoPE + 128 B RoPE + 7 scales + 1 pad = 585 B, one more than the default 584
    for head, token in ((513, 585), (512, 584), (448, 448 - 64 + 128 + (448 - 64) // 64 + 1)):
        ms = J.from_config({**base, "num_hidden_layers": 1, "compress_ratios": [0], "head_dim": head})
        assert isinstance(ms, M.ModelSpec)
        (x,) = [x for _, x in ms.spec.layers]
        assert x.real_page == 64 * token and x.page == _round_up(64 * token, 576)


def test_tpu_inference_defaults_dcp_and_hybrid_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from kvlayout.models.tpu_inference import tpu_inference_from_config

    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 1024,
        "torch_dtype": "bfloat16",
    }
    ms = tpu_inference_from_config(llama)  # tp 1, dp 1, json reader, 16 pages, auto: flax_nnx
    assert (ms.tp, ms.mesh, ms.model_impl, ms.spec.num_blocks) == (1, {"data": 1, "model": 1}, "flax_nnx", 16)
    assert ms.spec.leaves[0].shape == (16, 64, 2 * 2 // 2, 2, 128)
    # dcp 2 on flax_nnx: KV heads padded to model * dcp = 4 shards, so 2 per model rank; vLLM's model: to tp
    for impl, per_rank in (("flax_nnx", 2), ("vllm", 1)):
        ms = tpu_inference_from_config(llama, tp=2, dcp=2, block_size=16, model_impl=impl)
        assert ms.spec.leaves[0].shape == (16, 16 * 2, -(-2 * per_rank // 2) * 2, 2, 128), impl
    # a hybrid keeps tpu-inference's page (16) where vLLM aligns its block (48 here); vLLM's note is dropped
    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 2,
        "hybrid_override_pattern": "M*",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "attention_head_dim": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    vllm_ms = J.from_config(nem, block_size=16)
    assert isinstance(vllm_ms, M.ModelSpec) and vllm_ms.block_size == _hybrid_block(17_920, 512, 16) == 48
    ms = tpu_inference_from_config(nem, block_size=16, num_blocks=2)
    # head size 64: K and V share one 128-lane row, 2 heads packed 2 per 32 bits
    assert ms.block_size == 16 and [x.shape for x in ms.spec.leaves] == [(2, 16, 2 // 2, 2, 128)]
    assert ms.notes == (
        "hybrid: one array per attention layer (named by layer: runner.kv_caches also holds the Mamba state "
        "tuples, per request slot, never zeroed by block id); not checked against tpu-inference's own code",
    )
    # the reader reaches both of vLLM's readings (the default page's too): a stub class fills the heads
    fake = types.ModuleType("transformers")
    fake.CONFIG_MAPPING = {"fake": _FakeConfigClass}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    bare = {k: v for k, v in llama.items() if k not in ("num_attention_heads", "head_dim")}
    ms = tpu_inference_from_config({**bare, "model_type": "fake"}, reader="transformers", num_blocks=2)
    assert ms.block_size == 64 and ms.spec.leaves[0].shape == (
        2,
        64,
        2 // 2,
        2,
        128,
    )  # the stub's head_dim 64


def test_config_from_a_path_block_one_and_falcon_multi_query(tmp_path: Any) -> None:
    import json
    from pathlib import Path

    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama))
    assert J.from_config(str(path)).block_size == 16
    # a block of one token is a positive block size (DeepSeek-V4 window-only layers take it)
    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures/models/deepseek_v4/config.json").read_text()
    )
    assert (
        J.from_config({**base, "num_hidden_layers": 2, "compress_ratios": [0, 1]}, block_size=1).block_size
        == 1
    )
    ms = J.from_config(path, block_size=32)
    assert isinstance(ms, M.ModelSpec) and ms.block_size == 32 and ms.architecture == "LlamaForCausalLM"
    with pytest.raises(SpecError) as e:
        J.from_config(tmp_path / "missing.json")
    assert e.value.field == "config file" and "missing.json" in str(e.value)
    path.write_text("[1, 2]")
    with pytest.raises(SpecError) as e:
        J.from_config(path)
    assert str(e.value) == "config = 'list': must be a JSON object (a model's config.json)"
    falcon = {
        "architectures": ["FalconForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "new_decoder_architecture": False,
        "multi_query": True,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(falcon, block_size=16)
    assert isinstance(ms, M.ModelSpec) and {x.num_kv_heads for _, x in ms.spec.layers} == {1}


def test_more_refusal_messages() -> None:
    from kvlayout.models.attention import VARIATIONS, read_attention

    glm, fal = VARIATIONS["ChatGLMModel"], VARIATIONS["FalconForCausalLM"]
    b = {"num_attention_heads": 16, "hidden_size": 2048}
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "head_dim": 64,
    }
    hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
    cases = {
        "glm_flag": lambda: read_attention(Config(b, "config"), 1, variation=glm),
        "glm_num": lambda: read_attention(
            Config({**b, "multi_query_attention": True}, "config"), 1, variation=glm
        ),
        "fal_new": lambda: read_attention(Config(b, "config"), 1, variation=fal),
        "fal_kv": lambda: read_attention(
            Config({**b, "new_decoder_architecture": True}, "config"), 1, variation=fal
        ),
        "fal_mq": lambda: read_attention(
            Config({**b, "new_decoder_architecture": False}, "config"), 1, variation=fal
        ),
        "arch_missing": lambda: J.from_config({**llama, "architectures": None}),
        "arch_bad": lambda: J.from_config({**llama, "architectures": []}),
        "block": lambda: J.from_config(llama, block_size=0),
        "layers": lambda: J.from_config({**llama, "num_hidden_layers": 10_001}),
        "tp": lambda: J.from_config(llama, tp=0),
        "kvd": lambda: J.from_config(llama, kv_cache_dtype="int8"),
        "dtype": lambda: J.from_config(llama, dtype="int8"),
        "engine": lambda: J.from_config(llama, engine="x"),
        "tpuopt": lambda: J.from_config(llama, dp=2),
        "device": lambda: J.from_config(llama, engine="tpu-inference", device="ampere"),
        "reader": lambda: J.from_config(llama, reader="x"),
        "text": lambda: J.from_config({**llama, "text_config": 3}),
        "tdtype": lambda: J.from_config({**llama, "torch_dtype": "int8"}),
    }
    want = dict(
        [
            (
                "glm_flag",
                "config.multi_query_attention = None: missing; ChatGLM's KV heads depend on it" + hint,
            ),
            (
                "glm_num",
                "config.multi_query_group_num = None: missing; the KV heads with multi_query_attention"
                + hint,
            ),
            (
                "fal_new",
                "config.new_decoder_architecture = None: missing; Falcon's KV heads depend on it" + hint,
            ),
            (
                "fal_kv",
                "config.num_kv_heads = None: missing; the KV heads of the new decoder architecture" + hint,
            ),
            ("fal_mq", "config.multi_query = None: missing; Falcon has one KV head with multi_query" + hint),
            (
                "arch_missing",
                "config.architectures = None: missing; it names the model class the engine builds",
            ),
            ("arch_bad", "config.architectures = []: must be a non-empty list of class names"),
            ("block", "block_size = 0: must be a positive integer, at most 2**53"),
            ("layers", "config.num_hidden_layers = 10001: must be at most 10,000"),
            ("tp", "tp = 0: must be a positive integer, at most 2**53"),
            ("kvd", "kv_cache_dtype = 'int8': valid: auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2"),
            ("dtype", "dtype = 'int8': valid: auto, bfloat16, float16, float32"),
            ("engine", "engine = 'x': valid: vllm, tpu-inference"),
            ("tpuopt", "dp = 2: applies to engine tpu-inference only"),
            (
                "device",
                "device = 'ampere': a CUDA GPU and its vLLM attention backend apply to engine vllm only",
            ),
            ("reader", "reader = 'x': valid: auto, json, transformers"),
            ("text", "config.text_config = 3: must be a JSON object"),
            ("tdtype", "config.torch_dtype = 'int8': valid: bfloat16, float16, float32 (or pass dtype=)"),
        ]
    )
    assert sorted(cases) == sorted(want)
    for key, call in cases.items():
        with pytest.raises(SpecError) as e:
            call()  # key: the case
        assert str(e.value) == want[key], key


def test_hybrid_groups_intervals_and_split_fields() -> None:
    falcon = {
        "architectures": ["FalconH1ForCausalLM"],
        "num_hidden_layers": 1,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_d_ssm": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    for tp in (1, 2):  # 2 groups: kept at tp 1 and 2 (divisible), conv (128 + 2 * 2 * 16) / tp
        ms = J.from_config(falcon, tp=tp)
        assert isinstance(ms, M.ModelSpec)
        (state,) = {x.state_bytes for _, x in ms.spec.layers if ms.kinds[x.name] == "mamba"}
        assert state == 3 * (128 + 2 * 2 * 16) // tp * 2 + 8 // tp * 16 * 16 * 2
    # mamba_expand is bounded to (0, 1024]
    assert (
        _field(J.from_config, {**falcon, "mamba_d_ssm": None, "mamba_expand": 1024.5})
        == "config.mamba_expand"
    )
    # a sharded dimension tp does not split is refused naming the field vLLM shards it by
    with pytest.raises(SpecError) as e:
        J.from_config({**falcon, "mamba_d_ssm": 127}, tp=2)
    assert str(e.value) == "config.mamba_n_groups = 191: not divisible by tp = 2"
    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 2,
        "hybrid_override_pattern": "M*",
        "mamba_num_heads": 3,
        "mamba_head_dim": 3,
        "n_groups": 2,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "attention_head_dim": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    with pytest.raises(SpecError) as e:
        J.from_config(nem, tp=2)
    assert str(e.value) == f"config.n_groups = {3 * 3 + 2 * 2 * 32}: not divisible by tp = 2"
    gdn = {
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 6,
        "full_attention_interval": 3,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 3,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 3,
        "linear_conv_kernel_dim": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_size": 512,
        "torch_dtype": "bfloat16",
    }
    with pytest.raises(SpecError) as e:
        J.from_config(gdn, tp=2)
    assert str(e.value) == f"config.linear_num_key_heads = {2 * 4 * 32 + 3 * 3}: not divisible by tp = 2"
    # every 3rd layer is full attention: layers 2 and 5
    gdn = {**gdn, "linear_num_value_heads": 8, "linear_value_head_dim": 16}
    ms = J.from_config(gdn)
    assert isinstance(ms, M.ModelSpec)
    assert sorted(n for n, k in ms.kinds.items() if k == "full") == [
        "model.layers.2.self_attn.attn",
        "model.layers.5.self_attn.attn",
    ]
    # layer_types must have exactly one entry per layer
    lt = ["linear_attention", "linear_attention", "full_attention"] * 2
    assert _field(J.from_config, {**gdn, "layer_types": [*lt, "full_attention"]}) == "config.layer_types"


def test_attention_and_backend_refusal_messages() -> None:
    from kvlayout.models.attention import Variation, layer_types, read_attention
    from kvlayout.models.backends import resolve

    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "head_dim": 64,
    }
    v32 = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
    }
    cases = {
        "list_type": lambda: _cfg(a=3).req_list("a", "", 1, int),
        "list_exact": lambda: _cfg(a=[1, 2]).req_list("a", "", 1, int, exact=True),
        "list_short": lambda: _cfg(a=[1]).req_list("a", "", 2, int),
        "list_item": lambda: _cfg(a=["x"]).req_list("a", "", 1, int),
        "heads_missing": lambda: read_attention(_cfg(), 1),
        "heads_tp": lambda: read_attention(_cfg(num_attention_heads=6, head_dim=8), 4),
        "kv_tp": lambda: read_attention(_cfg(num_attention_heads=48, num_key_value_heads=12, head_dim=8), 8),
        "kv_mult": lambda: read_attention(
            _cfg(num_attention_heads=48, num_key_value_heads=3, head_dim=8), 16
        ),
        "head_type": lambda: read_attention(_cfg(num_attention_heads=4, head_dim="x"), 1),
        "hidden": lambda: read_attention(_cfg(num_attention_heads=4), 1),
        "lt_need": lambda: layer_types(_cfg(sliding_window=4), "generic_sw", 2, Variation(layer_types=True)),
        "lt_flag": lambda: layer_types(
            _cfg(sliding_window=4), "generic", 2, Variation(window_flag="use_sliding_window")
        ),
        "lt_item": lambda: layer_types(_cfg(layer_types=["x", "full_attention"]), "gemma2", 2),
        "gemma3": lambda: layer_types(_cfg(), "gemma3", 2),
        "mistral": lambda: layer_types(_cfg(), "mistral", 2),
        "gpt_oss": lambda: J.from_config(
            {**llama, "architectures": ["GptOssForCausalLM"], "sliding_window": 4, "num_key_value_heads": 2},
            tp=4,
        ),
        "sw_missing": lambda: J.from_config({**llama, "architectures": ["Gemma2ForCausalLM"]}),
        "sparse_dev": lambda: resolve(mla=True, sparse=True, device="blackwell", kv_cache_dtype="auto"),
        "ab_kind": lambda: resolve(
            mla=True, sparse=True, device="hopper", kv_cache_dtype="auto", attention_backend="X"
        ),
        "ab_refused": lambda: resolve(
            mla=False, device="hopper", kv_cache_dtype="fp8_e5m2", attention_backend="FLASH_ATTN"
        ),
        "no_backend": lambda: resolve(mla=True, device="hopper", kv_cache_dtype="fp8", block_size=8),
        "ds_mla": lambda: J.from_config(v32, kv_cache_dtype="fp8_e5m2"),
        "mla_block": lambda: J.from_config(
            {**_drop(v32, "index_head_dim"), "architectures": ["DeepseekV3ForCausalLM"]},
            kv_cache_dtype="fp8",
            block_size=8,
        ),
    }
    want = {
        "list_type": ("config.a = 3: must be a list"),
        "list_exact": ("config.a = '2 items': needs exactly one item per layer (1)"),
        "list_short": ("config.a = '1 items': needs one item per layer (2)"),
        "list_item": ("config.a[0] = 'x': must be an integer"),
        "heads_missing": (
            "config.num_attention_heads = None: missing; the query heads; reader='transformer"
            "s' fills the config class's defaults, as vLLM does"
        ),
        "heads_tp": ("config.num_attention_heads = 6: not divisible by tp = 4"),
        "kv_tp": ("config.num_key_value_heads = 12: not divisible by tp = 8"),
        "kv_mult": (
            "config.num_key_value_heads = 3: tp = 16 is not a multiple of it (KV heads are replicated)"
        ),
        "head_type": ("config.head_dim = 'x': must be an integer"),
        "hidden": (
            "config.hidden_size = None: missing; the head size is hidden_size // num_attentio"
            "n_heads without head_dim; reader='transformers' fills the config class's default"
            "s, as vLLM does"
        ),
        "lt_need": (
            "config.layer_types = None: missing; this model's config class derives which laye"
            "rs slide; reader='transformers' fills the config class's defaults, as vLLM does"
        ),
        "lt_flag": (
            "config.use_sliding_window = None: missing; the window counts only when true; rea"
            "der='transformers' fills the config class's defaults, as vLLM does"
        ),
        "lt_item": ("config.layer_types[0] = 'x': valid: sliding_attention, full_attention"),
        "gemma3": (
            "config.sliding_window_pattern = None: missing; Gemma 3 slides unless (i + 1) % s"
            "liding_window_pattern == 0 (transformers' default is 6: write it into config.jso"
            "n); reader='transformers' fills the config class's defaults, as vLLM does"
        ),
        "mistral": (
            "config.sliding_window = None: missing; null for full attention (transformers' de"
            "fault is 4096); reader='transformers' fills the config class's defaults, as vLLM"
            " does"
        ),
        "gpt_oss": (
            "config.num_key_value_heads = 2: fewer than tp = 4: vLLM's GptOssAttention does not "
            "replicate KV heads (0 per rank)"
        ),
        "sw_missing": (
            "config.sliding_window = None: missing; the window of the sliding layers; reader="
            "'transformers' fills the config class's defaults, as vLLM does"
        ),
        "sparse_dev": (
            "device = 'blackwell': vLLM 0.33's sparse MLA choice on blackwell depends on head"
            " count and kernels not modeled here; name one with attention_backend (--attentio"
            "n-backend), e.g. FLASHMLA_SPARSE"
        ),
        "ab_kind": ("attention_backend = 'X': valid for sparse MLA: FLASH_ATTN_MLA_SPARSE, FLASHMLA_SPARSE"),
        "ab_refused": (
            "attention_backend = 'FLASH_ATTN': vLLM refuses it on hopper: kv_cache_dtype fp8_"
            "e5m2 not supported"
        ),
        "no_backend": (
            "block_size = 8: no vLLM MLA backend on hopper takes it (FLASH_ATTN_MLA: "
            "kv_cache_dtype fp8 not supported; FLASHMLA: block_size not supported; FLASHINFER"
            "_MLA: compute capability not supported; TRITON_MLA: block_size not supported)"
        ),
        "ds_mla": (  # fp8_ds_mla is planned (FLASHMLA_SPARSE takes it); fp8_e5m2 no backend takes
            "kv_cache_dtype = 'fp8_e5m2': no vLLM sparse MLA backend on hopper takes it (FLASH_ATTN_MLA"
            "_SPARSE: kv_cache_dtype fp8_e5m2 not supported; FLASHMLA_SPARSE: kv_cache_dtype fp8_e5m2 "
            "not supported)"
        ),
        "mla_block": (
            "block_size = 8: no vLLM MLA backend on hopper takes it (FLASH_ATTN_MLA: "
            "kv_cache_dtype fp8 not supported; FLASHMLA: block_size not supported; FLASHINFER"
            "_MLA: compute capability not supported; TRITON_MLA: block_size not supported)"
        ),
    }
    assert sorted(cases) == sorted(want)
    for key, call in cases.items():
        with pytest.raises(SpecError) as e:
            call()  # key: the case
        assert str(e.value) == want[key], key


def test_last_rules_types_and_head_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from kvlayout.models.backends import resolve
    from kvlayout.models.config import through_transformers

    # a list of integers refuses booleans (is_int), as a bad compress ratio
    assert _field(_cfg(a=[0, True]).req_list, "a", "", 2, int) == "config.a[1]"
    # layer_types longer than the layers is refused too (transformers refuses it)
    lt = ["sliding_attention", "full_attention", "full_attention"]
    assert _field(layer_types, _cfg(layer_types=lt), "gemma2", 2) == "config.layer_types"
    # Nemotron-H reads head_dim before attention_head_dim
    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 2,
        "hybrid_override_pattern": "M*",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "head_dim": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 1024,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(nem)
    assert isinstance(ms, M.ModelSpec) and {
        x.head_size for _, x in ms.spec.layers if ms.kinds[x.name] == "full"
    } == {32}
    with pytest.raises(SpecError) as e:
        resolve(mla=True, sparse=True, device="hopper", kv_cache_dtype="auto", attention_backend="FLASHMLA")
    assert str(e.value) == "attention_backend = 'FLASHMLA': vLLM refuses it on hopper: sparse not supported"
    with pytest.raises(SpecError) as e:
        resolve(
            mla=True, sparse=True, device="hopper", kv_cache_dtype="auto", attention_backend="FLASH_ATTN_MLA"
        )
    assert str(e.value).endswith("vLLM refuses it on hopper: sparse not supported")
    with pytest.raises(SpecError) as e:
        resolve(mla=True, device="hopper", kv_cache_dtype="auto", attention_backend="FLASHMLA_SPARSE")
    assert (
        str(e.value)
        == "attention_backend = 'FLASHMLA_SPARSE': vLLM refuses it on hopper: non-sparse not supported"
    )
    jamba = {
        "architectures": ["JambaForCausalLM"],
        "num_hidden_layers": 2,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "mamba_expand": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 16,
        "num_attention_heads": 1,
        "head_dim": 64,
    }
    with pytest.raises(SpecError) as e:
        J.from_config(jamba)
    # the attention's head size reads hidden_size first (pass 22: Jamba's layers take hidden // heads)
    assert str(e.value).startswith(
        "config.hidden_size = None: missing; the head size is hidden_size // num_attention_heads "
        "without head_dim;"
    )
    falcon = {
        "architectures": ["FalconH1ForCausalLM"],
        "num_hidden_layers": 1,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_n_groups": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "num_attention_heads": 4,
        "head_dim": 64,
    }
    with pytest.raises(SpecError) as e:
        J.from_config(falcon)
    assert str(e.value).startswith(
        "config.hidden_size = None: missing; the Mamba inner size is mamba_expand * hidden_size;"
    )

    # a config class without an attribute_map, and a written section the class does not make
    class Plain:
        @classmethod
        def from_dict(cls, d: dict[str, Any]) -> Any:
            return types.SimpleNamespace(to_dict=lambda: {"made": 1})

    fake = types.ModuleType("transformers")
    fake.CONFIG_MAPPING = {"plain": Plain}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    out, _ = through_transformers({"model_type": "plain", "extra": {"a": 1}}, [])
    assert out == {"made": 1, "model_type": "plain", "extra": {"a": 1}}


def test_remaining_messages_labels_and_kept_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from kvlayout.models.backends import check_device
    from kvlayout.models.config import resolve_kv_dtype, resolve_model_dtype, through_transformers

    hint = "; reader='transformers' fills the config class's defaults, as vLLM does"
    nem = {
        "architectures": ["NemotronHForCausalLM"],
        "num_hidden_layers": 2,
        "hybrid_override_pattern": "M*",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 32,
        "conv_kernel": 4,
        "attention_head_dim": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    ms = J.from_config(nem)
    assert isinstance(ms, M.ModelSpec) and ms.kinds["model.layers.0.mixer"] == "mamba"
    with pytest.raises(SpecError) as e:
        J.from_config({**nem, "hybrid_override_pattern": 5})
    assert str(e.value) == "config.hybrid_override_pattern = 5: must be a string"
    with pytest.raises(SpecError) as e:
        resolve_kv_dtype("int8", "bfloat16")
    assert str(e.value) == "kv_cache_dtype = 'int8': valid: auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2"
    with pytest.raises(SpecError) as e:
        check_device("volta")
    assert str(e.value) == "device = 'volta': valid: hopper, blackwell, ampere"
    notes: list[str] = []
    resolve_model_dtype(_cfg(), _cfg(), None, notes)
    assert notes == [
        "no torch_dtype in the config: vLLM reads the weights' dtype from safetensors, else runs it "
        "in bfloat16 (assumed here; pass dtype= for the weights' dtype)"
    ]
    with pytest.raises(SpecError) as e:
        J.from_config({"architectures": ["NoSuchForCausalLM"]})
    assert e.value.value == "NoSuchForCausalLM" and "unknown architecture (not one of vLLM" in str(e.value)
    assert str(e.value).endswith(M.ARCHITECTURES[-1])
    with pytest.raises(SpecError) as e:
        _cfg(a=0).req_int("a", "")
    assert str(e.value) == "config.a = 0: must be at least 1"
    assert _cfg(a=1).opt_int("a") == 1
    import json
    from pathlib import Path

    base = json.loads(
        (Path(__file__).resolve().parent / "fixtures/models/deepseek_v4/config.json").read_text()
    )
    with pytest.raises(SpecError) as e:
        J.from_config(_drop(base, "num_attention_heads"))
    assert str(e.value) == "config.num_attention_heads = None: missing; the query heads" + hint

    class Made:
        attribute_map = {"n_head": "num_attention_heads"}

        @classmethod
        def from_dict(cls, d: dict[str, Any]) -> Any:
            return types.SimpleNamespace(to_dict=lambda: {"made": 1, "num_attention_heads": 8, "n_head": 5})

    fake = types.ModuleType("transformers")
    fake.CONFIG_MAPPING = {"made": Made}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    out, _ = through_transformers({"model_type": "made", "made": 2}, [])
    assert out["made"] == 1 and out["n_head"] == 5  # transformers' values and aliases already set are kept
    with pytest.raises(SpecError) as e:
        through_transformers({"model_type": "made", "num_hidden_layers": 10_001}, [])
    assert e.value.value == 10_001


def test_tpu_options_reach_validation_and_reasons_list_every_skip() -> None:
    from kvlayout.models.backends import resolve

    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "torch_dtype": "bfloat16",
    }
    assert _field(J.from_config, llama, engine="tpu-inference", max_model_len=0) == "max_model_len"
    assert _field(J.from_config, llama, engine="tpu-inference", batched_rpa=1) == "batched_rpa"
    with pytest.raises(SpecError) as e:
        J.from_config(llama, engine="tpu-inference")
    assert str(e.value) == (
        "config.max_position_embeddings = None: missing; "
        + "tpu-inference's default page size follows max_model_len (or pass it)"
        + "; reader='transformers' fills the config class's defaults, as vLLM does"
    )
    x = resolve(mla=True, device="ampere", kv_cache_dtype="auto", block_size=16)
    assert x.reason == (
        "first valid MLA backend on ampere in vLLM's priority list "
        + "(skipped FLASH_ATTN_MLA: compute capability not supported; "
        + "FLASHMLA: compute capability not supported; FLASHINFER_MLA: compute capability not supported)"
    )
    # GraniteMoE-Shared's per-layer windows: every layer slides when sliding_window is set, none without
    lay = Variation(window="layer")
    assert layer_types(_cfg(sliding_window=8), "generic", 3, lay) == ["sliding"] * 3
    assert layer_types(_cfg(), "generic", 3, lay) == ["full"] * 3


# ---------------------------------------------------------------- fifth session: the last survivors
_FIX = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "models"


def test_layer_bound_is_inclusive_and_refusals_name_vllms_module() -> None:
    from kvlayout.models.base import MAX_LAYERS, Ctx
    from kvlayout.models.families import refusal

    def ctx(n: int) -> Ctx:
        cfg = _cfg(num_hidden_layers=n)
        return Ctx(cfg, cfg, "llama", 1, "bfloat16", None, None, None, "model.layers", [], {})

    assert ctx(MAX_LAYERS).num_layers() == MAX_LAYERS == 10_000  # the bound itself is accepted
    with pytest.raises(SpecError) as e:
        ctx(MAX_LAYERS + 1).num_layers()
    assert (e.value.field, e.value.value) == ("config.num_hidden_layers", MAX_LAYERS + 1)
    assert str(e.value).endswith("must be at most 10,000")
    # an architecture vLLM serves and kvlayout refuses: the reason names vLLM's module, not "unknown"
    with pytest.raises(SpecError) as e:
        J.from_config({"architectures": ["Glm5NextForCausalLM"]})
    assert (e.value.field, e.value.value) == ("config.architectures[0]", "Glm5NextForCausalLM")
    arch = "Glm5NextForCausalLM"
    assert str(e.value) == f"config.architectures[0] = '{arch}': {refusal(arch)}"
    assert str(e.value).startswith(
        "config.architectures[0] = 'Glm5NextForCausalLM': vLLM 0.33.0 serves it (hybrid, module "
        "vllm.models.glm5next); kvlayout refuses it: "
    )


def test_attention_backend_of_any_type_is_a_spec_error() -> None:
    """Unhashable, non-string and unknown backend names are refused naming ``attention_backend``
    (a dict lookup of a list raised a raw TypeError), on every family: DeepSeek-V4 took any value."""
    for family in ("llama", "deepseek_v3", "deepseek_v32", "deepseek_v4", "qwen3_next"):
        for value in (["FLASH_ATTN"], {"FLASHMLA": 1}, 3, b"FLASHMLA", "nope", "FLASHINFER_MLA_SPARSE_DSV4"):
            with pytest.raises(SpecError) as e:
                J.from_config(_FIX / family / "config.json", attention_backend=value)
            assert (e.value.field, e.value.value) == ("attention_backend", value), (family, value)
    with pytest.raises(SpecError) as e:
        J.from_config(_FIX / "deepseek_v4" / "config.json", attention_backend="FLASHINFER_MLA_SPARSE_DSV4")
    assert str(e.value) == (
        "attention_backend = 'FLASHINFER_MLA_SPARSE_DSV4': valid: FLASHMLA_SPARSE_DSV4 or a name in "
        "kvlayout.models.backends.BACKENDS (vLLM 0.33 gives DeepSeek-V4 the FlashMLA cache modeled here for "
        "each); FlashInfer's DSv4 cache is not modeled"
    )
    # vLLM 0.33 builds V4's FlashMLA cache for FLASHMLA_SPARSE(_DSV4) and for backends V4 does not use
    plain = J.from_config(_FIX / "deepseek_v4" / "config.json")
    for name in ("FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "FLASH_ATTN"):
        assert J.from_config(_FIX / "deepseek_v4" / "config.json", attention_backend=name).spec == plain.spec


def test_v32_fp8_ds_mla_is_planned_as_vllm_plans_it() -> None:
    """``--kv-cache-dtype fp8_ds_mla`` on DeepSeek-V3.2: vLLM 0.33's FLASHMLA_SPARSE lists it (its
    ``fp8`` is an alias of it), so the cache is the fp8 one: 656 B per token, 64-token blocks."""
    v32 = _FIX / "deepseek_v32" / "config.json"
    for device, backend in (("hopper", None), ("blackwell", "FLASHMLA_SPARSE")):
        ds = J.from_config(v32, kv_cache_dtype="fp8_ds_mla", device=device, attention_backend=backend)
        fp8 = J.from_config(v32, kv_cache_dtype="fp8", device=device, attention_backend=backend)
        assert isinstance(ds, M.ModelSpec) and isinstance(fp8, M.ModelSpec)
        assert ds.spec == fp8.spec and ds.attention_backend == "FLASHMLA_SPARSE" and ds.block_size == 64
        assert ds.kv_cache_dtype == "fp8_ds_mla"
        att = [x for _, x in ds.spec.layers if ds.kinds[x.name] == "mla"]
        assert att and all(x.token_bytes == 512 + 512 // 128 * 4 + 2 * 64 for x in att)
    # FLASH_ATTN_MLA_SPARSE (first on Hopper) does not take it: the reason says so
    ds = J.from_config(v32, kv_cache_dtype="fp8_ds_mla")
    assert "skipped FLASH_ATTN_MLA_SPARSE: kv_cache_dtype fp8_ds_mla not supported" in ds.backend_reason
    with pytest.raises(SpecError) as e:
        J.from_config(v32, kv_cache_dtype="fp8_ds_mla", attention_backend="FLASH_ATTN_MLA_SPARSE")
    assert e.value.field == "attention_backend" and "kv_cache_dtype fp8_ds_mla not supported" in str(e.value)
    # fp8_e4m3: vLLM goes on to FLASHINFER_MLA_SPARSE_SM90 (64-token multiples), not modeled: said so
    skipped = (
        "FLASH_ATTN_MLA_SPARSE: kv_cache_dtype fp8_e4m3 not supported; "
        "FLASHMLA_SPARSE: kv_cache_dtype fp8_e4m3 not supported"
    )
    for block_size in (None, 64, 128):
        with pytest.raises(SpecError) as e:
            J.from_config(v32, kv_cache_dtype="fp8_e4m3", block_size=block_size)
        assert str(e.value) == (
            "kv_cache_dtype = 'fp8_e4m3': vLLM 0.33 passes over the sparse MLA backends modeled here "
            f"({skipped}) to FLASHINFER_MLA_SPARSE_SM90 (FlashInfer's SM90 sparse MLA), whose cache "
            "kvlayout does not model"
        )
    for block_size in (16, 32, 96):  # no vLLM backend takes these blocks (each wants 64-token multiples)
        with pytest.raises(SpecError) as e:
            J.from_config(v32, kv_cache_dtype="fp8_e4m3", block_size=block_size)
        assert str(e.value).startswith("kv_cache_dtype = 'fp8_e4m3': no vLLM sparse MLA backend on hopper")


def test_falcon_h1_state_that_fills_the_page_is_not_aligned() -> None:
    """A Falcon-H1 Mamba state exactly one attention page (16 tokens x 256 B = 4,096 B) takes no
    ``alignment`` (its page is its state), like the Mamba layers of the other hybrids."""
    falcon = {
        "architectures": ["FalconH1ForCausalLM"],
        "num_hidden_layers": 2,
        "mamba_n_heads": 1,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 2,
        "mamba_d_ssm": 992,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_size": 256,
        "torch_dtype": "bfloat16",
    }
    state = 1 * (992 + 2 * 16) * 2 + 1 * 64 * 16 * 2  # conv (1 step) + ssm, bf16
    per_token = 2 * 1 * 64 * 2
    assert state == 16 * per_token == 4096
    ms = J.from_config(falcon)
    _check_hybrid(ms, state, per_token, None, ["model.2.mixer", "model.3.mixer"],
                  ["model.layers.0.attn", "model.layers.1.attn"])
    mamba = [x for _, x in ms.spec.layers if x.name.endswith("mixer")]
    assert [x.alignment for x in mamba] == [None, None]
    assert all("alignment" not in x.to_dict() for x in mamba)
    # 4 B more: the next 16 tokens, and the state padded to that page
    ms = J.from_config({**falcon, "mamba_d_ssm": 994})
    _check_hybrid(ms, state + 4, per_token, None, ["model.2.mixer", "model.3.mixer"],
                  ["model.layers.0.attn", "model.layers.1.attn"])
    assert ms.block_size == 32 and {x.alignment for _, x in ms.spec.layers if x.name.endswith("mixer")} == {
        32 * per_token
    }


def test_tpu_inference_mesh_is_bounded_and_head_errors_name_dcp() -> None:
    """A mesh of more than 65,536 devices (as kvlayout.sharding bounds one) is refused naming the
    product (``dp=10**19`` with 0 blocks was planned); KV heads padded over ``tp * dcp`` (flax_nnx,
    seven axes) name ``tp * dcp``, not ``tp`` (was ``tp = 3`` for ``tp=1, dcp=3``)."""
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 1024,
        "torch_dtype": "bfloat16",
    }
    tpu = {"engine": "tpu-inference", "num_blocks": 0}
    for dp, tp, dcp in ((2**16, 1, 1), (2**13, 8, 1), (2**10, 8, 8)):
        assert isinstance(J.from_config(llama, dp=dp, tp=tp, dcp=dcp, **tpu), M.NativeModelSpec)
    for dp, tp, dcp in ((2**16 + 1, 1, 1), (2**13, 8, 2), (2**53, 1, 1), (1, 8, 2**13 + 1)):
        with pytest.raises(SpecError) as e:
            J.from_config(llama, dp=dp, tp=tp, dcp=dcp, **tpu)
        assert (e.value.field, e.value.value) == ("dp * tp * dcp", dp * tp * dcp)
        assert str(e.value) == f"dp * tp * dcp = {dp * tp * dcp}: a mesh has at most 65,536 devices"
    for tp, dcp, field, value, why in (
        (1, 3, "tp * dcp", 3, "does not divide the 8 KV heads"),
        (2, 3, "tp * dcp", 6, "does not divide the 8 KV heads"),
        (4, 4, "tp * dcp", 16, None),  # 16 shards: the 8 heads replicated to 16
        (16, 1, "tp", 16, None),
        (3, 1, "tp", 3, "does not divide the 8 KV heads"),
        (12, 1, "tp", 12, "is not a multiple of the 8 KV heads"),
        (4, 3, "tp * dcp", 12, "is not a multiple of the 8 KV heads"),
        (4, 6, "tp * dcp", 24, None),
    ):
        if why is None:
            assert isinstance(J.from_config(llama, tp=tp, dcp=dcp, **tpu), M.NativeModelSpec)
            continue
        with pytest.raises(SpecError) as e:
            J.from_config(llama, tp=tp, dcp=dcp, **tpu)
        assert (e.value.field, e.value.value) == (field, value), (tp, dcp)
        assert str(e.value) == f"{field} = {value}: {why} (tpu-inference asserts it)"


def test_mamba_ssm_cache_dtype_is_checked_for_every_model() -> None:
    """vLLM 0.33's ``--mamba-ssm-cache-dtype`` is one of auto, float32, float16, bfloat16 for any model;
    kvlayout checked it only where a family read it (Llama and DeepSeek took any value, of any type)."""
    for family in ("llama", "deepseek_v3", "deepseek_v4", "jamba", "qwen3_next"):
        for engine in ("vllm", "tpu-inference"):
            if engine == "tpu-inference" and family == "deepseek_v4":
                continue
            for value in ("nope", "fp8", "int8", 5, ["float32"], b"float32", True):
                with pytest.raises(SpecError) as e:
                    J.from_config(_FIX / family / "config.json", engine=engine, mamba_ssm_cache_dtype=value)
                assert (e.value.field, e.value.value) == ("mamba_ssm_cache_dtype", value), (family, value)
                want = f"mamba_ssm_cache_dtype = {value!r}: valid: auto, bfloat16, float16, float32"
                assert str(e.value) == want
    plain = J.from_config(_FIX / "llama" / "config.json")
    for value in (None, "auto", "float32", "float16", "bfloat16"):  # no Mamba state: no effect
        assert J.from_config(_FIX / "llama" / "config.json", mamba_ssm_cache_dtype=value).spec == plain.spec
    jamba = {x.name: x for _, x in J.from_config(_FIX / "jamba" / "config.json").spec.layers}
    f32 = J.from_config(_FIX / "jamba" / "config.json", mamba_ssm_cache_dtype="float32")
    states = [(x.state_bytes, jamba[x.name].state_bytes) for _, x in f32.spec.layers if x.kind == "mamba"]
    assert states and all(mine > theirs for mine, theirs in states)  # the argument reaches the state


# ---- this session's rules (issue 23): Llama 4's chunked layers, Zamba2's shared attention -------------
_L4: dict[str, Any] = {
    "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 1024,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0], "torch_dtype": "bfloat16",
}


def _kinds(cfg: dict[str, Any], **kw: Any) -> list[str]:
    return list(J.from_config(cfg, **kw).kinds.values())


def test_llama4_rope_layers_are_chunked_nope_layers_full() -> None:
    """vLLM's Llama4Attention: a layer with RoPE (no_rope_layers[i] != 0) attends within
    attention_chunk_size chunks; NoPE layers and a null chunk size are full attention."""
    marks = [1, 0, 2, 0, 0, 1, 1, 0]
    m = J.from_config({**_L4, "no_rope_layers": marks})
    assert list(m.kinds) == [f"model.layers.{i}.self_attn.attn" for i in range(8)]
    assert list(m.kinds.values()) == ["chunked" if x != 0 else "full" for x in marks]
    assert m.notes[0].startswith("chunked local attention (8,192-token chunks) on 4 of 8 layers")
    page = 2 * 8 * 128 * 2 * m.block_size  # chunked pages are full attention's
    assert {layer.page for g in m.spec.groups for layer in g.layers} == {page}
    assert _kinds({**_L4, "attention_chunk_size": None}) == ["full"] * 8
    # an empty list: transformers' default, a NoPE layer every no_rope_layer_interval layers
    for every in (1, 2, 3, 4):
        want = ["chunked" if (i + 1) % every != 0 else "full" for i in range(8)]
        assert _kinds({**_L4, "no_rope_layers": [], "no_rope_layer_interval": every}) == want, every
        cfg = {k: v for k, v in _L4.items() if k != "no_rope_layers"}
        assert _kinds({**cfg, "no_rope_layer_interval": every}) == want, every
    for bad, field in (
        ({k: v for k, v in _L4.items() if k != "attention_chunk_size"}, "config.attention_chunk_size"),
        ({**_L4, "no_rope_layers": [1, 0]}, "config.no_rope_layers"),
        ({**_L4, "no_rope_layers": [], "no_rope_layer_interval": None}, "config.no_rope_layer_interval"),
    ):
        with pytest.raises(SpecError) as e:
            J.from_config(bad)
        assert e.value.field == field, field
    with pytest.raises(SpecError) as e:
        J.from_config({k: v for k, v in _L4.items() if k != "attention_chunk_size"})
    assert "Llama 4's RoPE layers attend within chunks of it" in str(e.value)


_Z2: dict[str, Any] = {
    "architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "hidden_size": 256,
    "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1, "n_mamba_heads": 8,
    "num_attention_heads": 8, "num_key_value_heads": 8, "attention_hidden_size": 512,
    "attention_head_dim": 64, "torch_dtype": "bfloat16",
}


def test_zamba2_shared_attention_names_and_heads() -> None:
    """vLLM's Zamba2 (zamba2.py): hybrid layer k runs shared block k % num_mem_blocks, and every
    (block, layer) pair is a KV cache of its own, block b's numbered model.attn.{j} from
    j = b * (H + num_mem_blocks - 1) // num_mem_blocks (numbers may be skipped); the Mamba2 mixers
    follow as {H + i}.mixer (H hybrid layers); the attention has num_attention_heads heads of
    attention_head_dim, split over tp."""
    for types in (["hybrid"], ["mamba", "hybrid", "mamba", "hybrid"], ["hybrid"] * 3 + ["mamba"] * 2):
        hyb = [i for i, t in enumerate(types) if t == "hybrid"]
        h = len(hyb)
        for blocks in (1, 2, 3, 7):
            cfg = {**_Z2, "num_hidden_layers": len(types), "layers_block_type": types,
                   "hybrid_layer_ids": hyb, "num_mem_blocks": blocks}
            for tp in (1, 2, 8):
                m = J.from_config(cfg, tp=tp)
                names = list(m.kinds)
                want = []
                for b in range(blocks):
                    j = b * (h + blocks - 1) // blocks
                    for k in range(h):
                        if k % blocks == b:
                            want.append(f"model.attn.{j}")
                            j += 1
                assert names == want + [f"{h + i}.mixer" for i in range(len(types))], (types, blocks)
                attn = [layer for g in m.spec.groups for layer in g.layers if layer.name.startswith("model.")]
                assert {(a.num_kv_heads, a.head_size) for a in attn} == {(8 // tp, 64)}, (types, blocks, tp)
    base = {**_Z2, "num_hidden_layers": 2, "layers_block_type": ["mamba", "hybrid"], "num_mem_blocks": 1}
    for bad, field in (
        ({**base, "hybrid_layer_ids": [0]}, "config.hybrid_layer_ids"),
        ({**base, "hybrid_layer_ids": [1, 2]}, "config.hybrid_layer_ids"),
        ({k: v for k, v in {**base, "hybrid_layer_ids": [1]}.items() if k != "num_mem_blocks"},
         "config.num_mem_blocks"),
        ({**base, "hybrid_layer_ids": [1], "attention_hidden_size": 500}, "config.attention_hidden_size"),
        ({**base, "hybrid_layer_ids": [1], "num_key_value_heads": 4}, "config.num_key_value_heads"),
    ):
        with pytest.raises(SpecError) as e:
            J.from_config(bad)
        assert e.value.field == field, field


def test_dbrx_kv_heads_from_attn_config() -> None:
    """vLLM's DbrxAttention: the KV heads are attn_config.kv_n_heads (split over tp, one at least),
    the head size hidden_size // num_attention_heads whatever head_dim says."""
    var = VARIATIONS["DbrxForCausalLM"]
    for kv, tp in ((4, 1), (4, 2), (4, 8), (2, 2), (16, 4)):
        cfg = Config({"num_attention_heads": 32, "hidden_size": 2048, "head_dim": 100,
                      "attn_config": {"kv_n_heads": kv}}, "config")
        att = read_attention(cfg, tp, variation=var)
        assert (att.heads, att.kv_heads, att.head_size) == (32, max(1, kv // tp), 2048 // 32), (kv, tp)
    for attn, field, value in (
        (None, "config.attn_config", None), ([4], "config.attn_config", [4]),
        ("x", "config.attn_config", "x"), ({}, "config.attn_config.kv_n_heads", None),
    ):
        cfg = Config({"num_attention_heads": 32, "hidden_size": 2048, "attn_config": attn}, "config")
        with pytest.raises(SpecError) as e:
            read_attention(cfg, 1, variation=var)
        assert (e.value.field, e.value.value) == (field, value), attn
        if field == "config.attn_config":
            assert str(e.value).endswith("must be an object holding kv_n_heads")
        else:
            assert "DBRX's KV heads" in str(e.value)


_HINT = "; reader='transformers' fills the config class's defaults, as vLLM does"
_DBRX: dict[str, Any] = {
    "architectures": ["DbrxForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 32,
    "hidden_size": 2048, "head_dim": 100, "attn_config": {"kv_n_heads": 8}, "torch_dtype": "bfloat16",
}


def _error(fn: Any, *args: Any, **kw: Any) -> SpecError:
    with pytest.raises(SpecError) as e:
        fn(*args, **kw)
    return e.value


def _attention_layers(m: Any) -> list[FullAttentionSpec]:
    assert isinstance(m, M.ModelSpec)
    layers = [x for _, x in m.spec.layers]
    assert all(isinstance(x, FullAttentionSpec) for x in layers)
    return layers  # type: ignore[return-value]


def test_dbrx_attn_config_messages_name_the_field_and_value() -> None:
    """vLLM's DbrxAttention and ModelConfig read the KV heads from attn_config.kv_n_heads: the layers
    (transformer.blocks.{i}.norm_attn_norm.attn.attn) take kv_n_heads // tp of hidden_size // heads;
    a refusal names config.attn_config(.kv_n_heads), its value and why, whole."""
    for kv, tp in ((8, 1), (8, 2), (8, 8), (2, 8), (16, 4)):
        m = J.from_config({**_DBRX, "attn_config": {"kv_n_heads": kv}}, tp=tp)
        assert list(m.kinds) == [f"transformer.blocks.{i}.norm_attn_norm.attn.attn" for i in range(2)]
        layers = _attention_layers(m)
        assert {(x.num_kv_heads, x.head_size) for x in layers} == {(max(1, kv // tp), 2048 // 32)}, (kv, tp)
    # the field the KV heads came from names a count tp does not split
    e = _error(J.from_config, {**_DBRX, "attn_config": {"kv_n_heads": 3}}, tp=2)
    assert (e.field, e.value) == ("config.attn_config.kv_n_heads", 3)
    assert str(e) == "config.attn_config.kv_n_heads = 3: not divisible by tp = 2"
    e = _error(J.from_config, {**_DBRX, "attn_config": {"kv_n_heads": 3}}, tp=4)
    assert str(e) == (
        "config.attn_config.kv_n_heads = 3: tp = 4 is not a multiple of it (KV heads are replicated)"
    )
    # attn_config not an object
    for attn in ([8], "kv_n_heads", 8, None):
        e = _error(J.from_config, {**_DBRX, "attn_config": attn})
        assert (e.field, e.value) == ("config.attn_config", attn)
        assert str(e) == f"config.attn_config = {attn!r}: must be an object holding kv_n_heads"
    no_attn = {k: v for k, v in _DBRX.items() if k != "attn_config"}
    e = _error(J.from_config, no_attn)
    assert str(e) == "config.attn_config = None: must be an object holding kv_n_heads"
    # kv_n_heads missing or mistyped: named under attn_config; the reader hint only when read as written
    for sub, value, why in (
        ({}, None, "missing; DBRX's KV heads" + _HINT),
        ({"kv_n_heads": None}, None, "missing; DBRX's KV heads" + _HINT),
        ({"KV_N_HEADS": 8}, None, "missing; DBRX's KV heads" + _HINT),
        ({"kv_n_heads": "8"}, "8", "must be an integer"),
        ({"kv_n_heads": 0}, 0, "must be at least 1"),
    ):
        e = _error(J.from_config, {**_DBRX, "attn_config": sub})
        assert (e.field, e.value) == ("config.attn_config.kv_n_heads", value), sub
        assert str(e) == f"config.attn_config.kv_n_heads = {value!r}: {why}", sub
    var = VARIATIONS["DbrxForCausalLM"]
    data = {"num_attention_heads": 32, "hidden_size": 2048, "attn_config": {}}
    for completed, hint in ((False, _HINT), (True, "")):
        e = _error(read_attention, Config(data, "config", completed=completed), 1, variation=var)
        assert str(e) == f"config.attn_config.kv_n_heads = None: missing; DBRX's KV heads{hint}", completed
        # the path of the config it sits in (a text_config's)
        e = _error(read_attention, Config(data, "config.text_config", completed=completed), 1, variation=var)
        assert str(e) == f"config.text_config.attn_config.kv_n_heads = None: missing; DBRX's KV heads{hint}"


def test_head_size_from_hidden_size_is_at_least_one() -> None:
    """vLLM's head size without head_dim is hidden_size // num_attention_heads: 1 is a head size (hidden
    equal to the heads), 0 (hidden below the heads) is refused naming hidden_size, its value and why."""
    for heads, hidden in ((8, 8), (8, 15), (16, 16), (16, 31), (16, 32)):
        att = read_attention(_cfg(num_attention_heads=heads, num_key_value_heads=2, hidden_size=hidden), 1)
        assert att.head_size == hidden // heads, (heads, hidden)
    # a variation that ignores head_dim takes the same floor
    cfg = _cfg(num_attention_heads=8, num_key_value_heads=8, hidden_size=8, head_dim=128)
    assert read_attention(cfg, 1, variation=Variation(head_dim=False)).head_size == 1
    for heads, hidden, tp in ((8, 7, 1), (16, 1, 1), (16, 15, 2), (32, 31, 4)):
        cfg = _cfg(num_attention_heads=heads, num_key_value_heads=8, hidden_size=hidden)
        e = _error(read_attention, cfg, tp)
        assert (e.field, e.value) == ("config.hidden_size", hidden)
        assert str(e) == (
            f"config.hidden_size = {hidden}: below num_attention_heads = {heads}: the head size "
            "hidden_size // heads is 0"
        )
    e = _error(J.from_config, {**_DBRX, "hidden_size": 31})  # DBRX ignores head_dim = 100
    assert str(e) == (
        "config.hidden_size = 31: below num_attention_heads = 32: the head size hidden_size // heads is 0"
    )


def test_llama4_missing_fields_are_named_with_the_rule() -> None:
    """vLLM's Llama4Attention: attention_chunk_size is required as written; a written non-empty
    no_rope_layers wins over no_rope_layer_interval (transformers' default only for an empty or absent
    list); each missing field is named with its rule, whole."""
    no_chunk = {k: v for k, v in _L4.items() if k != "attention_chunk_size"}
    e = _error(J.from_config, no_chunk)
    assert (e.field, e.value) == ("config.attention_chunk_size", None)
    assert str(e) == (
        "config.attention_chunk_size = None: missing; Llama 4's RoPE layers attend within chunks of it"
        + _HINT
    )
    # written marks with an interval too: the marks (layer i chunked iff no_rope_layers[i] != 0)
    marks = [1, 0, 2, 0, 0, 1, 1, 0]
    for every in (1, 2, 3, 4):
        want = ["chunked" if x != 0 else "full" for x in marks]
        assert _kinds({**_L4, "no_rope_layers": marks, "no_rope_layer_interval": every}) == want, every
    # neither: no_rope_layers is missing (an interval written null does not stand in for it)
    bare = {k: v for k, v in _L4.items() if k != "no_rope_layers"}
    for cfg in (bare, {**bare, "no_rope_layer_interval": None}):
        e = _error(J.from_config, cfg)
        assert (e.field, e.value) == ("config.no_rope_layers", None)
        assert str(e) == (
            "config.no_rope_layers = None: missing; 0 marks a NoPE (full attention) layer" + _HINT
        )
    # an empty list without an interval: the interval is missing
    for cfg in ({**_L4, "no_rope_layers": []}, {**_L4, "no_rope_layers": [], "no_rope_layer_interval": None}):
        e = _error(J.from_config, cfg)
        assert (e.field, e.value) == ("config.no_rope_layer_interval", None)
        assert str(e) == (
            "config.no_rope_layer_interval = None: missing; layer i has RoPE unless "
            "(i + 1) % no_rope_layer_interval == 0" + _HINT
        )
    # read through a config class (completed): no reader hint
    read = Config({k: v for k, v in bare.items() if k != "architectures"}, "config", completed=True)
    e = _error(layer_types, read, "generic_sw", 8, VARIATIONS["Llama4ForCausalLM"])
    assert str(e) == "config.no_rope_layers = None: missing; 0 marks a NoPE (full attention) layer"


def test_llama4_multimodal_wrapper_takes_its_text_models_names_and_rules() -> None:
    """vLLM's mllama4.py builds Llama4ForCausalLM from text_config as language_model: the wrapper's layers
    are Llama 4's (chunked where no_rope_layers[i] != 0, full attention's pages), named
    language_model.model.layers.{i}.self_attn.attn, its KV heads text_config's."""
    text = {k: v for k, v in _L4.items() if k not in ("architectures", "torch_dtype")}
    marks = [1, 0, 2, 0, 0, 1, 1, 0]
    wrapper = {
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
        "torch_dtype": "bfloat16", "text_config": {**text, "no_rope_layers": marks},
    }
    for tp in (1, 2, 8):
        m = J.from_config(wrapper, tp=tp)
        assert (m.architecture, m.family) == ("Llama4ForConditionalGeneration", "generic_sw")
        assert list(m.kinds) == [f"language_model.model.layers.{i}.self_attn.attn" for i in range(8)]
        assert list(m.kinds.values()) == ["chunked" if x != 0 else "full" for x in marks]
        assert m.notes[0] == (
            "chunked local attention (8,192-token chunks) on 4 of 8 layers: full attention's pages, "
            "in groups of their own"
        )
        layers = _attention_layers(m)
        assert {(x.num_kv_heads, x.head_size) for x in layers} == {(8 // tp, 128)}
        assert {x.page for x in layers} == {2 * (8 // tp) * 128 * 2 * m.block_size}
    # the same text model unwrapped: the same cache under model.layers
    plain = J.from_config({**_L4, "no_rope_layers": marks})
    assert [x.removeprefix("language_model.") for x in J.from_config(wrapper).kinds] == list(plain.kinds)
    assert list(J.from_config(wrapper).kinds.values()) == list(plain.kinds.values())


def test_qwen2_named_family_ignores_head_dim() -> None:
    """vLLM 0.33's Qwen2Attention takes hidden_size // num_attention_heads and never reads head_dim
    (the named family's variation, applied by attention_family)."""
    qwen2 = {
        "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 28,
        "num_key_value_heads": 4, "hidden_size": 3584, "head_dim": 64, "use_sliding_window": False,
        "torch_dtype": "bfloat16",
    }
    for tp in (1, 2, 4):
        m = J.from_config(qwen2, tp=tp)
        assert m.family == "qwen2"
        layers = _attention_layers(m)
        assert [x.name for x in layers] == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
        assert {(x.num_kv_heads, x.head_size) for x in layers} == {(4 // tp, 3584 // 28)}, tp


def test_engine_flags_for_vllm_only_are_refused_whole() -> None:
    """device and attention_backend choose vLLM's CUDA backend: another engine refuses the one given,
    naming it with its value."""
    why = "a CUDA GPU and its vLLM attention backend apply to engine vllm only"
    for backend in ("FLASHINFER", "FLASH_ATTN"):
        e = _error(J.from_config, _DBRX, engine="tpu-inference", attention_backend=backend)
        assert (e.field, e.value) == ("attention_backend", backend)
        assert str(e) == f"attention_backend = {backend!r}: {why}"
    e = _error(J.from_config, _DBRX, engine="tpu-inference", device="ampere", attention_backend="FLASHINFER")
    assert (e.field, e.value) == ("device", "ampere")
    assert str(e) == f"device = 'ampere': {why}"


def test_minicpm3_heads_are_its_decompressed_latent_heads() -> None:
    """vLLM's MiniCPM3Attention: KV heads = the query heads (split over tp), each qk_nope_head_dim +
    qk_rope_head_dim wide (V padded to it); head_dim and num_key_value_heads are not read."""
    var = VARIATIONS["MiniCPM3ForCausalLM"]
    assert var == Variation(kv_heads="heads", head_size="qk")
    for tp in (1, 2, 8):
        cfg = Config({"num_attention_heads": 40, "num_key_value_heads": 2, "hidden_size": 2560,
                      "head_dim": 100, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32}, "config")
        att = read_attention(cfg, tp, variation=var)
        assert (att.heads, att.kv_heads, att.head_size) == (40, 40 // tp, 96), tp
    base = {"architectures": ["MiniCPM3ForCausalLM"], "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 2, "hidden_size": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "torch_dtype": "bfloat16"}
    ms = J.from_config(base, tp=2)
    assert isinstance(ms, M.ModelSpec)
    got = [(x.name, x.num_kv_heads, x.head_size) for _, x in ms.spec.layers]  # type: ignore[attr-defined]
    assert got == [(f"model.layers.{i}.self_attn.attn", 4, 96) for i in range(2)]
    assert ms.bytes_per_block == 2 * 16 * 2 * 4 * 96 * 2  # layers * tokens * (K, V) * heads * size * bf16
    for key in ("qk_nope_head_dim", "qk_rope_head_dim"):
        with pytest.raises(SpecError) as e:
            J.from_config({k: v for k, v in base.items() if k != key})
        why = "MiniCPM3's head size is qk_nope_head_dim + qk_rope_head_dim"
        assert str(e.value) == f"config.{key} = None: missing; {why}" + _HINT


def test_laguna_slides_only_where_layer_types_says() -> None:
    """vLLM's LagunaAttention: a layer slides iff layer_types names it sliding_attention; without
    layer_types no layer slides, whatever sliding_window says (the engine's window is cleared)."""
    assert VARIATIONS["LagunaForCausalLM"] == Variation(window="types")
    base = {"architectures": ["LagunaForCausalLM"], "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 2, "hidden_size": 256, "head_dim": 64, "torch_dtype": "bfloat16",
            "sliding_window": 128}

    def windows(**kw: Any) -> list[int | None]:
        ms = J.from_config({**base, **kw})
        assert isinstance(ms, M.ModelSpec)
        return [getattr(x, "window", None) for _, x in sorted(ms.spec.layers, key=lambda p: p[1].name)]

    assert windows() == [None] * 3
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    assert windows(layer_types=types) == [128, None, 128]
    var = VARIATIONS["LagunaForCausalLM"]
    cfg = Config({**base, "layer_types": types}, "config")
    assert layer_types(cfg, "generic_sw", 3, var) == ["sliding", "full", "sliding"]
    assert layer_types(Config(base, "config"), "generic_sw", 3, var) == ["full"] * 3
    with pytest.raises(SpecError) as e:
        J.from_config({**base, "layer_types": ["sliding_attention", "x", "full_attention"]})
    assert str(e.value) == "config.layer_types[1] = 'x': valid: sliding_attention, full_attention"


def test_config_integers_tp_and_block_size_are_capped_at_2_53() -> None:
    """Every config integer, tp and block_size: 2**53 is taken, 2**53 + 1 refused by name (a
    2,200-digit conv_dim crashed a note's f-string: issue 25)."""
    from kvlayout.models.base import Ctx
    from kvlayout.models.config import MAX_CONFIG_INT, check_tp

    assert MAX_CONFIG_INT == 2**53
    cfg = Config({"a": 2**53, "b": 2**53 + 1}, "config")
    assert cfg.req_int("a", "") == 2**53 and cfg.opt_int("a") == 2**53
    with pytest.raises(SpecError) as e:
        cfg.req_int("b", "")
    assert (e.value.field, e.value.value, str(e.value)) == (
        "config.b", 2**53 + 1, f"config.b = {2**53 + 1}: must be at most 2**53"
    )
    assert check_tp(2**53) == 2**53
    ctx = Ctx(top=cfg, cfg=cfg, family="generic", tp=1, dtype="bfloat16", kv_cache_dtype=None,
              block_size=2**53, mamba_ssm_cache_dtype=None, prefix="model.layers", notes=[], kinds={})
    assert ctx.block(16) == 2**53


def test_deepseek_v4_layer_bound() -> None:
    """2,500 DeepSeek-V4 layers plan; 2,501 are refused by name (10,000 took seconds: issue 25)."""
    import json
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "models" / "deepseek_v4" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["compress_ratios"] = (cfg["compress_ratios"] * 60)[:2501]
    ms = J.from_config({**cfg, "num_hidden_layers": 2500})
    assert len(ms.spec.layers) == 9546  # type: ignore[union-attr]
    with pytest.raises(SpecError) as e:
        J.from_config({**cfg, "num_hidden_layers": 2501})
    assert (e.value.field, e.value.value, str(e.value)) == (
        "config.num_hidden_layers", 2501,
        "config.num_hidden_layers = 2501: must be at most 2,500 for DeepSeek-V4 (up to five caches a layer)",
    )


def test_reader_transformers_names_a_missing_architecture_first() -> None:
    """Read through transformers, a config without architectures is refused before transformers is
    imported, under the field's own path and without the hint to use that reader."""
    with pytest.raises(SpecError) as e:
        J.from_config({}, reader="transformers")
    assert e.value.field == "config.architectures"
    assert str(e.value) == "config.architectures = None: missing; it names the model class the engine builds"
