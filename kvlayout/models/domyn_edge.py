"""DomynEdge (``DomynEdgeForCausalLM``, model_type ``domyn_edge``: domyn/Domyn-Edge-*; vLLM 0.33's
``domyn_edge.py``).

- The config class is the checkpoint's remote code (vLLM 0.33 ships none for the type): kvlayout reads
  config.json as written, and a field vLLM's layers read that the config leaves out is refused, naming it.
- ``DomynEdgeModel`` is vLLM's ``Qwen2Model`` with ``DomynEdgeDecoderLayer``: one ``DomynEdgeAttention``
  per layer, named ``model.layers.{i}.attention.attn``, with ``num_key_value_heads`` KV heads, per rank
  ``max(1, kv // tp)`` (split when at least ``tp``, else replicated), and head size
  ``per_layer_config[i].head_dim``: transformers' heterogeneous config (``PreTrainedConfig``'s
  ``per_layer_config``, an object of layer index -> overrides) gives layer ``i``'s own ``head_dim`` where
  written, else the global ``head_dim``. Overrides of other fields are refused (vLLM reads them globally).
- Layer ``i``'s window is ``window_sizes[i][0] + 1`` where that entry is above 0 (an HF window
  ``(w, 0)`` attends to ``w + 1`` keys), else the engine's one window: a written ``sliding_window`` would
  be that, and is refused (not checked against vLLM's construction); ``position_layers[i]`` must be
  ``rope`` or ``nope`` (the layer raises on another).
- Groups as vLLM's ``get_kv_cache_groups``: layers of one kind (all full, or all sliding with one window)
  are one group of per-layer pages where head sizes differ (``UniformTypeKVCacheSpecs``); otherwise pages
  are unified to the largest (:func:`.mimo_v2.unify_pages`) and each distinct spec is a bucket, split as
  any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from ..validate import is_int
from .attention import kv_per_rank
from .base import Ctx
from .config import MAX_CONFIG_INT, Config, resolve_kv_dtype
from .grouping import vllm_groups
from .mimo_v2 import unify_pages

#: what a config read as written must hold where the remote-code class may derive it
_REMOTE = "the config class is the checkpoint's remote code, which kvlayout does not run: write it"


def _req_int(cfg: Config, key: str, why: str) -> int:
    """A required integer of at least 1, refused by name when left out (no reader has the remote class's
    defaults)."""
    if not cfg.has(key):
        raise spec_error(cfg.field(key), None, f"missing; {why}; {_REMOTE}")
    return cfg.req_int(key, why)


def _list(cfg: Config, key: str, n: int, why: str) -> list[Any]:
    """A list written with at least ``n`` entries (vLLM indexes it by layer)."""
    raw = cfg.data.get(key)
    if raw is None:
        raise spec_error(cfg.field(key), None, f"missing; {why}; {_REMOTE}")
    if not isinstance(raw, list):
        raise spec_error(cfg.field(key), raw, "must be a list of one entry per layer")
    if len(raw) < n:
        raise spec_error(cfg.field(key), f"{len(raw)} entries", f"needs one entry per layer ({n})")
    return raw[:n]


def _layer_index(key: Any, n: int, where: str) -> int:
    """A ``per_layer_config`` key: a layer index in ``[0, n)`` written in decimal digits (transformers
    ``int()``s it and refuses one out of range)."""
    # at most 9 digits before int(): Python refuses to convert a string of more than 4,300 (a raw ValueError)
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9 and int(key) < n:
        return int(key)
    why = f"keys must be layer indices in [0, {n}) (transformers' per-layer config refuses another)"
    raise spec_error(where, key, why)


def head_sizes(cfg: Config, n: int) -> list[int]:
    """Layer i's head size: ``per_layer_config[i].head_dim``, as transformers' heterogeneous config gives
    it (``PreTrainedConfig.per_layer_config``: the layer's overrides over the global config, which every
    layer without a ``head_dim`` of its own reads)."""
    raw = cfg.data.get("per_layer_config")
    where = cfg.field("per_layer_config")
    overrides: dict[int, int] = {}
    if raw is not None:
        if not isinstance(raw, Mapping):
            why = "must be an object of layer index -> overrides (transformers' heterogeneous config)"
            raise spec_error(where, raw, why)
        for key, entry in raw.items():
            i = _layer_index(key, n, where)
            at = f"{where}[{key}]"
            if i in overrides:
                raise spec_error(at, key, f"names layer {i} again")
            if not isinstance(entry, Mapping):
                raise spec_error(at, entry, "must be an object of the layer's overrides")
            for k in entry:
                if k != "head_dim":
                    why = (
                        "kvlayout reads only head_dim per layer (vLLM 0.33's DomynEdge layers read the other "
                        "fields from the global config, which transformers refuses for a per-layer attribute)"
                    )
                    raise spec_error(f"{at}.{k}", entry[k], why)
            if "head_dim" not in entry:
                continue
            head = entry["head_dim"]
            if not is_int(head) or not 1 <= head <= MAX_CONFIG_INT:
                why = "the layer's head size: a positive integer (at most 2**53)"
                raise spec_error(f"{at}.head_dim", head, why)
            overrides[i] = int(head)
    if len(overrides) == n:
        return [overrides[i] for i in range(n)]
    why = (
        "the head size of every layer per_layer_config does not give one (vLLM's DomynEdgeDecoderLayer reads "
        "per_layer_config[i].head_dim)"
    )
    default = _req_int(cfg, "head_dim", why)
    return [overrides.get(i, default) for i in range(n)]


def windows(cfg: Config, n: int) -> list[int | None]:
    """Layer i's window (None: full), as vLLM 0.33's ``DomynEdgeAttention`` passes it."""
    raw = _list(cfg, "window_sizes", n, "vLLM's DomynEdgeDecoderLayer reads window_sizes[i][0]")
    out: list[int | None] = []
    for i, entry in enumerate(raw):
        where = f"{cfg.field('window_sizes')}[{i}]"
        if not isinstance(entry, list) or not entry:
            why = "must be a list whose first entry is the layer's window (HF's (w, 0))"
            raise spec_error(where, entry, why)
        w = entry[0]
        if not is_int(w) or not -MAX_CONFIG_INT <= w < MAX_CONFIG_INT:
            why = "the layer's window: an integer (above 0 slides over w + 1 tokens, else full attention)"
            raise spec_error(f"{where}[0]", w, why)
        out.append(int(w) + 1 if w > 0 else None)
    return out


def _positions(cfg: Config, n: int) -> None:
    """``position_layers[i]``: vLLM's layer raises on anything but ``rope`` and ``nope``."""
    raw = _list(cfg, "position_layers", n, "vLLM's DomynEdgeDecoderLayer reads position_layers[i]")
    for i, p in enumerate(raw):
        if p not in ("rope", "nope"):
            why = "valid: rope, nope (vLLM's DomynEdgeDecoderLayer raises ValueError on another)"
            raise spec_error(f"{cfg.field('position_layers')}[{i}]", p, why)


def _kv_per_rank(cfg: Config, heads: int, tp: int) -> int:
    """``num_key_value_heads`` per rank, with vLLM's assertions (the attention's and ``Attention``'s)."""
    total = _req_int(cfg, "num_key_value_heads", "vLLM's DomynEdgeAttention reads it")
    return kv_per_rank(cfg.field("num_key_value_heads"), total, heads, tp)


def _refuse_engine_window(cfg: Config, n: int) -> None:
    """What vLLM reads beside the layers' own fields: the engine window and Qwen2Model's assertion."""
    if cfg.has("sliding_window"):
        why = (
            "the layers whose window_sizes entry is 0 would take it as vLLM's one engine window, which "
            "kvlayout has not checked against vLLM's construction for DomynEdge: write null or leave it out"
        )
        raise spec_error(cfg.field("sliding_window"), cfg.data["sliding_window"], why)
    types = cfg.data.get("layer_types")
    # vLLM's Qwen2Model asserts on len(set(layer_types)), Python's set: 1 and "1" are two types (kvlayout
    # compared str(t), one type), a string is the set of its letters
    kinds: set[Any] = set()
    try:
        kinds = set(types) if isinstance(types, list) else kinds
    except TypeError:  # an unhashable item: vLLM's set() raises too
        types = "an unhashable item"
    if types is not None and not isinstance(types, list):
        why = "must be a list of layer types (vLLM's Qwen2Model reads the set of its items)"
        raise spec_error(cfg.field("layer_types"), types, why)
    mixed = len(kinds) > 1
    if mixed and cfg.data.get("max_window_layers") != n:
        why = f"mixed: vLLM's Qwen2Model asserts max_window_layers == num_hidden_layers ({n})"
        raise spec_error(cfg.field("layer_types"), "mixed", why)


def domyn_edge_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = _req_int(cfg, "num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    kv_heads = _kv_per_rank(cfg, heads, c.tp)
    sizes = head_sizes(cfg, n)
    wins = windows(cfg, n)
    _positions(cfg, n)
    _refuse_engine_window(cfg, n)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    layers: list[FullAttentionSpec] = []
    for i, (head, w) in enumerate(zip(sizes, wins, strict=True)):
        name = c.name(i, "attention.attn")  # Qwen2Model's make_layers; DomynEdgeAttention's attn
        full = FullAttentionSpec(name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv)
        if w is None:
            layers.append(full)
        else:
            layers.append(
                SlidingWindowSpec(
                    name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=w
                )
            )
        c.kinds[name] = "full" if w is None else "sliding"
    kinds = set(wins)  # one kind: all full, or all sliding with one window (UniformTypeKVCacheSpecs)
    if len(kinds) > 1:
        layers = unify_pages(layers, c.notes)
    elif len(set(sizes)) > 1:
        c.notes.append(
            "head sizes differ by layer: vLLM 0.33 keeps one group of per-layer pages "
            "(UniformTypeKVCacheSpecs); a block is the sum of the pages"
        )
    slid = sorted({w for w in wins if w is not None})
    bucket: dict[Any, list[LayerSpec]] = {}
    names: dict[Any, str] = {}
    for w, layer in zip(wins, layers, strict=True):
        kind = "full" if w is None else ("sliding" if len(slid) == 1 else f"sliding.w{w}")
        key = (w, layer.head_size, layer.block_size, layer.page) if len(kinds) > 1 else w
        one_size = len(kinds) == 1 or len(set(sizes)) == 1
        names.setdefault(key, kind if one_size else f"{kind}.h{layer.head_size}")
        bucket.setdefault(key, []).append(layer)  # vLLM: one bucket per distinct spec, first seen first
    return vllm_groups([(names[k], ls) for k, ls in bucket.items()]), kv, bs
