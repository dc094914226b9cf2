"""Gemma 4 (vLLM 0.33's ``gemma4.py``, ``Gemma4ForCausalLM``; its multimodal wrapper's text model):
sliding and full layers of different head sizes, and layers that keep no cache of their own.

- ``layer_types`` says which layers slide (``sliding_attention``) and which attend fully
  (``full_attention``); transformers' ``Gemma4TextConfig`` makes the last layer full whatever is
  written, and so does kvlayout (with a note). The window is ``sliding_window``, halved plus one when
  ``use_bidirectional_attention`` is ``"all"`` (the config class's exclusive bound).
- A layer's head size and KV heads are its ``per_layer_config`` entry's (keyed by layer index),
  else the config's ``head_dim`` and ``num_key_value_heads``. Without ``per_layer_config`` the config
  class writes one for the full layers: head size ``global_head_dim``, and with ``attention_k_eq_v``
  KV heads ``num_global_key_value_heads`` (when set). KV heads per rank ``max(1, total // tp)``, where
  ``tp`` must divide the total or the total ``tp`` (``Gemma4Attention``'s assertions).
- The last ``num_kv_shared_layers`` layers read the cache of the last earlier layer of their type
  (``kv_sharing_target_layer_name``): the model runner gives them no cache, so they are not in the spec.
- Head sizes that differ across layers make vLLM's ``Gemma4Config`` run every layer on FlashAttention 4
  where it is available, else on TRITON_ATTN: both take blocks in multiples of 16 tokens and declare
  no layout, so the pages differ in ``LBNHC`` and are unified as MiMo-V2's
  (:func:`.mimo_v2.unify_pages`: a page that divides the largest takes a block that many times
  larger, another is padded). Then the layers split into groups as any sliding-window model's.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .backends import BACKENDS, Resolved
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups
from .mimo_v2 import unify_pages

_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


def layer_types(cfg: Config, n: int, model: str, notes: list[str] | None = None) -> list[str]:
    """``sliding`` or ``full`` per layer as ``layer_types`` writes them; with ``notes``, the last one made
    full (``Gemma4TextConfig.__post_init__``; Gemma 3n's class leaves it as written)."""
    if not cfg.has("layer_types"):
        raise cfg.missing("layer_types", f"{model} names its sliding and full layers there")
    raw = cfg.req_list("layer_types", "", n, str, exact=True)
    out = []
    for i, t in enumerate(raw):
        if t not in _TYPES:
            valid = "valid: sliding_attention, full_attention"
            raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, valid)
        out.append(_TYPES[t])
    if notes is not None and out[-1] != "full":
        notes.append(f"layer {n - 1} is written {raw[-1]}: Gemma4TextConfig makes the last layer full")
        out[-1] = "full"
    return out


def _overrides(cfg: Config, n: int) -> dict[int, Mapping[str, object]] | None:
    """``per_layer_config`` as written (layer index -> fields), None where the config has none. Written
    null, it is no entry at all: transformers then writes none from the global fields either."""
    if "per_layer_config" not in cfg.data:
        return None
    raw = cfg.data["per_layer_config"]
    if raw is None:
        return {}
    where = cfg.field("per_layer_config")
    if not isinstance(raw, Mapping):
        raise spec_error(where, raw, "must be an object: layer index -> that layer's fields")
    out: dict[int, Mapping[str, object]] = {}
    for key, value in raw.items():
        i = int(key) if isinstance(key, str) and key.isdecimal() and len(key) <= 9 else None
        if i is None or not 0 <= i < n:
            raise spec_error(f"{where} key", key, f"must be a layer index, 0 to {n - 1}")
        if not isinstance(value, Mapping):
            raise spec_error(f"{where}[{key!r}]", value, "must be an object of the layer's fields")
        out[i] = value
    return out


def _shapes(cfg: Config, types: list[str]) -> list[tuple[int, int]]:
    """(head size, total KV heads) per layer."""
    n = len(types)
    head = cfg.req_int("head_dim", "the sliding layers' head size")
    kv = cfg.req_int("num_key_value_heads", "the sliding layers' KV heads")
    given = _overrides(cfg, n)
    if given is None:  # Gemma4TextConfig writes the full layers' entries from the global fields
        k_eq_v = cfg.data.get("attention_k_eq_v", False)
        if not isinstance(k_eq_v, bool):
            raise spec_error(cfg.field("attention_k_eq_v"), k_eq_v, "must be true or false")
        full = {"head_dim": cfg.req_int("global_head_dim", "the full layers' head size (class default 512)")}
        if k_eq_v and cfg.has("num_global_key_value_heads"):
            full["num_key_value_heads"] = cfg.req_int("num_global_key_value_heads", "")
        given = {i: full for i, t in enumerate(types) if t == "full"}
    out = []
    for i in range(n):
        entry = given.get(i)
        if entry is None:
            out.append((head, kv))
            continue
        sub = Config(entry, f"{cfg.field('per_layer_config')}[{str(i)!r}]")
        h = sub.opt_int("head_dim")
        k = sub.opt_int("num_key_value_heads")
        out.append((head if h is None else h, kv if k is None else k))
    return out


def per_rank(cfg: Config, i: int | None, total: int, heads: int, tp: int) -> int:
    """KV heads per rank of layer ``i`` (None: of every layer), as ``Gemma4Attention`` (``Gemma3nAttention``)
    and ``Attention`` assert them."""
    where = cfg.field("num_key_value_heads") + ("" if i is None else f" of layer {i}")
    if total >= tp and total % tp or total < tp and tp % total:
        why = f"not divisible by tp = {tp}" if total >= tp else f"tp = {tp} is not a multiple of it"
        raise spec_error(where, total, why)
    kv = max(1, total // tp)
    if (heads // tp) % kv:
        raise spec_error(where, total, f"the {heads // tp} query heads per rank are not a multiple of {kv}")
    return kv


def _shared(cfg: Config, types: list[str]) -> int:
    """The first layer that keeps no cache (``num_hidden_layers - num_kv_shared_layers``)."""
    n = len(types)
    shared = cfg.opt_int("num_kv_shared_layers", lo=0) or 0
    if shared > n:
        why = f"must be at most num_hidden_layers ({n})"
        raise spec_error(cfg.field("num_kv_shared_layers"), shared, why)
    first = n - shared
    kept = set(types[:first])
    for i in range(first, n):
        if types[i] not in kept:
            why = f"layer {i} ({types[i]}) shares the cache of an earlier {types[i]} layer, and there is none"
            raise spec_error(cfg.field("num_kv_shared_layers"), shared, why)
    return first


def gemma4_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    types = layer_types(cfg, n, "Gemma 4", c.notes)
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    shapes = _shapes(cfg, types)
    first_shared = _shared(cfg, types)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    # vLLM's Gemma4Config: the head size of the last layer of each type (a dict keyed by type)
    sizes = sorted(set({t: h for t, (h, _) in zip(types, shapes, strict=True)}.values()))
    if len(sizes) > 1:
        if c.attention_backend is not None:
            why = "Gemma 4's head sizes differ across layers: vLLM's Gemma4Config chooses the backend itself"
            raise spec_error("attention_backend", c.attention_backend, why)
        b = BACKENDS["TRITON_ATTN"]
        c.resolved = resolved = Resolved(
            b,
            b.preferred_block_size(),
            f"head sizes {', '.join(map(str, sizes))} differ: vLLM's Gemma4Config runs FlashAttention 4 "
            "where available, else TRITON_ATTN; both take blocks in multiples of 16 tokens",
        )
        bs = c.block(resolved.block_size)
        if bs % 16:
            raise spec_error("block_size", bs, "FlashAttention 4 and TRITON_ATTN take multiples of 16 tokens")
    else:
        resolved = c.backend(mla=False)
        bs = c.block(resolved.block_size)
    window = 0
    bidi = cfg.data.get("use_bidirectional_attention")
    if bidi not in (None, "all", "vision"):  # transformers' Literal["all", "vision"] | None
        raise spec_error(cfg.field("use_bidirectional_attention"), bidi, "valid: all, vision (or null)")
    if "sliding" in types[:first_shared]:
        window = cfg.req_int("sliding_window", "the sliding layers' window")
        if bidi == "all":
            window = window // 2 + 1
            c.notes.append(f"use_bidirectional_attention 'all': the window is {window:,} (half plus one)")
    if first_shared < n:
        c.notes.append(
            f"layers {first_shared} to {n - 1} read earlier layers' caches (num_kv_shared_layers): no cache"
        )
    ranks = [per_rank(cfg, i, total, heads, c.tp) for i, (_, total) in enumerate(shapes)]  # every layer
    layers: list[FullAttentionSpec] = []
    for i in range(first_shared):
        h, kv_heads, name = shapes[i][0], ranks[i], c.name(i, "self_attn.attn")
        if types[i] == "sliding":
            layers.append(SlidingWindowSpec(name, bs, kv_heads, h, kv, window=window))
        else:
            layers.append(FullAttentionSpec(name, bs, kv_heads, h, kv))
    kept = types[:first_shared]
    for t in ("sliding", "full"):
        if len({(x.num_kv_heads, x.head_size) for x, u in zip(layers, kept, strict=True) if u == t}) > 1:
            why = f"its {t} layers differ in head size or KV heads: vLLM merges such specs, not modeled"
            raise spec_error(cfg.field("per_layer_config"), "per-layer shapes", why)
    name = resolved.backend.name
    if len({x.page for x in layers}) > 1 and name not in ("FLASH_ATTN", "TRITON_ATTN"):
        why = f"pages differ on {name}, whose layout vLLM may pack block-outermost: not modeled for Gemma 4"
        raise spec_error("device", c.device, why)
    bucket: dict[str, list[LayerSpec]] = {}
    for layer, t in zip(unify_pages(layers, c.notes), kept, strict=True):
        c.add(t, layer, bucket)
    return vllm_groups(list(bucket.items())), kv, bs
