"""Which of vLLM 0.33's plain, sliding-window and MLA architectures follow the generic rules
(or a named variation), by vLLM's own model construction on the CPU
(tests/test_models_generic.py, which generates this file with ``--write`` and fails when it
is stale; do not edit)."""

from __future__ import annotations

from collections.abc import Mapping

#: architecture -> (layer-name prefix, tail): layer i is ``{prefix}.{i}.{tail}``
GENERIC_ATTENTION: Mapping[str, tuple[str, str]] = {
    'AXK1ForCausalLM': ('model.layers', 'self_attn.attn'),
    'AfmoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'ApertusForCausalLM': ('model.layers', 'self_attn.attn'),
    'ArceeForCausalLM': ('model.layers', 'self_attn.attn'),
    'BailingMoeForCausalLM': ('model.layers', 'attention.attn'),
    'BailingMoeV2ForCausalLM': ('model.layers', 'attention.attn'),
    'BloomForCausalLM': ('transformer.h', 'self_attention.attn'),
    'ChatGLMForConditionalGeneration': ('transformer.encoder.layers', 'self_attention.attn'),
    'ChatGLMModel': ('transformer.encoder.layers', 'self_attention.attn'),
    'Cohere2ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Cohere2MoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'CohereForCausalLM': ('model.layers', 'self_attn.attn'),
    'CwmForCausalLM': ('model.layers', 'self_attn.attn'),
    'DbrxForCausalLM': ('transformer.blocks', 'norm_attn_norm.attn.attn'),
    'DeepseekForCausalLM': ('model.layers', 'self_attn.attn'),
    'Ernie4_5ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Ernie4_5_MoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'Exaone4ForCausalLM': ('model.layers', 'self_attn.attn'),
    'ExaoneForCausalLM': ('model.h', 'attn.attention.attn'),
    'ExaoneMoEForCausalLM': ('model.layers', 'self_attn.attn'),
    'ExaoneMoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'FalconForCausalLM': ('transformer.h', 'self_attention.attn'),
    'FlexOlmoForCausalLM': ('model.layers', 'self_attn.attn'),
    'GPT2LMHeadModel': ('transformer.h', 'attn.attn'),
    'GPTBigCodeForCausalLM': ('model.h', 'attn.attn'),
    'GPTJForCausalLM': ('transformer.h', 'attn.attn'),
    'GPTNeoXForCausalLM': ('model.layers', 'attention.attn'),
    'GemmaForCausalLM': ('model.layers', 'self_attn.attn'),
    'Glm4ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Glm4MoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'Glm4MoeLiteForCausalLM': ('model.layers', 'self_attn.attn'),
    'GlmForCausalLM': ('model.layers', 'self_attn.attn'),
    'GraniteForCausalLM': ('model.layers', 'self_attn.attn'),
    'GraniteMoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'GraniteMoeSWAForCausalLM': ('model.layers', 'self_attn.attn'),
    'GraniteMoeSharedForCausalLM': ('model.layers', 'self_attn.attn'),
    'GraniteSWAForCausalLM': ('model.layers', 'self_attn.attn'),
    'HYV3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'HunYuanDenseV1ForCausalLM': ('model.layers', 'self_attn.attn'),
    'HunYuanMoEV1ForCausalLM': ('model.layers', 'self_attn.attn'),
    'HyperCLOVAXForCausalLM': ('model.layers', 'self_attn.attn'),
    'IQuestCoderForCausalLM': ('model.layers', 'self_attn.attn'),
    'InternLM2ForCausalLM': ('model.layers', 'attention.attn'),
    'InternLM3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Jais2ForCausalLM': ('model.layers', 'self_attn.attn'),
    'K2HorizonForCausalLM': ('model.layers', 'self_attn.attn'),
    'Kolibri1ForCausalLM': ('model.layers', 'self_attn.attn'),
    'LLaMAForCausalLM': ('model.layers', 'self_attn.attn'),
    'LagunaForCausalLM': ('model.layers', 'self_attn.attn'),
    'Llama4ForCausalLM': ('model.layers', 'self_attn.attn'),
    'MellumForCausalLM': ('model.layers', 'self_attn.attn'),
    'MiniCPM3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'MiniCPMForCausalLM': ('model.layers', 'self_attn.attn'),
    'MiniMaxM2ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Ministral3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'MistralLarge3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'MixtralForCausalLM': ('model.layers', 'self_attn.attn'),
    'NemotronForCausalLM': ('model.layers', 'self_attn.attn'),
    'OPTForCausalLM': ('model.decoder.layers', 'self_attn.attn'),
    'Olmo2ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Olmo3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'OlmoForCausalLM': ('model.layers', 'self_attn.attn'),
    'OlmoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'OrionForCausalLM': ('model.layers', 'self_attn.attn'),
    'PanguUltraMoEForCausalLM': ('model.layers', 'self_attn.attn'),
    'Param2MoEForCausalLM': ('model.layers', 'self_attn.attn'),
    'PhiForCausalLM': ('model.layers', 'self_attn.attn'),
    'PhiMoEForCausalLM': ('model.layers', 'self_attn.attn'),
    'Qwen2MoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'SarvamMLAForCausalLM': ('model.layers', 'self_attn.attn'),
    'SarvamMoEForCausalLM': ('model.layers', 'attention.attn'),
    'SeedOssForCausalLM': ('model.layers', 'self_attn.attn'),
    'SmolLM3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'SolarForCausalLM': ('model.layers', 'self_attn.attn'),
    'StableLmForCausalLM': ('model.layers', 'self_attn.attn'),
    'Starcoder2ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Step3TextForCausalLM': ('.layers', 'self_attn.attn'),
    'Step3p5ForCausalLM': ('model.layers', 'self_attn.attn'),
    'TeleChat2ForCausalLM': ('model.layers', 'self_attn.attn'),
    'TeleChat3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'TeleFLMForCausalLM': ('model.layers', 'self_attn.attn'),
    'VaultGemmaForCausalLM': ('model.layers', 'self_attn.attn'),
}
#: architecture -> why the generic rules are not taken for it
NOT_GENERIC: Mapping[str, str] = {
    'HCXVisionV2ForCausalLM': (
        "not built by the harness: vLLM's ModelConfig refuses the small config (ValidationError), about 18 "
        "s"
    ),
    'HYV4ForCausalLM': (
        "kvlayout's generic rules refuse the defaults config (transformers): config.kv_lora_rank = None: "
        "missing; the MLA latent (head size kv_lora_rank + qk_rope_head_dim); vLLM 0.33 reads model_type "
        "'hy_v4' with its own config class: write it"
    ),
    'MiniMaxM3SparseForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: ValidationError: 1 validation error for"
        " ModelConfig"
    ),
    'MuseGlimmerForCausalLM': (
        "not built by the harness: a multimodal config whose text model takes its config class's defaults "
        "(3 and more layers, not the harness's 2), about 15 s per build"
    ),
    'NanbeigeForCausalLM': (
        "not built by the harness: vLLM serves it through its Transformers modeling backend, whose model is"
        " transformers' class of that name: the installed transformers has none, so vLLM builds it only "
        "from the checkpoint's remote code (auto_map), which kvlayout does not run"
    ),
    'Step5ForCausalLM': (
        "not built by the harness: vLLM's ModelConfig refuses the small config (ValidationError) after "
        "about 11 s"
    ),
}
