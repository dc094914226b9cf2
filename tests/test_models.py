"""kvlayout.models (issue 17): a model's config.json to the layout vLLM allocates.

Every expected number is a literal worked out by hand from the fixture's fields, with the
arithmetic in a comment; none is computed by the library under test. The fixtures are
real public configs (tests/fixtures/models/<family>/SOURCE.md says which and from where).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.conformance import run_case

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
FAMILIES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())


def config(family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / family / "config.json").read_text())
    return data


def kinds_of(ms: M.ModelSpec) -> dict[str, tuple[int, int, int]]:
    """kind -> (layers, real page, padded page); every layer of a kind has one page here."""
    out: dict[str, tuple[int, int, int]] = {}
    for _, layer in ms.spec.layers:
        kind = ms.kinds[layer.name]
        n, real, page = out.get(kind, (0, layer.real_page, layer.page))
        assert (real, page) == (layer.real_page, layer.page), f"{kind}: pages differ within the kind"
        out[kind] = (n + 1, real, page)
    return out


def groups_of(ms: M.ModelSpec) -> list[tuple[str, int]]:
    return [(g.name, len(g.layers)) for g in ms.spec.groups]


# --------------------------------------------------------------------------- the fixtures, by hand
# family: (architecture, block size, KV cache dtype, kinds, groups, bytes per block)
EXPECTED: dict[str, tuple[str, int, str, dict[str, tuple[int, int, int]], list[tuple[str, int]], int]] = {
    # K+V: 2 * 16 tokens * 8 KV heads * 128 (4096 // 32) * 2 B = 65,536 B; 32 layers * 65,536 = 2,097,152
    "llama": ("LlamaForCausalLM", 16, "bfloat16", {"full": (32, 65_536, 65_536)}, [("full", 32)], 2_097_152),
    # the same geometry as Llama-3.1-8B
    "mistral": (
        "MistralForCausalLM",
        16,
        "bfloat16",
        {"full": (32, 65_536, 65_536)},
        [("full", 32)],
        2_097_152,
    ),
    # 2 * 16 * 4 KV heads * 128 (3584 // 28) * 2 = 32,768; 28 * 32,768 = 917,504
    "qwen2": ("Qwen2ForCausalLM", 16, "bfloat16", {"full": (28, 32_768, 32_768)}, [("full", 28)], 917_504),
    # 2 * 16 * 8 * 128 (head_dim) * 2 = 65,536; 36 * 65,536 = 2,359,296
    "qwen3": ("Qwen3ForCausalLM", 16, "bfloat16", {"full": (36, 65_536, 65_536)}, [("full", 36)], 2_359_296),
    # float32 checkpoint runs in bf16: 2 * 16 * 8 * 256 * 2 = 131,072; 21 sliding (even) + 21 full layers,
    # group size 21 (21 < 1.5 * 21): 21 * 131,072 = 2,752,512
    "gemma2": (
        "Gemma2ForCausalLM",
        16,
        "bfloat16",
        {"sliding": (21, 131_072, 131_072), "full": (21, 131_072, 131_072)},
        [("sliding", 21), ("full", 21)],
        2_752_512,
    ),
    # 2 * 16 * 16 * 128 * 2 = 131,072; full where (i + 1) % 6 == 0: 10 of 62 layers, 52 sliding;
    # group size 10 (52 >= 1.5 * 10): sliding in ceil(52 / 10) = 6 groups of 9, 9, 9, 9, 8, 8;
    # the largest group: 10 * 131,072 = 1,310,720
    "gemma3": (
        "Gemma3ForConditionalGeneration",
        16,
        "bfloat16",
        {"sliding": (52, 131_072, 131_072), "full": (10, 131_072, 131_072)},
        [
            ("sliding.0", 9),
            ("sliding.1", 9),
            ("sliding.2", 9),
            ("sliding.3", 9),
            ("sliding.4", 8),
            ("sliding.5", 8),
            ("full", 10),
        ],
        1_310_720,
    ),
    # 2 * 16 * 8 * 64 * 2 = 32,768; 12 sliding + 12 full; 12 * 32,768 = 393,216
    "gpt_oss": (
        "GptOssForCausalLM",
        16,
        "bfloat16",
        {"sliding": (12, 32_768, 32_768), "full": (12, 32_768, 32_768)},
        [("sliding", 12), ("full", 12)],
        393_216,
    ),
    # MLA head 512 + 64 = 576, bf16, 64-token blocks: 64 * 576 * 2 = 73,728; 61 * 73,728 = 4,497,408
    "deepseek_v3": (
        "DeepseekV3ForCausalLM",
        64,
        "bfloat16",
        {"mla": (61, 73_728, 73_728)},
        [("mla", 61)],
        4_497_408,
    ),
    # + the indexer: (128 + 128 // 128 * 4) = 132 B per token * 64 = 8,448; one group of 122 layers:
    # 61 * (73,728 + 8,448) = 61 * 82,176 = 5,012,736
    "deepseek_v32": (
        "DeepseekV32ForCausalLM",
        64,
        "bfloat16",
        {"indexer": (61, 8_448, 8_448), "mla": (61, 73_728, 73_728)},
        [("mla", 122)],
        5_012_736,
    ),
    # fp8_ds_mla, pages padded to 576 B:
    #   swa: 64 tokens * 584 = 37,376 -> 65 * 576 = 37,440 (43 layers)
    #   c4: 256 / 4 = 64 stored * 584 = 37,376 -> 37,440 (21); c128: 2 * 584 = 1,168 -> 3 * 576 = 1,728 (20)
    #   indexer: 64 * 132 = 8,448 -> 15 * 576 = 8,640 (21)
    #   compressor states, float32: c4 4 tokens * 2*2*512 * 4 = 32,768 -> 57 * 576 = 32,832 (21);
    #   c128 8 * 2*1*512 * 4 = 32,768 -> 32,832 (20); indexer 4 * 2*2*128 * 4 = 8,192 -> 8,640 (21)
    # vLLM's packed grouping: buckets of one type, block size and window: swa (43 of one page: 43 repeats),
    # compressed = c4 + c128 + indexer (21 / 20 / 21 per page: unbalanced, stays whole), c4 states (21 of
    # each of two pages: balanced, 21 repeats), c128 states (20 repeats). Repeats per group: the d >= 21
    # padding (43, 21, 20) least: d = 21 pads 20 + 0 + 1 = 21, d = 22 pads 1 + 1 + 2 = 4, d = 23 pads
    # 3 + 2 + 3 = 8, larger d pads more; d = 22 splits swa into ceil(43 / 22) = 2 groups (every other
    # layer: 22, 21). The largest group is compressed: 21 * 37,440 + 20 * 1,728 + 21 * 8,640 = 1,002,240
    "deepseek_v4": (
        "DeepseekV4ForCausalLM",
        256,
        "fp8_ds_mla",
        {
            "swa": (43, 37_376, 37_440),
            "c4": (21, 37_376, 37_440),
            "c128": (20, 1_168, 1_728),
            "c4_indexer": (21, 8_448, 8_640),
            "c4_state": (21, 32_768, 32_832),
            "c128_state": (20, 32_768, 32_832),
            "c4_indexer_state": (21, 8_192, 8_640),
        },
        [("swa.0", 22), ("swa.1", 21), ("compressed", 62), ("c4_states", 42), ("c128_states", 20)],
        1_002_240,
    ),
    # Mamba1 state, bf16: conv 3 * (2 * 4096) * 2 = 49,152 + ssm 8192 * 16 * 2 = 262,144 -> 311,296;
    # attention 2 * 8 * 128 * 2 = 4,096 B per token: 16 * ceil(311,296 / (16 * 4,096)) = 16 * 5 = 80 tokens,
    # page 80 * 4,096 = 327,680 (Mamba padded by 16,384); 4 attention (4, 12, 20, 28) and 28 Mamba layers,
    # group size 4: 7 Mamba groups; 4 * 327,680 = 1,310,720
    "jamba": (
        "JambaForCausalLM",
        80,
        "bfloat16",
        {"mamba": (28, 311_296, 327_680), "full": (4, 327_680, 327_680)},
        [(f"mamba.{j}", 4) for j in range(7)] + [("full", 4)],
        1_310_720,
    ),
    # Mamba2: conv_dim 128 * 64 + 2 * 8 * 128 = 10,240; conv 3 * 10,240 * 2 = 61,440 + ssm float32
    # 128 * 64 * 128 * 4 = 4,194,304 -> 4,255,744; attention 4,096 B per token:
    # 16 * ceil(4,255,744 / 65,536) = 16 * 65 = 1,040 tokens, page 4,259,840 (Mamba padded by 4,096);
    # 24 M and 4 * of the pattern; 4 * 4,259,840 = 17,039,360
    "nemotron_h": (
        "NemotronHForCausalLM",
        1040,
        "bfloat16",
        {"mamba": (24, 4_255_744, 4_259_840), "full": (4, 4_259_840, 4_259_840)},
        [(f"mamba.{j}", 4) for j in range(6)] + [("full", 4)],
        17_039_360,
    ),
    # gated delta net, bf16: conv_dim 2 * 16 * 128 + 32 * 128 = 8,192; conv 3 * 8,192 * 2 = 49,152 + ssm
    # 32 * 128 * 128 * 2 = 1,048,576 -> 1,097,728; attention 2 * 2 * 256 * 2 = 2,048 B per token:
    # 16 * ceil(1,097,728 / 32,768) = 16 * 34 = 544, page 1,114,112 (GDN padded by 16,384);
    # 12 full + 36 GDN layers, 3 GDN groups; 12 * 1,114,112 = 13,369,344
    "qwen3_next": (
        "Qwen3NextForCausalLM",
        544,
        "bfloat16",
        {"gdn": (36, 1_097_728, 1_114_112), "full": (12, 1_114_112, 1_114_112)},
        [("gdn.0", 12), ("gdn.1", 12), ("gdn.2", 12), ("full", 12)],
        13_369_344,
    ),
    # CONTEXT.md's Qwen3.5-style hybrid: conv_dim 2 * 16 * 128 + 16 * 128 = 6,144; conv 3 * 6,144 * 2
    # = 36,864 + ssm float32 16 * 128 * 128 * 4 = 1,048,576 -> 1,085,440; 16 * ceil(1,085,440 / 32,768)
    # = 16 * 34 = 544 tokens, pages of 544 * 2,048 = 1,114,112 (GDN padded by 28,672); 6 * 1,114,112
    "qwen3_5": (
        "Qwen3_5ForConditionalGeneration",
        544,
        "bfloat16",
        {"gdn": (18, 1_085_440, 1_114_112), "full": (6, 1_114_112, 1_114_112)},
        [("gdn.0", 6), ("gdn.1", 6), ("gdn.2", 6), ("full", 6)],
        6_684_672,
    ),
}

# family: (a layer name vLLM gives, its kind)
NAMES: dict[str, list[tuple[str, str]]] = {
    "llama": [("model.layers.0.self_attn.attn", "full"), ("model.layers.31.self_attn.attn", "full")],
    "mistral": [("model.layers.31.self_attn.attn", "full")],
    "qwen2": [("model.layers.27.self_attn.attn", "full")],
    "qwen3": [("model.layers.35.self_attn.attn", "full")],
    "gemma2": [("model.layers.0.self_attn.attn", "sliding"), ("model.layers.1.self_attn.attn", "full")],
    "gemma3": [
        ("language_model.model.layers.4.self_attn.attn", "sliding"),
        ("language_model.model.layers.5.self_attn.attn", "full"),
    ],
    "gpt_oss": [("model.layers.0.attn.attn", "sliding"), ("model.layers.23.attn.attn", "full")],
    "deepseek_v3": [("model.layers.60.self_attn.attn", "mla")],
    "deepseek_v32": [
        ("model.layers.0.self_attn.indexer.k_cache", "indexer"),
        ("model.layers.0.self_attn.attn", "mla"),
    ],
    "deepseek_v4": [
        ("model.layers.0.attn.swa_cache", "swa"),
        ("model.layers.2.attn", "c4"),
        ("model.layers.2.attn.indexer.k_cache", "c4_indexer"),
        ("model.layers.2.attn.indexer.compressor.state_cache", "c4_indexer_state"),
        ("model.layers.3.attn", "c128"),
        ("model.layers.3.attn.compressor.state_cache", "c128_state"),
        ("model.layers.42.attn", "c4"),
    ],
    "jamba": [("model.layers.0.mixer", "mamba"), ("model.layers.4.attn", "full")],
    "nemotron_h": [("model.layers.0.mixer", "mamba"), ("model.layers.7.mixer.attn", "full")],
    "qwen3_next": [("model.layers.0.linear_attn", "gdn"), ("model.layers.3.self_attn.attn", "full")],
    "qwen3_5": [
        ("language_model.model.layers.0.linear_attn", "gdn"),
        ("language_model.model.layers.23.self_attn.attn", "full"),
    ],
}


def test_every_fixture_has_a_source_note_and_an_expectation() -> None:
    assert set(FAMILIES) == set(EXPECTED) == set(NAMES)
    for f in FAMILIES:
        text = (FIXTURES / f / "SOURCE.md").read_text()
        assert "huggingface.co/" in text and "No network" in text


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_fixture_pages_match_hand_computation(family: str) -> None:
    arch, block, kv, kinds, groups, per_block = EXPECTED[family]
    ms = M.from_config(FIXTURES / family / "config.json")
    assert (ms.architecture, ms.block_size, ms.kv_cache_dtype, ms.engine, ms.tp) == (
        arch,
        block,
        kv,
        "vllm",
        1,
    )
    assert kinds_of(ms) == kinds
    assert groups_of(ms) == groups
    assert ms.bytes_per_block == per_block
    assert ms.blocks_per_gib == 2**30 // per_block
    assert ms.spec.layout == "packed" and ms.spec.num_blocks == M.DEFAULT_NUM_BLOCKS
    for name, kind in NAMES[family]:
        assert ms.kinds[name] == kind
    # the path and the dict give the same spec, and spec_from_config is from_config's spec
    assert M.spec_from_config(config(family)) == ms.spec


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_fixture_plans_verifies_and_zeroes_on_the_reference(family: str) -> None:
    spec = M.spec_from_config(config(family), num_blocks=3)
    table = K.plan(spec)
    report = K.verify(table)
    assert report.ok and report.padding_checked, report.format()
    res = run_case(K.ReferenceBackend, table, [0, 2])
    assert res.ok, res.check.describe()
    zeroed_kinds = {M.from_config(config(family)).kinds[s.layer] for s in table.segments}
    assert zeroed_kinds.isdisjoint({"mamba", "gdn"})  # Mamba states are never zeroed


@pytest.mark.parametrize("backend", ["cuda", pytest.param("pallas", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_fixture_zeroes_on_every_backend(family: str, backend: str) -> None:
    be = K.load_backend(backend)  # CI installs both extras: a missing one fails here
    table = K.plan(M.spec_from_config(config(family), num_blocks=2))
    res = run_case(be, table, [1])
    assert res.ok, res.check.describe()


def test_gemma3_sliding_layers_keep_their_window() -> None:
    spec = M.spec_from_config(config("gemma3"))
    by_name = {layer.name: layer for _, layer in spec.layers}
    sliding = by_name["language_model.model.layers.0.self_attn.attn"]
    assert isinstance(sliding, K.SlidingWindowSpec) and sliding.window == 1024
    assert type(by_name["language_model.model.layers.59.self_attn.attn"]) is K.FullAttentionSpec
    # vLLM's split takes every 6th sliding layer into a group: layers 0, 7, 14, ... (sliding indices 0, 6, 12)
    first = [layer.name for layer in spec.groups[0].layers[:3]]
    assert first == [f"language_model.model.layers.{i}.self_attn.attn" for i in (0, 7, 14)]


def test_gemma2_float32_checkpoint_runs_in_bfloat16_unless_told() -> None:
    ms = M.from_config(config("gemma2"))
    assert ms.dtype == "bfloat16" and any("float32" in n for n in ms.notes)
    # dtype="float32" asks for it: 2 * 16 * 8 * 256 * 4 = 262,144
    assert kinds_of(M.from_config(config("gemma2"), dtype="float32"))["full"] == (21, 262_144, 262_144)


# --------------------------------------------------------------------------- tp, fp8, block size
@pytest.mark.parametrize(
    ("family", "tp", "page"),
    [
        ("llama", 2, 32_768),  # 8 // 2 = 4 KV heads: 2 * 16 * 4 * 128 * 2
        ("llama", 8, 8_192),  # 8 // 8 = 1: 2 * 16 * 1 * 128 * 2
        ("llama", 16, 8_192),  # fewer KV heads than ranks: replicated, max(1, 8 // 16) = 1
        ("qwen2", 4, 8_192),  # 4 // 4 = 1 (28 heads / 4 = 7 per rank)
        ("gpt_oss", 8, 4_096),  # 2 * 16 * 1 * 64 * 2
    ],
)
def test_tensor_parallel_kv_heads(family: str, tp: int, page: int) -> None:
    ms = M.from_config(config(family), tp=tp)
    assert ms.tp == tp
    assert {(real, pg) for _, real, pg in kinds_of(ms).values()} == {(page, page)}


def test_mla_is_not_split_by_tp_and_fp8_halves_it() -> None:
    assert kinds_of(M.from_config(config("deepseek_v3"), tp=8))["mla"] == (61, 73_728, 73_728)
    fp8 = M.from_config(config("deepseek_v3"), kv_cache_dtype="fp8")
    assert fp8.kv_cache_dtype == "float8_e4m3fn"
    assert kinds_of(fp8)["mla"] == (61, 36_864, 36_864)  # 64 * 576 * 1


def test_fp8_attention_pages() -> None:
    ms = M.from_config(config("llama"), kv_cache_dtype="fp8")
    assert (ms.kv_cache_dtype, kinds_of(ms)["full"]) == (
        "float8_e4m3fn",
        (32, 32_768, 32_768),
    )  # 2*16*8*128*1
    e5 = M.from_config(config("llama"), kv_cache_dtype="fp8_e5m2")
    assert e5.kv_cache_dtype == "float8_e5m2" and e5.bytes_per_block == 1_048_576  # 32 * 32,768


def test_deepseek_v32_fp8_is_fp8_ds_mla_656_bytes_per_token() -> None:
    ms = M.from_config(config("deepseek_v32"), kv_cache_dtype="fp8")
    assert ms.kv_cache_dtype == "fp8_ds_mla"
    # 64 tokens * 656 B (512 fp8 + 4 * 4 B scales + 64 * 2 B RoPE) = 41,984; the indexer stays 8,448
    assert kinds_of(ms) == {"indexer": (61, 8_448, 8_448), "mla": (61, 41_984, 41_984)}
    assert ms.bytes_per_block == 3_076_352  # 61 * (41,984 + 8,448)


def test_hybrid_fp8_and_tp_move_the_block_size() -> None:
    # fp8: 2 * 2 * 256 * 1 = 1,024 B per token; 16 * ceil(1,085,440 / 16,384) = 16 * 67 = 1,072 tokens,
    # pages 1,072 * 1,024 = 1,097,728 (GDN padded by 12,288)
    fp8 = M.from_config(config("qwen3_5"), kv_cache_dtype="fp8")
    assert fp8.block_size == 1_072
    assert kinds_of(fp8) == {"gdn": (18, 1_085_440, 1_097_728), "full": (6, 1_097_728, 1_097_728)}
    # tp 2: 1 KV head (1,024 B per token); conv 3 * 3,072 * 2 = 18,432 + ssm 8 * 128 * 128 * 4 = 524,288
    # -> 542,720; 16 * ceil(542,720 / 16,384) = 16 * 34 = 544 tokens, pages 557,056
    tp2 = M.from_config(config("qwen3_5"), tp=2)
    assert tp2.block_size == 544
    assert kinds_of(tp2) == {"gdn": (18, 542_720, 557_056), "full": (6, 557_056, 557_056)}


def test_block_size_argument() -> None:
    assert kinds_of(M.from_config(config("llama"), block_size=32))["full"] == (
        32,
        131_072,
        131_072,
    )  # 2*32*8*128*2
    # a hybrid keeps a larger block (1,024 * 2,048 = 2,097,152) and raises a smaller one to 544
    big = M.from_config(config("qwen3_5"), block_size=1024)
    assert big.block_size == 1024 and kinds_of(big)["gdn"] == (18, 1_085_440, 2_097_152)
    small = M.from_config(config("qwen3_5"), block_size=16)
    assert small.block_size == 544 and any("raised to 544" in n for n in small.notes)
    # vLLM 0.33 steps in units of the block already set: 48 * ceil(1,085,440 / (48 * 2,048)) = 48 * 12 = 576
    assert M.from_config(config("qwen3_5"), block_size=48).block_size == 576
    # DeepSeek-V4 at 512 tokens: c4 128 * 584 = 74,752 -> 130 * 576 = 74,880; c128 4 * 584 = 2,336 -> 2,880;
    # the 64-token window cache does not change
    v4 = kinds_of(M.from_config(config("deepseek_v4"), block_size=512))
    assert (v4["c4"], v4["c128"], v4["swa"]) == (
        (21, 74_752, 74_880),
        (20, 2_336, 2_880),
        (43, 37_376, 37_440),
    )


def test_mamba_ssm_cache_dtype() -> None:
    # Nemotron-H with a bf16 ssm state: 61,440 + 128 * 64 * 128 * 2 = 2,158,592; 16 * ceil(2,158,592 / 65,536)
    # = 16 * 33 = 528 tokens, pages 528 * 4,096 = 2,162,688
    ms = M.from_config(config("nemotron_h"), mamba_ssm_cache_dtype="bfloat16")
    assert ms.block_size == 528 and kinds_of(ms)["mamba"] == (24, 2_158_592, 2_162_688)
    # the config's own field counts when the argument is not given
    cfg = config("nemotron_h")
    cfg["mamba_ssm_cache_dtype"] = "bfloat16"
    assert M.from_config(cfg).spec == ms.spec


def test_layer_rules_without_layer_types() -> None:
    qn = config("qwen3_next")
    del qn["layer_types"]  # full_attention_interval 4 says the same
    assert M.from_config(qn).spec == M.from_config(config("qwen3_next")).spec
    q2 = config("qwen2")
    q2["use_sliding_window"] = True
    q2["max_window_layers"] = 20  # layers 20..27 slide: 8 sliding, 20 full -> group size 8, full in 3 groups
    ms = M.from_config(q2)
    assert groups_of(ms) == [("full.0", 7), ("full.1", 7), ("full.2", 6), ("sliding", 8)]
    mis = config("mistral")
    mis["sliding_window"] = 4096
    assert set(M.from_config(mis).kinds.values()) == {"sliding"}


def test_group_size_threshold_is_one_and_a_half() -> None:
    cfg = config("gpt_oss")
    cfg["num_hidden_layers"] = 29
    cfg["layer_types"] = ["sliding_attention"] * 12 + ["full_attention"] * 17
    # 17 < 1.5 * 12 = 18: group size 17, one group per kind (vLLM pads the sliding one)
    assert groups_of(M.from_config(cfg)) == [("sliding", 12), ("full", 17)]
    cfg["num_hidden_layers"] = 30
    cfg["layer_types"] = ["sliding_attention"] * 12 + ["full_attention"] * 18
    # 18 is not under 18: group size 12, the 18 full layers in ceil(18 / 12) = 2 groups of 9
    assert groups_of(M.from_config(cfg)) == [("sliding", 12), ("full.0", 9), ("full.1", 9)]


def test_missing_kv_heads_means_multi_head_attention() -> None:
    cfg = config("llama")
    del cfg["num_key_value_heads"]  # vLLM falls back to num_attention_heads: 2 * 16 * 32 * 128 * 2
    assert kinds_of(M.from_config(cfg))["full"] == (32, 262_144, 262_144)


# --------------------------------------------------------------------------- errors name the field
def _without(family: str, *path: str) -> dict[str, Any]:
    cfg = copy.deepcopy(config(family))
    d = cfg
    for k in path[:-1]:
        d = d[k]
    del d[path[-1]]
    return cfg


@pytest.mark.parametrize(
    ("cfg", "kwargs", "field"),
    [
        (_without("llama", "architectures"), {}, "config.architectures"),
        ({**config("llama"), "architectures": ["BertModel"]}, {}, "config.architectures[0]"),
        (_without("llama", "num_attention_heads"), {}, "config.num_attention_heads"),
        (_without("llama", "torch_dtype"), {}, "config.torch_dtype"),
        (_without("llama", "num_hidden_layers"), {}, "config.num_hidden_layers"),
        (_without("llama", "hidden_size"), {}, "config.hidden_size"),
        ({**config("llama"), "num_key_value_heads": "8"}, {}, "config.num_key_value_heads"),
        (config("llama"), {"tp": 3}, "config.num_attention_heads"),
        (config("llama"), {"tp": 0}, "tp"),
        (config("llama"), {"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
        (config("llama"), {"dtype": "float64"}, "dtype"),
        (config("llama"), {"engine": "sglang"}, "engine"),
        (config("qwen2"), {"tp": 8}, "config.num_attention_heads"),
        (_without("mistral", "sliding_window"), {}, "config.sliding_window"),
        (_without("qwen2", "use_sliding_window"), {}, "config.use_sliding_window"),
        (
            _without("gemma3", "text_config", "sliding_window_pattern"),
            {},
            "config.text_config.sliding_window_pattern",
        ),
        (
            _without("gemma3", "text_config", "num_key_value_heads"),
            {"tp": 64},
            "config.text_config.num_attention_heads",
        ),
        (_without("gpt_oss", "layer_types"), {}, "config.layer_types"),
        (_without("deepseek_v3", "kv_lora_rank"), {}, "config.kv_lora_rank"),
        (_without("deepseek_v32", "index_head_dim"), {}, "config.index_head_dim"),
        (_without("deepseek_v4", "compress_ratios"), {}, "config.compress_ratios"),
        ({**config("deepseek_v4"), "compress_ratios": [0, 0, 4]}, {}, "config.compress_ratios"),
        (
            {**config("deepseek_v4"), "compress_ratios": [0, 0, 4, 2] + [4] * 40},
            {},
            "config.compress_ratios[3]",
        ),
        (config("deepseek_v4"), {"kv_cache_dtype": "bfloat16"}, "kv_cache_dtype"),
        (config("deepseek_v4"), {"block_size": 64}, "block_size"),
        (_without("jamba", "mamba_d_state"), {}, "config.mamba_d_state"),
        ({**config("nemotron_h"), "hybrid_override_pattern": "M*M"}, {}, "config.hybrid_override_pattern"),
        (_without("qwen3_next", "linear_num_value_heads"), {}, "config.linear_num_value_heads"),
        (
            _without("qwen3_5", "text_config", "linear_conv_kernel_dim"),
            {},
            "config.text_config.linear_conv_kernel_dim",
        ),
        (config("qwen3_next"), {"tp": 3}, "config.num_attention_heads"),
        (config("qwen3_5"), {"mamba_ssm_cache_dtype": "int8"}, "mamba_ssm_cache_dtype"),
    ],
)
def test_errors_name_the_field(cfg: dict[str, Any], kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(K.SpecError) as e:
        M.from_config(cfg, **kwargs)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field} = ")


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(K.SpecError, match="config file"):
        M.spec_from_config(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(K.SpecError) as e:
        M.spec_from_config(bad)
    assert e.value.field == "config"
    bad.write_text("{not json")
    with pytest.raises(K.SpecError, match="not valid JSON"):
        M.spec_from_config(bad)


def test_summary_is_one_screen() -> None:
    ms = M.from_config(config("qwen3_5"))
    text = M.summary(ms)
    lines = text.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 120
    assert "4 groups, 24 layers" in text
    assert "bytes per block 6,684,672; blocks per GiB 160" in text  # 2**30 // 6,684,672 = 160
    assert "gdn" in text and "1,085,440" in text and "28,672" in text  # real page and padding of the GDN kind
    assert text.rstrip().endswith("SAFE")


# --------------------------------------------------------------------------- tpu-inference's arrays
@pytest.mark.parametrize(
    ("family", "kwargs", "arrays", "users", "page_shape", "dtype", "page"),
    [
        # K and V interleaved on heads, packing 32 // 16 = 2: 2 * 8 // 2 = 8 rows of 2; 16 * 8 * 2 * 128 * 2 B
        ("llama", {}, 32, 1, (16, 8, 2, 128), "bfloat16", 65_536),
        # 1 KV head per rank, fp8 packing 32 // 8 = 4: align(2, 4) // 4 = 1 row of 4: 16 * 1 * 4 * 128 * 1,
        # twice vLLM's 4,096 B page (2 * 16 * 1 * 128 * 1): the heads are padded to the packing
        ("llama", {"tp": 8, "kv_cache_dtype": "fp8"}, 32, 1, (16, 1, 4, 128), "float8_e4m3fn", 8_192),
        # head_dim 64 padded to 128 lanes: 16 * 8 * 2 * 128 * 2 (vLLM: 32,768); 12 arrays, each shared by the
        # sliding and the full layer of its slot (vLLM's two groups of 12)
        ("gpt_oss", {}, 12, 2, (16, 8, 2, 128), "bfloat16", 65_536),
        # MLA (pages, 64 // 32, 32, align(512, 128) + align(64, 128) = 640): 2 * 32 * 640 * 2 (vLLM: 73,728)
        ("deepseek_v3", {}, 61, 1, (2, 32, 640), "bfloat16", 81_920),
        # the 6 attention layers only: (544, 2 * 2 // 2 = 2, 2, 256), 544 * 2 * 2 * 256 * 2 = 1,114,112
        ("qwen3_5", {}, 6, 1, (544, 2, 2, 256), "bfloat16", 1_114_112),
    ],
)
def test_tpu_inference_arrays(
    family: str,
    kwargs: dict[str, Any],
    arrays: int,
    users: int,
    page_shape: tuple[int, ...],
    dtype: str,
    page: int,
) -> None:
    from kvlayout.native import NativeCacheSpec, verify_native

    ms = M.from_config(config(family), engine="tpu-inference", num_blocks=5, **kwargs)
    assert isinstance(ms, M.NativeModelSpec) and ms.engine == "tpu-inference"
    spec = ms.spec
    assert isinstance(spec, NativeCacheSpec) and len(spec.leaves) == arrays
    assert {(x.shape, x.dtype, x.page_bytes) for x in spec.leaves} == {((5, *page_shape), dtype, page)}
    assert {len(ms.shared_by[x.name]) for x in spec.leaves} == {users}
    assert ms.bytes_per_block == arrays * page
    assert all(r.ok for r in verify_native(spec).values())
    assert M.spec_from_config(config(family), engine="tpu-inference", num_blocks=5, **kwargs) == spec


def test_tpu_inference_slots_and_zeroing() -> None:
    import numpy as np

    from kvlayout.native import zero_native_numpy

    ms = M.from_config(config("gpt_oss"), engine="tpu-inference", num_blocks=3)
    assert isinstance(ms, M.NativeModelSpec)
    first = ms.spec.leaves[0]
    assert first.name == "kv_caches[0]" and first.group == ""  # shared by two groups
    assert ms.shared_by["kv_caches[0]"] == ("model.layers.0.attn.attn", "model.layers.1.attn.attn")
    llama = M.from_config(config("llama"), engine="tpu-inference", num_blocks=3)
    assert isinstance(llama, M.NativeModelSpec)
    assert {x.group for x in llama.spec.leaves} == {"full"}  # one group: one array per layer
    arrays = [np.full((3, 16, 8, 2, 128), 7, np.uint16) for _ in llama.spec.leaves]  # bf16-sized, poisoned
    zero_native_numpy(arrays, llama.spec, [1])
    for a in arrays:
        assert not a[1].any() and (a[0] == 7).all() and (a[2] == 7).all()
    hybrid = M.from_config(config("qwen3_5"), engine="tpu-inference")
    assert any("request slot" in n for n in hybrid.notes)


@pytest.mark.parametrize("family", ["deepseek_v32", "deepseek_v4"])
def test_tpu_inference_refuses_what_it_does_not_model(family: str) -> None:
    with pytest.raises(K.SpecError) as e:
        M.from_config(config(family), engine="tpu-inference")
    assert e.value.field == "engine"


def test_tpu_inference_mla_pages_need_32_tokens() -> None:
    with pytest.raises(K.SpecError) as e:
        M.from_config(config("deepseek_v3"), engine="tpu-inference", block_size=48)
    assert e.value.field == "block_size"


def test_tpu_inference_summary() -> None:
    text = M.summary(M.from_config(config("deepseek_v3"), engine="tpu-inference"))
    assert "61 arrays of 16 pages" in text and "(2, 32, 640)" in text
    assert "bytes per block 4,997,120; blocks per GiB 214" in text  # 61 * 81,920; 2**30 // 4,997,120
    assert text.rstrip().endswith("SAFE")


# --------------------------------------------------------------------------- vLLM's own functions
# Not run yet: vLLM 0.33 is not installed in this environment. When it is (CPU install, see
# CONTEXT.md), these compare the quantities vLLM computes from the same config.json on CPU:
#   head size       vllm.config.ModelConfig.get_head_size()
#   KV heads/rank   vllm.config.ModelConfig.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp))
#   Mamba states    <model class>.get_mamba_state_shape_from_config(vllm_config) and
#                   .get_mamba_state_dtype_from_config(vllm_config) (JambaForCausalLM,
#                   NemotronHForCausalLM, Qwen3NextForCausalLM), through
#                   vllm.v1.kv_cache_interface.MambaSpec(...).page_size_bytes
#   hybrid block    vllm.model_executor.models.config.HybridAttentionMambaModelConfig
#                   .verify_and_update_config(vllm_config): cache_config.block_size and
#                   cache_config.mamba_page_size_padded
#   groups          vllm.v1.core.kv_cache_utils.get_kv_cache_groups(vllm_config, kv_cache_spec)
#                   on the specs above (needs the layers' KVCacheSpec per name)
VLLM_COMPARISONS = ("head_size", "kv_heads_per_rank", "mamba_state_bytes", "hybrid_block_size", "groups")


@pytest.mark.parametrize("quantity", VLLM_COMPARISONS)
def test_against_vllm_functions(quantity: str) -> None:
    pytest.importorskip("vllm", reason="vLLM 0.33 is not installed here; see the comment above")
    pytest.skip(
        f"comparison of {quantity} against vLLM's own function not written yet (see the comment above)"
    )
