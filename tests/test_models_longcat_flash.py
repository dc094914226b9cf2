"""LongCat-Flash (``LongcatFlashForCausalLM``) and LongCat-Flash-Lite (``LongcatFlashNgramForCausalLM``) by
vLLM 0.33's own construction (issue 23): two MLA attentions per decoder layer,
``model.layers.{i}.self_attn.{j}.attn``, one latent head of ``kv_lora_rank + qk_rope_head_dim`` each.

vLLM reads the config with transformers' ``LongcatFlashConfig`` (installed: no stand-in), a config.json
without ``model_type`` (the published checkpoints') as ``longcat_flash``. Each small config is built by
tests/test_models_hybrid_vllm.py's driver as one rank of tp 1, 2 and 8 with a bf16 and an fp8 cache (the
driver's stubs: the CPU platform's MLA refusal of fp8, ``cpu_mla_takes_fp8``, and the tp group's size);
its block size is the MLA backend's that kvlayout resolves for Hopper and Blackwell (16 / 64 on Hopper,
32 on Blackwell; the table checked against vLLM's backend classes in tests/test_models_backends.py),
handed to vLLM's CacheConfig as vLLM's GPU platform sets it. Layers, pages, blocks, groups and bytes per
block must equal kvlayout's plan for every device whose block size it is.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import longcat_flash as L

#: meituan-longcat/LongCat-Flash-Chat's config.json in its structure (no model_type, remote code named),
#: small: 2 decoder layers, latent 64 + RoPE 16, qk_nope_head_dim 64 (FlashInfer-MLA's sizes: Blackwell)
CHAT: dict[str, Any] = {
    "architectures": ["LongcatFlashForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_longcat_flash.LongcatFlashConfig"},
    "vocab_size": 1024,
    "hidden_size": 256,
    "ffn_hidden_size": 512,
    "expert_ffn_hidden_size": 128,
    "num_layers": 2,
    "num_attention_heads": 8,
    "kv_lora_rank": 64,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "n_routed_experts": 4,
    "moe_topk": 2,
    "zero_expert_num": 2,
    "zero_expert_type": "identity",
    "routed_scaling_factor": 6.0,
    "mla_scale_q_lora": True,
    "mla_scale_kv_lora": True,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000000.0,
    "torch_dtype": "bfloat16",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "chat": CHAT,
    # model_type written, and num_hidden_layers beside num_layers: the class's setter makes 6 // 2 = 3 layers
    "typed": {**CHAT, "model_type": "longcat_flash", "num_hidden_layers": 6},
    # an odd count: 5 // 2 = 2 decoder layers
    "odd": {**CHAT, "num_hidden_layers": 5},
    # qk_nope_head_dim 32: no FlashInfer-MLA on Blackwell (CUTLASS_MLA's 128 tokens with bf16 and fp8)
    "nope32": {**CHAT, "qk_nope_head_dim": 32, "num_layers": 1},
    # LongCat-Flash-Lite: the n-gram embedding's fields (vLLM's V2 model runner)
    "ngram": {
        **CHAT,
        "architectures": ["LongcatFlashNgramForCausalLM"],
        "ngram_vocab_size_ratio": 2,
        "emb_neighbor_num": 2,
        "emb_split_num": 2,
    },
}
TPS = (1, 2, 8)
KVS = ("auto", "fp8")
DEVICES = ("hopper", "blackwell")


def _block(cfg: dict[str, Any], tp: int, kv: str, device: str) -> int:
    ms = M.from_config(cfg, tp=tp, kv_cache_dtype=None if kv == "auto" else kv, device=device)
    assert isinstance(ms, M.ModelSpec)
    return ms.block_size


def _cases() -> dict[str, dict[str, Any]]:
    """One case per config, tp, cache dtype and distinct block size; ``devices``: whose block it is."""
    out: dict[str, dict[str, Any]] = {}
    for name, cfg in CONFIGS.items():
        for tp in TPS:
            for kv in KVS:
                for device in DEVICES:
                    block = _block(cfg, tp, kv, device)
                    case = out.setdefault(
                        f"{name}-tp{tp}-{kv}-b{block}",
                        {"config": cfg, "tp": tp, "kv_cache_dtype": kv, "block_size": block, "devices": []},
                    )
                    case["devices"].append(device)
    return out


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return vllm_answers({k: {x: v for x, v in c.items() if x != "devices"} for k, c in _cases().items()})


def _mismatches(answers: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(case, device) where kvlayout's plan differs from vLLM's construction (on the devices whose block
    each case is)."""
    from tests.test_models_hybrid_vllm import differences

    return differences(answers, _cases())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert {d for c in _cases().values() for d in c["devices"]} == set(DEVICES)
    assert _mismatches(answers) == []


def test_a_wrong_rule_fails_the_comparison(answers: dict[str, dict[str, Any]], monkeypatch: Any) -> None:
    """The comparison can fail: num_layers read over a written num_hidden_layers (the class's setter
    ignored), or a head without its RoPE part, each differ from vLLM's construction."""
    monkeypatch.setattr(L, "decoder_layers", lambda c: c.cfg.req_int("num_layers", ""))
    bad = {case for case, _ in _mismatches(answers)}
    assert bad and all(case.startswith("typed-") for case in bad), bad
    monkeypatch.undo()

    real = L.MLASpec

    def no_rope(**kw: Any) -> Any:
        return real(**{**kw, "head_size": kw["head_size"] - 16})

    monkeypatch.setattr(L, "MLASpec", no_rope)
    assert len(_mismatches(answers)) == sum(len(c["devices"]) for c in _cases().values())


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    names = [f"model.layers.{i}.self_attn.{j}.attn" for i in range(2) for j in (0, 1)]
    c = answers["chat-tp8-auto-b16"]  # Hopper, bf16: FLASH_ATTN_MLA's 16 tokens; one latent head a rank
    assert list(c["layers"]) == names and c["groups"] == [names]
    assert c["layers"][names[1]] == ["MLAAttentionSpec", 80 * 16 * 2, 80 * 16 * 2]
    assert c["bytes_per_block"] == 4 * 80 * 16 * 2
    assert answers["chat-tp1-fp8-b64"]["bytes_per_block"] == 4 * 80 * 64 * 1  # FlashMLA's 64, fp8
    assert answers["chat-tp2-auto-b32"]["bytes_per_block"] == 4 * 80 * 32 * 2  # Blackwell: FlashInfer-MLA
    assert len(answers["typed-tp1-auto-b16"]["layers"]) == 6  # 3 decoder layers
    assert len(answers["odd-tp1-auto-b16"]["layers"]) == 4  # 2 decoder layers
    assert answers["nope32-tp1-auto-b128"]["bytes_per_block"] == 2 * 80 * 128 * 2  # CUTLASS_MLA on Blackwell
    assert answers["ngram-tp2-fp8-b64"]["groups"] == [names]


def _refused(cfg: dict[str, Any], field: str, match: str, **kw: Any) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json", **kw)
    assert e.value.field == field, str(e.value)


def test_published_shape_and_class_defaults() -> None:
    """LongCat-Flash-Chat: 28 decoder layers, latent 512 + RoPE 64: 56 heads of 576 a block, on every rank;
    where config.json leaves the sizes out, LongcatFlashConfig's defaults (the same) through transformers."""
    chat = {**CHAT, "num_layers": 28, "hidden_size": 6144, "num_attention_heads": 64, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "q_lora_rank": 1536, "v_head_dim": 128}
    bare = {"architectures": CHAT["architectures"]}
    for cfg, reader in ((chat, "json"), (chat, "transformers"), (bare, "auto")):
        ms = M.from_config(cfg, reader=reader, tp=8)
        assert isinstance(ms, M.ModelSpec) and ms.family == "longcat_flash" and ms.block_size == 16
        assert len(ms.spec.layers) == 56 and ms.bytes_per_block == 56 * 576 * 16 * 2 == 1_032_192
    fp8 = M.from_config(chat, kv_cache_dtype="fp8")
    assert isinstance(fp8, M.ModelSpec) and fp8.bytes_per_block == 56 * 576 * 64
    assert fp8.attention_backend == "FLASHMLA"
    bw = M.from_config(chat, device="blackwell")
    assert isinstance(bw, M.ModelSpec) and bw.bytes_per_block == 56 * 576 * 32 * 2
    assert bw.attention_backend == "FLASHINFER_MLA"


def test_refusals_name_the_field() -> None:
    for key in ("num_layers", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim"):
        cfg = {k: v for k, v in CHAT.items() if k != key}
        _refused(cfg, f"config.{key}", "missing")  # the json reader: the class default through transformers
        _refused({**CHAT, key: None}, f"config.{key}", "LongcatFlashConfig refuses null")
        _refused({**CHAT, key: "8"}, f"config.{key}", "must be an integer")
    for bad in (None, "6", 6.0, True):
        _refused({**CHAT, "num_hidden_layers": bad}, "config.num_hidden_layers", "an integer")
    for bad in (1, 0, -2):
        _refused({**CHAT, "num_hidden_layers": bad}, "config.num_hidden_layers", "at least 2")
    _refused({**CHAT, "num_layers": 0}, "config.num_layers", "at least 1")
    _refused({**CHAT, "num_layers": 10_001}, "config.num_layers", "at most 10,000")
    _refused({**CHAT, "num_hidden_layers": 20_004}, "config.num_hidden_layers", "at most 20,000")
    _refused(CHAT, "config.num_attention_heads", "not divisible by tp = 3", tp=3)
    for mt in ("deepseek_v3", "longcat"):
        with pytest.raises(SpecError, match="LongcatFlashConfig") as e:
            cfg = {**CHAT, "model_type": mt, "auto_map": {"AutoConfig": "x.Y"}}
            M.from_config(cfg, reader="transformers")
        assert e.value.field == "config.model_type", str(e.value)
    _refused(CHAT, "kv_cache_dtype", "valid", kv_cache_dtype="fp8_ds_mla")
    _refused(CHAT, "kv_cache_dtype", "no vLLM MLA backend", kv_cache_dtype="fp8_e5m2")
    with pytest.raises(SpecError, match="two MLA attentions per decoder layer") as e:
        M.spec_from_config(CHAT, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"


def test_model_type_by_architecture() -> None:
    """vLLM reads a config.json that writes no model_type (or null) by its architecture; others unchanged."""
    notes: list[str] = []
    assert L.with_model_type({**CHAT, "model_type": None}, notes)["model_type"] == "longcat_flash" and notes
    llama = {"architectures": ["LlamaForCausalLM"]}
    assert L.with_model_type(llama, notes) is llama
    assert L.with_model_type({"architectures": "x"}, notes) == {"architectures": "x"}
    written = {**CHAT, "model_type": "longcat_flash"}
    assert M.from_config(written, reader="json").spec == M.from_config(CHAT, reader="json").spec
