"""HRM-Text (``HrmTextForCausalLM``, model_type ``hrm_text``; vLLM 0.33's ``hrm_text.py``, read through
transformers' ``HrmTextConfig``).

- Two stacks of ``num_layers_per_stack`` layers, L and H, run in cycles: the L stack at steps
  ``h * (L_cycles + 1) + l`` (``h < H_cycles``, ``l < L_cycles``), the H stack at ``h * (L_cycles + 1) +
  L_cycles``. Every (step, layer) holds its own attention and cache (``HrmTextAttention``'s
  ``attn_per_step``), named ``model.{L,H}_module.layers.{step * num_layers_per_stack + i}.self_attn.attn``,
  built stack by stack, layer by layer, step by step.
- ``HrmTextConfig`` sets ``num_layers_per_stack`` to the written ``num_hidden_layers`` where it is null or
  left out (and rewrites ``num_hidden_layers`` to the total of attention invocations); ``H_cycles`` and
  ``L_cycles`` default to 2 and 3 (read through transformers; the json reader asks for them).
- Multi-head attention: the KV heads are the query heads (``num_key_value_heads`` is not read), per rank
  ``heads // tp``; head size ``head_dim`` (the class's default 128; ``hidden_size // heads`` is never
  taken, the class always holding one). The class refuses a ``hidden_size`` the heads do not divide.
- ``PrefillPrefixLMAttention`` keeps a full-attention cache (its spec flagged non-causal: the layout is
  the decoder's); with the engine's one window (a written ``sliding_window``: ``step1.engine_window``),
  every attention slides over it, as ``Attention`` takes the cache config's window.
- One spec for every layer: one group, as vLLM's ``get_kv_cache_groups``.
"""

from __future__ import annotations

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .base import MAX_LAYERS, Ctx
from .config import Config, resolve_kv_dtype
from .step1 import engine_window


def _class_int(cfg: Config, key: str, why: str) -> int:
    """An integer field, or HrmTextConfig's default where left out (:data:`.config_aliases.DEFAULTS`)."""
    if key not in cfg.data:
        value = cfg.class_default(key)
        if value is not None:
            return value
    return cfg.req_int(key, why)


def attention_layers(cfg: Config) -> list[tuple[str, int]]:
    """(stack, global index) of every attention, in vLLM 0.33's construction order."""
    key = "num_layers_per_stack"
    if cfg.has(key):
        per_stack = cfg.req_int(key, "the layers of each stack")
    else:  # HrmTextConfig: the written num_hidden_layers is the per-stack count
        key = "num_hidden_layers"
        per_stack = cfg.req_int(key, "HrmTextConfig reads it as the layers of each stack")
    high = cfg.req_int("H_cycles", "the cycles of the H stack")
    low = cfg.req_int("L_cycles", "the L stack's cycles within each H cycle")
    total = per_stack * high * (low + 1)
    if total > MAX_LAYERS:
        why = f"times H_cycles * (L_cycles + 1): {total:,} attentions, at most {MAX_LAYERS:,}"
        raise spec_error(cfg.field(key), per_stack, why)
    steps = {
        "L": [h * (low + 1) + j for h in range(high) for j in range(low)],
        "H": [h * (low + 1) + low for h in range(high)],
    }
    return [(k, s * per_stack + i) for k in ("L", "H") for i in range(per_stack) for s in steps[k]]


def hrm_text_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    heads = cfg.req_int("num_attention_heads", "the query heads, and the KV heads (multi-head attention)")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    hidden = cfg.req_int("hidden_size", "HrmTextConfig checks that the heads divide it")
    if hidden % heads:
        why = f"not a multiple of num_attention_heads = {heads}: HrmTextConfig refuses it"
        raise spec_error(cfg.field("hidden_size"), hidden, why)
    head = _class_int(cfg, "head_dim", "the head size")
    window = engine_window(cfg)
    layers_at = attention_layers(cfg)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    kind = "full" if window is None else "sliding"
    layers: list[LayerSpec] = []
    for stack, idx in layers_at:
        name = f"model.{stack}_module.layers.{idx}.self_attn.attn"
        if window is None:
            layer: LayerSpec = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=heads // c.tp, head_size=head, dtype=kv
            )
        else:
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=heads // c.tp, head_size=head, dtype=kv, window=window
            )
        layers.append(layer)
        c.kinds[name] = kind
    return (GroupSpec(kind, tuple(layers)),), kv, bs
