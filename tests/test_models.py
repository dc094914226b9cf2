"""kvlayout.models (issue 17): a model's config.json to the layout vLLM allocates.

Every expected number is a literal worked out by hand from the fixture's fields, with the
arithmetic in a comment; none is computed by the library under test. The fixtures are
real public configs (tests/fixtures/models/<family>/SOURCE.md says which and from where).
The last section compares the same quantities with vLLM 0.33's own functions, run on the CPU
in one driver process (this file with ``--vllm-driver``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.conformance import run_case
from tests import json_reader as J

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
    # MLA head 512 + 64 = 576, bf16, on Hopper FLASH_ATTN_MLA's 16-token blocks: 16 * 576 * 2 = 18,432;
    # 61 * 18,432 = 1,124,352
    "deepseek_v3": (
        "DeepseekV3ForCausalLM",
        16,
        "bfloat16",
        {"mla": (61, 18_432, 18_432)},
        [("mla", 61)],
        1_124_352,
    ),
    # sparse: FLASH_ATTN_MLA_SPARSE (MultipleOf(64): 64-token blocks) + the indexer: (128 + 128 // 128 * 4)
    # = 132 B per token * 64 = 8,448; one group of 122 layers: 61 * (73,728 + 8,448) = 61 * 82,176
    # = 5,012,736 under LBNHC, the layout vLLM resolves (no backend of V3.2's declares one), which pads each
    # layer's stride alone to whole 1,152 B token rows (align_blocks_to_rows): a 64-token page already is
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
    ms = J.from_config(FIXTURES / family / "config.json")
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
    assert J.spec_from_config(config(family)) == ms.spec


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_fixture_plans_verifies_and_zeroes_on_the_reference(family: str) -> None:
    spec = J.spec_from_config(config(family), num_blocks=3)
    table = K.plan(spec)
    report = K.verify(table)
    assert report.ok and report.padding_checked, report.format()
    res = run_case(K.ReferenceBackend, table, [0, 2])
    assert res.ok, res.check.describe()
    zeroed_kinds = {J.from_config(config(family)).kinds[s.layer] for s in table.segments}
    assert zeroed_kinds.isdisjoint({"mamba", "gdn"})  # Mamba states are never zeroed


@pytest.mark.parametrize("backend", ["reference", "cuda", pytest.param("pallas", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_fixture_zeroes_on_every_backend(family: str, backend: str) -> None:
    """vLLM's flat layout: planned, proven, and zeroed exactly (guard bands included) by every
    backend (on a CPU: cuda under Triton's interpreter, pallas in TPU interpret mode)."""
    be = K.load_backend(backend)  # CI installs both extras: a missing one fails here
    table = K.plan(J.spec_from_config(config(family), num_blocks=2))
    assert K.verify(table).ok
    res = run_case(be, table, [1])
    assert res.ok, res.check.describe()


NATIVE_FAMILIES = [f for f in FAMILIES if f not in ("deepseek_v32", "deepseek_v4")]  # refused: see below


@pytest.mark.parametrize("kernel", ["tpu", pytest.param("triton", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", NATIVE_FAMILIES)
def test_fixture_native_arrays_zero_with_the_cache_zeroer(family: str, kernel: str) -> None:
    """tpu-inference's arrays: every array's one-row table proven, then all arrays zeroed in one
    CacheZeroer call (TPU kernel in TPU interpret mode, or the Triton kernel interpreted), byte
    for byte against the NumPy reference of section 9."""
    import jax.numpy as jnp
    import numpy as np
    from kvlayout.backends.pallas import CacheZeroer

    from tests.test_native_pallas import poisoned

    spec = J.spec_from_config(config(family), engine="tpu-inference", num_blocks=3, block_size=16)
    assert isinstance(spec, K.NativeCacheSpec)
    assert all(r.ok for r in K.verify_native(spec).values())
    # plain interpret mode quiets bf16 NaN payloads on XLA:CPU: the Triton path gets finite poison
    host = [poisoned(x.shape, x.dtype, i, finite=kernel == "triton") for i, x in enumerate(spec.leaves)]
    z = CacheZeroer([jnp.asarray(a) for a in host], spec=spec, kernel=kernel, interpret=True)
    out = z([jnp.asarray(a) for a in host], [2, 0, 2])
    z.check()
    want = [a.reshape(-1).view(np.uint8).copy() for a in host]
    K.zero_native_numpy(want, spec, [0, 2])
    for leaf, got, exp in zip(spec.leaves, out, want):
        assert np.array_equal(np.asarray(got).reshape(-1).view(np.uint8), exp), leaf.name
        assert not exp[: leaf.page_bytes].any() and exp[leaf.page_bytes : 2 * leaf.page_bytes].all()


def test_gemma3_sliding_layers_keep_their_window() -> None:
    spec = J.spec_from_config(config("gemma3"))
    by_name = {layer.name: layer for _, layer in spec.layers}
    sliding = by_name["language_model.model.layers.0.self_attn.attn"]
    assert isinstance(sliding, K.SlidingWindowSpec) and sliding.window == 1024
    assert type(by_name["language_model.model.layers.59.self_attn.attn"]) is K.FullAttentionSpec
    # vLLM's split takes every 6th sliding layer into a group: layers 0, 7, 14, ... (sliding indices 0, 6, 12)
    first = [layer.name for layer in spec.groups[0].layers[:3]]
    assert first == [f"language_model.model.layers.{i}.self_attn.attn" for i in (0, 7, 14)]


def test_gemma2_float32_checkpoint_runs_in_bfloat16_unless_told() -> None:
    ms = J.from_config(config("gemma2"))
    assert ms.dtype == "bfloat16" and any("float32" in n for n in ms.notes)
    # dtype="float32" asks for it: 2 * 16 * 8 * 256 * 4 = 262,144
    assert kinds_of(J.from_config(config("gemma2"), dtype="float32"))["full"] == (21, 262_144, 262_144)


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
    ms = J.from_config(config(family), tp=tp)
    assert ms.tp == tp
    assert {(real, pg) for _, real, pg in kinds_of(ms).values()} == {(page, page)}


def test_mla_is_not_split_by_tp_and_fp8_halves_it() -> None:
    assert kinds_of(J.from_config(config("deepseek_v3"), tp=8))["mla"] == (61, 18_432, 18_432)
    fp8 = J.from_config(config("deepseek_v3"), kv_cache_dtype="fp8")
    assert fp8.kv_cache_dtype == "float8_e4m3fn"
    assert kinds_of(fp8)["mla"] == (61, 36_864, 36_864)  # FlashMLA on Hopper: 64 * 576 * 1


def test_fp8_attention_pages() -> None:
    ms = J.from_config(config("llama"), kv_cache_dtype="fp8")
    assert (ms.kv_cache_dtype, kinds_of(ms)["full"]) == (
        "float8_e4m3fn",
        (32, 32_768, 32_768),
    )  # 2*16*8*128*1
    e5 = J.from_config(config("llama"), kv_cache_dtype="fp8_e5m2")
    assert e5.kv_cache_dtype == "float8_e5m2" and e5.bytes_per_block == 1_048_576  # 32 * 32,768


def test_deepseek_v32_fp8_is_fp8_ds_mla_656_bytes_per_token() -> None:
    ms = J.from_config(config("deepseek_v32"), kv_cache_dtype="fp8")
    assert ms.kv_cache_dtype == "fp8_ds_mla"
    # 64 tokens * 656 B (512 fp8 + 4 * 4 B scales + 64 * 2 B RoPE) = 41,984; the indexer stays 8,448
    assert kinds_of(ms) == {"indexer": (61, 8_448, 8_448), "mla": (61, 41_984, 41_984)}
    assert ms.bytes_per_block == 3_076_352  # 61 * (41,984 + 8,448)


def test_hybrid_fp8_and_tp_move_the_block_size() -> None:
    # fp8: 2 * 2 * 256 * 1 = 1,024 B per token; 16 * ceil(1,085,440 / 16,384) = 16 * 67 = 1,072 tokens,
    # pages 1,072 * 1,024 = 1,097,728 (GDN padded by 12,288)
    fp8 = J.from_config(config("qwen3_5"), kv_cache_dtype="fp8")
    assert fp8.block_size == 1_072
    assert kinds_of(fp8) == {"gdn": (18, 1_085_440, 1_097_728), "full": (6, 1_097_728, 1_097_728)}
    # tp 2: 1 KV head (1,024 B per token); conv 3 * 3,072 * 2 = 18,432 + ssm 8 * 128 * 128 * 4 = 524,288
    # -> 542,720; 16 * ceil(542,720 / 16,384) = 16 * 34 = 544 tokens, pages 557,056
    tp2 = J.from_config(config("qwen3_5"), tp=2)
    assert tp2.block_size == 544
    assert kinds_of(tp2) == {"gdn": (18, 542_720, 557_056), "full": (6, 557_056, 557_056)}


def test_block_size_argument() -> None:
    assert kinds_of(J.from_config(config("llama"), block_size=32))["full"] == (
        32,
        131_072,
        131_072,
    )  # 2*32*8*128*2
    # a hybrid keeps a larger block (1,024 * 2,048 = 2,097,152) and raises a smaller one to 544
    big = J.from_config(config("qwen3_5"), block_size=1024)
    assert big.block_size == 1024 and kinds_of(big)["gdn"] == (18, 1_085_440, 2_097_152)
    small = J.from_config(config("qwen3_5"), block_size=16)
    assert small.block_size == 544 and any("raised to 544" in n for n in small.notes)
    # vLLM 0.33 steps in units of the block already set: 48 * ceil(1,085,440 / (48 * 2,048)) = 48 * 12 = 576
    assert J.from_config(config("qwen3_5"), block_size=48).block_size == 576
    # DeepSeek-V4 at 512 tokens: c4 128 * 584 = 74,752 -> 130 * 576 = 74,880; c128 4 * 584 = 2,336 -> 2,880;
    # the 64-token window cache does not change
    v4 = kinds_of(J.from_config(config("deepseek_v4"), block_size=512))
    assert (v4["c4"], v4["c128"], v4["swa"]) == (
        (21, 74_752, 74_880),
        (20, 2_336, 2_880),
        (43, 37_376, 37_440),
    )


def test_mamba_ssm_cache_dtype() -> None:
    # Nemotron-H with a bf16 ssm state: 61,440 + 128 * 64 * 128 * 2 = 2,158,592; 16 * ceil(2,158,592 / 65,536)
    # = 16 * 33 = 528 tokens, pages 528 * 4,096 = 2,162,688
    ms = J.from_config(config("nemotron_h"), mamba_ssm_cache_dtype="bfloat16")
    assert ms.block_size == 528 and kinds_of(ms)["mamba"] == (24, 2_158_592, 2_162_688)
    # the config's own field counts when the argument is not given
    cfg = config("nemotron_h")
    cfg["mamba_ssm_cache_dtype"] = "bfloat16"
    assert J.from_config(cfg).spec == ms.spec


def test_layer_rules_without_layer_types() -> None:
    qn = config("qwen3_next")
    del qn["layer_types"]  # full_attention_interval 4 says the same
    assert J.from_config(qn).spec == J.from_config(config("qwen3_next")).spec
    q2 = config("qwen2")
    q2["use_sliding_window"] = True
    q2["max_window_layers"] = 20  # layers 20..27 would slide: vLLM's Qwen2Model asserts against it
    with pytest.raises(K.SpecError) as e:
        J.from_config(q2)
    assert e.value.field == "config.max_window_layers"
    q2["max_window_layers"] = 0  # every layer slides
    assert set(J.from_config(q2).kinds.values()) == {"sliding"}
    q2["max_window_layers"] = 28  # none does
    assert set(J.from_config(q2).kinds.values()) == {"full"}
    mis = config("mistral")
    mis["sliding_window"] = 4096
    assert set(J.from_config(mis).kinds.values()) == {"sliding"}


def test_group_size_threshold_is_one_and_a_half() -> None:
    cfg = config("llama")  # Llama's layers slide by layer_types (GPT-OSS's by parity: vLLM reads none)
    cfg["sliding_window"] = 128
    cfg["num_hidden_layers"] = 29
    cfg["layer_types"] = ["sliding_attention"] * 12 + ["full_attention"] * 17
    # 17 < 1.5 * 12 = 18: group size 17, one group per kind (vLLM pads the sliding one)
    assert groups_of(J.from_config(cfg)) == [("sliding", 12), ("full", 17)]
    cfg["num_hidden_layers"] = 30
    cfg["layer_types"] = ["sliding_attention"] * 12 + ["full_attention"] * 18
    # 18 is not under 18: group size 12, the 18 full layers in ceil(18 / 12) = 2 groups of 9
    assert groups_of(J.from_config(cfg)) == [("sliding", 12), ("full.0", 9), ("full.1", 9)]


def test_missing_kv_heads_means_multi_head_attention() -> None:
    cfg = config("llama")
    del cfg["num_key_value_heads"]  # vLLM falls back to num_attention_heads: 2 * 16 * 32 * 128 * 2
    assert kinds_of(J.from_config(cfg))["full"] == (32, 262_144, 262_144)


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
        # GPT-OSS slides on even layers whatever layer_types say: its window is what it needs
        (_without("gpt_oss", "sliding_window"), {}, "config.sliding_window"),
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
        J.from_config(cfg, **kwargs)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field} = ")


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(K.SpecError, match="config file"):
        J.spec_from_config(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(K.SpecError) as e:
        J.spec_from_config(bad)
    assert e.value.field == "config"
    bad.write_text("{not json")
    with pytest.raises(K.SpecError, match="not valid JSON"):
        J.spec_from_config(bad)


def test_summary_is_one_screen() -> None:
    ms = J.from_config(config("qwen3_5"))
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
        ("llama", {"block_size": 16}, 32, 1, (16, 8, 2, 128), "bfloat16", 65_536),
        # the global array: one shard's 1 KV head, fp8 packing 32 // 8 = 4: align(2, 4) // 4 = 1 row of 4,
        # times tp 8 = 8 rows: 16 * 8 * 4 * 128 * 1 (issue 24: the padding is per shard)
        (
            "llama",
            {"tp": 8, "kv_cache_dtype": "fp8", "block_size": 16},
            32,
            1,
            (16, 8, 4, 128),
            "float8_e4m3fn",
            65_536,
        ),
        # head_dim 64: K and V share one 128-lane row, align(8, 2) // 2 = 4 rows of 2: 16 * 4 * 2 * 128 * 2;
        # 12 arrays, each shared by the sliding and the full layer of its slot (vLLM's two groups of 12)
        ("gpt_oss", {"block_size": 16}, 12, 2, (16, 4, 2, 128), "bfloat16", 32_768),
        # MLA (pages, 64 // 32, 32, align(512, 128) + align(64, 128) = 640): 2 * 32 * 640 * 2 (vLLM: 73,728)
        ("deepseek_v3", {"block_size": 64}, 61, 1, (2, 32, 640), "bfloat16", 81_920),
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

    ms = J.from_config(config(family), engine="tpu-inference", num_blocks=5, **kwargs)
    assert isinstance(ms, M.NativeModelSpec) and ms.engine == "tpu-inference"
    spec = ms.spec
    assert isinstance(spec, NativeCacheSpec) and len(spec.leaves) == arrays
    assert {(x.shape, x.dtype, x.page_bytes) for x in spec.leaves} == {((5, *page_shape), dtype, page)}
    assert {len(ms.shared_by[x.name]) for x in spec.leaves} == {users}
    assert ms.bytes_per_block == arrays * page
    assert all(r.ok for r in verify_native(spec).values())
    assert J.spec_from_config(config(family), engine="tpu-inference", num_blocks=5, **kwargs) == spec


def test_tpu_inference_slots_and_zeroing() -> None:
    import numpy as np

    from kvlayout.native import zero_native_numpy

    ms = J.from_config(config("gpt_oss"), engine="tpu-inference", num_blocks=3, block_size=16)
    assert isinstance(ms, M.NativeModelSpec)
    first = ms.spec.leaves[0]
    assert first.name == "kv_caches[0]" and first.group == ("sliding", "full")  # each group zeroes it
    assert ms.shared_by["kv_caches[0]"] == ("model.layers.0.attn.attn", "model.layers.1.attn.attn")
    llama = J.from_config(config("llama"), engine="tpu-inference", num_blocks=3, block_size=16)
    assert isinstance(llama, M.NativeModelSpec)
    assert {x.group for x in llama.spec.leaves} == {"full"}  # one group: one array per layer
    arrays = [np.full((3, 16, 8, 2, 128), 7, np.uint16) for _ in llama.spec.leaves]  # bf16-sized, poisoned
    zero_native_numpy(arrays, llama.spec, [1])
    for a in arrays:
        assert not a[1].any() and (a[0] == 7).all() and (a[2] == 7).all()
    hybrid = J.from_config(config("qwen3_5"), engine="tpu-inference", block_size=16)
    assert any("request slot" in n for n in hybrid.notes)


@pytest.mark.parametrize("family", ["deepseek_v32", "deepseek_v4"])
def test_tpu_inference_refuses_what_it_does_not_model(family: str) -> None:
    with pytest.raises(K.SpecError) as e:
        J.from_config(config(family), engine="tpu-inference")
    assert e.value.field == "engine"


def test_tpu_inference_mla_pages_padded_to_32_tokens() -> None:
    """tpu-inference pads an MLA page to whole 32-token rows (issue 24: 16 tokens were refused)."""
    for tokens, rows in ((48, 2), (16, 1), (64, 2)):
        spec = J.spec_from_config(config("deepseek_v3"), engine="tpu-inference", block_size=tokens)
        assert isinstance(spec, K.NativeCacheSpec) and spec.leaves[0].page_shape == (rows, 32, 640)


def test_tpu_inference_summary() -> None:
    text = M.summary(J.from_config(config("deepseek_v3"), engine="tpu-inference", block_size=64))
    assert "61 arrays of 16 pages" in text and "(2, 32, 640)" in text
    assert "bytes per block 4,997,120; blocks per GiB 214" in text  # 61 * 81,920; 2**30 // 4,997,120
    assert text.rstrip().endswith("SAFE")


# --------------------------------------------------------------------------- vLLM's own functions
# vLLM 0.33 (installed in CI, --no-deps) computes from the same config.json, on the CPU, in one
# subprocess (``python tests/test_models.py --vllm-driver``; vLLM's import takes most of its time):
#   head size, KV heads   the HF config through vllm.transformers_utils.config.get_config, vLLM's
#                         ModelArchConfigConvertor (what ModelConfig.get_head_size returns) and
#                         ModelConfig.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp));
#                         the model dtype from vllm.config.model._get_and_verify_dtype
#   Mamba states          <model class>.get_mamba_state_shape_from_config / _dtype_from_config
#                         (JambaForCausalLM, NemotronHForCausalLM, Qwen3NextForCausalLM) after the
#                         model's own MODELS_CONFIG_MAP hook, as vLLM's MambaSpec page_size_bytes
#   hybrid block size     Platform._align_hybrid_block_size with the Triton attention backend:
#                         cache_config.block_size and mamba_page_size_padded
#   groups, pages, bytes  vllm.v1.core.kv_cache_planning.get_kv_cache_groups and
#                         _pool_bytes_per_block, block-outermost layout, on vLLM KV cache specs made
#                         as the models' layers make them (Attention, DeepseekV32IndexerCache,
#                         DeepSeek-V4's SWA, compressed, indexer and compressor-state caches), with
#                         the head size, KV heads and Mamba states vLLM computed above; kvlayout
#                         supplies only the layer names and kinds, in model order, and the block size
#                         of the non-hybrids (its attention backend's on Hopper, DeepSeek-V4 256;
#                         tests/test_models_backends.py checks the backend choice against vLLM's).
#                         DeepSeek-V3.2 with a bf16 cache: FLASH_ATTN_MLA_SPARSE.customize_spec, which
#                         is align_blocks_to_rows (the driver checks that in vLLM's source).
# Stand-ins, each checked: Qwen3.5's model module needs torchvision (not installed), so its states
# and block size come from Qwen3NextForCausalLM, whose two state classmethods have the same code
# (the driver compares their syntax trees in vLLM's source; a difference fails the test).
# vLLM's quantization modules import compressed_tensors (not installed) for classes these
# functions never call: the driver gives them an empty stand-in package.
#: (case id, family, keyword arguments of from_config)
VLLM_CASES: list[tuple[str, str, dict[str, Any]]] = [
    *((f, f, {}) for f in FAMILIES),
    ("llama-tp2", "llama", {"tp": 2}),
    ("llama-tp8-fp8", "llama", {"tp": 8, "kv_cache_dtype": "fp8"}),
    ("llama-tp16", "llama", {"tp": 16}),
    ("qwen2-tp4", "qwen2", {"tp": 4}),
    ("gpt_oss-tp8", "gpt_oss", {"tp": 8}),
    ("gemma3-tp2-fp8", "gemma3", {"tp": 2, "kv_cache_dtype": "fp8"}),
    ("deepseek_v3-tp8-fp8", "deepseek_v3", {"tp": 8, "kv_cache_dtype": "fp8"}),
    ("deepseek_v32-fp8", "deepseek_v32", {"kv_cache_dtype": "fp8"}),
    ("deepseek_v4-512", "deepseek_v4", {"block_size": 512}),
    ("jamba-tp2", "jamba", {"tp": 2}),
    ("nemotron_h-bf16-ssm", "nemotron_h", {"mamba_ssm_cache_dtype": "bfloat16"}),
    ("nemotron_h-tp4", "nemotron_h", {"tp": 4}),
    ("qwen3_next-fp8", "qwen3_next", {"kv_cache_dtype": "fp8"}),
    ("qwen3_5-tp2", "qwen3_5", {"tp": 2}),
    ("qwen3_5-fp8", "qwen3_5", {"kv_cache_dtype": "fp8"}),
    ("qwen3_5-block48", "qwen3_5", {"block_size": 48}),
    ("qwen3_5-block1024", "qwen3_5", {"block_size": 1024}),
]
_HYBRIDS = ("jamba", "nemotron_h", "falcon_h1", "qwen3_next", "qwen3_5")
_DRIVER_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}


def _model(case_id: str) -> M.ModelSpec:
    family, kwargs = next((f, kw) for c, f, kw in VLLM_CASES if c == case_id)
    ms = J.from_config(FIXTURES / family / "config.json", **kwargs)
    assert isinstance(ms, M.ModelSpec)
    return ms


def _request() -> list[dict[str, Any]]:
    out = []
    for case_id, family, kwargs in VLLM_CASES:
        ms = _model(case_id)
        out.append(
            {
                "id": case_id,
                "family": family,
                "dir": str(FIXTURES / family),
                "tp": kwargs.get("tp", 1),
                "kv_cache_dtype": kwargs.get("kv_cache_dtype", "auto"),
                "mamba_ssm_cache_dtype": kwargs.get("mamba_ssm_cache_dtype", "auto"),
                "block_size": kwargs.get("block_size"),
                "default_block_size": ms.block_size,  # the backend's: tests/test_models_backends.py
                "layers": list(ms.kinds.items()),  # model order
            }
        )
    return out


@pytest.fixture(scope="module")
def vllm() -> dict[str, dict[str, Any]]:
    """vLLM's answers for every case, from one driver process (vLLM missing is a failure)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **_DRIVER_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run(
        [sys.executable, __file__, "--vllm-driver"],
        input=json.dumps(_request()),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    answers: dict[str, dict[str, Any]] = json.loads(res.stdout)
    return answers


def test_vllm_cases_cover_every_family() -> None:
    assert {f for _, f, _ in VLLM_CASES} == set(FAMILIES)
    assert {f for _, f, kw in VLLM_CASES if kw.get("tp", 1) > 1} >= {"llama", "deepseek_v3", "qwen3_5"}


@pytest.mark.parametrize("case_id", [c for c, _, _ in VLLM_CASES])
def test_head_size_kv_heads_and_dtypes_match_vllm(case_id: str, vllm: dict[str, dict[str, Any]]) -> None:
    got, ms = vllm[case_id], _model(case_id)
    assert "error" not in got, got.get("error")
    assert got["dtype"] == ms.dtype
    if ms.kv_cache_dtype != "fp8_ds_mla":  # vLLM holds fp8 caches as uint8 tensors: compare the sizes
        assert got["kv_itemsize"] == K.DTYPE_SIZES[ms.kv_cache_dtype]
        if got["kv_dtype"] != "uint8":
            assert got["kv_dtype"] == ms.kv_cache_dtype
    layers = [layer for _, layer in ms.spec.layers]
    attention = [x for x in layers if isinstance(x, K.FullAttentionSpec)]
    assert got["use_mla"] == (not attention)
    for x in attention:
        assert (x.head_size, x.num_kv_heads) == (got["head_size"], got["kv_heads"]), x.name
    if not attention:  # MLA: one latent head, not split by tp; DeepSeek-V4's attention head is head_dim
        assert got["kv_heads"] == 1
        mla = [x for x in layers if ms.kinds[x.name] in ("mla", "c4", "c128", "swa")]
        assert mla and {x.head_size for x in mla} == {got["head_size"]}  # type: ignore[attr-defined]


@pytest.mark.parametrize("case_id", [c for c, f, _ in VLLM_CASES if f in _HYBRIDS])
def test_mamba_states_and_hybrid_block_size_match_vllm(case_id: str, vllm: dict[str, dict[str, Any]]) -> None:
    got, ms = vllm[case_id], _model(case_id)
    assert "error" not in got, got.get("error")
    if ms.family == "qwen3_5":
        assert got["stand_in_identical"] is True  # Qwen3.5's state classmethods are Qwen3-Next's
    states = {x for _, x in ms.spec.layers if isinstance(x, K.MambaSpec)}
    assert len({(x.real_page, x.page) for x in states}) == 1
    state = states.pop()
    assert state.real_page == got["mamba_page"]  # vLLM's MambaSpec(shapes, dtypes).page_size_bytes
    assert ms.block_size == got["block_size"]  # Platform._align_hybrid_block_size
    assert state.page == (got["mamba_page_padded"] or got["mamba_page"])


@pytest.mark.parametrize("case_id", [c for c, _, _ in VLLM_CASES])
def test_groups_pages_and_bytes_per_block_match_vllm(case_id: str, vllm: dict[str, dict[str, Any]]) -> None:
    got, ms = vllm[case_id], _model(case_id)
    assert "error" not in got, got.get("error")
    assert [[x.name for x in g.layers] for g in ms.spec.groups] == got["groups"]  # members and order
    assert {x.name: [x.real_page, x.page] for _, x in ms.spec.layers} == got["pages"]
    # kvlayout's bytes per block are vLLM's under the layout vLLM resolves: the first of its default
    # preference that takes the model (no backend of these families declares a layout of its own, but
    # DeepSeek-V4's, which vLLM accepts only block-outermost). Every family is planned "packed"; vLLM's
    # other layouts take the same bytes where it accepts them, except that a block-outermost layout rounds
    # the block row up to whole token rows where a layer-outermost one pads each layer's stride alone
    # (DeepSeek-V3.2 bf16: 5,013,504 against vLLM's default 5,012,736)
    by_layout = got["bytes_per_block_by_layout"]
    accepted = {k for k, v in by_layout.items() if isinstance(v, int)}
    resolved = next(k for k in got["default_layouts"] if k in accepted)
    assert ms.bytes_per_block == by_layout[resolved], resolved
    block_outermost = {k for k in by_layout if k.startswith("B")}  # BLHNC, BLNHC, BHLNC
    assert len({by_layout[k] for k in accepted & block_outermost}) == 1
    assert by_layout["BLHNC"] == got["bytes_per_block"]
    per_layer = max(
        sum(-(-x.page // x.stride_alignment) * x.stride_alignment for x in g.layers) for g in ms.spec.groups
    )
    assert {by_layout[k] for k in accepted - block_outermost} <= {per_layer}
    assert accepted == (block_outermost if ms.family == "deepseek_v4" else set(by_layout))


def test_vllm_answers_are_the_hand_computed_ones(vllm: dict[str, dict[str, Any]]) -> None:
    """A few of vLLM's numbers, by hand (the comments of EXPECTED), so the driver cannot drift."""
    assert vllm["qwen3_5"]["block_size"] == 544 and vllm["qwen3_5"]["mamba_page_padded"] == 1_114_112
    assert vllm["nemotron_h"]["mamba_shapes"] == [[3, 10_240], [128, 64, 128]]
    assert vllm["nemotron_h"]["mamba_dtypes"] == ["bfloat16", "float32"]
    assert vllm["jamba"]["mamba_shapes"] == [[3, 8_192], [8_192, 16]]
    assert vllm["llama-tp16"]["kv_heads"] == 1 and vllm["deepseek_v3-tp8-fp8"]["kv_heads"] == 1
    assert vllm["deepseek_v4"]["bytes_per_block"] == 1_002_240
    assert [len(g) for g in vllm["deepseek_v4"]["groups"]] == [22, 21, 62, 42, 20]


# --------------------------------------------------------------------------- the vLLM driver process
def _stub_compressed_tensors() -> None:
    """An empty ``compressed_tensors`` package: vLLM's quantization modules import names from it
    that the state and grouping functions never use (the package is not installed)."""
    import importlib.abc
    import importlib.machinery
    import sys
    import types

    class _Anything(type):
        def __getattr__(cls, key: str) -> Any:
            return _Anything(key, (), {})

    def _name(key: str) -> Any:
        # a dunder is a module's own attribute, absent here: a stand-in for __file__ broke the source lookup
        # of torch.library.custom_op (inspect walks every module's __file__), reached by gpt-oss's mxfp4
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        return _Anything(key, (), {})

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name.split(".")[0] != "compressed_tensors":
                return None
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec: Any) -> Any:
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = _name  # type: ignore[method-assign]
            return module

        def exec_module(self, module: Any) -> None:
            return None

    sys.meta_path.append(_Finder())


def _same_state_code(a: str, b: str) -> bool:
    """Whether models ``a`` and ``b`` of vLLM define their two Mamba state classmethods identically."""
    import ast

    import vllm.model_executor.models as mm

    root = Path(mm.__file__).parent
    names = ("get_mamba_state_shape_from_config", "get_mamba_state_dtype_from_config")

    def bodies(module: str) -> set[str]:
        tree = ast.parse((root / f"{module}.py").read_text())
        fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]
        return {ast.dump(ast.Module(body=n.body, type_ignores=[])) for n in fns}

    mine = bodies(b)
    return len(mine) == 2 and bodies(a) == mine


def _vllm_answer(case: dict[str, Any]) -> dict[str, Any]:
    """Everything vLLM computes for one case (see the comment above VLLM_CASES)."""
    from types import SimpleNamespace as NS

    import torch
    import vllm.config  # noqa: F401  (before the convertor: vLLM's own import order)
    from vllm.config.model import ModelConfig, _get_and_verify_dtype
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.platforms.interface import Platform
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1 import kv_cache_interface as I
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.core import kv_cache_planning as P

    def name(dt: Any) -> str:
        return str(dt).removeprefix("torch.")

    path, fam, kv = case["dir"], case["family"], case["kv_cache_dtype"]
    hf = get_config(path, trust_remote_code=False)
    text = get_hf_text_config(hf)
    arch = MODEL_ARCH_CONFIG_CONVERTORS.get(hf.model_type, ModelArchConfigConvertorBase)(hf, text).convert()
    dtype = _get_and_verify_dtype(path, hf, "auto", is_pooling_model=False)
    par = NS(tensor_parallel_size=case["tp"], rank=0, pipeline_parallel_size=1)
    mc = NS(
        hf_config=hf,
        hf_text_config=text,
        model_arch_config=arch,
        use_mla=arch.is_deepseek_mla,
        dtype=dtype,
        architecture=hf.architectures[0],
        architectures=hf.architectures,
        model_impl="auto",
        convert_type="none",
        runner_type="generate",
    )
    mc.get_num_kv_heads = lambda p, a=None: ModelConfig.get_num_kv_heads(mc, p, a)  # type: ignore[arg-type]
    mc.get_head_size = lambda: ModelConfig.get_head_size(mc)  # type: ignore[arg-type]
    kv_dtype = dtype if kv == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kv]
    out: dict[str, Any] = {
        "head_size": mc.get_head_size(),
        "kv_heads": mc.get_num_kv_heads(par),
        "use_mla": mc.use_mla,
        "dtype": name(dtype),
        "kv_dtype": name(kv_dtype),
        "kv_itemsize": kv_dtype.itemsize,
        # vLLM's window for layers whose model code passes none (EngineArgs.create_engine_config: the
        # text config's sliding_window when it has no layer_types or they all slide), and layer_types
        "layer_types": getattr(text, "layer_types", None),
        "global_window": (
            getattr(text, "sliding_window", None)
            if getattr(text, "layer_types", None) is None
            or all(t == "sliding_attention" for t in text.layer_types)
            else None
        ),
    }
    block = case["block_size"] or case["default_block_size"]
    mamba = None
    if fam in _HYBRIDS:
        cache = NS(
            cache_dtype=kv,
            block_size=case["block_size"] or 16,
            mamba_page_size_padded=None,
            mamba_cache_mode="none",
            mamba_cache_dtype="auto",
            mamba_ssm_cache_dtype=case["mamba_ssm_cache_dtype"],
            use_replayssm=False,
            kv_cache_dtype_skip_layers=None,
        )
        vc = NS(
            model_config=mc,
            cache_config=cache,
            parallel_config=par,
            speculative_config=None,
            num_speculative_tokens=0,
            compilation_config=NS(static_forward_context={}),
        )
        hook = MODELS_CONFIG_MAP.get(mc.architecture)
        if hook is not None:
            hook.verify_and_update_config(vc)  # Nemotron-H, Qwen3.5: the ssm state dtype
        if fam == "qwen3_5":
            out["stand_in_identical"] = _same_state_code("qwen3_5", "qwen3_next")
            mc.architecture = "Qwen3NextForCausalLM"
        cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
        shapes = cls.get_mamba_state_shape_from_config(vc)
        dtypes = cls.get_mamba_state_dtype_from_config(vc)
        out["mamba_shapes"] = [list(x) for x in shapes]
        out["mamba_dtypes"] = [name(x) for x in dtypes]
        out["mamba_page"] = I.MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
        Platform._align_hybrid_block_size(vc, TritonAttentionBackend)
        block = out["block_size"] = cache.block_size
        out["mamba_page_padded"] = cache.mamba_page_size_padded
        mamba = I.MambaSpec(
            shapes=shapes, dtypes=dtypes, block_size=block, page_size_padded=cache.mamba_page_size_padded
        )
    hs, kvh = out["head_size"], out["kv_heads"]
    specs: dict[str, Any] = {}
    for layer, kind in case["layers"]:
        if kind == "full":
            specs[layer] = I.FullAttentionSpec(
                block_size=block, num_kv_heads=kvh, head_size=hs, dtype=kv_dtype
            )
        elif kind == "sliding":
            specs[layer] = I.SlidingWindowSpec(
                block_size=block,
                num_kv_heads=kvh,
                head_size=hs,
                dtype=kv_dtype,
                sliding_window=text.sliding_window,
            )
        elif kind == "chunked":  # Llama 4's ChunkedLocalAttention.get_kv_cache_spec
            specs[layer] = I.ChunkedLocalAttentionSpec(
                block_size=block,
                num_kv_heads=kvh,
                head_size=hs,
                dtype=kv_dtype,
                attention_chunk_size=text.attention_chunk_size,
            )
        elif kind in ("mamba", "gdn"):
            specs[layer] = mamba
        elif kind == "mla" and fam == "deepseek_v32" and kv.startswith("fp8"):
            # MLAAttention.get_kv_cache_spec: V3.2 stores an fp8 cache as fp8_ds_mla, one opaque row
            specs[layer] = I.MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                max_tp_shards=1,
                head_size=hs,
                dtype=torch.uint8,
                cache_dtype_str="fp8_ds_mla",
                kv_quant_mode=I.get_kv_quant_mode("fp8_ds_mla"),
                state_content_bytes=656,  # vLLM's literal for fp8_ds_mla
            )
        elif kind == "mla":
            specs[layer] = I.MLAAttentionSpec(
                block_size=block, num_kv_heads=1, max_tp_shards=1, head_size=hs, dtype=kv_dtype
            )
            if fam == "deepseek_v32":  # Hopper's FLASH_ATTN_MLA_SPARSE pads block strides to token rows
                specs[layer] = _flash_attn_mla_sparse_customize(specs[layer])
        elif kind == "indexer":  # DeepseekV32IndexerCache: fp8 values + an fp32 scale per 128
            d = text.index_head_dim
            specs[layer] = I.MLAAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=d + d // 128 * 4, dtype=torch.uint8
            )
        else:
            specs[layer] = _dsv4_spec(I, torch, kind, text, block)

    def planning_for(layout: Any) -> Any:
        return NS(
            cache_config=NS(
                num_gpu_blocks_override=4,
                prefix_cache_retention_interval=None,
                kv_cache_layout=layout.name,
                get_resolved_kv_cache_layout=lambda: layout,
            ),
            attention_config=NS(hisparse_config=None),
            scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
            model_config=NS(supports_kv_cache_grouping=False),
        )

    # bytes per block on every layout: the same as block-outermost's wherever vLLM accepts the model
    per_layout: dict[str, Any] = {}
    for lay in I.KVCacheLayout:
        try:
            plan = planning_for(lay)
            per_layout[lay.name] = P._pool_bytes_per_block(plan, P.get_kv_cache_groups(plan, dict(specs)))
        except Exception as e:  # a layout vLLM refuses for this model
            per_layout[lay.name] = f"refused: {type(e).__name__}"
    out["bytes_per_block_by_layout"] = per_layout
    from vllm.v1.attention.backends.utils import _DEFAULT_LAYOUT_PREFERENCE

    out["default_layouts"] = [lay.name for lay in _DEFAULT_LAYOUT_PREFERENCE]  # when no backend declares one
    planning = planning_for(next(m for m in I.KVCacheLayout if m.is_block_outermost))
    groups = P.get_kv_cache_groups(planning, specs)
    out["groups"] = [list(g.layer_names) for g in groups]
    pages: dict[str, list[int]] = {}
    for g in groups:
        gs = g.kv_cache_spec
        for layer in g.layer_names:
            ls = gs.kv_cache_specs[layer] if isinstance(gs, I.UniformTypeKVCacheSpecs) else gs
            pages[layer] = [getattr(ls, "real_page_size_bytes", ls.page_size_bytes), ls.page_size_bytes]
    out["pages"] = pages
    out["bytes_per_block"] = P._pool_bytes_per_block(planning, groups)
    return out


def _flash_attn_mla_sparse_customize(spec: Any) -> Any:
    """FLASH_ATTN_MLA_SPARSE.customize_spec (its module needs the GPU build to import): the driver
    checks in vLLM's source that it is ``align_blocks_to_rows(spec)`` and calls that."""
    import vllm.v1.attention.backends.mla as mla_pkg
    from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows

    src = (Path(mla_pkg.__file__).parent / "flashattn_mla_sparse.py").read_text()
    body = (
        "def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:\n"
        "        return align_blocks_to_rows(spec)"
    )
    assert body in src, "FLASH_ATTN_MLA_SPARSE.customize_spec changed"
    # and it declares no layout: vLLM resolves its default preference's first (LBNHC) for V3.2's layers
    assert "supported_kv_cache_layouts" not in src, "FLASH_ATTN_MLA_SPARSE declares its layouts now"
    return align_blocks_to_rows(spec)


def _dsv4_spec(iface: Any, torch: Any, kind: str, text: Any, block: int) -> Any:
    """A DeepSeek-V4 layer's spec as vLLM 0.33's layer returns it with an fp8 cache
    (models/deepseek_v4/attention.py, compressor.py; v1/attention/backends/mla/sparse_swa.py)."""
    fp8 = {
        "cache_dtype_str": "fp8_ds_mla",
        "model_version": "deepseek_v4",
        "kv_quant_mode": iface.get_kv_quant_mode("fp8_ds_mla"),
        "state_content_bytes": 584,  # 448 B NoPE + 128 B RoPE + 8 B scales, as vLLM writes it
    }
    one = {"num_kv_heads": 1, "max_tp_shards": 1, "alignment": 576}
    if kind == "swa":  # DeepseekV4SWACache
        return iface.SlidingWindowMLASpec(
            block_size=64,
            head_size=text.head_dim,
            dtype=torch.uint8,
            sliding_window=text.sliding_window,
            **one,
            **fp8,
        )
    if kind in ("c4", "c128"):  # the attention layer itself
        return iface.MLAAttentionSpec(
            block_size=block,
            head_size=text.head_dim,
            dtype=torch.uint8,
            tokens_per_state=int(kind[1:]),
            **one,
            **fp8,
        )
    if kind == "c4_indexer":  # DeepseekV4IndexerCache
        d = text.index_head_dim
        return iface.MLAAttentionSpec(
            block_size=block, head_size=d + d // 128 * 4, dtype=torch.uint8, tokens_per_state=4, **one
        )
    ratio = 4 if kind.startswith("c4") else 128  # CompressorStateCache
    coff = 2 if ratio == 4 else 1
    dim = text.index_head_dim if kind == "c4_indexer_state" else text.head_dim
    return iface.SlidingWindowMLASpec(
        block_size=4 if ratio == 4 else 8,
        head_size=2 * coff * dim,
        dtype=torch.float32,
        sliding_window=coff * ratio,
        **one,
    )


def _vllm_driver() -> None:
    """Read the cases (JSON) from stdin, write vLLM's answers (JSON) to stdout."""
    import sys
    import traceback

    _stub_compressed_tensors()
    out, sys.stdout = sys.stdout, sys.stderr  # vLLM's prints must not mix with the answers
    request = json.load(sys.stdin)  # a list of cases, or {"cases": [...], "backends": [names]}
    cases = request["cases"] if isinstance(request, dict) else request
    answers: dict[str, Any] = {}
    for case in cases:
        try:
            answers[case["id"]] = _vllm_answer(case)
        except Exception as e:  # one case's failure is reported by its own tests
            traceback.print_exc()
            answers[case["id"]] = {"error": f"{type(e).__name__}: {e}"}
    if isinstance(request, dict) and "backends" in request:  # tests/test_models_backends.py's questions
        from tests.test_models_backends import backend_answers

        answers["__backends__"] = backend_answers(request["backends"])
    json.dump(answers, out)


if __name__ == "__main__" and "--vllm-driver" in __import__("sys").argv:
    _vllm_driver()


def test_qwen2_ignores_a_written_head_dim_as_vllm_does() -> None:
    """vLLM 0.33's Qwen2Attention takes ``hidden_size // num_attention_heads`` and never reads
    ``head_dim`` (MiMo, built on it, shows it by construction in tests/test_models_generic.py); a Qwen2
    config that writes another head_dim was planned with it: a page of the wrong size. Qwen3 and Llama
    read it."""
    q2 = config("qwen2")
    want = q2["hidden_size"] // q2["num_attention_heads"]
    for hd in (None, want // 2, want * 2):
        c = dict(q2) if hd is None else {**q2, "head_dim": hd}
        sizes = {layer.head_size for g in J.from_config(c).spec.groups for layer in g.layers}
        assert sizes == {want}, hd
    for fam in ("llama", "qwen3"):
        c = config(fam)
        hd = c["hidden_size"] // c["num_attention_heads"] * 2
        spec = J.from_config({**c, "head_dim": hd}).spec
        assert {layer.head_size for g in spec.groups for layer in g.layers} == {hd}, fam
    found = importlib.util.find_spec("vllm")  # the source, without importing vLLM
    if found is None or found.origin is None:
        pytest.skip("vllm is not installed")
    text = (Path(found.origin).parent / "model_executor" / "models" / "qwen2.py").read_text()
    assert "self.head_dim = hidden_size // self.total_num_heads" in text and "config.head_dim" not in text
