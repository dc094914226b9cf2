"""Beam (``BeamForCausalLM``, model_type ``beam``; vLLM 0.33's ``vllm/models/beam``, read through vLLM's own
``BeamConfig``).

- One attention per layer (``BeamAttention``), named ``model.layers.{i}.self_attn.attn``:
  ``num_key_value_heads`` KV heads (``BeamConfig``'s default 4 where left out), per rank
  ``max(1, kv // tp)`` (split when at least ``tp``, else replicated), head size ``head_dim`` where written,
  else ``hidden_size // num_attention_heads`` (the class's default is None).
- Layer ``i`` slides over ``sliding_window`` (the class's default 4096) where ``layer_types[i]`` is
  ``sliding_attention`` (the class's default: every layer), else it is full; ``BeamModel`` clears the
  engine's one window first, so a ``sliding_window`` written null leaves every layer full.
- ``BeamConfig`` refuses a ``layer_types`` or ``mlp_layer_types`` of another length or kind: refused here,
  naming the field.
- Groups as vLLM's ``get_kv_cache_groups``: one page for every layer; the full and the sliding layers are a
  bucket each (first seen first), split as any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .attention import kv_per_rank
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups

#: BeamConfig's defaults that decide the cache where config.json leaves the field out (vLLM 0.33's
#: vllm/transformers_utils/configs/beam.py); its KV heads come from config_aliases.DEFAULTS
SLIDING_WINDOW_DEFAULT = 4096
_TYPES = ("full_attention", "sliding_attention")
_MLP_TYPES = ("dense", "sparse")


def _per_layer(cfg: Config, key: str, n: int, kinds: tuple[str, ...], default: str) -> list[str]:
    """A per-layer list as ``BeamConfig`` takes it: null or absent is ``default`` on every layer, else
    exactly ``n`` entries, each one of ``kinds``."""
    raw: Any = cfg.data.get(key)
    if raw is None:
        return [default] * n
    if not isinstance(raw, list) or len(raw) != n:
        shown = f"{len(raw)} entries" if isinstance(raw, list) else raw
        raise spec_error(cfg.field(key), shown, f"BeamConfig takes exactly one entry per layer ({n})")
    for i, t in enumerate(raw):
        if t not in kinds:
            raise spec_error(f"{cfg.field(key)}[{i}]", t, f"BeamConfig takes one of {', '.join(kinds)}")
    return list(raw)


def _window(cfg: Config) -> int | None:
    """``sliding_window`` as ``BeamConfig`` holds it: its default where left out, None where written null."""
    if "sliding_window" not in cfg.data:
        cfg.notes.append(
            f"{cfg.field('sliding_window')} left out: BeamConfig's default, {SLIDING_WINDOW_DEFAULT} (vLLM), "
            "as vLLM reads it"
        )
        return SLIDING_WINDOW_DEFAULT
    if cfg.data["sliding_window"] is None:
        return None
    return cfg.req_int("sliding_window", "the window of every sliding_attention layer")


def _kv_total(cfg: Config) -> int:
    """``num_key_value_heads``, or BeamConfig's default where left out (a null written is refused)."""
    if "num_key_value_heads" not in cfg.data:
        value = cfg.class_default("num_key_value_heads")
        if value is not None:
            return value
    return cfg.req_int("num_key_value_heads", "the KV heads of every layer")


def windows(cfg: Config, n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM 0.33's ``BeamAttention`` passes it."""
    types = _per_layer(cfg, "layer_types", n, _TYPES, "sliding_attention")
    _per_layer(cfg, "mlp_layer_types", n, _MLP_TYPES, "sparse")  # BeamConfig's check only: no cache
    w = _window(cfg) if "sliding_attention" in types else None
    return [w if t == "sliding_attention" else None for t in types]


def head_size(cfg: Config, heads: int) -> int:
    """``head_dim`` where written (not null, not 0, 0.0 or false), else ``hidden_size //
    num_attention_heads``: vLLM 0.33's ``BeamAttention`` takes ``config.head_dim or hidden_size // heads``
    (pass 27: a 0 was refused; pass 28: 0.0 and false, which vLLM builds the same way)."""
    written = cfg.data.get("head_dim")
    if cfg.has("head_dim") and not (type(written) in (int, float, bool) and written == 0):  # false, 0, 0.0
        return cfg.req_int("head_dim", "the head size")
    hidden = cfg.req_int("hidden_size", "the head size is hidden_size // num_attention_heads")
    if hidden < heads:
        why = f"below num_attention_heads = {heads}: the head size hidden_size // heads is 0"
        raise spec_error(cfg.field("hidden_size"), hidden, why)
    return hidden // heads


def beam_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    kv_heads = kv_per_rank(cfg.field("num_key_value_heads"), _kv_total(cfg), heads, c.tp)
    head = head_size(cfg, heads)
    wins = windows(cfg, n)
    if cfg.data.get("tie_word_embeddings", False):  # BeamConfig's default: untied
        why = "vLLM 0.33's BeamForCausalLM requires tie_word_embeddings=False"
        raise spec_error(cfg.field("tie_word_embeddings"), cfg.data["tie_word_embeddings"], why)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    bucket: dict[str, list[LayerSpec]] = {}
    for i, w in enumerate(wins):
        name = c.name(i, "self_attn.attn")
        layer: LayerSpec
        if w is None:
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv
            )
        else:
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=w
            )
        c.add("full" if w is None else "sliding", layer, bucket)
    return vllm_groups(list(bucket.items())), kv, bs
