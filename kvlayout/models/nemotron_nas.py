"""Llama-Nemotron NAS models (``DeciLMForCausalLM``, model_type ``nemotron-nas``: Llama-3.1-Nemotron-51B,
Llama-3.3-Nemotron-Super-49B, Llama-3.1-Nemotron-Ultra-253B; vLLM 0.33's ``nemotron_nas.py``).

- The config class is the checkpoint's remote code (``DeciLMConfig``, a ``LlamaConfig`` whose
  ``block_configs`` entries become ``BlockConfig`` objects of an ``attention`` and an ``ffn`` sub-block;
  vLLM 0.33 has no class of its own for the type). kvlayout reads config.json as written: a field vLLM
  reads that the config leaves out is refused, naming it (the remote class's defaults are not read).
- ``DeciLMDecoderLayer``: layer ``i`` builds no attention, hence no cache, where
  ``block_configs[i].attention.no_op``; else ``DeciLMAttention`` (vLLM's ``LlamaAttention``) with
  ``num_attention_heads // n_heads_in_group`` KV heads, per rank ``max(1, kv // tp)`` (split when at
  least ``tp``, else replicated: ``tp`` must be a multiple), head size ``head_dim`` or
  ``hidden_size // num_attention_heads``. vLLM reads no other attention field: ``replace_with_linear``
  (the class then nulls ``n_heads_in_group``, and vLLM's layer divides by it: ``TypeError``) is
  refused, and ``window_length`` / ``num_sink_tokens`` leave the layer full attention (noted).
  An FFN vLLM builds needs ``ffn_mult`` (the class asserts it; a linear FFN has none: refused).
- Windows as ``LlamaAttention``'s: ``layer_types[i] == "sliding_attention"`` takes ``sliding_window``;
  without ``layer_types`` every layer takes the engine's one window (``sliding_window``, if written).
- Groups (``get_kv_cache_groups``): attention of one kind (all full, or all sliding) is one group even
  where the KV heads differ (``UniformTypeKVCacheSpecs``: each layer its own page, a block the sum of
  them); full and sliding layers together have their pages unified to the largest
  (``unify_kv_cache_spec_page_size``: :func:`.mimo_v2.unify_pages`), then each distinct layer spec is a
  bucket, split into groups as any hybrid's (:func:`.grouping.vllm_groups`).
- No attention layer at all: vLLM's ModelConfig finds no KV heads
  (``NemotronNasModelArchConfigConvertor.get_total_num_kv_heads`` raises): refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from ..validate import is_int
from .attention import refuse_draft_offset
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups
from .mimo_v2 import unify_pages

#: the sub-block flags the config class defaults to false (``SubblockConfig``)
_FLAGS = ("no_op", "replace_with_linear")


@dataclass(frozen=True)
class Block:
    """What vLLM's ``DeciLMDecoderLayer`` takes from one ``block_configs`` entry for the cache."""

    attention: bool  # False: no_op attention, no layer and no cache
    n_heads_in_group: int  # query heads per KV head (0 where no attention)
    ignored: tuple[str, ...]  # attention fields written that vLLM does not read (window_length, ...)


def _flags(sub: Mapping[str, Any], where: str) -> tuple[bool, bool]:
    """``no_op`` and ``replace_with_linear`` of a sub-block (absent: false), never both (the class
    asserts it)."""
    out = []
    for key in _FLAGS:
        v = sub.get(key, False)
        if not isinstance(v, bool):
            raise spec_error(f"{where}.{key}", v, "must be true or false (the config class's default: false)")
        out.append(v)
    if out[0] and out[1]:
        why = "beside replace_with_linear true: the config class asserts a sub-block is not both"
        raise spec_error(f"{where}.no_op", True, why)
    return out[0], out[1]


def _sub(entry: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    sub = entry.get(key)
    if not isinstance(sub, Mapping):
        why = "must be an object (the config class's BlockConfig requires an attention and an ffn sub-block)"
        raise spec_error(f"{where}.{key}", sub, why)
    return sub


def _ffn(ffn: Mapping[str, Any], where: str) -> None:
    """Refuse an FFN sub-block vLLM cannot build (it holds no cache, but the model must load)."""
    no_op, linear = _flags(ffn, where)
    if no_op:
        return
    if linear:
        why = (
            "vLLM 0.33's DeciLMDecoderLayer builds a LlamaMLP from ffn_mult, which the config class nulls "
            "for a linear FFN (int(2 * None * ...): TypeError)"
        )
        raise spec_error(f"{where}.replace_with_linear", True, why)
    mult = ffn.get("ffn_mult")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not math.isfinite(mult) or mult <= 0:
        why = "the FFN's width as a multiple of hidden_size: a positive number (the config class asserts one)"
        raise spec_error(f"{where}.ffn_mult", mult, why)


def read_blocks(cfg: Config, n: int) -> list[Block]:
    """``block_configs`` as vLLM's layers read it: one entry per layer (the class asserts the count)."""
    raw = cfg.data.get("block_configs")
    where = cfg.field("block_configs")
    if raw is None:
        why = (
            "missing; vLLM's DeciLMDecoderLayer reads block_configs[i] for every layer (the config class has "
            "no default)"
        )
        raise spec_error(where, None, why)
    if not isinstance(raw, list):
        raise spec_error(where, raw, "must be a list of one block object per layer")
    if len(raw) != n:
        why = f"needs exactly one entry per layer ({n}): the config class asserts it"
        raise spec_error(where, f"{len(raw)} entries", why)
    out = []
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise spec_error(at, entry, "must be an object with attention and ffn sub-blocks")
        att = _sub(entry, "attention", at)
        _ffn(_sub(entry, "ffn", at), f"{at}.ffn")
        no_op, linear = _flags(att, f"{at}.attention")
        if no_op:  # the class nulls n_heads_in_group and the window fields: nothing else is read
            out.append(Block(False, 0, ()))
            continue
        if linear:
            why = (
                "vLLM 0.33 reads only no_op: its DeciLMDecoderLayer builds attention with "
                "num_attention_heads // n_heads_in_group KV heads, which the config class nulls for a "
                "linear attention (TypeError)"
            )
            raise spec_error(f"{at}.attention.replace_with_linear", True, why)
        group: Any = att.get("n_heads_in_group")
        if not is_int(group) or group < 1:
            why = "query heads per KV head: a positive integer (the config class asserts one for attention)"
            raise spec_error(f"{at}.attention.n_heads_in_group", group, why)
        ignored = tuple(k for k in ("window_length", "num_sink_tokens") if att.get(k) is not None)
        out.append(Block(True, int(group), ignored))
    return out


def _kv_heads(heads: int, group: int, tp: int, where: str) -> int:
    """KV heads per rank of a layer with ``heads // group`` KV heads (vLLM's ``LlamaAttention`` and
    ``Attention`` assertions, refused by name)."""
    total = heads // group
    if total < 1:
        why = f"above num_attention_heads = {heads}: no KV head (vLLM divides tp by 0)"
        raise spec_error(where, group, why)
    if total >= tp and total % tp:
        raise spec_error(where, group, f"the layer's {total} KV heads are not divisible by tp = {tp}")
    if total < tp and tp % total:
        why = f"tp = {tp} is not a multiple of the layer's {total} KV heads (they are replicated)"
        raise spec_error(where, group, why)
    per_rank = max(1, total // tp)
    if (heads // tp) % per_rank:
        why = (
            f"the {heads // tp} query heads per rank are not a multiple of the layer's {per_rank} KV heads "
            "per rank (vLLM's Attention asserts it)"
        )
        raise spec_error(where, group, why)
    return per_rank


def _sliding(cfg: Config, n: int) -> list[bool]:
    """Which layers slide, as vLLM's ``LlamaAttention`` and engine window make them."""
    if cfg.has("layer_types"):
        refuse_draft_offset(cfg)  # LlamaAttention's EAGLE-3 shift of the entries read (pass 25)
        types = cfg.req_list("layer_types", "", n, str, exact=True)  # transformers refuses another length
        for i, t in enumerate(types):
            if t not in ("sliding_attention", "full_attention"):
                why = "valid: sliding_attention, full_attention (vLLM's LlamaAttention slides on the first)"
                raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, why)
        slides = [t == "sliding_attention" for t in types]
        if any(slides) and "sliding_window" not in cfg.data:  # the config class has no such attribute
            why = "missing; vLLM's LlamaAttention reads config.sliding_window for a sliding layer"
            raise spec_error(cfg.field("sliding_window"), None, why)
    else:  # every layer takes the engine's one window
        slides = [cfg.has("sliding_window")] * n
    return slides if cfg.has("sliding_window") else [False] * n  # a null window: every layer full


def nemotron_nas_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = cfg.req_int("num_attention_heads", "the query heads of every attention layer")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    blocks = read_blocks(cfg, n)
    if not any(b.attention for b in blocks):
        why = (
            "every layer's attention is no_op: vLLM 0.33's ModelConfig finds no KV heads and refuses the "
            "model (NemotronNasModelArchConfigConvertor.get_total_num_kv_heads)"
        )
        raise spec_error(cfg.field("block_configs"), f"{n} no_op attention blocks", why)
    if cfg.has("head_dim"):
        head = cfg.req_int("head_dim", "")
    else:  # LlamaAttention: head_dim or hidden_size // num_attention_heads
        hidden = cfg.req_int("hidden_size", "the head size is hidden_size // num_attention_heads")
        head = hidden // heads
        if head < 1:
            why = f"below num_attention_heads = {heads}: the head size hidden_size // heads is 0"
            raise spec_error(cfg.field("hidden_size"), hidden, why)
    slides = _sliding(cfg, n)
    window = cfg.req_int("sliding_window", "the window") if any(slides) else 0
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    layers: list[FullAttentionSpec] = []
    kinds: list[str] = []
    ignored: set[str] = set()
    for i, b in enumerate(blocks):
        if not b.attention:
            continue
        where = f"{cfg.field('block_configs')}[{i}].attention.n_heads_in_group"
        name, per_rank = c.name(i, "self_attn.attn"), _kv_heads(heads, b.n_heads_in_group, c.tp, where)
        if slides[i]:
            layers.append(
                SlidingWindowSpec(
                    name=name, block_size=bs, num_kv_heads=per_rank, head_size=head, dtype=kv, window=window
                )
            )
        else:
            full = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=per_rank, head_size=head, dtype=kv
            )
            layers.append(full)
        kinds.append("sliding" if slides[i] else "full")
        ignored.update(b.ignored)
    if ignored:
        c.notes.append(
            f"block_configs' {' and '.join(sorted(ignored))} are not read by vLLM 0.33's DeciLMDecoderLayer: "
            "those layers are its full (or engine-window) attention"
        )
    skipped = n - len(layers)
    if skipped:
        c.notes.append(f"{skipped} of {n} layers have no_op attention: no attention layer, no cache")
    if len(set(kinds)) > 1:  # full and sliding together: one page for all (vLLM unifies them first)
        layers = unify_pages(layers, c.notes)
    elif len({x.num_kv_heads for x in layers}) > 1:
        c.notes.append(
            "KV heads differ by layer: vLLM 0.33 keeps one group of per-layer pages "
            "(UniformTypeKVCacheSpecs); a block is the sum of the pages"
        )
    bucket: dict[Any, list[LayerSpec]] = {}
    names: dict[Any, str] = {}
    for kind, layer in zip(kinds, layers, strict=True):
        # one bucket per distinct spec where the kinds mix (vLLM's same_type_layers), else one per kind
        key = (kind, layer.num_kv_heads, layer.block_size, layer.page) if len(set(kinds)) > 1 else kind
        names.setdefault(key, kind if len(set(kinds)) == 1 else f"{kind}.kv{layer.num_kv_heads}")
        c.kinds[layer.name] = kind
        bucket.setdefault(key, []).append(layer)
    return vllm_groups([(names[k], ls) for k, ls in bucket.items()]), kv, bs
