"""The generic attention rules against vLLM 0.33's own model construction (issue 23).

For every architecture of vLLM's registry (kvlayout/models/registry_vllm.py) of kind ``attention``,
``sliding-window`` or ``mla`` that no named family covers, small configs (2 layers, hidden 256) are
built into vLLM's model class on the CPU in one subprocess (vLLM's ModelConfig from the config.json,
its VllmConfig with the cache's one window set as ``EngineArgs.create_engine_config`` sets it, the
model class from its registry, constructed under ``set_current_vllm_config`` in a 1-rank gloo group),
and each attention layer's ``get_kv_cache_spec`` (kind, KV heads, head size, head size of V, window,
dtype) and name (its ``layer_name``, the key of vLLM's KV cache config) is compared with kvlayout's
plan of the same config by the generic rules, with the architecture's named variation
(kvlayout/models/attention.py's ``VARIATIONS``) if it has one. Variants: the config class's defaults
(read through transformers by both), ``head_dim`` written unlike ``hidden_size // heads``, a window
with ``layer_types`` (sliding then full), a window without ``layer_types`` (both readers, json and
transformers, on the complete variants; the json reader may instead name a field it needs); MLA: the
class's latent sizes and written ones. KV heads per rank at tp 2 and 8: vLLM's
``ModelConfig.get_num_kv_heads``; where a variation gives the KV heads (ModelConfig reads the generic
fields, those layers do not), the model itself is built as rank 0 of tp 2 and 8 (the tp group's
``world_size`` set, a stub asserted through ``get_tensor_model_parallel_world_size``; construction
runs no collective). An architecture is covered iff it constructs and agrees on every variant; the
others stay refused with the first difference or error as the reason. kvlayout/models/vllm_checked.py
is this test's output (``python tests/test_models_generic.py --write``); the test fails when it is not.

Configs: transformers' config class where its causal-LM mapping names the architecture, else
:data:`CONFIG_TYPES` (vLLM's own config classes, or a transformers type under another class name),
else a stand-in for a remote-code class (the fields as written). :data:`ARCH_FIELDS` adds what a
model needs and published configs write, none deciding the cache; :data:`NOT_BUILT` lists the
architectures too slow to build in CI, with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kvlayout.errors import SpecError
from kvlayout.spec import MLASpec
from tests import json_reader as J

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "kvlayout" / "models" / "vllm_checked.py"
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
_BASE: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
}
#: what an MLA model of vLLM needs beyond _BASE (DeepSeek-V2's shape, small); every MLA variant has it
MLA_FIXED: dict[str, Any] = {
    "num_key_value_heads": 8,
    "q_lora_rank": 64,
    "v_head_dim": 32,
    "qk_nope_head_dim": 32,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
}
#: MLA variant -> (extra fields, json reader compared too): the config class's latent sizes (DeepSeek-V3's
#: 512 + 64) and written ones
MLA_VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "defaults": ({}, False),
    "mla": ({"kv_lora_rank": 64, "qk_rope_head_dim": 16}, True),
}
#: tensor-parallel sizes whose KV heads per rank are compared with vLLM's ModelConfig.get_num_kv_heads
TPS = (2, 8)
#: variant -> (extra fields, json reader compared too)
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "defaults": ({}, False),
    "head_dim": ({"head_dim": 64}, True),
    "layer_types": (
        {"head_dim": 64, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
        True,
    ),
    "window": ({"head_dim": 64, "sliding_window": 128}, True),
}


#: architecture -> model_type where transformers' causal-LM mapping does not name the class (or names
#: another config class first: Llama 4's multimodal ``llama4`` before its text ``llama4_text``): the
#: type of vLLM 0.33's own config class (its ``_CONFIG_REGISTRY``, vllm/transformers_utils/config.py,
#: asserted by the driver), or a transformers type the published checkpoints use under another class
#: name (ExaoneMoE, PhiMoE; old LLaMA checkpoints)
CONFIG_TYPES: dict[str, str] = {
    "ChatGLMModel": "chatglm",
    "ChatGLMForConditionalGeneration": "chatglm",
    "Step3TextForCausalLM": "step3_text",
    "Step3p5ForCausalLM": "step3p5",
    "Step5ForCausalLM": "step5",
    "ExaoneMoEForCausalLM": "exaone_moe",
    "PhiMoEForCausalLM": "phimoe",
    "MuseGlimmerForCausalLM": "muse_glimmer",
    "LLaMAForCausalLM": "llama",
    "MistralLarge3ForCausalLM": "deepseek_v3",  # vLLM converts its Mistral-format config to this class
    "Llama4ForCausalLM": "llama4_text",  # transformers maps llama4 (the multimodal config) first
}
#: model_type prefix of a stand-in for a remote-code config class (hub code, never run here): a plain
#: ``PretrainedConfig`` holding the fields as written, registered with transformers' AutoConfig in the
#: driver; kvlayout reads such a type as written too (no class of transformers names it)
STAND_IN = "kvlayout_stand_in_"
#: architecture -> the model_type its remote-code checkpoints name, where vLLM decides by it (MLA is
#: vLLM's only for the types of ``is_deepseek_mla``): a stand-in registered under that name
NAMED_STAND_INS: dict[str, str] = {
    "PanguUltraMoEForCausalLM": "pangu_ultra_moe",
    "DeepseekForCausalLM": "deepseek",  # deepseek-moe-16b's: vLLM's DeepseekV2 layers take MHA for it
}


#: what a remote-code config writes that vLLM's model reads beyond the cache fields (a stand-in has no
#: defaults): written into every stand-in config
STAND_IN_FIELDS: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "attention_bias": False,
    "embedding_dropout": 0.0,
    "attention_dropout": 0.0,
}
#: architecture -> fields its vLLM model needs that the harness's small config lacks (published
#: configs write them), none deciding the cache: written into every variant
ARCH_FIELDS: dict[str, dict[str, Any]] = {
    "AfmoeForCausalLM": {"score_func": "sigmoid", "route_norm": True, "route_scale": 1.0, "n_group": 1,
                         "topk_group": 1, "num_dense_layers": 1, "num_shared_experts": 1},
    "ChatGLMModel": {"original_rope": True, "tie_word_embeddings": False, "multi_query_attention": True,
                     "multi_query_group_num": 2},
    "ChatGLMForConditionalGeneration": {"original_rope": True, "tie_word_embeddings": False,
                                        "multi_query_attention": True, "multi_query_group_num": 2},
    "GPTJForCausalLM": {"rotary_dim": 16, "activation_function": "gelu"},  # gelu_new: no CPU op
    "GPT2LMHeadModel": {"activation_function": "gelu"},
    "ExaoneForCausalLM": {"activation_function": "silu", "layer_norm_epsilon": 1e-5},
    "Glm4MoeForCausalLM": {"head_dim": 48},  # Glm4MoeConfig has no default; GLM-4.5 writes 128
    "HYV3ForCausalLM": {"first_k_dense_replace": 1, "expert_hidden_dim": 128, "num_shared_experts": 1,
                        "route_norm": True},
    "MiniMaxM2ForCausalLM": {"rotary_dim": 16, "scoring_func": "sigmoid"},
    "MiniCPMForCausalLM": {"dim_model_base": 256, "scale_emb": 1.0, "scale_depth": 1.0},
    **{
        a: {"head_dim": 48, "use_bias": False, "use_qkv_bias": False, "norm_topk_prob": True,
            "num_shared_experts": 1, "moe_shared_expert_intermediate_size": 128, "first_k_dense_replace": 1}
        for a in ("BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM")
    },
    "Param2MoEForCausalLM": {"head_dim": 48},
    # Transformers-backend models whose config class's pad_token_id (SmolLM3's 128004) passes the
    # harness's 1,024-token vocabulary (published configs' lie within theirs)
    **{a: {"pad_token_id": 0} for a in ("SmolLM3ForCausalLM", "GlmForCausalLM", "FlexOlmoForCausalLM")},
    # HunYuan's config classes have no head_dim default and its transformers attention reads it
    # (tencent/Hunyuan-7B-Instruct writes 128)
    **{a: {"head_dim": 48} for a in ("HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM")},
    # stepfun-ai/Step-3.5-Flash's config.json: an fp32 router with a bias (vLLM asserts both); 8 experts,
    # for its layers built as one rank of tp 8 (its MoE refuses fewer experts than ranks)
    "Step3p5ForCausalLM": {"mlp_layer_types": ["dense", "sparse"], "use_moe_router_bias": True,
                           "need_fp32_gate": True, "norm_expert_weight": True, "n_routed_experts": 8,
                           "num_attention_groups": 2,
                           "num_local_experts": 8},
    # stepfun-ai/step3's text_config writes its MoE layers as a comma-separated string
    "Step3TextForCausalLM": {"moe_layers_enum": "1"},
    "TeleFLMForCausalLM": {"use_mup": False, "output_mult": 1.0, "mup_scale_factor": 1.0},
    # DBRX: its published attn_config and ffn_config (transformers' DbrxAttentionConfig takes rope_theta)
    "DbrxForCausalLM": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": None},
                        "ffn_config": {"moe_num_experts": 4, "moe_top_k": 2, "ffn_hidden_size": 128},
                        "d_model": 256, "n_heads": 8, "n_layers": 2, "max_seq_len": 4096},
    "TeleChat2ForCausalLM": {"n_layer": 2, "n_head": 8, "ffn_hidden_size": 512, "layer_norm_epsilon": 1e-5},
    **{
        a: {"routed_scaling_factor": 1.0, "norm_topk_prob": True, "num_routed_experts": 4,
            "num_shared_experts": 1}
        for a in ("PanguUltraMoEForCausalLM",)
    },
    # deepseek-ai/deepseek-moe-16b-base's config.json (its model_type "deepseek": NAMED_STAND_INS)
    "DeepseekForCausalLM": {"norm_topk_prob": False, "scoring_func": "softmax", "moe_layer_freq": 1,
                            "first_k_dense_replace": 1, "n_shared_experts": 2, "topk_method": "greedy"},
    # IFM/K2-Horizon's configs (head_dim written: 128 in the 7B); layer 0 dense, layer 1 MoVA attention
    # with MoE (K2-Horizon-MoVA-36B-A4B's mova_num_experts)
    "K2HorizonForCausalLM": {
        "head_dim": 48, "decoder_sparse_step": 1, "mlp_only_layers": [0], "layernorm_num_groups": 4,
        "query_key_norm": True, "rope_head_dim": None, "attention_gate_func": None, "mova_num_experts": 2,
        "mova_num_experts_per_tok": 1, "moe_gate_bias": True, "router_score_func": "sigmoid",
        "router_scaling_factor": 1.0, "norm_topk_prob": True, "num_shared_experts": 1,
    },
}
#: a variant's key listing fields of the harness's base config it leaves out (not written to config.json)
DROP_KEY = "kvlayout_harness_drop"
_BIGCODE: dict[str, Any] = {
    DROP_KEY: ["num_key_value_heads", "hidden_size", "num_attention_heads", "num_hidden_layers"],
    "n_embd": 256, "n_head": 8, "n_layer": 2,
}
#: architecture -> variants of its own beyond :data:`VARIANTS` (name -> (extra fields, json reader
#: compared too)): Llama 4's NoPE layer (full attention) beside a chunked one, by ``no_rope_layers``
#: and by ``no_rope_layer_interval`` (an empty list is transformers' default), and no chunks at all
ARCH_VARIANTS: dict[str, dict[str, tuple[dict[str, Any], bool]]] = {
    "Llama4ForCausalLM": {
        "nope": ({"head_dim": 64, "attention_chunk_size": 64, "no_rope_layers": [1, 0]}, True),
        "interval": (
            {"head_dim": 64, "attention_chunk_size": 64, "no_rope_layers": [], "no_rope_layer_interval": 2},
            True,
        ),
        "no_chunks": ({"head_dim": 64, "attention_chunk_size": None, "no_rope_layers": [1, 0]}, True),
    },
    # GPT-BigCode as published (bigcode/starcoder: n_embd, n_head, n_layer, no num_key_value_heads):
    # multi_query gives one KV head, else the query heads
    "GPTBigCodeForCausalLM": {
        "multi_query": ({**_BIGCODE, "multi_query": True}, True),
        "multi_head": ({**_BIGCODE, "multi_query": False}, True),
    },
}
#: architecture -> fields its config class cannot take (FalconConfig's head_dim is a property)
ARCH_DROP: dict[str, tuple[str, ...]] = {
    "FalconForCausalLM": ("head_dim",),
}


def candidates() -> dict[str, str]:
    """Architecture -> model_type for the harness: :data:`CONFIG_TYPES`, then transformers' causal-LM
    class names, else a stand-in (:data:`STAND_IN`)."""
    from transformers.models.auto import modeling_auto as ma

    from kvlayout.models.families import NAMED_FAMILIES, SERVED

    model_type: dict[str, str] = {}
    for names in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        for mt, cls in names.items():
            for c in [cls] if isinstance(cls, str) else cls:
                model_type.setdefault(c, mt)
    ok: dict[str, str] = {}
    for arch, (_, kind, _) in sorted(SERVED.items()):
        if kind not in ("attention", "sliding-window", "mla") or arch in NAMED_FAMILIES:
            continue
        ok[arch] = CONFIG_TYPES.get(arch) or model_type.get(arch) or STAND_IN + arch.lower()
        ok[arch] = NAMED_STAND_INS.get(arch, ok[arch])
    return ok


#: architecture -> why the harness does not build it, refused with this reason: too slow (each took 10
#: to 60 s of the CI run, observed at issue 23's coverage commit), or its cache rests on fields vLLM's
#: model reads layer by layer that kvlayout's rules do not (stated from vLLM 0.33's model code)
NOT_BUILT: dict[str, str] = {
    "NanbeigeForCausalLM": (
        "vLLM serves it through its Transformers modeling backend, whose model is transformers' class of "
        "that name: the installed transformers has none, so vLLM builds it only from the checkpoint's "
        "remote code (auto_map), which kvlayout does not run"
    ),
    "MuseGlimmerForCausalLM": (
        "a multimodal config whose text model takes its config class's defaults (3 and more layers, not "
        "the harness's 2), about 15 s per build"
    ),
    "HCXVisionV2ForCausalLM": "vLLM's ModelConfig refuses the small config (ValidationError), about 18 s",
    "Step5ForCausalLM": "vLLM's ModelConfig refuses the small config (ValidationError) after about 11 s",
}
#: architecture -> the cause, from vLLM 0.33's code, of the difference its construction shows (appended
#: to the refusal; an architecture covered with a cause here fails the generation)
CAUSES: dict[str, str] = {}
#: a case's key (not written to config.json) asking the driver to build the model as one rank of tp N
TP_KEY = "kvlayout_harness_tp"


def _kind(arch: str) -> str:
    """The cache kind vLLM builds for ``arch`` (the registry's, or families.BUILT_KINDS')."""
    from kvlayout.models.families import built_kind

    return built_kind(arch)


#: MLA architectures whose model_type vLLM's ModelConfig does not take for MLA (``is_deepseek_mla``):
#: its ``get_num_kv_heads`` then divides num_key_value_heads, while the layers (MLAAttention) hold one
#: latent head on every rank and give the cache's spec; their layers are built at tp 2 and 8
MLA_BY_LAYERS: tuple[str, ...] = ("SarvamMLAForCausalLM",)


def _layer_tp(arch: str) -> bool:
    """Whether ``arch``'s layers are built at tp 2 and 8 (one rank's construction): its KV heads come
    from a variation (vLLM's ModelConfig reads the generic fields, its layers do not), or it is in
    :data:`MLA_BY_LAYERS`."""
    from kvlayout.models.attention import VARIATIONS
    from kvlayout.models.registry_vllm import TRANSFORMERS_BACKEND

    if arch in TRANSFORMERS_BACKEND:  # its layers take ModelConfig.get_num_kv_heads (transformers/base.py)
        return False
    return arch in MLA_BY_LAYERS or arch in VARIATIONS and bool(VARIATIONS[arch].kv_heads)


def _variants(arch: str) -> dict[str, tuple[dict[str, Any], bool]]:
    """The variants ``arch`` is built in: its kind's and its own (:data:`ARCH_VARIANTS`)."""
    return {**(MLA_VARIANTS if _kind(arch) == "mla" else VARIANTS), **ARCH_VARIANTS.get(arch, {})}


def _configs(arch: str, model_type: str) -> dict[str, dict[str, Any]]:
    stand_in = model_type.startswith(STAND_IN) or arch in NAMED_STAND_INS
    fixed = {**(STAND_IN_FIELDS if stand_in else {}), **ARCH_FIELDS.get(arch, {})}
    drop = (*ARCH_DROP.get(arch, ()), DROP_KEY)
    mla = _kind(arch) == "mla"
    if mla:  # a stand-in has no class defaults: its latent sizes are written in every variant
        fixed = {**MLA_FIXED, **({"kv_lora_rank": 128, "qk_rope_head_dim": 32} if stand_in else {}), **fixed}
    out = {
        v: {
            k: x
            for k, x in {**_BASE, **fixed, **extra, "architectures": [arch], "model_type": model_type}.items()
            if k not in drop
        }
        for v, (extra, _) in _variants(arch).items()
    }
    for v, (extra, _) in _variants(arch).items():
        for k in extra.get(DROP_KEY, ()):
            out[v].pop(k, None)
    if _layer_tp(arch):
        out.update({f"tp{t}": {**out["mla" if mla else "head_dim"], TP_KEY: t} for t in TPS})
    return out


def vllm_answers(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
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


def _kvlayout(
    config: dict[str, Any], reader: str, names: tuple[str, str], tp: int = 1
) -> list[list[Any]]:
    """kvlayout's generic plan of ``config`` as vLLM's answer's rows (the architecture planned as
    ``generic`` with vLLM's layer names)."""
    import kvlayout.models as M
    from kvlayout.models import families, vllm_checked

    arch = config["architectures"][0]
    fam = dict(families.FAMILIES)
    gen = dict(vllm_checked.GENERIC_ATTENTION)
    family = families.GENERIC_BY_KIND[_kind(arch)]
    fam[arch], gen[arch] = family, names
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(families, "FAMILIES", fam)
        mp.setattr(vllm_checked, "GENERIC_ATTENTION", gen)
        mp.setattr("kvlayout.models.attention.GENERIC_ATTENTION", gen)
        mp.setattr("kvlayout.models.build.GENERIC_ATTENTION", gen)
        mp.setattr("kvlayout.models.mla.GENERIC_ATTENTION", gen)
        mt = str(config.get("model_type"))
        if mt.startswith(STAND_IN) or mt in NAMED_STAND_INS.values():
            # a remote-code checkpoint names its class (vLLM's AutoConfig refuses a model_type it has no class
            # for otherwise): kvlayout reads it as written (issue 25, sixteenth pass)
            config = {**config, "auto_map": {"AutoConfig": "configuration_stand_in.StandInConfig"}}
        ms = J.from_config(config, reader=reader, block_size=16, tp=tp)
    assert isinstance(ms, M.ModelSpec)
    rows: list[list[Any]] = []
    for _, layer in ms.spec.layers:
        if ms.kinds[layer.name] == "chunked":  # a full attention page; vLLM's ChunkedLocalAttentionSpec
            rows.append([layer.name, "ChunkedLocalAttentionSpec", layer.num_kv_heads, layer.head_size,
                         layer.head_size, _chunk(config, reader), f"torch.{layer.dtype}"])
            continue
        if isinstance(layer, MLASpec):  # one latent head; vLLM's MLAAttentionSpec has no V size
            rows.append([layer.name, "MLAAttentionSpec", 1, layer.head_size, 0, None, f"torch.{layer.dtype}"])
            continue
        window = getattr(layer, "window", None)
        kind = "SlidingWindowSpec" if window else "FullAttentionSpec"
        v = getattr(layer, "head_size_v", None) or layer.head_size
        dtype = f"torch.{layer.dtype}"
        rows.append([layer.name, kind, layer.num_kv_heads, layer.head_size, v, window, dtype])
    return rows


def _chunk(config: dict[str, Any], reader: str) -> int | None:
    """``attention_chunk_size`` as kvlayout reads it (through transformers: its default)."""
    from kvlayout.models.attention import chunk_size
    from kvlayout.models.config import Config, load_config, text_config, through_transformers

    data = through_transformers(config, [])[0] if reader == "transformers" else load_config(config)
    return chunk_size(text_config(Config(data, "config")))


def _names(layers: list[list[Any]]) -> tuple[str, str] | None:
    """(prefix, tail) such that layer i is named ``{prefix}.{i}.{tail}``, or None. The index is the
    name's first: a later one is a sublayer's (LongCat-Flash's ``model.layers.0.self_attn.{0,1}.attn``,
    two per decoder layer, would otherwise pass as a 2-layer model's ``model.layers.0.self_attn.{i}``)."""
    if not layers or ".0." not in layers[0][0]:
        return None
    cut = layers[0][0].index(".0.")
    prefix, tail = layers[0][0][:cut], layers[0][0][cut + 3:]
    if [row[0] for row in layers] == [f"{prefix}.{i}.{tail}" for i in range(len(layers))]:
        return prefix, tail
    return None


def judge(
    arch: str, answers: dict[str, dict[str, Any]], configs: dict[str, dict[str, Any]]
) -> str | tuple[str, str]:
    """(prefix, tail) when vLLM's construction agrees with kvlayout on every variant, else why not."""
    names = None
    for variant, config in configs.items():
        got = answers[f"{arch}/{variant}"]
        if "error" in got:
            return f"vLLM's construction of a 2-layer config ({variant}) failed: {got['error']}"
        n = _names(got["layers"])
        if n is None or len(got["layers"]) != config.get("num_hidden_layers", config.get("n_layer")):
            shown = [row[0] for row in got["layers"]][:3]
            return f"its attention layers are not one per decoder layer under one name ({variant}: {shown})"
        names = names or n
        if n != names:
            return f"its layer names change with the config ({variant})"
        tp = config.get(TP_KEY, 1)
        config = {k: x for k, x in config.items() if k != TP_KEY}
        json_too = _variants(arch)[variant.split("/")[0]][1] if (
            not variant.startswith("tp")
        ) else True
        for reader in ("transformers", "json") if json_too else ("transformers",):
            try:
                mine = _kvlayout(config, reader, names, tp)
            except SpecError as e:  # asking for a field the config class would derive: safe, not wrong
                if reader == "json" and e.value is None and ": missing;" in str(e):
                    continue
                return f"kvlayout's generic rules refuse the {variant} config ({reader}): {e}"
            except Exception as e:  # noqa: BLE001  # kvlayout refuses what vLLM built: recorded
                return f"kvlayout's generic rules refuse the {variant} config ({reader}): {e}"
            if mine != got["layers"]:
                diff = next((a, b) for a, b in zip(mine, got["layers"], strict=True) if a != b)
                return (
                    f"vLLM's layers differ from the generic rules ({variant}, reader {reader}, tp {tp}): "
                    f"vLLM {diff[1]}, generic {diff[0]} (name, kind, KV heads, head size, V, window, dtype)"
                )
            for t in () if _layer_tp(arch) or tp != 1 else TPS:
                try:
                    heads = {row[2] for row in _kvlayout(config, reader, names, t)}
                except Exception as e:  # noqa: BLE001  # recorded
                    return f"kvlayout's generic rules refuse tp {t} ({variant}, reader {reader}): {e}"
                if heads != {got["tp_kv_heads"][str(t)]}:
                    return (
                        f"KV heads per rank at tp {t} ({variant}, reader {reader}): vLLM's ModelConfig "
                        f"{got['tp_kv_heads'][str(t)]}, generic rules {sorted(heads)}"
                    )
    assert names is not None
    return names


def _str_lines(key: str, text: str, width: int = 110) -> list[str]:
    """``key: text,`` as table lines of at most ``width`` characters (tests/test_line_length.py):
    a long text is split at spaces into adjacent literals that concatenate back to it."""
    one = f"    {key!r}: {json.dumps(text)},"
    if len(one) <= width:
        return [one]
    parts = textwrap.wrap(text, width - 12, drop_whitespace=False, break_on_hyphens=False,
                          replace_whitespace=False, expand_tabs=False, break_long_words=True)
    if "".join(parts) != text:
        raise ValueError(f"cannot split the reason of {key} exactly")
    return [f"    {key!r}: (", *(f"        {json.dumps(p)}" for p in parts), "    ),"]


def generate() -> str:
    ok = candidates()
    cases = {
        f"{a}/{v}": c for a, mt in ok.items() if a not in NOT_BUILT for v, c in _configs(a, mt).items()
    }
    answers = vllm_answers(cases)
    generic: dict[str, tuple[str, str]] = {}
    refused: dict[str, str] = {a: f"not built by the harness: {why}" for a, why in NOT_BUILT.items()}
    for arch, mt in ok.items():
        if arch in NOT_BUILT:
            continue
        verdict = judge(arch, answers, _configs(arch, mt))
        if isinstance(verdict, tuple):
            if arch in CAUSES:
                raise AssertionError(f"{arch} is covered: drop its cause from CAUSES")
            generic[arch] = verdict
        else:
            refused[arch] = f"{verdict}; {CAUSES[arch]}" if arch in CAUSES else verdict
    lines = [
        '"""Which of vLLM 0.33\'s plain, sliding-window and MLA architectures follow the generic rules',
        "(or a named variation), by vLLM's own model construction on the CPU",
        "(tests/test_models_generic.py, which generates this file with ``--write`` and fails when it",
        'is stale; do not edit)."""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "",
        "#: architecture -> (layer-name prefix, tail): layer i is ``{prefix}.{i}.{tail}``",
        "GENERIC_ATTENTION: Mapping[str, tuple[str, str]] = {",
        *(f"    {a!r}: {v!r}," for a, v in sorted(generic.items())),
        "}",
        "#: architecture -> why the generic rules are not taken for it",
        "NOT_GENERIC: Mapping[str, str] = {",
        *(line for a, v in sorted(refused.items()) for line in _str_lines(a, v)),
        "}",
        "",
    ]
    return "\n".join(lines)


def test_the_committed_table_is_vllms_construction() -> None:
    """Every candidate constructs in vLLM and agrees, or is refused with the recorded reason (vLLM
    missing is a failure: scripts/test.sh installs it)."""
    assert TABLE.read_text() == generate()


def test_covered_architectures_plan_through_from_config() -> None:
    """A covered architecture plans without the harness's patching, with vLLM's layer names, and a
    refused one names the reason."""
    import kvlayout.models as M
    from kvlayout.errors import SpecError
    from kvlayout.models.vllm_checked import GENERIC_ATTENTION, NOT_GENERIC

    assert GENERIC_ATTENTION and NOT_GENERIC
    arch = next(a for a in GENERIC_ATTENTION if _kind(a) != "mla")  # MLA: the test above
    config = _configs(arch, candidates()[arch])["layer_types"]
    ms = J.from_config(config)
    assert isinstance(ms, M.ModelSpec) and ms.family in ("generic", "generic_sw")
    prefix, tail = GENERIC_ATTENTION[arch]
    assert sorted(layer.name for _, layer in ms.spec.layers) == [f"{prefix}.0.{tail}", f"{prefix}.1.{tail}"]
    refused = next(iter(NOT_GENERIC))
    with pytest.raises(SpecError, match="not shown to hold by vLLM's model construction"):
        J.from_config({**config, "architectures": [refused]})


def _rows(
    arch: str, model_type: str, tp: int = 1, reader: str = "json", **fields: Any
) -> list[tuple[Any, ...]]:
    """(KV heads, head size, window) per layer of kvlayout's plan of a small config of ``arch``."""
    import kvlayout.models as M

    config = {k: v for k, v in {**_BASE, **fields}.items() if v is not None}
    ms = J.from_config({**config, "architectures": [arch], "model_type": model_type}, tp=tp, reader=reader)
    assert isinstance(ms, M.ModelSpec)
    return [(x.num_kv_heads, x.head_size, getattr(x, "window", None)) for _, x in ms.spec.layers]


def test_named_variations_as_vllm_builds_them() -> None:
    """Each variation of the generic rules, with the values vLLM 0.33's layers gave in the harness
    (the generic rule gives other values in each case: a variation dropped or changed fails here)."""
    from kvlayout.models.attention import VARIATIONS
    from kvlayout.models.vllm_checked import GENERIC_ATTENTION

    assert set(VARIATIONS) <= set(GENERIC_ATTENTION)  # a variation vLLM does not confirm is no rule
    # Bloom: KV heads are the query heads (num_key_value_heads 2 ignored), head_dim 64 ignored (256 / 8)
    assert _rows("BloomForCausalLM", "bloom", head_dim=64) == [(8, 32, None)] * 2
    assert _rows("BloomForCausalLM", "bloom", tp=8) == [(1, 32, None)] * 2
    assert _rows("GPT2LMHeadModel", "gpt2", tp=2, head_dim=64) == [(4, 32, None)] * 2
    # Falcon: one KV head with multi_query, the query heads without, num_kv_heads with the new
    # decoder architecture; no window; the json reader names a missing flag
    falcon = {"new_decoder_architecture": False, "multi_query": True, "sliding_window": 128}
    assert _rows("FalconForCausalLM", "falcon", **falcon) == [(1, 32, None)] * 2
    # a written head_dim is ignored as by vLLM's FalconAttention (hidden_size // heads; transformers'
    # FalconConfig cannot even take one, so the harness drops it: checked here for the json reader)
    assert _rows("FalconForCausalLM", "falcon", head_dim=64, **falcon) == [(1, 32, None)] * 2
    assert _rows("FalconForCausalLM", "falcon", **{**falcon, "multi_query": False}) == [(8, 32, None)] * 2
    new = {**falcon, "new_decoder_architecture": True, "num_kv_heads": 4}
    assert _rows("FalconForCausalLM", "falcon", tp=2, **new) == [(2, 32, None)] * 2
    with pytest.raises(SpecError, match="multi_query"):
        _rows("FalconForCausalLM", "falcon", **{**falcon, "multi_query": None})
    # ChatGLM: multi_query_group_num with multi_query_attention, else the query heads
    glm = {"multi_query_attention": True, "multi_query_group_num": 2, "num_key_value_heads": None}
    assert _rows("ChatGLMModel", "chatglm", **glm) == [(2, 32, None)] * 2
    assert _rows("ChatGLMModel", "chatglm", **{**glm, "multi_query_attention": False}) == [(8, 32, None)] * 2
    # Qwen2-MoE: head_dim ignored; a window only with use_sliding_window (its config class drops it)
    assert _rows("Qwen2MoeForCausalLM", "qwen2_moe", head_dim=64) == [(2, 32, None)] * 2
    q2 = {"sliding_window": 128, "use_sliding_window": True}
    # without layer_types its config class derives them with layer 1 full: the engine's window is withheld
    # (hostile pass 24, against vLLM's construction in tests/test_hostile_s24_models.py); all sliding keep it
    assert _rows("Qwen2MoeForCausalLM", "qwen2_moe", **q2) == [(2, 32, None)] * 2
    every = ["sliding_attention"] * 2
    assert _rows("Qwen2MoeForCausalLM", "qwen2_moe", **q2, layer_types=every) == [(2, 32, 128)] * 2
    off = {**q2, "use_sliding_window": False}
    assert _rows("Qwen2MoeForCausalLM", "qwen2_moe", **off) == [(2, 32, None)] * 2
    with pytest.raises(SpecError, match="use_sliding_window"):
        _rows("Qwen2MoeForCausalLM", "qwen2_moe", sliding_window=128)
    # Cohere 2: a sliding layer's window is one larger; read as written it must name its layer_types
    types = {"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]}
    assert _rows("Cohere2ForCausalLM", "cohere2", **types) == [(2, 32, 129), (2, 32, None)]
    with pytest.raises(SpecError, match="layer_types"):
        _rows("Cohere2ForCausalLM", "cohere2", sliding_window=128)
    # PhiMoE: the engine's one window (no per-layer window): mixed layer_types leave every layer full
    assert _rows("PhiMoEForCausalLM", "phimoe", **types) == [(2, 32, None)] * 2
    # DBRX: the KV heads are attn_config.kv_n_heads (num_key_value_heads 2 ignored), head_dim ignored
    assert _rows("DbrxForCausalLM", "dbrx", head_dim=64, attn_config={"kv_n_heads": 4}) == [(4, 32, None)] * 2
    assert _rows("DbrxForCausalLM", "dbrx", tp=8, attn_config={"kv_n_heads": 4}) == [(1, 32, None)] * 2
    with pytest.raises(SpecError, match=r"config\.attn_config\.kv_n_heads = None: missing"):
        _rows("DbrxForCausalLM", "dbrx", attn_config={})
    # GraniteMoE-SWA: per-layer windows, head_dim ignored; read as written it must name its layer_types
    swa = _rows("GraniteMoeSWAForCausalLM", "granitemoe_swa", head_dim=64, **types)
    assert swa == [(2, 32, 128), (2, 32, None)]
    with pytest.raises(SpecError, match="layer_types"):
        _rows("GraniteMoeSWAForCausalLM", "granitemoe_swa", sliding_window=128)
    # Transformers backend: HunYuan's head_dim has no default (vLLM's construction fails without it)
    with pytest.raises(SpecError, match=r"config\.head_dim = None: missing; this model's attention reads it"):
        _rows("HunYuanDenseV1ForCausalLM", "hunyuan_v1_dense", reader="transformers")
    # GPT-BigCode without a KV field: one KV head with multi_query, else the query heads; read as written
    # a missing multi_query is named (GPTBigCodeConfig defaults it to true)
    bigcode = {"num_key_value_heads": None, "multi_query": True}
    assert _rows("GPTBigCodeForCausalLM", "gpt_bigcode", **bigcode) == [(1, 32, None)] * 2
    assert _rows("GPTBigCodeForCausalLM", "gpt_bigcode", tp=8, **bigcode) == [(1, 32, None)] * 2
    mha = {**bigcode, "multi_query": False}
    assert _rows("GPTBigCodeForCausalLM", "gpt_bigcode", tp=2, **mha) == [(4, 32, None)] * 2
    with pytest.raises(SpecError, match=r"config\.multi_query = None: missing"):
        _rows("GPTBigCodeForCausalLM", "gpt_bigcode", **{**bigcode, "multi_query": None})
    # OLMo 3's config class derives layer_types (and a 4,096 window): read as written it must name them
    with pytest.raises(SpecError, match=r"config\.layer_types = None: missing"):
        _rows("Olmo3ForCausalLM", "olmo3", sliding_window=128)
    # GraniteMoE-Shared: per-layer windows, head_dim ignored
    assert _rows("GraniteMoeSharedForCausalLM", "granitemoeshared", head_dim=64, **types) == [
        (2, 32, 128),
        (2, 32, None),
    ]


def test_llama4_chunked_layers() -> None:
    """Llama 4 (the values vLLM 0.33's layers gave in the harness): a layer with RoPE is chunked local
    attention (full attention's page, its own groups), a NoPE layer (``no_rope_layers[i] == 0``) full;
    an empty ``no_rope_layers`` takes ``no_rope_layer_interval``; no chunks without a chunk size; read
    as written, a missing ``attention_chunk_size`` is named."""
    import kvlayout.models as M

    base = {**_BASE, "num_hidden_layers": 4, "architectures": ["Llama4ForCausalLM"]}
    base["model_type"] = "llama4_text"

    def kinds(**fields: Any) -> list[str]:
        ms = J.from_config({**base, **fields})
        assert isinstance(ms, M.ModelSpec)
        assert {type(x).__name__ for _, x in ms.spec.layers} == {"FullAttentionSpec"}
        return list(ms.kinds.values())

    c, f = "chunked", "full"
    assert kinds(attention_chunk_size=64, no_rope_layers=[1, 0, 2, 1]) == [c, f, c, c]
    assert kinds(attention_chunk_size=64, no_rope_layers=[], no_rope_layer_interval=2) == [c, f] * 2
    assert kinds(attention_chunk_size=None, no_rope_layers=[1, 0, 1, 0]) == ["full"] * 4
    ms = J.from_config({**base, "attention_chunk_size": 64, "no_rope_layers": [1, 1, 1, 0]})
    assert isinstance(ms, M.ModelSpec)
    assert [g.name for g in ms.spec.groups] == ["chunked.0", "chunked.1", "chunked.2", "full"]  # 3 to 1
    assert any("chunked local attention (64-token chunks) on 3 of 4 layers" in n for n in ms.notes)
    with pytest.raises(SpecError, match=r"config\.attention_chunk_size = None: missing"):
        J.from_config({**base, "no_rope_layers": [1, 1, 1, 0]})
    with pytest.raises(SpecError, match=r"config\.no_rope_layer_interval = None: missing"):
        J.from_config({**base, "attention_chunk_size": 64, "no_rope_layers": []})


def test_generic_mla_is_deepseek_v2s_latent_rule() -> None:
    """An MLA architecture vLLM's construction confirms: one latent head of kv_lora_rank +
    qk_rope_head_dim on every rank under vLLM's layer names, the MLA backend's blocks (Hopper, bf16:
    FLASH_ATTN_MLA's 16 tokens; fp8: FlashMLA's 64), as DeepSeek-V2's named rule gives."""
    import kvlayout.models as M
    from kvlayout.models.vllm_checked import GENERIC_ATTENTION

    arch = "Glm4MoeLiteForCausalLM"
    assert GENERIC_ATTENTION[arch] == ("model.layers", "self_attn.attn")
    config = {**_BASE, **MLA_FIXED, **MLA_VARIANTS["mla"][0], "architectures": [arch], "model_type": "x"}
    for tp, kv, block in ((1, None, 16), (8, "fp8", 64)):
        ms = J.from_config(config, tp=tp, kv_cache_dtype=kv)
        assert isinstance(ms, M.ModelSpec) and ms.family == "generic_mla" and ms.block_size == block
        layers = [x for _, x in ms.spec.layers]
        assert [x.name for x in layers] == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
        assert {(type(x).__name__, x.head_size, x.block_size) for x in layers} == {("MLASpec", 80, block)}
        same = J.from_config({**config, "architectures": ["DeepseekV2ForCausalLM"]}, tp=tp, kv_cache_dtype=kv)
        assert isinstance(same, M.ModelSpec) and same.bytes_per_block == ms.bytes_per_block


def test_transformers_reader_takes_the_config_class_aliases() -> None:
    """GPT-2's published config names n_head, n_embd, n_layer: read through GPT2Config, its
    attribute_map gives vLLM's num_attention_heads etc.; the json reader reads the same aliases by that
    map (config_aliases.py, since the sixteenth session), and without them the field is missing."""
    gpt2 = {"n_head": 12, "n_embd": 768, "n_layer": 3, "torch_dtype": "float16"}
    base = {k: None for k in _BASE}
    assert _rows("GPT2LMHeadModel", "gpt2", reader="transformers", **{**base, **gpt2}) == [(12, 64, None)] * 3
    assert _rows("GPT2LMHeadModel", "gpt2", **{**base, **gpt2}) == [(12, 64, None)] * 3
    with pytest.raises(SpecError, match=r"config\.num_hidden_layers = None: missing"):
        _rows("GPT2LMHeadModel", "gpt2", **{**base, **gpt2, "n_layer": None})


# --------------------------------------------------------------------------- the vLLM side
def _driver() -> None:
    """Build each case's model class in vLLM and print its attention layers' KV cache specs."""
    import contextlib
    import io
    import tempfile

    cases = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints stay off the answer
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        get_tensor_model_parallel_world_size,
        get_tp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.registry import ModelRegistry

    from tests.driver import cpu_registry_in_process

    cpu_registry_in_process()
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:0", local_rank=0, backend="gloo"
        )
        initialize_model_parallel(1, 1)
    from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    for mt in sorted({c["model_type"] for c in cases.values()}):
        if mt.startswith(STAND_IN) or mt in NAMED_STAND_INS.values():  # a remote-code class: as written
            AutoConfig.register(mt, type(f"StandIn_{mt}", (PretrainedConfig,), {"model_type": mt}))
        elif mt not in CONFIG_MAPPING and mt not in _CONFIG_REGISTRY:
            raise AssertionError(f"model_type {mt!r} has no config class in transformers or vLLM")
    out: dict[str, Any] = {}
    failed: set[str] = set()
    for case_id, config in cases.items():
        arch = config["architectures"][0]
        if arch in failed:  # judge() stops at an architecture's first failed variant
            out[case_id] = {"error": "not built: an earlier variant failed"}
            continue
        tp = config.pop(TP_KEY, 1)
        d = tempfile.mkdtemp()
        Path(d, "config.json").write_text(json.dumps(config))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                mc = ModelConfig(model=d, tokenizer=None, skip_tokenizer_init=True, dtype="auto")
                types = getattr(mc.hf_text_config, "layer_types", None)
                window = (  # EngineArgs.create_engine_config's rule for the cache's one window
                    mc.get_sliding_window()
                    if types is None or all(t == "sliding_attention" for t in types)
                    else None
                )
                cache = CacheConfig(block_size=16, sliding_window=window)
                vc = VllmConfig(model_config=mc, cache_config=cache)
                group = get_tp_group()
                group.world_size = tp  # stub: one rank of tp N (construction only reads the size)
                try:
                    assert get_tensor_model_parallel_world_size() == tp and group.rank_in_group == 0
                    with set_current_vllm_config(vc), torch.device("cpu"):
                        cls, _ = ModelRegistry.resolve_model_cls(config["architectures"], mc)
                        model = cls(vllm_config=vc, prefix="")
                finally:
                    group.world_size = 1
            layers = []
            for name, mod in model.named_modules():
                if isinstance(mod, AttentionLayerBase):
                    s = mod.get_kv_cache_spec(vc)
                    fields = ("num_kv_heads", "head_size", "head_size_v")
                    window = getattr(s, "sliding_window", None) or getattr(s, "attention_chunk_size", None)
                    layers.append([  # the name vLLM's KV cache config keys it by (its prefix)
                        getattr(mod, "layer_name", name), type(s).__name__,
                        *(getattr(s, f, None) for f in fields), window,
                        str(getattr(s, "dtype", None)),
                    ])  # window: a chunked layer's chunk; no block size: the CPU backend's (CUDA's:
                    # tests/test_models_backends.py)
            tp_heads = {  # KV heads per rank at tp > 1: ModelConfig's rule (no model built at tp > 1)
                str(t): mc.get_num_kv_heads(
                    ParallelConfig(tensor_parallel_size=t, distributed_executor_backend="mp")
                )
                for t in TPS
            }
            out[case_id] = {"layers": layers, "tp_kv_heads": tp_heads}
        except Exception as e:  # noqa: BLE001  # recorded as the architecture's refusal
            failed.add(arch)
            out[case_id] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    real_stdout.write(json.dumps(out) + "\n")
    real_stdout.flush()
    os._exit(0)  # skip vLLM's teardown of the gloo group


if __name__ == "__main__" and "--driver" in sys.argv:
    _driver()
elif __name__ == "__main__" and "--write" in sys.argv:
    TABLE.write_text(generate())
