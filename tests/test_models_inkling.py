"""Inkling (``InklingForCausalLM``, model_type ``inkling_model``, and ``InklingForConditionalGeneration``,
``inkling_mm_model``) by vLLM 0.33's own construction: each decoder layer a short-conv state
(``model.layers.{i}.conv_state``, a sliding-window cache of the kernel's tokens, its packed head rounded up
to a power of two, bfloat16) and an attention (``model.layers.{i}.attn``, sliding on the local layers).

Each small config is built by tests/test_models_hybrid_vllm.py's driver (the CPU import of vLLM's NVIDIA
Inkling modules needs no stand-in) at tp 1, 2 and 8 with a bf16 and an fp8 cache, and its layers, pages,
blocks, windows, groups and bytes per block must equal kvlayout's Hopper and Blackwell plans; at tp 4
over 2 KV heads, and with a float16 model, vLLM's construction and kvlayout's plan both refuse. The
driver resolves the layout from the layers' ``attn_backend`` (Inkling's layers have none: they name
theirs with ``get_attn_backend``, FLASH_ATTN and INKLING_SCONV_SWA); neither declares layouts, so the
engine's preference is the same (asserted from their sources).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.errors import SpecError
from kvlayout.models import inkling
from tests import shared_answers

TEXT: dict[str, Any] = {
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "local_layer_ids": [0, 1, 2],
    "sliding_window_size": 64,
    "swa_num_key_value_heads": 4,
    "sconv_kernel_size": 4,
    "dense_mlp_idx": 4,  # dense MLPs: vLLM's Inkling MoE block makes CUDA events
    "intermediate_size": 512,
}
BASE: dict[str, Any] = {
    "architectures": ["InklingForCausalLM"], "model_type": "inkling_model", "torch_dtype": "bfloat16", **TEXT,
}
CONFIGS: dict[str, dict[str, Any]] = {
    # local layers of 4 KV heads beside a global one of 2: the global attention's page doubles its block
    "mixed": BASE,
    # head size 48: no page divides another (conv 5 * 8 * 256 * 2 = 20,480 B, attention 24,576 B bf16 or
    # 12,288 B fp8), the smaller padded; the kernel by transformers' name conv_kernel_size; 8 KV heads (tp 8)
    "padded": {
        **{k: v for k, v in BASE.items() if k not in ("swa_num_key_value_heads", "sconv_kernel_size")},
        "num_hidden_layers": 2, "num_key_value_heads": 8, "head_dim": 48, "local_layer_ids": [1],
        "sliding_window_size": 32, "conv_kernel_size": 5, "dense_mlp_idx": 2,
    },
    # the multimodal wrapper: its text_config is InklingModelConfig, whose defaults fill the KV heads (4),
    # head_dim (256 // 8) and the swa_ fields
    "mm": {
        "architectures": ["InklingForConditionalGeneration"], "model_type": "inkling_mm_model",
        "torch_dtype": "bfloat16",
        "text_config": {
            k: v for k, v in TEXT.items()
            if k not in ("num_key_value_heads", "head_dim", "swa_num_key_value_heads")
        },
    },
}
# every layer local over a window of the kernel's 16 tokens, 16 the block: one group of per-layer pages
# (UniformTypeKVCacheSpecs), none unified
CONFIGS["uniform"] = {
    **BASE, "local_layer_ids": [0, 1, 2, 3], "sconv_kernel_size": 16, "sliding_window_size": 16,
}
_TPS = {"mixed": (1, 2), "padded": (1, 8), "mm": (1,), "uniform": (1,)}
REFUSED = {
    "mixed-tp4-auto": {"config": BASE, "tp": 4, "kv_cache_dtype": "auto"},  # tp above 2 KV heads
    "float16-tp1-auto": {"config": {**BASE, "torch_dtype": "float16"}, "tp": 1, "kv_cache_dtype": "auto"},
}


def _cases() -> dict[str, dict[str, Any]]:
    return {**shared_answers.grid(CONFIGS, (1,), ("auto", "fp8"), _TPS), **REFUSED}


def _built() -> dict[str, dict[str, Any]]:
    return {k: c for k, c in _cases().items() if k not in REFUSED}


shared_answers.register("hybrid", __name__, _cases())  # one driver run with the other files' cases


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    pytest.importorskip("vllm")
    from tests.test_models_hybrid_vllm import vllm_answers

    return shared_answers.answers("hybrid", __name__, _cases(), vllm_answers)


def _differences(answers: dict[str, dict[str, Any]]) -> set[str]:
    return shared_answers.differing({k: answers[k] for k in _built()}, _built())


def test_equals_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers) == set(_cases())
    assert _differences(answers) == set()


def test_refused_by_both(answers: dict[str, dict[str, Any]]) -> None:
    assert "tp_size <= num_kv_heads (2), got 4" in answers["mixed-tp4-auto"]["error"]
    with pytest.raises(SpecError, match="asserts tp <= num_kv_heads") as e:
        M.from_config(BASE, tp=4)
    assert e.value.field == "config.num_key_value_heads"
    assert "bfloat16 only, got torch.float16" in answers["float16-tp1-auto"]["error"]
    with pytest.raises(SpecError, match="asserts the model's dtype is bfloat16") as e:
        M.from_config(REFUSED["float16-tp1-auto"]["config"])
    assert e.value.field == "dtype"


def test_a_wrong_rule_fails_the_comparison(
    answers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conv state's packed head not rounded up to a power of two differs wherever it is not one."""
    monkeypatch.setattr(inkling, "conv_head_size", lambda head, hidden, kv: 2 * head + 2 * (hidden // kv))
    assert _differences(answers) == {"mixed", "padded", "mm", "uniform"}


def test_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    conv, attn = "model.layers.{}.conv_state".format, "model.layers.{}.attn".format
    m = answers["mixed-tp1-auto"]
    # conv: local 4 heads of 2 * 32 + 2 * 64 = 192 -> 256, global 2 of 2 * 32 + 2 * 128 = 320 -> 512; 4 tokens
    assert m["layers"][conv(0)] == ["SlidingWindowSpec", 4 * 4 * 256 * 2, 8192]
    assert m["layers"][conv(3)][1] == 4 * 2 * 512 * 2 == 8192
    # attention: local 16 * 4 * 64 * 2 = 8,192 B; the global 4,096 B page takes 32-token blocks
    assert m["blocks"][attn(3)] == 32 and m["blocks"][attn(0)] == 16 and m["blocks"][conv(0)] == 4
    assert m["windows"][conv(0)] == 4 and m["windows"][attn(0)] == 64 and attn(3) not in m["windows"]
    # buckets of 3, 3, 1 and 1 layers: groups of one, each bucket's in turn
    order = (conv(0), conv(1), conv(2), attn(0), attn(1), attn(2), conv(3), attn(3))
    assert m["groups"] == [[x] for x in order]
    assert m["bytes_per_block"] == 8192
    p = answers["padded-tp1-fp8"]
    assert p["layers"][conv(0)] == ["SlidingWindowSpec", 5 * 8 * 256 * 2, 20480]
    assert p["layers"][attn(0)] == ["FullAttentionSpec", 16 * 8 * 96, 20480]  # fp8, padded
    assert answers["padded-tp8-auto"]["layers"][conv(1)] == ["SlidingWindowSpec", 2560, 3072]
    mm = answers["mm-tp1-auto"]  # InklingModelConfig's 4 KV heads of 256 // 8 = 32
    assert mm["layers"][attn(0)][1] == 16 * 4 * 64 * 2 and len(mm["groups"]) == 8
    u = answers["uniform-tp1-auto"]  # conv 16 * 4 * 256 * 2, attention 16 * 4 * 64 * 2: one block of both
    assert len(u["groups"]) == 1 and u["bytes_per_block"] == 4 * (32768 + 8192)


def test_the_driver_layouts_are_the_engines() -> None:
    """Inkling's layers name FLASH_ATTN and INKLING_SCONV_SWA (get_attn_backend), which declare no KV cache
    layouts: the engine's default preference, as the driver resolves it from no backend."""
    pytest.importorskip("vllm")
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent

    def source(path: str) -> str:
        return (root / path).read_text()

    fa = source("v1/attention/backends/flash_attn.py")
    attn = source("models/inkling/nvidia/attention.py")
    conv = source("models/inkling/nvidia/sconv_swa_attn.py")
    assert "def supported_kv_cache_layouts" not in fa + conv
    assert "return FlashAttentionBackend" in attn and "return InklingSconvBackend" in conv
    assert "attn_backend =" not in attn + conv  # the driver's layout reads no backend of theirs


def _refused(cfg: dict[str, Any], field: str, match: str, **kw: Any) -> None:
    with pytest.raises(SpecError, match=match) as e:
        M.from_config(cfg, reader="json", **kw)
    assert e.value.field == field, str(e.value)


def test_reads_and_refusals() -> None:
    ms = M.from_config(CONFIGS["mm"], reader="transformers")
    assert isinstance(ms, M.ModelSpec) and ms.family == "inkling"
    bare = M.from_config({**CONFIGS["mm"], "text_config": None})  # InklingModelConfig's 16 layers
    assert isinstance(bare, M.ModelSpec) and len(bare.spec.layers) == 32
    assert any("left out: InklingMMConfig builds" in n for n in bare.notes)
    same = M.from_config(BASE, device="blackwell")
    assert isinstance(same, M.ModelSpec) and same.spec == M.from_config(BASE).spec
    # the local layers' heads left out are the global ones': the field written is named
    _refused({**BASE, "num_attention_heads": 6}, "config.num_attention_heads", "not divisible by tp", tp=4)
    _refused({**BASE, "swa_num_key_value_heads": 3}, "config.swa_num_key_value_heads", "divisible", tp=2)
    _refused(BASE, "attention_backend", "name their own backends", attention_backend="FLASHINFER")
    _refused(BASE, "block_size", "multiples of 16", block_size=8)
    _refused({**BASE, "swa_head_dim": 256}, "config.swa_head_dim", "not modeled", device="blackwell")
    _refused({**BASE, "head_dim": 512}, "config.head_dim", "not modeled", kv_cache_dtype="fp8")
    _refused({**BASE, "local_layer_ids": ["0"]}, "config.local_layer_ids[0]", "integer")
    _refused({**BASE, "model_type": "inkling_text"}, "config.model_type", "inkling_model")
    _refused({**CONFIGS["mm"], "hidden_size": 256}, "config.hidden_size", "read-only property")
    _refused({**BASE, "hidden_size": None}, "config.hidden_size", "missing")
    with pytest.raises(SpecError, match="short-conv states") as e:
        M.spec_from_config(BASE, engine="tpu-inference", reader="json")
    assert e.value.field == "engine"
