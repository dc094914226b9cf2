"""Hybrids by vLLM 0.33's own model construction (issue 23): GraniteMoeHybrid (IBM Granite 4.0-H),
LFM2 and LFM2-MoE (Liquid; short-conv state), OLMo hybrid (gated delta net), Zamba2 (shared attention
blocks beside a Mamba2 mixer in every layer), MiMo-V2 (Xiaomi: full and sliding-window layers of
different heads and V head sizes, pages unified by vLLM) and Gemma 4 (Google: sliding and full layers of
different head sizes, pages unified; layers reading earlier layers' caches) and Gemma 3n (one head size,
the last layers reading caches at fixed offsets).

For each small config (the shape of the published ones), at tp 1, 2 and 8, with a bf16 and an fp8
cache, one subprocess (this file with ``--driver``) does what vLLM does on a GPU, on the CPU:
ModelConfig from the config.json, VllmConfig with that cache dtype, the model class from vLLM's
registry constructed under ``set_current_vllm_config`` as rank 0 of tp N (the tp group's
``world_size`` set, asserted through ``get_tensor_model_parallel_world_size``; construction runs no
collective), ``Platform._align_hybrid_block_size`` (the hybrid block size and the padded Mamba
page), every layer's own ``get_kv_cache_spec`` (names as vLLM's KV cache config keys them, the state
shapes and dtypes the layers compute per rank), the layout ``resolve_kv_cache_layout`` picks for the
layers' backends, then ``get_kv_cache_groups`` and ``_pool_bytes_per_block`` (the hybrid KV cache
manager on); each layer is read back as its group holds it (unified pages). Two stubs: the CPU platform's
float32 ssm states for its own kernels turned off (its AVX-512 BF16 check answers no), and
``Platform._find_non_ssm_backends`` answers CUDA's standard attention backend (Triton, smallest
kernel block 16, as FlashAttention's), not the CPU backend the layers were built with; for Gemma 4 and
Gemma 3n the layers' backend is set to the one vLLM picks on a GPU (:func:`_as_gpu_gemma4`), and layers that
read another layer's cache are left out, as vLLM's model runner leaves them. kvlayout's
plan of the same config must give the same layer names and kinds, state bytes, block sizes (the
main one and each attention layer's), windows, groups (members and order), pages (real and padded)
and bytes per block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvlayout.models as M
from kvlayout.spec import FullAttentionSpec, MambaSpec, MLASpec, SlidingWindowSpec
from tests.test_models_gemma3n import GEMMA3N
from tests.test_models_gemma4 import GEMMA4, GEMMA4_SHARED
from tests.test_models_mimo_v2 import MIMO_V2_FLASH

ROOT = Path(__file__).resolve().parents[1]
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
_BASE: dict[str, Any] = {"torch_dtype": "bfloat16", "vocab_size": 1024, "max_position_embeddings": 4096}

#: name -> config, small, in the shape of the published ones
CONFIGS: dict[str, dict[str, Any]] = {
    # ibm-granite/granite-4.0-h-*: Mamba2 layers and a few attention layers, layer_types as published
    "granitemoehybrid": {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"],
        "mamba_n_heads": 16,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 256,
        "shared_intermediate_size": 256,
        "position_embedding_type": "nope",
    },
    # LiquidAI/LFM2-*: short-conv layers (conv_dim channels, conv_L_cache - 1 steps) and attention
    "lfm2": {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "hidden_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "conv_dim": 512,
        "conv_L_cache": 3,
        "conv_bias": False,
        "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
        "full_attn_idxs": [2, 5],
        "intermediate_size": 1024,
        "block_dim": 512,
        "block_ff_dim": 1024,
    },
    "lfm2_moe": {
        "architectures": ["Lfm2MoeForCausalLM"],
        "model_type": "lfm2_moe",
        "hidden_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "conv_L_cache": 3,
        "conv_bias": False,
        "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention"],
        "num_dense_layers": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "intermediate_size": 1024,
    },
    # allenai OLMo hybrid: gated delta net layers and full attention, layer_types as published
    "olmo_hybrid": {
        "architectures": ["OlmoHybridForCausalLM"],
        "model_type": "olmo_hybrid",
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "linear_num_key_heads": 8,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "intermediate_size": 1024,
    },
    # Zyphra/Zamba2-*: hybrid layers share num_mem_blocks attention blocks (each a KV cache of its own)
    "zamba2": {
        "architectures": ["Zamba2ForCausalLM"],
        "model_type": "zamba2",
        "hidden_size": 256,
        "num_hidden_layers": 6,
        "layers_block_type": ["mamba", "mamba", "hybrid", "mamba", "mamba", "hybrid"],
        "hybrid_layer_ids": [2, 5],
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_ngroups": 1,
        "n_mamba_heads": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "attention_hidden_size": 512,
        "attention_head_dim": 64,
        "num_mem_blocks": 1,
        "use_shared_attention_adapter": False,
        "intermediate_size": 1024,
    },
}
# Zamba2 with two shared attention blocks over three hybrid layers: block 0 takes hybrid layers 0 and 2
# (model.attn.0, .1), block 1 layer 1, numbered from ceil(3 / 2) = 2 (model.attn.2)
CONFIGS["zamba2_mem2"] = {
    **CONFIGS["zamba2"],
    "num_hidden_layers": 7,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid", "mamba"],
    "hybrid_layer_ids": [1, 3, 5],
    "num_mem_blocks": 2,
}
# XiaomiMiMo/MiMo-V2-Flash's shape, smaller (tests/test_models_mimo_v2.py)
CONFIGS["mimo_v2_flash"] = MIMO_V2_FLASH
# pages that do not divide (sliding V heads of 64): the smaller page is padded to the larger, which is
# the sliding one at tp 1 and 2 (4 KV heads of 256 against 2 of 320) and the full one at tp 8 (one each);
# the first layer slides (the sliding groups come first). V heads of K's size run on the standard backend,
# which the CPU construction would replace by its own: the generic harness covers that path.
CONFIGS["mimo_v2_padded"] = {
    **CONFIGS["mimo_v2_flash"],
    "swa_v_head_dim": 64,
    "hybrid_layer_pattern": [1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0],
}
# Gemma 4 (tests/test_models_gemma4.py): sliding and full layers of different head sizes (the full
# page doubles its block); the small models' layers that read earlier caches (no cache of their own);
# pages that do not divide (sliding 2 KV heads of 96: the full page padded); the bidirectional window
CONFIGS["gemma4"] = GEMMA4
CONFIGS["gemma4_shared"] = GEMMA4_SHARED
CONFIGS["gemma4_padded"] = {**GEMMA4, "num_key_value_heads": 2, "head_dim": 96}
CONFIGS["gemma4_bidi"] = {**GEMMA4, "use_bidirectional_attention": "all"}
CONFIGS["gemma4_plc_null"] = {**GEMMA4, "per_layer_config": None}  # no entry: every layer at head_dim
# Gemma 3n (tests/test_models_gemma3n.py): one head size, the last layers reading caches at fixed offsets;
# with one layer before the shared ones, the sliding shared layers (target index -1) keep their own
CONFIGS["gemma3n"] = GEMMA3N
CONFIGS["gemma3n_first1"] = {**GEMMA3N, "num_kv_shared_layers": 9}
#: no attention layer at all (issue 25's hostile pass: planned, never compared): vLLM still pads the
#: Mamba page to the attention page its config would have (Platform._align_hybrid_block_size)
CONFIGS["granite_all_mamba"] = {**CONFIGS["granitemoehybrid"], "layer_types": ["mamba"] * 8}
# Mamba-only models (vLLM registers them attention-free; their layers hold Mamba states): Mamba1 with its
# inner size from expand (state-spaces/mamba-*-hf), FalconMamba with intermediate_size written (tiiuae/
# falcon-mamba-7b writes 8192 beside expand 16: the written size stands), Mamba2 with one B/C group
# (replicated to every rank) and with 8 (mistralai/Mamba-Codestral-7B-v0.1's shape)
CONFIGS["mamba"] = {
    "architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 256, "num_hidden_layers": 4,
    "state_size": 16, "conv_kernel": 4, "expand": 2,
}
CONFIGS["falcon_mamba"] = {
    "architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba", "hidden_size": 256,
    "num_hidden_layers": 4, "state_size": 16, "conv_kernel": 4, "expand": 16, "intermediate_size": 512,
}
CONFIGS["mamba2"] = {
    "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 256,
    "num_hidden_layers": 4, "expand": 2, "num_heads": 8, "head_dim": 64, "n_groups": 1, "state_size": 64,
    "conv_kernel": 4,
}
CONFIGS["mamba2_g8"] = {**CONFIGS["mamba2"], "n_groups": 8}
# a written intermediate_size the mixer takes (getattr) beside expand * hidden_size = 512 (issue 25, pass 20)
CONFIGS["mamba2_inner640"] = {**CONFIGS["mamba2"], "intermediate_size": 640}
# no attention layer: the per-rank head rule does not run in vLLM (no Attention is built), its block alignment
# still reads the 3 KV heads (issue 25, twentieth pass)
CONFIGS["granite_all_mamba_kv3"] = {**CONFIGS["granite_all_mamba"], "num_key_value_heads": 3}
TPS = (1, 2, 8)
KV = ("auto", "fp8")
#: name -> its tensor-parallel sizes where not TPS
_TPS = {"zamba2_mem2": (1,), "granite_all_mamba": (1,), "granite_all_mamba_kv3": (1, 2),
        "gemma4_padded": (1,), "gemma4_bidi": (1,), "gemma4_plc_null": (1,), "gemma3n_first1": (1,)}


def _cases() -> dict[str, dict[str, Any]]:
    return {
        f"{name}-tp{tp}-{kv}": {"config": {**_BASE, **cfg}, "tp": tp, "kv_cache_dtype": kv}
        for name, cfg in CONFIGS.items()
        for tp in _TPS.get(name, TPS)
        for kv in KV
    }


def _kvlayout(case: dict[str, Any]) -> dict[str, Any]:
    """kvlayout's plan of a case in the driver's answer's shape (``user_block_size``: the block size the user
    sets, as vLLM's CacheConfig.block_size)."""
    kv = None if case["kv_cache_dtype"] == "auto" else case["kv_cache_dtype"]
    ms = M.from_config(
        case["config"], tp=case["tp"], kv_cache_dtype=kv, device=case.get("device", "hopper"),
        attention_backend=case.get("attention_backend"), block_size=case.get("user_block_size"),
        mamba_ssm_cache_dtype=case.get("mamba_ssm_cache_dtype"),
    )
    assert isinstance(ms, M.ModelSpec)
    layers, blocks, windows = {}, {}, {}
    for _, x in ms.spec.layers:
        kind = "MambaSpec" if isinstance(x, MambaSpec) else type(x).__name__
        kind = {"MLASpec": "MLAAttentionSpec"}.get(kind, kind)  # vLLM's name of the kind
        if ms.kinds.get(x.name) == "chunked":  # Llama 4's chunked local layers: full attention's page in
            kind = "ChunkedLocalAttentionSpec"  # kvlayout's spec, vLLM's kind (tests/test_models_generic.py)
        layers[x.name] = [kind, x.real_page, x.page]
        if isinstance(x, (FullAttentionSpec, MLASpec)):
            blocks[x.name] = x.block_size
        if isinstance(x, SlidingWindowSpec):
            windows[x.name] = x.window
    return {
        "block_size": ms.block_size,
        "layers": layers,
        "blocks": blocks,
        "windows": windows,
        "groups": [[x.name for x in g.layers] for g in ms.spec.groups],
        "bytes_per_block": ms.bytes_per_block,
    }


def vllm_answers(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """vLLM 0.33's own construction of ``cases`` (this file's ``--driver``, in a process of its own on the
    CPU): one answer per case id. Shared by the hybrid, vision-language and Transformers-backend tests."""
    env = {**os.environ, **_ENV, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, __file__, "--driver"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out: dict[str, dict[str, Any]] = json.loads(res.stdout.splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def answers() -> dict[str, dict[str, Any]]:
    return vllm_answers(_cases())


def each_agrees(
    answers: dict[str, dict[str, Any]], cases: dict[str, dict[str, Any]]
) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every case has vLLM's answer, without error, equal to kvlayout's on the fields kvlayout gives;
    yields (case id, case, vLLM's answer) for a test's further checks."""
    assert set(answers) == set(cases)
    for case_id, case in cases.items():
        got = answers[case_id]
        assert "error" not in got, (case_id, got.get("error"))
        mine = _kvlayout(case)
        assert mine == {k: got[k] for k in mine}, case_id
        yield case_id, case, got


def differences(
    answers: dict[str, dict[str, Any]], cases: dict[str, dict[str, Any]],
    devices: tuple[str, ...] = ("hopper", "blackwell"),
) -> list[tuple[str, str]]:
    """(case id, device) for each device where kvlayout's plan differs from vLLM's answer; every case must
    have an answer without error. ``devices``: unless the case names its own (``case["devices"]``). Shared
    by the single-architecture tests, whose wrong-rule tests read which cases a wrong rule changes."""
    out = []
    for case_id, case in cases.items():
        got = answers[case_id]
        assert "error" not in got, (case_id, got.get("error"))
        for device in case.get("devices", devices):
            mine = _kvlayout({**case, "device": device})
            if mine != {k: got[k] for k in mine}:
                out.append((case_id, device))
    return out


def test_hybrids_equal_vllms_construction(answers: dict[str, dict[str, Any]]) -> None:
    for _ in each_agrees(answers, _cases()):
        pass


def test_hybrid_answers_are_the_hand_computed_ones(answers: dict[str, dict[str, Any]]) -> None:
    """vLLM's numbers by hand, so that the comparison cannot pass on two equal wrong answers."""
    g = answers["granitemoehybrid-tp1-auto"]
    # Mamba2: conv (4 - 1, 2 * 512 + 2 * 1 * 128) bf16 + ssm (16, 64, 128) bf16 = 7,680 + 262,144 B;
    # attention 8 heads * 64 * 2 (K, V) * 2 B = 2,048 B a token: 144 tokens (a multiple of 16) hold it
    assert g["states"]["model.layers.0.mixer"] == [[[3, 1280], [16, 64, 128]], ["torch.bfloat16"] * 2]
    assert g["layers"]["model.layers.0.mixer"] == ["MambaSpec", 269_824, 144 * 2_048]
    assert g["block_size"] == 144 and g["bytes_per_block"] == 2 * 144 * 2_048
    # tp 8: one group replicated to 8, conv (3, (1024 + 2 * 8 * 128) / 8 = 384), ssm (2, 64, 128)
    tp8 = answers["granitemoehybrid-tp8-auto"]["states"]["model.layers.0.mixer"]
    assert tp8[0] == [[3, 384], [2, 64, 128]]
    # LFM2: short conv (3 - 1, 512) bf16 = 2,048 B, below a 16-token attention page (32,768 B)
    lfm = answers["lfm2-tp2-auto"]
    assert lfm["states"]["model.layers.0.short_conv"] == [[[2, 256]], ["torch.bfloat16"]]
    assert lfm["block_size"] == 16 and lfm["layers"]["model.layers.0.short_conv"][1:] == [1_024, 16_384]
    # Zamba2: its shared attention is model.attn.{j}, the mixers {hybrid layers + i}.mixer; fp8 halves
    # the attention page (8 heads * 64 * 2 * 1 B = 1,024 B a token) below the 19,648 B state: 32 tokens
    # no attention layer: the same 144-token blocks and 294,912 B padded pages as with attention
    a = answers["granite_all_mamba-tp1-auto"]
    assert a["block_size"] == 144
    assert a["layers"]["model.layers.3.mixer"] == ["MambaSpec", 269_824, 294_912]
    assert a["bytes_per_block"] == 8 * 294_912 and len(a["groups"]) == 1  # one group of 8 Mamba layers
    # MiMo-V2: full 2 KV heads of 192 + 128 bf16 = 1,280 B a token, sliding 4 heads 2,560 B: vLLM resolves
    # LBNHC (not block-outermost) and doubles the full layers' block to 32 tokens (40,960 B pages)
    m = answers["mimo_v2_flash-tp1-auto"]
    assert m["layout"] == "LBNHC" and m["block_size"] == 16
    blocks = m["blocks"]
    assert blocks["model.layers.0.self_attn.attn"] == 32 and blocks["model.layers.1.self_attn.attn"] == 16
    assert m["layers"]["model.layers.0.self_attn.attn"] == ["FullAttentionSpec", 40_960, 40_960]
    assert m["windows"]["model.layers.1.self_attn.attn"] == 128 and m["bytes_per_block"] == 3 * 40_960
    # padded: the full page (20,480 B real) padded to the sliding 4 * (192 + 64) * 2 * 16 = 32,768 B
    p = answers["mimo_v2_padded-tp1-auto"]
    assert p["layers"]["model.layers.2.self_attn.attn"] == ["FullAttentionSpec", 20_480, 32_768]
    # Gemma 4: sliding 4 KV heads of 64 = 1,024 B a token, full 1 head of 128 = 512 B: the full layers
    # take 32-token blocks (16,384 B pages); the shared model's layers 6-9 have no cache at all
    g4 = answers["gemma4-tp1-auto"]
    assert g4["layout"] == "LBNHC" and g4["blocks"]["model.layers.3.self_attn.attn"] == 32
    assert g4["layers"]["model.layers.3.self_attn.attn"] == ["FullAttentionSpec", 16_384, 16_384]
    assert len(answers["gemma4_shared-tp1-auto"]["layers"]) == 6
    # padded: the full 8,192 B page under the sliding 2 * 96 * 2 * 2 * 16 = 12,288 B; window 128 // 2 + 1
    g4p = answers["gemma4_padded-tp1-auto"]["layers"]["model.layers.3.self_attn.attn"]
    assert g4p == ["FullAttentionSpec", 8_192, 12_288]
    assert answers["gemma4_bidi-tp1-auto"]["windows"]["model.layers.0.self_attn.attn"] == 65
    # Gemma 3n: 2 KV heads of 64 bf16 = 512 B a token, 8,192 B pages; layers 6-9 read layers 4 (full)
    # and 3 (sliding): 6 layers, each its own group (5 sliding, 1 full); with one layer before the shared
    # ones the sliding shared layers keep their own caches and the full ones read layer 0 (sliding)
    g3 = answers["gemma3n-tp1-auto"]
    assert sorted(g3["layers"]) == [f"model.layers.{i}.self_attn.attn" for i in range(6)]
    assert g3["layers"]["model.layers.4.self_attn.attn"] == ["FullAttentionSpec", 8_192, 8_192]
    assert len(g3["groups"]) == 6 and g3["bytes_per_block"] == 8_192
    f1 = answers["gemma3n_first1-tp1-auto"]
    assert [int(n.split(".")[2]) for n in f1["groups"][0]] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert f1["bytes_per_block"] == 8 * 8_192
    z = answers["zamba2-tp1-fp8"]
    assert list(z["layers"]) == ["model.attn.0", "model.attn.1", *(f"{2 + i}.mixer" for i in range(6))]
    assert z["block_size"] == 32 and z["layers"]["2.mixer"][1:] == [19_648, 32_768]
    # Mamba1, inner 2 * 256 = 512: conv (3, 512) + ssm (512, 16), bf16; 16-token blocks, one group, no padding
    mb = answers["mamba-tp1-auto"]
    assert mb["block_size"] == 16 and mb["groups"] == [[f"backbone.layers.{i}.mixer" for i in range(4)]]
    assert mb["layers"]["backbone.layers.0.mixer"] == ["MambaSpec", 19_456, 19_456] == [
        "MambaSpec", 3 * 512 * 2 + 512 * 16 * 2, 19_456]
    # FalconMamba: the written intermediate_size 512, not expand * hidden_size = 4096
    fm = answers["falcon_mamba-tp2-fp8"]["layers"]["backbone.layers.3.mixer"]
    assert fm[1] == 3 * 256 * 2 + 256 * 16 * 2
    # Mamba2 at tp 8: one group replicated to 8: conv (3, (512 + 2 * 8 * 64) / 8), ssm (1, 64, 64)
    m2 = answers["mamba2-tp8-auto"]["layers"]["backbone.layers.0.mixer"]
    assert m2[1] == 3 * (512 + 2 * 8 * 64) // 8 * 2 + 64 * 64 * 2


# --------------------------------------------------------------------------- the vLLM side
def _on_gpu_backend(arch: str) -> bool:
    """Whether the driver moves ``arch``'s layers to the backend a Hopper GPU picks (:func:`_as_gpu_gemma4`):
    Gemma 4, Gemma 3n, the vision-language wrappers and the architectures of vLLM's Transformers modeling
    backend (sliding layers, whose block the CPU backend sets to 32)."""
    from kvlayout.models.families import VL_WRAPPERS
    from kvlayout.models.registry_vllm import TRANSFORMERS_BACKEND

    return arch.startswith(("Gemma4", "Gemma3n")) or arch in VL_WRAPPERS or arch in TRANSFORMERS_BACKEND


def _as_gpu_gemma4(vc: Any, layers: dict[str, Any]) -> None:
    """Stub: Gemma 4's layers (and :func:`_on_gpu_backend`'s others) on the backend vLLM chooses for them
    on a Hopper GPU. With head sizes
    that differ, vLLM's Gemma4Config picks FlashAttention 4 where it is available, else sets TRITON_ATTN
    (on the CPU: FA4 is not); with one head size it leaves the choice to the platform (FLASH_ATTN first
    on Hopper). The CPU platform builds its own backend instead (blocks in multiples of 32), which a GPU
    would not. The GPU backends take blocks in multiples of 16 and declare the same layouts."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    chosen = vc.attention_config.backend
    assert chosen in (AttentionBackendEnum.TRITON_ATTN, None), chosen
    gpu = TritonAttentionBackend if chosen is not None else FlashAttentionBackend
    sizes = [str(x) for x in TritonAttentionBackend.get_supported_kernel_block_sizes()]
    assert sizes == [str(x) for x in FlashAttentionBackend.get_supported_kernel_block_sizes()], sizes
    for mod in layers.values():
        if not hasattr(mod, "attn_backend"):  # a hybrid's Mamba mixers: a state, no attention backend
            continue
        assert mod.attn_backend.get_name() == "CPU_ATTN", mod.attn_backend.get_name()
        mod.attn_backend = gpu


def _as_gpu_block_size(vc: Any, layers: dict[str, Any], backend: str) -> None:
    """The block size vLLM's GPU platform sets once the model is built (the base class's
    ``Platform.update_block_size_for_backend``: the CPU platform's differs), its layers' attention backend
    the GPU one named (built with the CPU's; asserted: they are MLA layers, and ``backend`` is an MLA
    backend); with no attention layer (SSM backends only) nothing is aligned, as on the GPU."""
    from vllm.platforms.interface import Platform

    attn = [m.get_attn_backend() for m in layers.values() if not m.get_attn_backend().is_ssm()]
    assert all(b.get_name().endswith("MLA") for b in attn) and backend.endswith("MLA"), (attn, backend)
    found = [_gpu_backend(backend, attn[0])] if attn else []
    stub = Platform._find_non_ssm_backends
    Platform._find_non_ssm_backends = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls, vc: found
    )
    try:
        Platform.update_block_size_for_backend(vc)
    finally:
        Platform._find_non_ssm_backends = stub  # type: ignore[method-assign]


def _gpu_backend(name: str, built: Any) -> Any:
    """vLLM's GPU attention backend ``name``; where its class imports only with the GPU build of flash-attn,
    FlashInfer or CUTLASS, a stand-in: the backend the layers were built with, answering the GPU backend's
    name and kernel block sizes (kvlayout's table, which tests/test_models_backends.py checks against vLLM's
    classes and sources) and the base class's ``supports_block_size`` (asserted: its module does not
    override it), the only things the block alignment asks of it."""
    import importlib.util

    from vllm.v1.attention.backend import AttentionBackend, MultipleOf
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from kvlayout.models.backends import BACKENDS

    try:
        return AttentionBackendEnum[name].get_class()
    except (ImportError, AssertionError, OSError):  # CUTLASS_MLA's module asserts CUDA
        spec = importlib.util.find_spec(AttentionBackendEnum[name].value.rsplit(".", 1)[0])
        assert spec is not None and spec.origin is not None, name
        assert "def supports_block_size" not in Path(spec.origin).read_text(), name
        sizes = [MultipleOf(s) if multiple else s for s, multiple in BACKENDS[name].block_sizes]
        methods = {
            "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None: list(sizes)),
            "get_name": staticmethod(lambda: name),
            "supports_block_size": classmethod(AttentionBackend.supports_block_size.__func__),  # type: ignore
        }
        return type(f"{name}StandIn", (built,), methods)


def _torchvision_without_ops() -> None:
    """Make vLLM's vision-language modules importable: they import torchvision (and LLaVA's and Mistral
    3's mistral_common), pinned in .vl-deps (requirements-vl.txt) beside the venv. torchvision's wheel links
    CUDA's libtorch, so its C++ operators (detection ops: nms, roi_align, ...) do not load beside CPU
    torch, and its module registering their meta kernels fails: that one module is stubbed. Nothing of
    the model construction calls them (an operator that does not exist raises where it is called)."""
    import types

    deps = ROOT / ".vl-deps"
    assert (deps / "torchvision").is_dir(), "scripts/test.sh installs torchvision into .vl-deps"
    sys.path.insert(0, str(deps))
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    import torchvision

    assert torchvision.__version__.startswith("0.28.0"), torchvision.__version__
    assert not torchvision.extension._has_ops()  # the stub's assumption: its operators are absent
    # Qwen2-VL's vision blocks take QuickGELU, which looks up vLLM's compiled ``_C.gelu_quick`` when it is
    # built (vllm._C is not in the CPU install): the operator's schema only, with no kernel, so any call
    # of it raises (the vision tower holds no cache and construction runs nothing)
    import torch

    if not hasattr(torch.ops._C, "gelu_quick"):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define("gelu_quick(Tensor(a!) out, Tensor input) -> ()")
        _KEEP.append(lib)


_KEEP: list[Any] = []  # the stub library above lives as long as the driver


def _activation_schemas() -> None:
    """Stub: GPT-2's and GPT-J's MLPs take ``gelu_new`` (and others ``gelu_fast``), which look up vLLM's
    compiled ``_C`` operator when built (vllm._C is not in the CPU install): the operators' schemas only,
    with no kernel, so any call of one raises (construction runs nothing; the MLP holds no cache)."""
    import torch

    for op in ("gelu_new", "gelu_fast"):
        if not hasattr(torch.ops._C, op):
            lib = torch.library.Library("_C", "FRAGMENT")
            lib.define(f"{op}(Tensor(a!) out, Tensor input) -> ()")
            _KEEP.append(lib)


def _stand_ins(model_types: set[str]) -> None:
    """Stub: a remote-code config class (hub code, not fetched offline, never run here) stands in as a plain
    ``PretrainedConfig`` holding the fields as written, registered with transformers' AutoConfig, as
    tests/test_models_generic.py's driver does; the fields vLLM's model reads beyond the cache's, where the
    file leaves them to the class, are the stand-in's class attributes (:data:`STAND_IN_DEFAULTS`), never
    written into the config. Asserted: transformers and vLLM have no class of their own for the type."""
    import importlib

    from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    for mt in sorted(model_types):
        assert mt not in CONFIG_MAPPING and mt not in _CONFIG_REGISTRY, mt
        if mt in STAND_IN_CLASSES:  # a class whose objects vLLM reads (tests/test_models_nemotron_nas.py)
            module, name = STAND_IN_CLASSES[mt].split(":")
            AutoConfig.register(mt, getattr(importlib.import_module(module), name))
            continue
        stand_in = type(f"StandIn_{mt}", (PretrainedConfig,), {"model_type": mt, **STAND_IN_DEFAULTS})
        AutoConfig.register(mt, stand_in)


#: model_type -> "module:class" of a stand-in that builds what vLLM's model reads beyond plain fields (the
#: remote-code DeciLMConfig's block objects), where a plain one holding the fields as written cannot
STAND_IN_CLASSES: dict[str, str] = {"nemotron-nas": "tests.test_models_nemotron_nas:DeciLMStandIn"}


#: the MLA hybrids with KDA states the driver builds with tests/driver.py's cpu_kimi_linear stubs
#: (tests/test_models_kimi_linear.py)
MLA_KDA_HYBRIDS = ("KimiLinearForCausalLM", "BailingMoeV3ForCausalLM")


#: a stand-in's class defaults (what a remote-code class fills that vLLM's model reads, not the cache's)
STAND_IN_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
#: other multimodal architectures whose vLLM modules import torchvision (tests/test_models_backend_vllm.py)
_TORCHVISION = (  # the wrappers whose vLLM module imports torchvision (its processor's), beside VL_WRAPPERS
    "KimiK25ForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Llama4ForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
)


def _driver() -> None:
    """Build each case's model in vLLM and print its KV cache: layers, groups, bytes per block."""
    import contextlib
    import io
    import tempfile
    from types import SimpleNamespace as NS

    from tests.test_models import _stub_compressed_tensors

    _stub_compressed_tensors()  # OLMo hybrid's import reaches quantization code naming it (not installed)
    cases = json.load(sys.stdin)
    from kvlayout.models.families import VL_WRAPPERS

    if any(c["config"]["architectures"][0] in (*VL_WRAPPERS, *_TORCHVISION) for c in cases.values()):
        _torchvision_without_ops()
    _activation_schemas()
    _stand_ins({c["config"]["model_type"] for c in cases.values() if c.get("stand_in")})
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints stay off the answer
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.distributed import (
        get_tensor_model_parallel_world_size,
        get_tp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.platforms.interface import Platform
    from vllm.v1 import kv_cache_interface as I
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.flash_attn_diffkv import FlashAttentionDiffKVBackend
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core import kv_cache_planning as P
    from vllm.v1.worker.utils import customize_attention_spec

    from tests.driver import (
        cpu_attention_takes_fp8,
        cpu_fp8_block_linear,
        cpu_kimi_linear,
        cpu_mla_takes_fp8,
        cpu_mxfp4_experts,
        cpu_registry_in_process,
        cpu_sparse_mla,
        cpu_ungated_experts,
    )

    cpu_registry_in_process()  # the registry's class inspections without a Python started for each
    cpu_attention_takes_fp8()  # a host without AVX-512 refuses fp8 in the CPU backend
    cpu_mla_takes_fp8()  # the CPU platform refuses fp8 for MLA (Kimi-K2.5's layers), a GPU takes it
    cpu_sparse_mla()  # and sparse MLA (DeepSeek-V3.2's layers: tests/test_models_indexcache_vllm.py)
    cpu_mxfp4_experts()  # and has no MXFP4 MoE kernel (gpt-oss's experts; they hold no cache)
    cpu_fp8_block_linear()  # nor, without AMX, an FP8 block-scaled matmul (DeepSeek-V3's linear layers)
    cpu_ungated_experts()  # and refuses ungated experts (Nemotron-3 Nano's relu2; they hold no cache)
    if any(c["config"]["architectures"][0] in MLA_KDA_HYBRIDS for c in cases.values()):
        cpu_kimi_linear()  # its CUDA stream, o_proj kernel flag and the CPU's MLA prefix-caching rule
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:0", local_rank=0, backend="gloo"
        )
        initialize_model_parallel(1, 1)
    # stub: the CPU platform sets float32 ssm states for its own accelerated kernels where the CPU has
    # AVX-512 BF16 (CpuPlatform.check_and_update_config); a CUDA platform does not
    torch.cpu._is_avx512_bf16_supported = lambda: False
    # stub: CUDA's standard attention backend for the alignment (its smallest kernel block is 16)
    assert min(TritonAttentionBackend.get_supported_kernel_block_sizes(), key=lambda s: getattr(s, "base", s))
    Platform._find_non_ssm_backends = classmethod(lambda cls, vc: [TritonAttentionBackend])  # type: ignore
    # the model classes imported here, where the stub above exists (vLLM would inspect a lazily
    # registered class in a subprocess without it): the same classes, registered directly
    # (an architecture vLLM does not register is left to its resolution, which refuses it per case)
    for arch in sorted({c["config"]["architectures"][0] for c in cases.values()} & set(ModelRegistry.models)):
        ModelRegistry.register_model(arch, ModelRegistry.models[arch].load_model_cls())
    planning = NS(
        cache_config=NS(
            num_gpu_blocks_override=4,
            prefix_cache_retention_interval=None,
            kv_cache_layout=None,
            get_resolved_kv_cache_layout=None,  # set per case: the layout vLLM resolves for its layers
        ),
        attention_config=NS(hisparse_config=None),
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        model_config=NS(supports_kv_cache_grouping=False),
    )
    out: dict[str, Any] = {}
    for case_id, case in cases.items():
        tp = case["tp"]
        d = tempfile.mkdtemp()
        Path(d, "config.json").write_text(json.dumps(case["config"]))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
                types = getattr(mc.hf_text_config, "layer_types", None)
                window = (  # EngineArgs.create_engine_config's rule for the cache's one window
                    mc.get_sliding_window()
                    if types is None or all(t == "sliding_attention" for t in types)
                    else None
                )
                # what a GPU platform starts from: 16 tokens, or the case's (an MLA backend's block)
                block = case.get("block_size", 16)
                dtype = case["kv_cache_dtype"]
                ssm = case.get("mamba_ssm_cache_dtype", "auto")
                cache = CacheConfig(
                    block_size=block, cache_dtype=dtype, sliding_window=window, mamba_ssm_cache_dtype=ssm
                )
                par = ParallelConfig(tensor_parallel_size=tp, distributed_executor_backend="mp")
                vc = VllmConfig(model_config=mc, cache_config=cache, parallel_config=par)
                cache.block_size, cache.mamba_page_size_padded = block, None
                # align_backend: a GPU backend's name; the block is then set as vLLM sets it on that GPU,
                # after the model is built (update_block_size_for_backend: _as_gpu_block_size)
                if mc.is_hybrid and not case.get("align_backend"):
                    Platform._align_hybrid_block_size(vc, TritonAttentionBackend)
                # (VllmConfig refuses a mamba block size without prefix caching where it validates again:
                # Kimi-K2.5's language model, built by with_hf_config)
                if cache.mamba_block_size is None and (mc.is_hybrid or cache.enable_prefix_caching):
                    cache.mamba_block_size = cache.block_size
                group = get_tp_group()
                group.world_size = tp  # stub: one rank of tp N (construction only reads the size)
                try:
                    assert get_tensor_model_parallel_world_size() == tp and group.rank_in_group == 0
                    with set_current_vllm_config(vc), torch.device(case.get("torch_device", "cpu")):
                        cls, _ = ModelRegistry.resolve_model_cls(case["config"]["architectures"], mc)
                        cls(vllm_config=vc, prefix="")
                        # what the model runner asks (its get_kv_cache_spec): every registered layer
                        layers_of = get_layers_from_vllm_config(vc, AttentionLayerBase)  # type: ignore
                        if case.get("align_backend"):
                            _as_gpu_block_size(vc, layers_of, case["align_backend"])
                        if _on_gpu_backend(case["config"]["architectures"][0]) or case.get("gpu_backend"):
                            _as_gpu_gemma4(vc, layers_of)
                        # a layer reading another's cache gets none (the runner: kv_sharing_target_layer_name)
                        layers_of = {
                            name: mod
                            for name, mod in layers_of.items()
                            if not getattr(mod, "kv_sharing_target_layer_name", None)
                        }
                        specs = {name: mod.get_kv_cache_spec(vc) for name, mod in layers_of.items()}
                        if case.get("attention_backend"):  # layers built on the GPU backend the case
                            # names (DeepSeek-V3.2's, stood in: cpu_sparse_mla): what the model runner
                            # then asks that backend (customize_attention_spec: its block stride alignment)
                            for name, mod in layers_of.items():
                                spec = specs[name]
                                if isinstance(spec, I.AttentionSpec):
                                    specs[name] = customize_attention_spec(mod.get_attn_backend(), spec)
                finally:
                    group.world_size = 1
            # the layout vLLM's engine core resolves from the layers' backends (resolve_kv_cache_layout)
            backends = {mod.attn_backend for mod in layers_of.values() if hasattr(mod, "attn_backend")}
            for b in backends:  # built on the CPU: Triton's V-of-another-size backend, where a Hopper GPU
                # runs FlashAttention's; both declare the same layouts (none: vLLM's default preference)
                if b.get_name().endswith("_DIFFKV"):
                    fa = FlashAttentionDiffKVBackend.supported_kv_cache_layouts()
                    assert b.supported_kv_cache_layouts() == fa, (b.get_name(), fa)
            if _on_gpu_backend(case["config"]["architectures"][0]) or case.get("gpu_backend"):
                # built on the CPU with its own backend; on a Hopper GPU vLLM runs the layers on
                # FlashAttention (4) or TRITON_ATTN, which declare the same layouts (_as_gpu_gemma4)
                fa = FlashAttentionBackend.supported_kv_cache_layouts()
                assert TritonAttentionBackend.supported_kv_cache_layouts() == fa, fa
                assert backends <= {TritonAttentionBackend, FlashAttentionBackend}, backends
            names = [x.name for x in get_supported_kv_cache_layouts(backends)]
            cache.kv_cache_layout = None
            layout = resolve_kv_cache_layout(vc, [names], specs.values())
            planning.cache_config.get_resolved_kv_cache_layout = lambda layout=layout: layout
            groups = P.get_kv_cache_groups(planning, dict(specs))
            # each layer as its group holds it (pages unified: a block made larger, or a page padded)
            held = {}
            for g in groups:
                gs = g.kv_cache_spec
                for name in g.layer_names:
                    held[name] = gs.kv_cache_specs[name] if hasattr(gs, "kv_cache_specs") else gs
            layers, blocks, windows = {}, {}, {}
            for name in specs:
                s = held[name]
                real = s.real_page_size_bytes if hasattr(s, "real_page_size_bytes") else s.page_size_bytes
                if isinstance(s, I.MambaSpec):
                    real = I.MambaSpec(shapes=s.shapes, dtypes=s.dtypes, block_size=-1).page_size_bytes
                else:
                    blocks[name] = s.block_size
                if isinstance(s, I.SlidingWindowSpec):
                    windows[name] = s.sliding_window
                layers[name] = [type(s).__name__, real, s.page_size_bytes]
            out[case_id] = {
                "block_size": cache.block_size,
                "layout": layout.name,
                "layers": layers,
                "blocks": blocks,
                "windows": windows,
                "states": {
                    n: [[list(x) for x in s.shapes], [str(t) for t in s.dtypes]]
                    for n, s in specs.items()
                    if isinstance(s, I.MambaSpec)
                },
                "groups": [list(g.layer_names) for g in groups],
                "bytes_per_block": P._pool_bytes_per_block(planning, groups),
            }
        except Exception as e:  # noqa: BLE001  # reported by the test
            import traceback

            traceback.print_exc()
            out[case_id] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
    real_stdout.write(json.dumps(out) + "\n")
    real_stdout.flush()
    os._exit(0)  # skip vLLM's teardown of the gloo group


if __name__ == "__main__" and "--driver" in sys.argv:
    _driver()
