"""Standard attention: head size, KV heads per rank, sliding windows (vLLM 0.33's ModelConfig).

- Head size: ``head_dim``, else the config class's default where it fills one unlike the generic rule
  (``Config.class_default``: Gemma 2's 256), else ``hidden_size // num_attention_heads``. KV heads: the
  first of ``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num`` (two
  written with different values are refused: ModelConfig reads the first, most models' layers
  ``num_key_value_heads``), else the class's default (Mistral's 8), else ``num_attention_heads``; per rank
  ``max(1, total // tp)`` (replicated when fewer than tp; ``tp`` must divide the heads or be a
  multiple of them).
- Sliding windows: ``layer_types`` (``sliding_attention``/``full_attention``) when the config
  has it; else Gemma 2 alternates (even layers slide), Gemma 3 slides unless
  ``(i + 1) % sliding_window_pattern == 0``, Mistral slides everywhere when ``sliding_window`` is
  set. Qwen2/Qwen3 slide everywhere when ``use_sliding_window`` is true and
  ``max_window_layers`` is 0; vLLM refuses a window on some layers only
  (``Qwen2Model`` asserts ``max_window_layers == num_hidden_layers``, which then leaves all full).
  Qwen3-MoE and Phi-3 pass no per-layer window in vLLM: every layer takes the config's one window
  (``EngineArgs.create_engine_config``: the text config's ``sliding_window``, none when ``layer_types``
  are written and not all sliding), which Qwen3-MoE's config class drops unless ``use_sliding_window``
  is true (tests/test_models_vllm_truth.py). GPT-OSS slides on its even layers, and on the odd ones too
  (the engine's window) where the written ``layer_types`` are all sliding. A written null
  ``sliding_window`` leaves the sliding layers full (their window is it).
- The generic rules (the architectures of :mod:`.vllm_checked`, whose cache vLLM 0.33's own model
  construction shows to follow them). ``generic`` (registry kind ``attention``: the model passes no
  per-layer window): every layer takes the engine's one window, ``sliding_window`` when
  ``layer_types`` is absent or all ``sliding_attention`` (``EngineArgs.create_engine_config``),
  else none. ``generic_sw`` (kind ``sliding-window``): ``layer_types`` when written (a layer slides
  iff ``sliding_attention``), else every layer slides when ``sliding_window`` is set. Layer names
  as vLLM's model makes them (the table records the prefix and tail).
- Named variations of the generic rules (:data:`VARIATIONS`, one row per architecture, each shown by
  the same construction): KV heads from another source (Bloom, OPT, GPT-2, GPT-J: the query heads,
  ``num_key_value_heads`` ignored; Falcon: ``num_kv_heads`` with ``new_decoder_architecture``, else
  one with ``multi_query``, else the query heads; ChatGLM: ``multi_query_group_num`` with
  ``multi_query_attention``, else the query heads; DBRX: ``attn_config.kv_n_heads``); ``head_dim``
  ignored (head size ``hidden_size // num_attention_heads``: those and Falcon, Qwen2-MoE, OLMoE,
  StableLM, GraniteMoE, InternLM2, Orion, MiniCPM, DBRX, and the named Qwen2 and MiMo);
  windows: none at all (Falcon), the engine's one
  where the registry saw a per-layer one (Cohere, PhiMoE), per layer where it saw none
  (GraniteMoE-Shared, GraniteMoE-SWA), only with ``use_sliding_window`` true (Qwen2-MoE), one
  larger (Cohere 2: ``sliding_window + 1``, a layer sees ``[pos - window, pos]``); ``layer_types``
  required from a config read as written where the config class derives it (Cohere 2, AFMoE,
  EXAONE 4 and MoE, Granite-SWA, GraniteMoE-SWA); chunked local attention (Llama 4: a layer with
  RoPE, ``no_rope_layers[i] != 0``, attends within ``attention_chunk_size`` chunks, vLLM's
  ``ChunkedLocalAttentionSpec``; no window); windows only where ``layer_types`` says
  ``sliding_attention``, none without it (Laguna); KV heads the query heads and head size
  ``qk_nope_head_dim + qk_rope_head_dim`` (MiniCPM3: its decompressed latent heads, V padded to K);
  one ``model_type`` only, fields that change the attention refused (DeepSeek-MoE: ``deepseek``,
  whose layers vLLM builds as plain attention though its module is MLA; ``rswa_window`` refused).
  kvlayout's spec has no chunked kind: such a layer's page is full attention's (vLLM's
  ``AttentionSpec.page_size_bytes``), so it is a ``FullAttentionSpec`` labelled ``chunked``, and
  vLLM 0.33 (hybrid KV cache manager on by default,
  ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``) groups it apart from the full layers.
- Layers are named ``model.layers.{i}.self_attn.attn`` (GPT-OSS: ``attn.attn``), under
  ``language_model.`` for a ``...ForConditionalGeneration`` model (Llama 4's: :data:`WRAPPERS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import spec_error
from ..spec import DTYPE_SIZES, FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups
from .vllm_checked import GENERIC_ATTENTION

GENERIC_FAMILIES = ("generic", "generic_sw")


@dataclass(frozen=True)
class Variation:
    """How one architecture's vLLM model departs from the generic rules (module docstring)."""

    kv_heads: str = ""  # "": the generic fields; "heads": the query heads (KV fields ignored); "falcon",
    # "chatglm", "dbrx": their attention classes' rules; "one": one KV head, replicated on every rank;
    # "groups": num_attention_groups; "bigcode": GPT-BigCode's multi_query where no KV field is written
    head_dim: bool = True  # False: a written head_dim is ignored (hidden_size // num_attention_heads)
    window: str = ""  # "": the registry kind's; "engine": the engine's one; "layer": per layer; "none";
    # "types": only the sliding layers of layer_types (none without it)
    window_flag: str = ""  # a window counts only when this field is true (the config class drops it)
    window_offset: int = 0  # added to sliding_window
    layer_types: bool = False  # True: a config read as written must name its layer_types
    alternate: bool = False  # True: without layer_types the config class derives them alternating (even
    # layers below max_window_layers slide, with the window flag): two or more layers withhold the engine's
    chunked: bool = False  # True: layers with RoPE attend within chunks (Llama 4's ChunkedLocalAttention)
    head_size: str = ""  # "qk": qk_nope_head_dim + qk_rope_head_dim (MiniCPM3's decompressed MLA heads)
    head_dim_default: int = 0  # the head size without head_dim (vLLM's own config class's default)
    head_dim_required: bool = False  # True: head_dim must be written (the model reads it; no default)
    model_type: str = ""  # the rule holds for this model_type only (vLLM builds another attention for others)
    refused: tuple[tuple[str, str], ...] = ()  # (field, what vLLM does with it): refused when written


#: architecture -> its variation of the generic rules (tests/test_models_generic.py shows each one)
VARIATIONS: Mapping[str, Variation] = {
    "BloomForCausalLM": Variation(kv_heads="heads", head_dim=False),
    "OPTForCausalLM": Variation(kv_heads="heads", head_dim=False),
    "GPT2LMHeadModel": Variation(kv_heads="heads", head_dim=False),
    "GPTJForCausalLM": Variation(kv_heads="heads", head_dim=False),
    "FalconForCausalLM": Variation(kv_heads="falcon", head_dim=False, window="none"),
    "ChatGLMModel": Variation(kv_heads="chatglm", head_dim=False),
    "ChatGLMForConditionalGeneration": Variation(kv_heads="chatglm", head_dim=False),
    "MiniCPMForCausalLM": Variation(head_dim=False),
    "Qwen2MoeForCausalLM": Variation(head_dim=False, window_flag="use_sliding_window", alternate=True),
    "OlmoeForCausalLM": Variation(head_dim=False),
    "StableLmForCausalLM": Variation(head_dim=False),
    "GraniteMoeForCausalLM": Variation(head_dim=False),
    "GraniteMoeSharedForCausalLM": Variation(head_dim=False, window="layer"),
    "InternLM2ForCausalLM": Variation(head_dim=False),
    "OrionForCausalLM": Variation(head_dim=False),
    "CohereForCausalLM": Variation(window="engine"),
    "PhiMoEForCausalLM": Variation(window="engine"),
    "Cohere2ForCausalLM": Variation(window_offset=1, layer_types=True),
    "Cohere2MoeForCausalLM": Variation(window_offset=1, layer_types=True),
    "AfmoeForCausalLM": Variation(layer_types=True),
    "Exaone4ForCausalLM": Variation(layer_types=True),
    "ExaoneMoEForCausalLM": Variation(layer_types=True),
    "ExaoneMoeForCausalLM": Variation(layer_types=True),
    "GraniteSWAForCausalLM": Variation(layer_types=True),
    "GraniteMoeSWAForCausalLM": Variation(head_dim=False, window="layer", layer_types=True),
    "Llama4ForCausalLM": Variation(window="none", chunked=True),
    "DbrxForCausalLM": Variation(kv_heads="dbrx", head_dim=False),
    "LagunaForCausalLM": Variation(window="types"),
    "MiniCPM3ForCausalLM": Variation(kv_heads="heads", head_size="qk"),
    # Step 3's text model: one KV head (Step3TextAttention), head_dim 256 unless written (vLLM's
    # Step3TextConfig, which it reads model_type step3_text through)
    "Step3TextForCausalLM": Variation(kv_heads="one", head_dim_default=256, model_type="step3_text"),
    # served by vLLM's Transformers modeling backend (transformers/base.py: a window on layer_types'
    # sliding layers), whose transformers config classes derive layer_types when it is not written
    # (OLMo 3, VaultGemma, CWM, Kolibri 1: sliding layers by a pattern; Mellum: all full; SmolLM3: by
    # use_sliding_window and no_rope_layers)
    **{
        a: Variation(layer_types=True)
        for a in (
            "Olmo3ForCausalLM", "VaultGemmaForCausalLM", "CwmForCausalLM", "Kolibri1ForCausalLM",
            "MellumForCausalLM", "SmolLM3ForCausalLM",
        )
    },
    # GPT-BigCode (Transformers backend): one KV head with multi_query unless a KV field is written
    "GPTBigCodeForCausalLM": Variation(kv_heads="bigcode"),
    # HunYuan (Transformers backend): transformers' HunYuan attention reads head_dim, which its config
    # classes leave None (vLLM's construction fails: None ** -0.5)
    "HunYuanDenseV1ForCausalLM": Variation(head_dim_required=True),
    "HunYuanMoEV1ForCausalLM": Variation(head_dim_required=True),
    # GLM-4.5 / 4.6: vLLM's Glm4MoeDecoderLayer reads config.head_dim, which transformers' Glm4MoeConfig does
    # not define (its construction fails without it; planned with hidden_size // heads before pass 36)
    "Glm4MoeForCausalLM": Variation(head_dim_required=True),
    # Step 3.5: KV heads num_attention_groups; windows only by layer_types (the engine's one is cleared)
    "Step3p5ForCausalLM": Variation(kv_heads="groups", layer_types=True),
    # DeepSeek-MoE: vLLM's DeepseekV2DecoderLayer takes DeepseekAttention for model_type "deepseek"
    # (num_key_value_heads, hidden_size // num_attention_heads; no per-layer window)
    "DeepseekForCausalLM": Variation(
        head_dim=False,
        model_type="deepseek",
        refused=(("rswa_window", "vLLM's DeepseekAttention then builds RSWAAttention (not modelled)"),),
    ),
}
NO_VARIATION = Variation()
#: a named family -> its variation: vLLM 0.33's Qwen2Attention takes hidden_size // num_attention_heads
#: and never reads head_dim (MiMo is vLLM's Qwen2ForCausalLM: the named qwen2 family too)
NAMED_VARIATIONS: Mapping[str, Variation] = {"qwen2": Variation(head_dim=False)}
#: a multimodal architecture -> the text architecture whose model it builds as ``language_model`` from
#: its ``text_config`` (vLLM 0.33's mllama4.py: ``Llama4ForCausalLM`` under ``language_model``); its
#: layers are that architecture's, named ``language_model.{name}``
WRAPPERS: Mapping[str, str] = {"Llama4ForConditionalGeneration": "Llama4ForCausalLM"}
#: multimodal architectures whose language model vLLM 0.33 builds from the text config's own architecture
#: (llava.py, llava_next.py, llava_onevision.py, mistral3.py: ``init_vllm_registered_model`` with
#: ``hf_config=config.text_config``; ``VllmConfig.with_hf_config`` takes its ``architectures``, else
#: transformers' causal-LM class of its ``model_type``), under ``language_model``
TEXT_CONFIG_WRAPPERS: tuple[str, ...] = (
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
)
#: a text config's ``model_type`` -> transformers' causal-LM class for it (its
#: ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, tests/test_models_vl_vllm.py), for the attention architectures
#: such a wrapper's published checkpoints name
CAUSAL_LM_TYPES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


@dataclass(frozen=True)
class Attention:
    heads: int  # query heads (total)
    kv_heads: int  # KV heads per rank
    head_size: int


#: the KV-head fields vLLM's ModelConfig reads, first found first (written with two values: refused)
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")


def _kv_total(cfg: Config, heads: int, how: str) -> tuple[int, str]:
    """The total KV heads and the field they came from, by the generic fields or variation ``how``."""
    if how == "heads":
        return heads, "num_attention_heads"
    if how == "bigcode" and not any(cfg.has(key) for key in KV_HEAD_KEYS):
        # GPTBigCodeConfig.__post_init__: num_key_value_heads = 1 if multi_query else n_head (a KV field
        # written wins: set after it), which vLLM's ModelConfig and Transformers-backend layers take
        if cfg.req_bool("multi_query", "GPT-BigCode's KV heads without num_key_value_heads"):
            return 1, "multi_query"
        return heads, "num_attention_heads"
    if how == "one":  # Step3TextAttention: num_kv_heads=1 whatever the config writes
        return 1, "num_attention_heads"
    if how == "groups":  # Step3p5DecoderLayer: num_attention_groups (num_key_value_heads in transformers)
        total = cfg.req_int("num_attention_groups", "the KV heads of Step 3.5's layers")
        other = cfg.opt_int("num_key_value_heads")
        if other is not None and other != total:  # vLLM's Step3p7TextConfig keeps num_attention_groups
            cfg.notes.append(
                f"{cfg.field('num_key_value_heads')} = {other} ignored: vLLM's config class sets it to "
                f"num_attention_groups = {total}, the KV heads its layers take"
            )
        return total, "num_attention_groups"
    if how == "chatglm":  # vLLM's GLMAttention
        if cfg.req_bool("multi_query_attention", "ChatGLM's KV heads depend on it"):
            return cfg.req_int("multi_query_group_num", "the KV heads with multi_query_attention"), (
                "multi_query_group_num"
            )
        return heads, "num_attention_heads"
    if how == "dbrx":  # vLLM's DbrxAttention and ModelConfig: attn_config.kv_n_heads
        attn = cfg.data.get("attn_config")
        if not isinstance(attn, Mapping):
            raise spec_error(cfg.field("attn_config"), attn, "must be an object holding kv_n_heads")
        sub = Config(attn, cfg.field("attn_config"), completed=cfg.completed, final=cfg.final)
        return sub.req_int("kv_n_heads", "DBRX's KV heads"), "attn_config.kv_n_heads"
    if how == "falcon":  # vLLM's FalconAttention
        if cfg.req_bool("new_decoder_architecture", "Falcon's KV heads depend on it"):
            return cfg.req_int("num_kv_heads", "the KV heads of the new decoder architecture"), "num_kv_heads"
        if cfg.req_bool("multi_query", "Falcon has one KV head with multi_query"):
            return 1, "multi_query"
        return heads, "num_attention_heads"
    found = [(key, cfg.req_int(key, "")) for key in KV_HEAD_KEYS if cfg.has(key)]
    for key, total in found[1:]:  # ModelConfig takes the first, most models' layers num_key_value_heads
        if total != found[0][1]:
            why = f"differs from {found[0][0]} = {found[0][1]} (vLLM's layers and ModelConfig read either)"
            raise spec_error(cfg.field(key), total, why)
    if found:
        return found[0][1], found[0][0]
    for key in KV_HEAD_KEYS:  # none written: the config class's default, where it fills one (Mistral's 8)
        value = cfg.class_default(key)
        if value is not None:
            return value, key
    return heads, "num_attention_heads"


def read_attention(
    cfg: Config,
    tp: int,
    *,
    head_keys: Sequence[str] = ("head_dim",),
    variation: Variation = NO_VARIATION,
    built: bool = True,
) -> Attention:
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {tp}")
    total, kv_key = _kv_total(cfg, heads, variation.kv_heads)
    if built and total > heads:  # vLLM's Attention asserts num_heads % num_kv_heads == 0 per rank (a
        # hybrid with no attention layer builds none: ``built`` false); 2**40 KV heads were blamed on
        # num_blocks (the layout's size) before (issue 25, nineteenth pass)
        why = f"more than num_attention_heads = {heads}: each KV head serves whole query heads"
        raise spec_error(cfg.field(kv_key), total, why)
    if built and total >= tp and total % tp:  # (no attention layer built: vLLM's alignment takes
        raise spec_error(cfg.field(kv_key), total, f"not divisible by tp = {tp}")  # max(1, total // tp))
    if built and total < tp and tp % total:
        raise spec_error(
            cfg.field(kv_key), total, f"tp = {tp} is not a multiple of it (KV heads are replicated)"
        )
    if built and (heads // tp) % max(1, total // tp):  # vLLM's Attention asserts it (per
        # rank): Qwen2Config's default of 32 KV heads beside 28 query heads was planned, vLLM refuses it
        why = f"the {heads // tp} query heads per rank are not a multiple of its {max(1, total // tp)}"
        raise spec_error(cfg.field(kv_key), total, f"{why} (vLLM's Attention asserts it)")
    head_size = None
    if variation.head_size == "qk":  # MiniCPM3Attention: K and V of nope + rope channels, V padded to it
        why = "MiniCPM3's head size is qk_nope_head_dim + qk_rope_head_dim"
        head_size = cfg.req_int("qk_nope_head_dim", why) + cfg.req_int("qk_rope_head_dim", why)
    if variation.head_dim_required and not cfg.has("head_dim"):  # no reader has a default for it
        why = "missing; this model's attention reads it and its config class has no default"
        raise spec_error(cfg.field("head_dim"), None, why)
    for key in head_keys if variation.head_dim and head_size is None else ():
        if cfg.has(key):
            head_size = cfg.req_int(key, "")
            break
    if head_size is None and variation.head_dim and variation.head_dim_default:
        head_size = variation.head_dim_default
    if head_size is None and variation.head_dim and "head_dim" in head_keys:
        head_size = cfg.class_default("head_dim")  # the config class's (Gemma 2's 256), where it fills one
    if head_size is None:
        hidden = cfg.req_int(
            "hidden_size", f"the head size is hidden_size // num_attention_heads without {head_keys[0]}"
        )
        head_size = hidden // heads
        if head_size < 1:  # no head size: hybrids divided by the 0-byte page (issue 25)
            why = f"below num_attention_heads = {heads}: the head size hidden_size // heads is 0"
            raise spec_error(cfg.field("hidden_size"), hidden, why)
    _check_as_transformers(cfg, heads)
    return Attention(heads, max(1, total // tp), head_size)


def _check_as_transformers(cfg: Config, heads: int) -> None:
    """What transformers' config class refuses in the fields read here, checked without transformers (the
    json reader; with transformers installed the default reader runs the class itself): a ``hidden_size``
    the heads do not divide where the class validates it (:data:`.config.HEADS_DIVIDE_HIDDEN`,
    ``LlamaConfig.validate_architecture``), and an odd written ``head_dim`` above 4 fully rotated by RoPE
    (``RotaryEmbeddingConfigMixin.validate_rope`` in ``modeling_rope_utils``: "RoPE requires an even rotary
    dimension"; the config writes RoPE: ``rope_theta``, ``rope_scaling`` or ``rope_parameters``). vLLM
    0.33 reads the config through that class and fails to load it."""
    from .config import HEADS_DIVIDE_HIDDEN, _transformers_reads

    mt = cfg.model_type
    read_as = _transformers_reads(mt) if mt is not None else None
    if read_as is None or cfg.completed:
        return
    if read_as in HEADS_DIVIDE_HIDDEN and cfg.has("hidden_size"):
        hidden = cfg.req_int("hidden_size", "")
        if hidden % heads:
            why = (
                f"does not divide hidden_size = {hidden}: transformers' config class for {read_as!r} refuses "
                "it (validate_architecture), and vLLM 0.33 reads the config through it"
            )
            raise spec_error(cfg.field("num_attention_heads"), heads, why)
    rope = next((cfg.data[k] for k in ("rope_parameters", "rope_scaling") if cfg.has(k)), None)
    if not cfg.has("head_dim") or not (rope is not None or cfg.has("rope_theta")):
        return
    head_dim = cfg.req_int("head_dim", "")
    factor = cfg.data.get("partial_rotary_factor", 1.0)
    where = cfg.field("partial_rotary_factor")
    if isinstance(rope, Mapping) and "partial_rotary_factor" in rope:
        factor = rope["partial_rotary_factor"]
        where = cfg.field(next(k for k in ("rope_parameters", "rope_scaling") if cfg.has(k))) + (
            ".partial_rotary_factor"
        )
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return  # transformers refuses the factor itself: not a check on the fields read here
    if isinstance(factor, float) and not math.isfinite(head_dim * factor):  # NaN, Infinity, 1e308
        why = f"head_dim ({head_dim}) times it must be finite (the rotary dimension: validate_rope)"
        raise spec_error(where, factor, why)
    if head_dim > 4 and head_dim % 2 and int(head_dim * factor) == head_dim:
        why = (
            f"odd, and RoPE rotates all of it (partial_rotary_factor {factor}): transformers refuses it "
            "(validate_rope: RoPE requires an even rotary dimension), and vLLM 0.33 reads the config "
            "through it"
        )
        raise spec_error(cfg.field("head_dim"), head_dim, why)


def token_bytes(att: Attention, kv_dtype: str) -> int:
    """K plus V of one token on one rank."""
    return 2 * att.kv_heads * att.head_size * DTYPE_SIZES[kv_dtype]


def layer_types(cfg: Config, family: str, n: int, variation: Variation = NO_VARIATION) -> list[str]:
    """``"full"`` or ``"sliding"`` per layer, by the family's rule (module docstring)."""
    if family in GENERIC_FAMILIES:
        if variation.chunked:
            return _chunked_types(cfg, n)
        if variation.window == "none":
            return ["full"] * n
        if variation.window == "types":  # only layer_types' sliding layers slide (LagunaAttention)
            return _written_or_family_types(cfg, family, n) if cfg.has("layer_types") else ["full"] * n
        family = {"engine": "generic", "layer": "generic_sw"}.get(variation.window, family)
        if variation.layer_types and not cfg.has("layer_types"):
            raise cfg.missing("layer_types", "this model's config class derives which layers slide")
        flag = variation.window_flag
        if flag and cfg.has("sliding_window") and not cfg.req_bool(flag, "the window counts only when true"):
            return ["full"] * n
        if variation.alternate and not cfg.has("layer_types") and n > 1:
            # Qwen2MoeConfig derives layer_types with layer 1 full: not all sliding, so the engine's one
            # window is withheld from every layer (issue 25, pass 24: planned all sliding)
            return ["full"] * n
        if variation.alternate and not cfg.has("layer_types") and cfg.has("sliding_window"):
            # one layer: it slides only below max_window_layers (pass 25: a max_window_layers of 0
            # derives ["full_attention"], withholding the engine's window; planned sliding)
            why = "Qwen2MoeConfig derives layer_types from it: layers below it slide"
            if cfg.req_int("max_window_layers", why, lo=0) < 1:
                return ["full"] * n
    if family in ("qwen2", "qwen3"):
        return _qwen2_types(cfg, n)
    if family == "qwen3_moe":  # no per-layer window: the engine's one, which mixed layer_types withhold
        # and Qwen3MoeConfig drops unless use_sliding_window (layer_types were read as the layers': pass 22)
        on = cfg.data.get("use_sliding_window") is True
        if on and "sliding_window" not in cfg.data:  # the class's 4,096 where read through it (pass 24)
            raise cfg.missing("sliding_window", "Qwen3-MoE's one window, with use_sliding_window true")
        on = on and cfg.has("sliding_window")
        if on and cfg.has("layer_types"):  # the engine's window: every entry sliding_attention, none read
            # as a kind (transformers' class keeps any strings; other entries only withhold it: pass 24)
            types = cfg.req_list("layer_types", "", n, str, exact=True)
            on = all(t == "sliding_attention" for t in types)
        return ["sliding" if on else "full"] * n
    if family == "gpt_oss":
        # GptOssAttention: even layers pass sliding_window, odd ones none, so they take the engine's one
        # window: sliding_window when the written layer_types are all sliding (pass 24; pass 22: the even
        # layers whatever layer_types say). Without them GptOssConfig derives alternating types: none.
        engine = cfg.has("layer_types") and _written_or_family_types(cfg, family, n) == ["sliding"] * n
        return ["sliding" if i % 2 == 0 or engine else "full" for i in range(n)]
    if family == "qwen3_vl":  # its text config classes have no use_sliding_window: the engine's one window
        family = "generic"
    if family == "generic":  # the engine's one window, on every layer
        types = _written_or_family_types(cfg, family, n) if cfg.has("layer_types") else ["sliding"]
        return ["sliding" if cfg.has("sliding_window") and set(types) == {"sliding"} else "full"] * n
    if family in ("generic_sw", "llama") and not cfg.has("layer_types"):
        # LlamaAttention passes a window only by layer_types: without them every layer takes the engine's
        return ["sliding" if cfg.has("sliding_window") else "full"] * n
    if family in ("generic_sw", "llama", "mistral"):
        refuse_draft_offset(cfg)
    return _written_or_family_types(cfg, family, n)


def refuse_draft_offset(cfg: Config) -> None:
    """Refuse an EAGLE-3 draft's ``target_layer_count`` beside ``layer_types``: vLLM's ``LlamaAttention``
    then reads layer ``i``'s type at ``i - target_layer_count`` (wrapping below 0; a null fails), so
    other layers slide than the ones written (issue 25, pass 25: planned layer 0 sliding where vLLM
    slid layer 1)."""
    if "target_layer_count" in cfg.data and cfg.data.get("layer_types"):
        why = (
            "an EAGLE-3 draft's field: vLLM's LlamaAttention then reads layer i's layer_types entry at "
            "i - target_layer_count; kvlayout plans target models: drop it"
        )
        raise spec_error(cfg.field("target_layer_count"), cfg.data["target_layer_count"], why)


def kv_per_rank(where: str, total: int, heads: int, tp: int) -> int:
    """KV heads per rank, ``max(1, total // tp)``, with vLLM's assertions: split when at least tp (tp
    divides them), replicated when fewer (they divide tp), and whole query heads per KV head on a rank."""
    if total >= tp and total % tp:
        raise spec_error(where, total, f"not divisible by tp = {tp}")
    if total < tp and tp % total:
        raise spec_error(where, total, f"tp = {tp} is not a multiple of it (KV heads are replicated)")
    per_rank = max(1, total // tp)
    if (heads // tp) % per_rank:
        why = (
            f"the {heads // tp} query heads per rank are not a multiple of its {per_rank} (vLLM's Attention)"
        )
        raise spec_error(where, total, why)
    return per_rank


def chunk_size(cfg: Config) -> int | None:
    """Llama 4's ``attention_chunk_size`` (written null: no chunked layers), required as written."""
    if "attention_chunk_size" not in cfg.data:
        raise cfg.missing("attention_chunk_size", "Llama 4's RoPE layers attend within chunks of it")
    return cfg.opt_int("attention_chunk_size")


def _chunked_types(cfg: Config, n: int) -> list[str]:
    """Llama 4 (vLLM's ``Llama4Attention``): layer i is chunked local attention when
    ``no_rope_layers[i]`` is not 0 and ``attention_chunk_size`` is set, else full; no sliding window.
    An empty, null or absent ``no_rope_layers`` is transformers' default, a NoPE layer every
    ``no_rope_layer_interval`` layers (``Llama4TextConfig``)."""
    chunk = chunk_size(cfg)
    marks = cfg.data.get("no_rope_layers")  # null, [] or absent: transformers' default by the interval
    if isinstance(marks, list) and not marks or (marks is None and cfg.has("no_rope_layer_interval")):
        every = cfg.req_int(
            "no_rope_layer_interval", "layer i has RoPE unless (i + 1) % no_rope_layer_interval == 0"
        )
        rope = [(i + 1) % every != 0 for i in range(n)]
    else:
        marks = cfg.req_list("no_rope_layers", "0 marks a NoPE (full attention) layer", n, int)
        rope = [x != 0 for x in marks]
    return ["chunked" if chunk and r else "full" for r in rope]


def _qwen2_types(cfg: Config, n: int) -> list[str]:
    """vLLM's Qwen2Model (Qwen3 too) passes no per-layer window: every layer takes the engine's one
    window, ``sliding_window`` when every layer type is ``sliding_attention`` and the config class keeps
    it (``Qwen2Config`` drops it unless ``use_sliding_window`` is true, and derives absent
    ``layer_types`` from ``max_window_layers``), else none. Types that differ are refused unless
    ``max_window_layers == num_hidden_layers`` (its assertion), which then leaves every layer full."""
    if cfg.has("layer_types"):
        types = _written_or_family_types(cfg, "qwen2", n)
        if types == ["sliding"] * n and not cfg.req_bool(
            "use_sliding_window", "Qwen2Config drops the window unless use_sliding_window is true"
        ):
            return ["full"] * n  # its layer_types said sliding (issue 25, pass 22 audit: all slid)
    elif not cfg.req_bool("use_sliding_window", "Qwen2/Qwen3 slide only when use_sliding_window is true"):
        return ["full"] * n
    elif "sliding_window" in cfg.data and cfg.data["sliding_window"] is None:
        return ["full"] * n  # Qwen2Config derives every layer full from a null window
    else:
        first = cfg.req_int("max_window_layers", "layers from max_window_layers on slide", lo=0)
        types = ["sliding" if i >= first else "full" for i in range(n)]
    if len(set(types)) > 1:
        mwl = cfg.opt_int("max_window_layers", lo=0)
        if mwl != n:
            why = f"vLLM 0.33 refuses a sliding window on some layers only (Qwen2Model: must equal {n})"
            raise spec_error(cfg.field("max_window_layers"), mwl, why)
        return ["full"] * n
    return types


def _written_or_family_types(cfg: Config, family: str, n: int) -> list[str]:
    if cfg.has("layer_types"):
        raw = cfg.req_list("layer_types", "", n, str, exact=True)
        out = []
        for i, t in enumerate(raw):
            if t not in ("sliding_attention", "full_attention"):
                raise spec_error(
                    f"{cfg.field('layer_types')}[{i}]", t, "valid: sliding_attention, full_attention"
                )
            out.append("sliding" if t == "sliding_attention" else "full")
        return out
    if family == "gemma2":
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    if family == "gemma3":
        p = cfg.req_int(
            "sliding_window_pattern",
            "Gemma 3 slides unless (i + 1) % sliding_window_pattern == 0 "
            "(transformers' default is 6: write it into config.json)",
        )
        return ["full" if (i + 1) % p == 0 else "sliding" for i in range(n)]
    if family == "phi3":  # vLLM's Phi-3 is its Llama: the config's one window for every layer
        return ["sliding" if cfg.has("sliding_window") else "full"] * n
    if family == "mistral":
        if "sliding_window" not in cfg.data:
            raise cfg.missing("sliding_window", "null for full attention (transformers' default is 4096)")
        return ["full"] * n if cfg.data["sliding_window"] is None else ["sliding"] * n
    return ["full"] * n


def _written_for(cfg: Config, var: Variation) -> None:
    """Refuse a config the variation's rule does not hold for: another ``model_type`` than its own,
    or a field written that makes vLLM build another attention."""
    if var.model_type and cfg.data.get("model_type") != var.model_type:
        why = (
            f"this rule is vLLM 0.33's attention for model_type {var.model_type!r} only "
            "(the model class builds another attention for other types)"
        )
        raise spec_error(cfg.field("model_type"), cfg.data.get("model_type"), why)
    for key, why in var.refused:
        if cfg.has(key):
            raise spec_error(cfg.field(key), cfg.data[key], why)


def attention_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    arch = c.text_arch or c.top.data["architectures"][0]
    arch = WRAPPERS.get(arch, arch)
    if c.family in GENERIC_FAMILIES:
        var = VARIATIONS.get(arch, NO_VARIATION)
    else:
        var = NAMED_VARIATIONS.get(c.family, NO_VARIATION)
    _written_for(c.cfg, var)
    att = read_attention(c.cfg, c.tp, variation=var)
    if c.family == "gpt_oss" and c.cfg.req_int("num_key_value_heads", "KV heads") < c.tp:
        # GptOssAttention divides the KV heads by tp without replicating them: vLLM fails (modulo by zero)
        kv_heads = c.cfg.req_int("num_key_value_heads", "KV heads")
        why = f"fewer than tp = {c.tp}: vLLM's GptOssAttention does not replicate KV heads (0 per rank)"
        raise spec_error(c.cfg.field("num_key_value_heads"), kv_heads, why)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    types = layer_types(c.cfg, c.family, n, var)
    null_window = "sliding_window" in c.cfg.data and c.cfg.data["sliding_window"] is None
    if var.window_offset and "sliding" in types and null_window:
        # Cohere 2's sliding layers take sliding_window + 1: vLLM's construction fails on a null (pass 24)
        why = (
            f"its sliding layers take sliding_window + {var.window_offset} (vLLM fails on a null window; "
            "ModelConfig reads a written 0 as null)"
        )
        raise spec_error(c.cfg.field("sliding_window"), None, why)
    if "sliding" in types and null_window:
        # the sliding layers pass config.sliding_window as their window (Gemma 2 / 3, GPT-OSS, Llama's
        # layer_types, ...), and the engine's is the same null: full attention (pass 22: refused as missing)
        types = ["full" if t == "sliding" else t for t in types]
        c.notes.append("sliding_window is null: every layer is full attention (vLLM passes the null window)")
    window = 0
    if "sliding" in types:
        window = c.cfg.req_int("sliding_window", "the window of the sliding layers") + var.window_offset
    if "chunked" in types:  # vLLM's ChunkedLocalAttentionSpec: full attention's page, its own groups
        c.notes.append(
            f"chunked local attention ({chunk_size(c.cfg):,}-token chunks) on "
            f"{types.count('chunked')} of {n} layers: full attention's pages, in groups of their own"
        )
    tail = "attn.attn" if c.family == "gpt_oss" else "self_attn.attn"
    if c.family in GENERIC_FAMILIES:
        tail = GENERIC_ATTENTION[arch][1]
    bucket: dict[str, list[LayerSpec]] = {}
    for i, t in enumerate(types):
        name = c.name(i, tail)
        if t == "sliding":
            layer: LayerSpec = SlidingWindowSpec(
                name=name,
                block_size=bs,
                num_kv_heads=att.kv_heads,
                head_size=att.head_size,
                dtype=kv,
                window=window,
            )
        else:  # full, or chunked local (kvlayout's spec has no chunked kind: its page is full attention's)
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=att.kv_heads, head_size=att.head_size, dtype=kv
            )
        c.add(t, layer, bucket)
    return vllm_groups(list(bucket.items())), kv, bs
