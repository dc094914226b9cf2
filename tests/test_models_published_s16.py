"""Published config.json files checked against vLLM 0.33's own construction (issue 23): 64 models
(tests/fixtures/published/, each with its source in SOURCES.json; gpt-oss-20b and -120b as published, mxfp4
experts and all, SmolLM3-3B and Gemma 3 12B, whose text_config leaves out what its class fills; and, verbatim,
Kimi-K2-Instruct, DeepSeek-V3 and -R1 with their fp8 quantization_config, Nemotron-H-56B,
Nemotron-3-Nano-30B-A3B, Llama 4 Scout, Llama 3.1 8B, Mistral 7B v0.1, Qwen3-8B, Qwen3.5-27B and -35B-A3B,
Gemma 4 26B-A4B; added in the eighteenth session: Llama 3.1 70B and 405B, Mistral-Nemo, Qwen2.5-72B,
QwQ-32B, DeepSeek-R1-Distill-Qwen-7B, Qwen3-Next-80B-A3B, MiniMax-M2.7, Gemma 2 9B and 27B, Phi-4, SmolLM2,
Jamba 1.5 Mini, Falcon-Mamba-7B and Mamba-Codestral-7B (Mamba-only), Llama-3.3-Nemotron-Super-49B (its
remote-code block_configs built through tests/test_models_nemotron_nas.py's stand-in of DeciLMConfig; vLLM
failed on the plain stand-in used before: no block objects), and Kimi-Linear (built through the driver's
``cpu_kimi_linear`` stubs, its block set for the MLA backend after construction as vLLM's GPU platform
sets it: tests/test_models_kimi_linear.py)), at tp 1, 2 and 8, with a bf16 and an fp8 cache, on Hopper and
Blackwell: 768 cases.

vLLM's answer for each (its cache: block size, groups, every layer's kind and pages, windows, bytes per
block; or the error its construction raises) is pinned in tests/fixtures/published/truth.json by
scripts/gen_published_truth.py, which builds every model in vLLM on the CPU
(tests/test_models_hybrid_vllm.py's driver, on the meta device: the published models' weights do not fit;
remote-code config classes as stand-ins holding the fields as written). kvlayout must give the same
cache, or refuse exactly where vLLM refuses. The slow test builds a few of them again in vLLM, so the
pins cannot rot.

Found on the way: ChatGLM (THUDM/chatglm3-6b) writes ``num_layers``, which vLLM 0.33 reads through its own
ChatGLMConfig as ``num_hidden_layers`` (the class's ``attribute_map``); kvlayout refused it as missing.
The CPU driver builds the fp8 checkpoints' linear layers without a kernel (tests/driver.py's
cpu_fp8_block_linear) and Nemotron-3 Nano's ungated experts past the CPU's refusal (cpu_ungated_experts):
they hold weights, not cache. Llama 4's chunked local layers are full attention's pages in kvlayout's spec,
named by vLLM's kind from ``ModelSpec.kinds``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from scripts.gen_published_truth import (
    DEVICES,
    KVS,
    TPS,
    TRUTH,
    TRUTH_BLOCKS,
    block_answer,
    block_cases,
    compare,
    configs,
    digest,
    kvlayout_answer,
)

CONFIGS = configs()
PINNED: dict[str, Any] = json.loads(TRUTH.read_text())
CASES = [
    (name, tp, kv, device) for name in CONFIGS for tp in TPS for kv in KVS for device in DEVICES
]


def test_the_set_is_whole() -> None:
    assert len(CONFIGS) == 64 and len(CASES) == 768
    assert set(PINNED["cases"]) == {f"{n}-tp{tp}-{kv}-{d}" for n, tp, kv, d in CASES}
    sources = json.loads((Path(TRUTH).parent / "SOURCES.json").read_text())
    assert set(sources) == set(CONFIGS)
    # what the README says of the set
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"On {len(CONFIGS)} published config.json files ({len(CASES)} cases" in readme


@pytest.mark.parametrize(("name", "tp", "kv", "device"), CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_published_equals_vllm(name: str, tp: int, kv: str, device: str) -> None:
    pinned = PINNED["answers"][PINNED["cases"][f"{name}-tp{tp}-{kv}-{device}"]]
    mine = kvlayout_answer(CONFIGS[name], tp, kv, device)
    verdict = compare(mine, pinned)
    assert verdict in ("agree", "refused-both"), (verdict, mine.get("refused"), pinned)


def test_pins_are_the_hand_computed_ones() -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong pins."""
    def pin(case: str) -> dict[str, Any]:
        out: dict[str, Any] = PINNED["answers"][PINNED["cases"][case]]
        return out

    # ChatGLM3-6B: 28 layers, 2 KV groups of 128 on every rank up to tp 2, K and V, 16 tokens, 2 B
    assert pin("chatglm3_6b-tp1-auto-hopper")["bytes_per_block"] == 28 * 2 * 2 * 128 * 16 * 2
    assert pin("chatglm3_6b-tp8-auto-hopper")["bytes_per_block"] == 28 * 1 * 2 * 128 * 16 * 2  # replicated
    # Phi-3.5-mini: the config's window on all 32 layers, 32 KV heads of 96
    phi = pin("phi3_5_mini-tp1-auto-blackwell")
    assert phi["windows"] == [262_144] and phi["pages"] == [["SlidingWindowSpec", 196_608, 196_608]]
    # Gemma 3 1B: 5 sliding layers to 1 full, one KV head of 256; 4 query heads: tp 8 refused
    assert pin("gemma3_1b-tp1-fp8-hopper")["bytes_per_block"] == 4 * 2 * 256 * 16
    assert "error" in pin("gemma3_1b-tp8-auto-hopper")
    # DeepSeek-V2-Lite: MLA 576 per token; FLASH_ATTN_MLA's 16 tokens (Hopper, bf16), FlashMLA's 64 (fp8)
    assert pin("deepseek_v2_lite-tp2-auto-hopper")["bytes_per_block"] == 27 * 576 * 16 * 2
    assert pin("deepseek_v2_lite-tp2-fp8-hopper")["bytes_per_block"] == 27 * 576 * 64
    # gpt-oss-20b: 12 sliding (window 128) and 12 full layers, 8 KV heads of 64, in two groups of 12 that
    # share a block's pages (a block holds 12 layers' pages)
    oss = pin("gpt_oss_20b-tp1-auto-hopper")
    assert oss["bytes_per_block"] == 12 * 2 * 8 * 64 * 16 * 2 and oss["groups"] == [12, 12]
    assert oss["windows"] == [128]
    assert pin("gpt_oss_120b-tp8-fp8-hopper")["bytes_per_block"] == 18 * 2 * 1 * 64 * 16  # one KV head a rank
    # Kimi-Linear-48B: 20 KDA states of 73,728 + 2,097,152 B at tp 1 and 7 MLA layers of 1,152 B a token:
    # 15 units of 128 tokens hold a state (1,920), groups of 7 pages; fp8 halves the token: 3,840 tokens
    kl = pin("kimi_linear_48b_a3b_instruct-tp1-auto-hopper")
    assert kl["block_size"] == 1920 and kl["bytes_per_block"] == 7 * 1920 * 1152
    assert kl["groups"] == [7, 7, 6, 7]
    assert pin("kimi_linear_48b_a3b_instruct-tp1-fp8-blackwell")["block_size"] == 3840
    # Kimi-K2 and DeepSeek-V3: 61 MLA layers of 576 a token, replicated at tp 8; 16 tokens (bf16), 64 (fp8)
    assert pin("kimi_k2_instruct-tp8-auto-hopper")["bytes_per_block"] == 61 * 576 * 16 * 2
    assert pin("deepseek_v3-tp2-fp8-hopper")["bytes_per_block"] == 61 * 576 * 64
    # Nemotron-H-56B: 10 attention layers (8 KV heads of 128) and 54 Mamba2 mixers in 7 groups; a mixer's
    # conv (3, 16,384 + 2 * 8 * 256) bf16 and ssm (256, 64, 256) float32 fit a block of 4,128 tokens
    nh = pin("nemotron_h_56b-tp1-auto-hopper")
    assert nh["groups"] == [9] * 6 + [10] and nh["block_size"] == 4_128
    page = 4_128 * 2 * 8 * 128 * 2  # the attention page; the mixers' state padded to it
    mixer = 3 * (16_384 + 2 * 8 * 256) * 2 + 256 * 64 * 256 * 4
    assert nh["pages"] == [["FullAttentionSpec", page, page], ["MambaSpec", mixer, page]]
    assert nh["bytes_per_block"] == 10 * page
    # Llama 4 Scout: 36 chunked local layers and 12 NoPE full ones, 8 KV heads of 128, four groups of 12
    l4 = pin("llama4_scout-tp1-auto-hopper")
    assert l4["groups"] == [12] * 4 and l4["bytes_per_block"] == 12 * 2 * 8 * 128 * 16 * 2
    assert [p[0] for p in l4["pages"]] == ["ChunkedLocalAttentionSpec", "FullAttentionSpec"]
    # Gemma 3 12B: text_config names no head_dim nor layer pattern; the class's 256 and 5 sliding (1,024
    # tokens) to 1 full: 40 sliding and 8 full layers of 8 KV heads, in six groups of 8
    g12 = pin("gemma3_12b-tp1-auto-hopper")
    assert g12["groups"] == [8] * 6 and g12["windows"] == [1_024]
    assert g12["bytes_per_block"] == 8 * 2 * 8 * 256 * 16 * 2
    # Mistral 7B v0.1: the 4,096-token window on all 32 layers
    m7 = pin("mistral_7b_v0_1-tp1-auto-hopper")
    assert m7["windows"] == [4_096] and m7["bytes_per_block"] == 32 * 2 * 8 * 128 * 16 * 2
    # Baichuan and Qwen (1): vLLM 0.33 no longer serves them
    assert "not supported anymore" in pin("baichuan2_7b-tp1-auto-hopper")["error"]


BLOCK_CASES = block_cases(CONFIGS)
BLOCK_PINS: dict[str, Any] = json.loads(TRUTH_BLOCKS.read_text())


def test_block_size_pins_are_whole_and_hand_checked() -> None:
    """The user-block-size set (scripts/gen_published_truth.py --block-sizes): 11 configs of every cache
    kind at 32, 64 and 128 tokens, tp 1 and 2, bf16 and fp8; a few of vLLM's answers by hand."""
    assert len(BLOCK_CASES) == 132 and set(BLOCK_PINS) == set(BLOCK_CASES)
    # Llama 3.1 8B at 64 tokens: 32 layers of 8 KV heads of 128, K and V, bf16
    assert BLOCK_PINS["llama3_1_8b-tp1-auto-b64"]["bytes_per_block"] == 32 * 2 * 8 * 128 * 64 * 2
    # Jamba 1.5 Mini, 4,096 B a token: a user's 32 tokens are raised to the smallest multiple of 32 whose
    # page holds the 311,296 B Mamba state (96: 393,216 B; 16-token default: 80); 128 already holds it
    assert BLOCK_PINS["jamba_1_5_mini-tp1-auto-b32"]["block_size"] == 96
    assert BLOCK_PINS["jamba_1_5_mini-tp1-auto-b128"]["block_size"] == 128
    # DeepSeek-V2-Lite, fp8 at 32 tokens: 27 MLA layers of 576 B a token
    assert BLOCK_PINS["deepseek_v2_lite-tp2-fp8-b32"]["bytes_per_block"] == 27 * 576 * 32
    # Mamba-Codestral: the block size changes no state (64 layers of 2,158,592 B)
    assert BLOCK_PINS["mamba_codestral_7b-tp1-fp8-b128"]["bytes_per_block"] == 64 * 2_158_592


#: user block sizes vLLM's FLASH_ATTN refuses on a Hopper GPU where the CPU construction (no FlashAttention 4
#: there: TRITON_ATTN stood in) pins an answer. Gemma 4's model head size is its largest, 512, so with an
#: fp8 cache FLASH_ATTN's kernel block is FA4's fixed 64 tokens and ``validate_configuration`` refuses 32
#: (tests/test_hostile_s26_models.py::test_f3_gemma4_hopper_fp8 asks vLLM's backend); vLLM then picks the
#: next backend (FlashInfer), whose packing of Gemma 4's pages kvlayout does not model: kvlayout refuses.
FA4_REFUSED = ("gemma4_26b_a4b-tp1-fp8-b32", "gemma4_26b_a4b-tp2-fp8-b32")


@pytest.mark.parametrize("case_id", list(BLOCK_CASES))
def test_user_block_size_equals_vllm(case_id: str) -> None:
    mine = block_answer(BLOCK_CASES[case_id])
    if case_id in FA4_REFUSED:
        assert "FlashAttention 4" in mine.get("refused", ""), mine
        return
    verdict = compare(mine, BLOCK_PINS[case_id])
    assert verdict == "agree", (verdict, BLOCK_PINS[case_id])


@pytest.mark.parametrize("reader", ["json", "auto", "transformers"])
def test_chatglm_reads_num_layers_as_vllms_chatglmconfig(reader: str) -> None:
    """THUDM/chatglm3-6b writes num_layers; vLLM 0.33's ChatGLMConfig reads it as num_hidden_layers."""
    cfg = CONFIGS["chatglm3_6b"]
    assert "num_hidden_layers" not in cfg and cfg["num_layers"] == 28
    ms = M.from_config(cfg, reader=reader)
    assert isinstance(ms, M.ModelSpec) and len(ms.spec.layers) == 28
    assert ms.bytes_per_block == 28 * 2 * 2 * 128 * 16 * 2
    # written beside it, num_hidden_layers is the class's alias: it sets num_layers (the alias wins)
    both = M.from_config({**cfg, "num_hidden_layers": 2}, reader="json")
    assert isinstance(both, M.ModelSpec) and len(both.spec.layers) == 2


@pytest.mark.slow
def test_pins_are_vllms_live() -> None:
    """A few cases built again in vLLM now (one process): the same answers as pinned."""
    from scripts.gen_published_truth import summary, vllm_cases
    from tests.test_models_hybrid_vllm import vllm_answers

    names = ("chatglm3_6b", "deepseek_v2_lite", "phi3_5_mini", "internlm2_5_7b", "gpt_oss_20b",
             "kimi_linear_48b_a3b_instruct")
    few = {n: CONFIGS[n] for n in names}
    cases, which = vllm_cases(few)
    # tp 2, and gpt-oss at tp 8 (its experts' shard the CPU's kernels refuse: tests/driver.py's stub)
    wanted = [k for k in cases if "-tp2-" in k and not k.startswith("gpt_oss")] + ["gpt_oss_20b-tp8-auto"]
    keep = {k: cases[k] for k in wanted}
    answers = vllm_answers(keep)
    for key, answer in answers.items():
        got = summary(answer)
        assert got == PINNED["answers"][key], key
        if "error" not in got:
            assert got["digest"] == digest(answer)
    assert len(keep) >= 9 and all(which[c] in PINNED["answers"] for c in which)
