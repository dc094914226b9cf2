"""Gemma 3n (vLLM 0.33's ``gemma3n.py``, ``Gemma3nForCausalLM``; its multimodal wrapper's text model):
sliding and full layers of one head size, and the last layers reading earlier layers' caches.

- ``layer_types`` says which layers slide (``sliding_attention``, window ``sliding_window`` as
  written) and which attend fully (``full_attention``). Unlike Gemma 4's config class,
  ``Gemma3nTextConfig`` leaves the last layer as written; unwritten, it makes every fifth layer full
  (``reader="transformers"`` fills that default, the json reader asks for the field).
- Every layer has ``head_dim`` and ``num_key_value_heads``; KV heads per rank ``max(1, total // tp)``,
  ``tp`` dividing the total or the total ``tp`` (``Gemma3nAttention``'s assertions).
- From layer ``first = num_hidden_layers - num_kv_shared_layers`` on, ``Gemma3nAttention`` names a
  fixed target: layer ``first - 2`` for a sliding layer, ``first - 1`` for a full one
  (``kv_sharing_target_layer_name``, whatever that layer's type), and the model runner gives such a
  layer no cache. Where that index is negative the layer names no target and keeps a cache of its own.
  ``num_kv_shared_layers`` is required by the json reader: the class default is 15, not 0.
"""

from __future__ import annotations

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .gemma4 import layer_types, per_rank
from .grouping import vllm_groups


def cached_layers(cfg: Config, types: list[str]) -> list[int]:
    """The layers that keep a cache of their own (``Gemma3nAttention``'s sharing targets)."""
    n = len(types)
    why = "the last layers reading earlier caches (Gemma3nTextConfig's default is 15)"
    shared = cfg.req_int("num_kv_shared_layers", why, lo=0)
    if shared > n:
        why = f"must be at most num_hidden_layers ({n})"
        raise spec_error(cfg.field("num_kv_shared_layers"), shared, why)
    first = n - shared
    return [i for i in range(n) if i < first or first - (2 if types[i] == "sliding" else 1) < 0]


def gemma3n_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    types = layer_types(cfg, n, "Gemma 3n")
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    head = cfg.req_int("head_dim", "every layer's head size")
    total = cfg.req_int("num_key_value_heads", "every layer's KV heads")
    kv_heads = per_rank(cfg, None, total, heads, c.tp)
    kept = cached_layers(cfg, types)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    window = 0
    if any(types[i] == "sliding" for i in kept):
        window = cfg.req_int("sliding_window", "the sliding layers' window")
    if len(kept) < n:
        c.notes.append(f"{n - len(kept)} layers read earlier layers' caches (num_kv_shared_layers): no cache")
    bucket: dict[str, list[LayerSpec]] = {}
    for i in kept:
        name = c.name(i, "self_attn.attn")
        if types[i] == "sliding":
            c.add("sliding", SlidingWindowSpec(name, bs, kv_heads, head, kv, window=window), bucket)
        else:
            c.add("full", FullAttentionSpec(name, bs, kv_heads, head, kv), bucket)
    return vllm_groups(list(bucket.items())), kv, bs
