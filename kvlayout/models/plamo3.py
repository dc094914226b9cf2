"""PLaMo 3 (``Plamo3ForCausalLM``, model_type ``plamo3``: pfnet/plamo-3-nict-*; vLLM 0.33's ``plamo3.py``).

- One attention per layer (``Plamo3AttentionMixer``), named ``model.layers.layers.{i}.mixer.attn`` (the
  decoder's layers sit under ``model.layers``): ``num_key_value_heads`` KV heads, per rank
  ``max(1, kv // tp)`` (split when at least ``tp``, else replicated), head size ``head_dim`` (read as
  such: no ``hidden_size // heads`` fallback).
- Layer ``i``'s window is ``interleaved_sliding_window[i]`` (``per_layer_sliding_window``): an integer
  slides, null leaves the engine's one window, which is none where ``layer_types`` mixes kinds
  (``EngineArgs.create_engine_config``); the layer also reads ``layer_types[i]`` (its RoPE).
- The config class is the checkpoint's remote code, which derives both lists (vLLM 0.33 has no class of
  its own, nor renames a written ``sliding_window`` list any more): kvlayout reads them as written and
  refuses a config that leaves either out, naming it. A null entry where every ``layer_types`` entry is
  ``sliding_attention`` would take the class's ``sliding_window``: refused, naming the entry; so is a
  window below 1 (vLLM builds a sliding layer of 0 tokens).
- Groups as vLLM's ``get_kv_cache_groups`` makes them: one page for every layer (one head shape); one
  group where every layer has one spec, else a bucket per distinct spec (full, or each window) split as
  any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from ..validate import is_int
from .attention import kv_per_rank
from .base import Ctx
from .config import MAX_CONFIG_INT, Config, resolve_kv_dtype
from .grouping import vllm_groups

#: what a config read as written must hold where the remote-code class derives it
_DERIVED = "the remote-code Plamo3Config derives it and kvlayout does not run remote code: write it"


def _kv_per_rank(cfg: Config, heads: int, tp: int) -> int:
    """``num_key_value_heads`` per rank, with vLLM's assertions (the mixer's and ``Attention``'s)."""
    total = cfg.req_int("num_key_value_heads", "the KV heads of every layer")
    return kv_per_rank(cfg.field("num_key_value_heads"), total, heads, tp)


def _list(cfg: Config, key: str, n: int, why: str) -> list[Any]:
    """A list written with at least ``n`` entries (vLLM indexes it by layer)."""
    raw = cfg.data.get(key)
    if raw is None:
        raise spec_error(cfg.field(key), None, f"missing; {why}; {_DERIVED}")
    if not isinstance(raw, list):
        raise spec_error(cfg.field(key), raw, "must be a list of one entry per layer")
    if len(raw) < n:
        raise spec_error(cfg.field(key), f"{len(raw)} entries", f"needs one entry per layer ({n})")
    return raw


def windows(cfg: Config, n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM 0.33's ``Plamo3AttentionMixer`` passes it."""
    types = _list(cfg, "layer_types", n, "vLLM's Plamo3AttentionMixer reads layer_types[i]")
    for i, t in enumerate(types):
        if not isinstance(t, str):
            raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, "must be a string")
    raw = _list(cfg, "interleaved_sliding_window", n, "layer i's window is interleaved_sliding_window[i]")
    out: list[int | None] = []
    all_sliding = all(t == "sliding_attention" for t in types)  # EngineArgs reads the whole list
    for i, w in enumerate(raw[:n]):
        where = f"{cfg.field('interleaved_sliding_window')}[{i}]"
        if w is None:
            if all_sliding:
                why = (
                    "a null window takes the engine's, which with every layer_types entry sliding_attention "
                    "is the remote config class's sliding_window (not read here): write the layer's window"
                )
                raise spec_error(where, None, why)
            out.append(None)
        elif not is_int(w) or not 1 <= w <= MAX_CONFIG_INT:  # named here, not as the layer's spec (pass 25)
            why = "a window of at least 1 token (at most 2**53), or null for full attention"
            raise spec_error(where, w, why)
        else:
            out.append(int(w))
    return out


def plamo3_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    kv_heads = _kv_per_rank(cfg, heads, c.tp)
    head = cfg.req_int("head_dim", "vLLM's Plamo3AttentionMixer reads config.head_dim")
    wins = windows(cfg, n)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    bucket: dict[int | None, list[LayerSpec]] = {}
    names: dict[int | None, str] = {}
    for i, w in enumerate(wins):
        name = f"{c.prefix}.layers.{i}.mixer.attn"  # Plamo3Decoder's make_layers under model.layers
        layer: LayerSpec
        if w is None:
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv
            )
        else:
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=w
            )
        c.kinds[name] = "full" if w is None else "sliding"
        bucket.setdefault(w, []).append(layer)  # vLLM: one bucket per distinct spec, first seen first
    slid = [w for w in bucket if w is not None]
    for w in bucket:
        names[w] = "full" if w is None else ("sliding" if len(slid) == 1 else f"sliding.w{w}")
    if len(slid) > 1:
        c.notes.append(
            f"{len(slid)} window sizes: vLLM 0.33 keeps the layers of each window in groups of their own"
        )
    return vllm_groups([(names[w], ls) for w, ls in bucket.items()]), kv, bs
