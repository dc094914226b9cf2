"""LongCat-Flash (``LongcatFlashForCausalLM``: meituan-longcat/LongCat-Flash-Chat and -Thinking) and
LongCat-Flash-Lite (``LongcatFlashNgramForCausalLM``), by vLLM 0.33's ``longcat_flash.py`` and
``longcat_flash_ngram.py``.

- Every decoder layer (``FlashDecoderLayer``) holds two MLA attentions, DeepSeek-V2's
  ``DeepseekV2MLAAttention``, registered as ``model.layers.{i}.self_attn.{j}.attn`` for ``j`` 0 and 1:
  ``2 * num_layers`` caches of one latent head of ``kv_lora_rank + qk_rope_head_dim`` on every rank
  (``num_attention_heads`` must divide by tp), the MLA backend's block size (:mod:`.backends`, with
  ``qk_nope_head_dim``), one group. The n-gram model builds the same ``FlashModel`` under an n-gram
  embedding (no cache of its own; vLLM runs it on its V2 model runner, whose spec is the same).
- The config class is transformers' ``LongcatFlashConfig`` whatever the checkpoint's remote code: vLLM
  reads ``model_type`` ``longcat_flash`` with it, and a config.json without ``model_type`` as that type
  (``_ARCHITECTURE_TO_MODEL_TYPE``, :data:`ARCHITECTURE_MODEL_TYPES`); another ``model_type`` is refused.
- Decoder layers: ``num_layers`` (the class's default 28 where left out), but a ``num_hidden_layers``
  written wins: the class's setter makes ``num_layers = num_hidden_layers // 2`` (its property is
  ``2 * num_layers``, the count of attention layers).
- Multi-token-prediction layers (``LongCatFlashMTP``) get no cache: only with speculative decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import spec_error
from ..spec import GroupSpec, LayerSpec, MLASpec
from ..validate import is_int
from .base import MAX_LAYERS, Ctx
from .config import resolve_kv_dtype

#: vLLM 0.33's ``_ARCHITECTURE_TO_MODEL_TYPE`` (vllm/transformers_utils/config.py): the model type it reads a
#: config.json that writes none (or null) as, by its first architecture
ARCHITECTURE_MODEL_TYPES: Mapping[str, str] = {
    "LongcatFlashForCausalLM": "longcat_flash",
    "LongcatFlashNgramForCausalLM": "longcat_flash",
}
MODEL_TYPE = "longcat_flash"


def with_model_type(data: Mapping[str, Any], notes: list[str]) -> Mapping[str, Any]:
    """``data`` with the model type vLLM 0.33 reads it as where it writes none (or null) and its first
    architecture is one of :data:`ARCHITECTURE_MODEL_TYPES` (``HFConfigParser.parse``)."""
    if data.get("model_type") is not None:
        return data
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    mt = ARCHITECTURE_MODEL_TYPES.get(arch)
    if mt is None:
        return data
    notes.append(f"no model_type written: vLLM 0.33 reads {arch}'s config as {mt!r} (by its architecture)")
    return {**data, "model_type": mt}


def decoder_layers(c: Ctx) -> int:
    """The decoder layers vLLM builds (``config.num_layers`` as ``LongcatFlashConfig`` sets it)."""
    cfg = c.cfg
    if "num_hidden_layers" in cfg.data:  # the class's setter: num_layers = num_hidden_layers // 2
        nhl = cfg.data["num_hidden_layers"]
        where = cfg.field("num_hidden_layers")
        if not is_int(nhl):
            why = "LongcatFlashConfig sets num_layers = num_hidden_layers // 2 from it: an integer"
            raise spec_error(where, nhl, why)
        if nhl < 2:
            why = "LongcatFlashConfig sets num_layers = num_hidden_layers // 2 from it: at least 2"
            raise spec_error(where, nhl, why)
        if nhl > 2 * MAX_LAYERS:
            raise spec_error(where, nhl, f"must be at most {2 * MAX_LAYERS:,}")
        n = int(nhl) // 2
        if nhl % 2:
            c.notes.append(
                f"num_hidden_layers {nhl} is odd: LongcatFlashConfig builds {n} decoder layers ({2 * n} MLA)"
            )
        elif "num_layers" in cfg.data and cfg.data["num_layers"] != n:
            c.notes.append(
                f"num_hidden_layers {nhl} written: LongcatFlashConfig sets num_layers to {n} over the "
                f"{cfg.data['num_layers']!r} written"
            )
        return n
    n = cfg.req_int("num_layers", "LongCat-Flash's decoder layers, two MLA attentions each")
    if n > MAX_LAYERS:
        raise spec_error(cfg.field("num_layers"), n, f"must be at most {MAX_LAYERS:,}")
    return n


def longcat_flash_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    """Two MLA layers per decoder layer, one latent head each, one group."""
    cfg = c.cfg
    mt = c.top.data.get("model_type")
    if mt != MODEL_TYPE:
        why = (
            "vLLM 0.33 builds LongCat-Flash from transformers' LongcatFlashConfig (model_type "
            f"{MODEL_TYPE!r}, or none written); another config class lacks its num_layers"
        )
        raise spec_error(c.top.field("model_type"), mt, why)
    n = decoder_layers(c)
    heads = cfg.req_int("num_attention_heads", "the query heads (DeepseekV2MLAAttention splits them by tp)")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    rank = cfg.req_int("kv_lora_rank", "the MLA latent (head size kv_lora_rank + qk_rope_head_dim)")
    rope = cfg.req_int("qk_rope_head_dim", "the MLA RoPE part (head size kv_lora_rank + qk_rope_head_dim)")
    nope = cfg.req_int("qk_nope_head_dim", "the MLA backend vLLM picks depends on it", lo=0)
    c.mla_dims = (rank, rope)
    raw = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    kv = resolve_kv_dtype(raw, c.dtype)
    bs = c.block(c.backend(mla=True, qk_nope_head_dim=nope).block_size)
    layers: list[LayerSpec] = []
    for i in range(n):
        for j in (0, 1):  # FlashDecoderLayer's self_attn ModuleList of two
            name = c.name(i, f"self_attn.{j}.attn")
            layer = MLASpec(name=name, block_size=bs, head_size=rank + rope, dtype=kv)
            c.kinds[layer.name] = "mla"
            layers.append(layer)
    return (GroupSpec("mla", tuple(layers)),), kv, bs
