"""Which of vLLM 0.33's plain and sliding-window attention architectures follow the generic
rules, by vLLM's own model construction on the CPU (tests/test_models_generic.py, which
generates this file with ``--write`` and fails when it is stale; do not edit)."""

from __future__ import annotations

from collections.abc import Mapping

#: architecture -> (layer-name prefix, tail): layer i is ``{prefix}.{i}.{tail}``
GENERIC_ATTENTION: Mapping[str, tuple[str, str]] = {
    'ApertusForCausalLM': ('model.layers', 'self_attn.attn'),
    'Ernie4_5ForCausalLM': ('model.layers', 'self_attn.attn'),
    'Ernie4_5_MoeForCausalLM': ('model.layers', 'self_attn.attn'),
    'GemmaForCausalLM': ('model.layers', 'self_attn.attn'),
    'Glm4ForCausalLM': ('model.layers', 'self_attn.attn'),
    'GraniteForCausalLM': ('model.layers', 'self_attn.attn'),
    'HyperCLOVAXForCausalLM': ('model.layers', 'self_attn.attn'),
    'Ministral3ForCausalLM': ('model.layers', 'self_attn.attn'),
    'MixtralForCausalLM': ('model.layers', 'self_attn.attn'),
    'NemotronForCausalLM': ('model.layers', 'self_attn.attn'),
}
#: architecture -> why the generic rules are not taken for it
NOT_GENERIC: Mapping[str, str] = {
    'AfmoeForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'AfmoeConfig' object "
        "has no attribute 'score_func'"
    ),
    'BailingMoeForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'BailingMoeV2ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'BeamForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 32, 32, 4096, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 128, 128, 512, 'torch.bfloat16'] (name,"
        " kind, KV heads, head size, V, window, dtype)"
    ),
    'BloomForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['transformer.h.0.self_attention.attn', 'FullAttentionSpec', 8, 32, 32, None, 'torch.bfloat16'], "
        "generic ['transformer.h.0.self_attention.attn', 'FullAttentionSpec', 2, 32, 32, None, "
        "'torch.bfloat16'] (name, kind, KV heads, head size, V, window, dtype)"
    ),
    'ChatGLMForConditionalGeneration': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'ChatGLMModel': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Cohere2ForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 32, 32, 4097, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 32, 32, 4096, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'Cohere2MoeForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 128, 128, 4097, 'torch.bfloat16'], "
        "generic ['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 128, 128, 4096, "
        "'torch.bfloat16'] (name, kind, KV heads, head size, V, window, dtype)"
    ),
    'CohereForCausalLM': (
        "vLLM's layers differ from the generic rules (layer_types, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 64, 64, 128, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'DbrxForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'DbrxAttentionConfig' "
        "object has no attribute 'rope_theta'"
    ),
    'DeciLMForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'DomynEdgeForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'DoryForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Exaone4ForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader json): vLLM "
        "['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 64, 64, 4096, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'ExaoneForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'ExaoneMoEForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'ExaoneMoeForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader json): vLLM "
        "['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 64, 64, 4096, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'FalconForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['transformer.h.0.self_attention.attn', 'FullAttentionSpec', 1, 32, 32, None, 'torch.bfloat16'], "
        "generic ['transformer.h.0.self_attention.attn', 'FullAttentionSpec', 8, 32, 32, None, "
        "'torch.bfloat16'] (name, kind, KV heads, head size, V, window, dtype)"
    ),
    'FlintForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'GPT2LMHeadModel': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: '_OpNamespace' '_C' "
        "object has no attribute 'gelu_new'"
    ),
    'GPTJForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: ValueError: partial_rotary_factor=2.0 "
        "must be between 0.0 and 1.0"
    ),
    'Gemma3nForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader json): vLLM "
        "['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 64, 64, 512, 'torch.bfloat16'], generic "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'Gemma4ForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.layers.1.self_attn.attn', 'FullAttentionSpec', 2, 512, 512, None, 'torch.bfloat16'], "
        "generic ['model.layers.1.self_attn.attn', 'FullAttentionSpec', 2, 256, 256, None, "
        "'torch.bfloat16'] (name, kind, KV heads, head size, V, window, dtype)"
    ),
    'Glm4MoeForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'Glm4MoeConfig' object "
        "has no attribute 'head_dim'"
    ),
    'GraniteMoeForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'GraniteMoeSWAForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.layers.1.self_attn.attn', 'SlidingWindowSpec', 2, 32, 32, 128, 'torch.bfloat16'], generic "
        "['model.layers.1.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'GraniteMoeSharedForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'GraniteSWAForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader json): vLLM "
        "['model.layers.1.self_attn.attn', 'SlidingWindowSpec', 2, 64, 64, 128, 'torch.bfloat16'], generic "
        "['model.layers.1.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'HCXVisionV2ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'HYV3ForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: ValueError: first_k_dense_replace not "
        "exist,please check config"
    ),
    'HrmTextForCausalLM': (
        "its attention layers are not one per decoder layer under one name (defaults: "
        "['model.L_module.layers.0.self_attn.attn_per_step.0', "
        "'model.L_module.layers.0.self_attn.attn_per_step.1', "
        "'model.L_module.layers.0.self_attn.attn_per_step.2'])"
    ),
    'IQuestCoderForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'IQuestLoopCoderForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'InklingForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'InklingTextConfig' "
        "object has no attribute 'padded_vocab_size'"
    ),
    'InklingForConditionalGeneration': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: property 'hidden_size' "
        "of 'InklingMMConfig' object has no setter"
    ),
    'InternLM2ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'InternLM3ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'K2HorizonForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'LLaMAForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'LagunaForCausalLM': (
        "vLLM's layers differ from the generic rules (window, reader json): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'SlidingWindowSpec', 2, 64, 64, 128, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'Llama4ForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'Llama4Config' object "
        "has no attribute 'no_rope_layers'"
    ),
    'LongcatFlashNgramForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'MiMoForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'MiMoV2FlashForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'MiMoV2FlashConfig' "
        "object has no attribute 'hybrid_layer_pattern'"
    ),
    'MiMoV2ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'MiniCPM3ForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 8, 96, 96, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'MiniCPMForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'MiniMaxM2ForCausalLM': (
        "vLLM's construction of a 2-layer config (defaults) failed: AttributeError: 'MiniMaxM2Config' "
        "object has no attribute 'rotary_dim'"
    ),
    'MuseGlimmerForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'OPTForCausalLM': (
        "vLLM's layers differ from the generic rules (defaults, reader transformers): vLLM "
        "['model.decoder.layers.0.self_attn.attn', 'FullAttentionSpec', 8, 32, 32, None, 'torch.bfloat16'],"
        " generic ['model.decoder.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, "
        "'torch.bfloat16'] (name, kind, KV heads, head size, V, window, dtype)"
    ),
    'OlmoeForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'OrionForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Param2MoEForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'PhiMoEForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Plamo3ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Qwen2MoeForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'Rnj1ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'SolarForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'StableLmForCausalLM': (
        "vLLM's layers differ from the generic rules (head_dim, reader transformers): vLLM "
        "['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 32, 32, None, 'torch.bfloat16'], generic"
        " ['model.layers.0.self_attn.attn', 'FullAttentionSpec', 2, 64, 64, None, 'torch.bfloat16'] (name, "
        "kind, KV heads, head size, V, window, dtype)"
    ),
    'Step1ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Step3TextForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Step3p5ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'Step5ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'TeleChat2ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'TeleChat3ForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
    'TeleFLMForCausalLM': (
        "no transformers config class names it (its config needs vLLM's own config class or remote code), "
        "so the harness builds no config for it"
    ),
}
