"""The architectures kvlayout reads and the family rule that builds each one's cache."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import spec_error
from ..spec import GroupSpec
from .attention import CAUSAL_LM_TYPES, TEXT_CONFIG_WRAPPERS, WRAPPERS, attention_family
from .base import Ctx
from .beam import beam_family
from .config import Config
from .deepseek_v4 import dsv4_family
from .domyn_edge import domyn_edge_family
from .dory import dory_family
from .flint import flint_family
from .gemma3n import gemma3n_family
from .gemma4 import gemma4_family
from .hrm_text import hrm_text_family
from .hybrid import MAMBA_ONLY, hybrid_family, mamba_only_family
from .inkling import inkling_family
from .iquest_loopcoder import iquest_loopcoder_family
from .kimi_linear import bailing_moe_v3_family, kimi_linear_family
from .longcat_flash import longcat_flash_family
from .mimo_v2 import mimo_v2_family
from .mla import mla_family
from .nemotron_nas import nemotron_nas_family
from .openpangu import openpangu_family
from .plamo3 import plamo3_family
from .registry_vllm import TEXT_GENERATION, TRANSFORMERS_BACKEND, VLLM_VERSION
from .rnj1 import rnj1_family
from .step1 import step1_family
from .vllm_checked import GENERIC_ATTENTION, NOT_GENERIC

# architecture -> family, by hand (the rules named in the modules)
NAMED_FAMILIES: Mapping[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    # vLLM's MiMoForCausalLM is its Qwen2ForCausalLM (mimo.py; the MTP weights dropped), its config a
    # Qwen2Config (config.REMOTE_PARENTS): a window only with use_sliding_window, as Qwen2's
    "MiMoForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Phi3ForCausalLM": "phi3",
    "FalconH1ForCausalLM": "falcon_h1",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    # GLM-5: vLLM 0.33 registers GlmMoeDsaForCausalLM as its DeepseekV32ForCausalLM (models/deepseek_v32)
    "GlmMoeDsaForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "JambaForCausalLM": "jamba",
    "NemotronHForCausalLM": "nemotron_h",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "Lfm2ForCausalLM": "lfm2",
    "Lfm2MoeForCausalLM": "lfm2",
    "OlmoHybridForCausalLM": "olmo_hybrid",
    "Zamba2ForCausalLM": "zamba2",
    # Mamba-only models: vLLM 0.33 registers them attention-free, but they hold Mamba states per block
    "MambaForCausalLM": "mamba",
    "FalconMambaForCausalLM": "mamba",
    "Mamba2ForCausalLM": "mamba2",
    "MiMoV2FlashForCausalLM": "mimo_v2",
    "MiMoV2ForCausalLM": "mimo_v2",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Gemma3nForCausalLM": "gemma3n",
    "Gemma3nForConditionalGeneration": "gemma3n",
    # Llama-3.1/3.3-Nemotron NAS models (51B, Super 49B, Ultra 253B): per-layer KV heads and no-op
    # attention from block_configs (vLLM 0.33's nemotron_nas.py; kvlayout/models/nemotron_nas.py)
    "DeciLMForCausalLM": "nemotron_nas",
    # PLaMo 3: layer i's window from interleaved_sliding_window[i] (vLLM 0.33's plamo3.py; plamo3.py here)
    "Plamo3ForCausalLM": "plamo3",
    # DomynEdge: layer i's head size per_layer_config[i].head_dim, window window_sizes[i][0] + 1 (none where
    # 0) (vLLM 0.33's domyn_edge.py; domyn_edge.py here)
    "DomynEdgeForCausalLM": "domyn_edge",
    # IQuest-Coder Loop: loop_num attentions per decoder layer, model.layers.{j * n + i}.self_attn.attn, the
    # later loops sliding over loop_window_size (vLLM 0.33's iquest_loopcoder.py; iquest_loopcoder.py here)
    "IQuestLoopCoderForCausalLM": "iquest_loopcoder",
    # Beam: read through vLLM's own BeamConfig (sliding_window 4096 and every layer sliding by default, head
    # size hidden_size // heads without head_dim), layer i sliding per layer_types (vLLM 0.33's
    # vllm/models/beam; beam.py here)
    "BeamForCausalLM": "beam",
    # Step 1: ALiBi layers with use_alibi_sqrt, built only on TRITON_ATTN; KV heads num_attention_groups, head
    # size hidden_size // heads, the engine's one window (vLLM 0.33's step1.py; step1.py here)
    "Step1ForCausalLM": "step1",
    # Rnj-1: chunked_attention layers slide over sliding_window (chunk_lookback 1), the others take the
    # engine's one window; built only on TRITON_ATTN (vLLM 0.33's rnj1.py; rnj1.py here)
    "Rnj1ForCausalLM": "rnj1",
    # Flint: read through vLLM's own FlintConfig (every layer full and a 513-token window by default), layer i
    # sliding per layer_types, built only on FLASHINFER with a bfloat16 cache (vLLM 0.33's vllm/models/flint;
    # flint.py here)
    "FlintForCausalLM": "flint",
    # openPangu Embedded and Pro-MoE-V2: standard attention (no MLA or sink fields written), layer i's window
    # from interleaved_sliding_window (an int, or a list at i % its length) (vLLM 0.33's openpangu.py;
    # openpangu.py here)
    "PanguEmbeddedForCausalLM": "openpangu",
    "PanguProMoEV2ForCausalLM": "openpangu",
    # HRM-Text: an L and an H stack run in cycles, one attention per (step, layer), model.{L,H}_module.layers.
    # {step * num_layers_per_stack + i}.self_attn.attn (vLLM 0.33's hrm_text.py; hrm_text.py here)
    "HrmTextForCausalLM": "hrm_text",
    # Dory: attention or MLP per layer (layer_types), the recurrent layers' loops each a cache of its own,
    # backbone.layers.{j * n + i}.mixer.attn, tp 1 only (vLLM 0.33's dory.py, read through vLLM's own
    # DoryConfig; dory.py here)
    "DoryForCausalLM": "dory",
    # Inkling and its multimodal wrapper: a short-conv state (a sliding-window cache of the kernel's tokens)
    # and an attention per decoder layer, model.layers.{i}.conv_state and .attn, local layers by
    # local_layer_ids (vLLM 0.33's vllm/models/inkling, read through its own InklingModelConfig; inkling.py)
    "InklingForCausalLM": "inkling",
    "InklingForConditionalGeneration": "inkling",
    # LongCat-Flash and its n-gram Lite: two MLA attentions per decoder layer, model.layers.{i}.self_attn.{j}
    # .attn (vLLM 0.33's longcat_flash.py and longcat_flash_ngram.py; longcat_flash.py here)
    "LongcatFlashForCausalLM": "longcat_flash",
    "LongcatFlashNgramForCausalLM": "longcat_flash",
    # Kimi-Linear: KDA states (1-based linear_attn_config.kda_layers) beside MLA layers, the block aligned to
    # a multiple of 128 tokens as vLLM 0.33 aligns an MLA hybrid's (vllm/models/kimi_k3; kimi_linear.py here)
    "KimiLinearForCausalLM": "kimi_linear",
    # AliceAI: the same KDA states beside Qwen3-Next's standard attention (layer_types), aligned as any
    # standard hybrid (vLLM 0.33's alice_ai.py; kimi_linear.py and hybrid.py here)
    "AliceAIForCausalLM": "alice_ai",
    # Bailing MoE V3: KDA by layer_group_size beside MLA, read by transformers' BailingHybridConfig (its
    # head_dim made qk_rope_head_dim), aligned as Kimi-Linear (vLLM 0.33's bailing_moe_v3.py; kimi_linear.py)
    "BailingMoeV3ForCausalLM": "bailing_moe_v3",
    # Kimi-K2.5: vLLM 0.33's kimi_k25.py builds its language model as DeepseekV2ForCausalLM under
    # ``language_model`` from the text_config (a DeepSeek-V3 MLA config, model_type kimi_k2, which
    # transformers' Kimi_K25Config, the class vLLM reads kimi_k25 with, makes deepseek_v3)
    "KimiK25ForConditionalGeneration": "deepseek_v3",
    # multimodal wrappers whose language model vLLM 0.33 builds as a fixed text architecture under
    # ``language_model`` (qwen2_vl.py, qwen2_5_vl.py: Qwen2ForCausalLM; qwen3_vl.py: Qwen3ForCausalLM;
    # qwen3_vl_moe.py: Qwen3MoeForCausalLM), read through the text config (tests/test_models_vl_vllm.py);
    # Qwen3-VL's text config classes have no use_sliding_window: family qwen3_vl (attention.py)
    "Qwen2VLForConditionalGeneration": "qwen2",
    "Qwen2_5_VLForConditionalGeneration": "qwen2",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl",
    # multimodal wrappers whose language model is the text config's own architecture: its family, found
    # when the config is read (text_architecture)
    **{w: "text_config" for w in TEXT_CONFIG_WRAPPERS},
}
#: the Qwen vision-language wrappers above (their vLLM modules import torchvision)
QWEN_VL: tuple[str, ...] = tuple(
    a for a in NAMED_FAMILIES if a.startswith(("Qwen2VL", "Qwen2_5_VL", "Qwen3VL"))
)
#: the multimodal architectures kvlayout reads (vLLM lists them apart from its text-generation registry)
MULTIMODAL: tuple[str, ...] = (
    "Gemma3ForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "Gemma3nForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Llama4ForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
    *QWEN_VL,
    *TEXT_CONFIG_WRAPPERS,
)
#: the vision-language wrappers read as a text architecture (their vLLM modules import torchvision)
VL_WRAPPERS: tuple[str, ...] = (*QWEN_VL, *TEXT_CONFIG_WRAPPERS)
#: registry kind -> the generic family of an architecture of that kind vLLM's construction confirms
GENERIC_BY_KIND: Mapping[str, str] = {
    "attention": "generic",
    "sliding-window": "generic_sw",
    "mla": "generic_mla",
}
#: architecture -> the cache kind vLLM 0.33's model builds where the registry's (its module's) differs:
#: DeepSeek-MoE's DeepseekV2 layers take plain attention for model_type ``deepseek`` (DeepseekAttention),
#: Sarvam-MoE is Bailing-MoE's plain attention in the ``sarvam`` module (whose other model is MLA),
#: LongCat-Flash-Lite is LongCat-Flash's MLA (its module builds longcat_flash.py's FlashModel, naming no
#: attention class)
BUILT_KINDS: Mapping[str, str] = {
    "DeepseekForCausalLM": "attention",
    "SarvamMoEForCausalLM": "attention",
    "LongcatFlashNgramForCausalLM": "mla",
}


#: every text-generation architecture vLLM 0.33 serves: its own model classes', then those its
#: Transformers modeling backend serves (registry_vllm.py; no architecture is in both)
SERVED: Mapping[str, tuple[str, str, tuple[str, ...]]] = {**TEXT_GENERATION, **TRANSFORMERS_BACKEND}


def built_kind(arch: str) -> str:
    """The cache kind of ``arch`` as vLLM 0.33 builds it (:data:`BUILT_KINDS`, else the registry's)."""
    return BUILT_KINDS.get(arch, SERVED[arch][1])


# architecture -> family: the named ones, then the plain and sliding-window attention architectures
# vLLM's own model construction shows to follow the generic rules (models/vllm_checked.py)
FAMILIES: Mapping[str, str] = {
    **NAMED_FAMILIES,
    **{a: GENERIC_BY_KIND[built_kind(a)] for a in GENERIC_ATTENTION},
    # a multimodal wrapper whose text model vLLM's construction confirms: that model's family
    **{w: GENERIC_BY_KIND[built_kind(t)] for w, t in WRAPPERS.items() if t in GENERIC_ATTENTION},
}
ARCHITECTURES = tuple(FAMILIES)
ATTENTION_FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_vl",
    "phi3",
    "gemma2",
    "gemma3",
    "gpt_oss",
    "generic",
    "generic_sw",
)
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "generic_mla")
HYBRID_FAMILIES = (
    "jamba", "nemotron_h", "falcon_h1", "qwen3_next", "qwen3_5", "granitemoehybrid", "lfm2", "olmo_hybrid",
    "zamba2", "alice_ai", *MAMBA_ONLY,
)

#: A family's rule: the groups, the KV cache dtype and the (main) block size.
FamilyRule = Callable[[Ctx], tuple[tuple[GroupSpec, ...], str, int]]


def architecture(top: Config) -> tuple[str, str]:
    archs = top.data.get("architectures")
    if archs is None:
        raise top.missing("architectures", "it names the model class the engine builds")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise spec_error(top.field("architectures"), archs, "must be a non-empty list of class names")
    arch = archs[0]
    if arch not in FAMILIES:
        raise spec_error(top.field("architectures[0]"), arch, refusal(arch))
    return arch, FAMILIES[arch]


#: Why an architecture vLLM serves has no rule here, by the kind of its cache (registry_vllm.py).
_NOT_YET = {
    "attention": "plain attention; the generic rules are not yet checked against vLLM's code for it",
    "sliding-window": "its sliding-window layout is not yet checked against vLLM's code for it",
    "mla": "its latent-attention cache is not yet checked against vLLM's code for it",
    "hybrid": "its Mamba / linear-attention states are not yet modeled",
    # vLLM's attention-free models still hold per-block states (Mamba's): none is left unmodeled today
    "attention-free": "vLLM registers it attention-free; its layers' per-block states are not yet modeled",
}


#: hybrids vLLM serves that kvlayout refuses, each with what it would have to model (vLLM 0.33's code)
HYBRID_REFUSALS: Mapping[str, str] = {
    "NemotronHPuzzleForCausalLM": (
        "its layers take per-layer configs (KV heads, windows, experts) from the remote-code config "
        "class's get_nemotron_h_config_for_layer over block_configs, which config.json alone does not give"
    ),
    "Qwen4ExpForCausalLM": (
        "several Mamba state layouts of different sizes (get_mamba_specs_from_config: vLLM aligns to the "
        "largest); kvlayout's hybrids have one state per model"
    ),
    "Glm5NextForCausalLM": (
        "sparse MLA layers holding an indexer cache and a tail cache each (Glm5NextIndexerCache, "
        "Glm5NextTailCache in vllm/models/glm5next) beside KDA layers (layer_types linear_attention): those "
        "caches are not modeled"
    ),
    "BailingMoeV2_5ForCausalLM": (
        "MLA attention beside lightning linear-attention states (MambaStateShapeCalculator."
        "linear_attention_state_shape): those states are not modeled (kvlayout's MLA hybrid alignment, to a "
        "multiple of 128 tokens, is modeled for KDA states only: Kimi-Linear, Bailing MoE V3)"
    ),
}


def refusal(arch: str) -> str:
    """The stated reason kvlayout refuses ``arch``."""
    row = SERVED.get(arch)
    if row is None:
        why = f"not one of vLLM {VLLM_VERSION}'s text-generation architectures"
        return f"unknown architecture ({why}); known: {', '.join(ARCHITECTURES)}"
    kind, module = built_kind(arch), row[0]
    if arch in TRANSFORMERS_BACKEND:
        module = f"{module}: its Transformers modeling backend"
    if arch in NOT_GENERIC:
        return (
            f"vLLM {VLLM_VERSION} serves it ({kind}, module {module}); kvlayout refuses it: the generic "
            f"rules were not shown to hold by vLLM's model construction: {NOT_GENERIC[arch]}"
        )
    why = HYBRID_REFUSALS.get(arch, _NOT_YET[kind])
    return f"vLLM {VLLM_VERSION} serves it ({kind}, module {module}); kvlayout refuses it: {why}"


def vllm_coverage() -> tuple[tuple[str, ...], int]:
    """The text-generation architectures of vLLM's registry kvlayout plans, and how many there are."""
    return tuple(sorted(a for a in TEXT_GENERATION if a in FAMILIES)), len(TEXT_GENERATION)


def transformers_backend_coverage() -> tuple[tuple[str, ...], int]:
    """The architectures vLLM serves through its Transformers modeling backend that kvlayout plans,
    and how many it serves so."""
    return tuple(sorted(a for a in TRANSFORMERS_BACKEND if a in FAMILIES)), len(TRANSFORMERS_BACKEND)


def family_rule(family: str) -> FamilyRule:
    """The function that builds ``family``'s groups."""
    if family in ATTENTION_FAMILIES:
        return attention_family
    if family in MLA_FAMILIES:
        return mla_family
    if family == "deepseek_v4":
        return dsv4_family
    if family == "mimo_v2":
        return mimo_v2_family
    if family == "gemma4":
        return gemma4_family
    if family == "gemma3n":
        return gemma3n_family
    if family == "nemotron_nas":
        return nemotron_nas_family
    if family == "plamo3":
        return plamo3_family
    if family == "domyn_edge":
        return domyn_edge_family
    if family == "iquest_loopcoder":
        return iquest_loopcoder_family
    if family == "beam":
        return beam_family
    if family == "step1":
        return step1_family
    if family == "rnj1":
        return rnj1_family
    if family == "flint":
        return flint_family
    if family == "openpangu":
        return openpangu_family
    if family == "hrm_text":
        return hrm_text_family
    if family == "dory":
        return dory_family
    if family == "inkling":
        return inkling_family
    if family == "longcat_flash":
        return longcat_flash_family
    if family == "kimi_linear":
        return kimi_linear_family
    if family == "bailing_moe_v3":
        return bailing_moe_v3_family
    if family in MAMBA_ONLY:
        return mamba_only_family
    return hybrid_family


def text_architecture(arch: str, top: Config, text: Config) -> tuple[str, str]:
    """The language model a :data:`TEXT_CONFIG_WRAPPERS` architecture builds (vLLM 0.33: the text config's
    ``architectures``, else transformers' causal-LM class of its ``model_type``) and its family; only an
    attention architecture kvlayout reads is taken."""
    if text is top:
        raise top.missing("text_config", f"{arch} builds its language model from it")
    archs = text.data.get("architectures")
    if archs is not None:
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise spec_error(text.field("architectures"), archs, "must be a non-empty list of class names")
        inner, field = archs[0], text.field("architectures[0]")
    else:
        mt = text.data.get("model_type")
        if mt is None:
            raise text.missing("model_type", f"{arch} builds the causal-LM class of this model type")
        if not isinstance(mt, str) or mt not in CAUSAL_LM_TYPES:
            why = f"valid: {', '.join(CAUSAL_LM_TYPES)} (or write the text config's architectures)"
            raise spec_error(text.field("model_type"), mt, why)
        inner, field = CAUSAL_LM_TYPES[mt], text.field("model_type")
    if inner in MULTIMODAL:  # a wrapper inside the wrapper: vLLM would build its whole multimodal model
        # (vision tower and all) from a text config; Llama 4's raised a KeyError (issue 25, tenth pass)
        why = f"{arch}'s language model must be a causal LM, not the multimodal architecture {inner}"
        raise spec_error(field, inner, why)
    family = FAMILIES.get(inner, "")
    if family not in ATTENTION_FAMILIES:
        why = (
            f"{arch}'s language model ({inner}) must be an attention architecture kvlayout reads "
            "(hybrid, MLA and other wrapped models are not checked against vLLM)"
        )
        raise spec_error(field, mt if archs is None else inner, why)
    return inner, family

