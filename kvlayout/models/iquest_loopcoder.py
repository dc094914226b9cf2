"""IQuest-Coder Loop (``IQuestLoopCoderForCausalLM``, model_type ``iquest_loopcoder``; vLLM 0.33's
``iquest_loopcoder.py``).

- ``LoopCoderAttention`` builds ``loop_num`` ``Attention`` layers per decoder layer: loop ``j`` of layer
  ``i`` is named ``model.layers.{j * num_hidden_layers + i}.self_attn.attn`` (the prefix's layer index
  replaced by the unique index), each with ``num_key_value_heads`` KV heads, per rank ``max(1, kv // tp)``
  (split when at least ``tp``, else replicated), head size ``hidden_size // num_attention_heads``
  (``head_dim`` is not read).
- Loop 0 takes the engine's cache config (its one window: a written ``sliding_window`` is refused here, not
  checked against vLLM's construction); every later loop a copy whose window is ``loop_window_size``.
- vLLM reads ``loop_num`` and ``loop_window_size`` with ``getattr`` defaults (2 and 64) that apply only where
  the config class lacks them; the class is the checkpoint's remote code, so kvlayout reads both as written
  and refuses a config that leaves either out. A written ``dual_chunk_attention_config`` is refused.
- Groups as vLLM's ``get_kv_cache_groups``: one page for every layer; the full (loop 0) and sliding layers
  are a bucket each, split as any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .attention import kv_per_rank
from .base import Ctx
from .config import MAX_CONFIG_LAYERS, Config, resolve_kv_dtype
from .grouping import vllm_groups

_REMOTE = "the config class is the checkpoint's remote code, which kvlayout does not run: write it"


def _req(cfg: Config, key: str, why: str) -> int:
    """A required integer of at least 1, refused by name when left out."""
    if not cfg.has(key):
        raise spec_error(cfg.field(key), None, f"missing; {why}; {_REMOTE}")
    return cfg.req_int(key, why)


def _kv_per_rank(cfg: Config, heads: int, tp: int) -> int:
    """``num_key_value_heads`` per rank, with the assertions of vLLM's ``LoopCoderAttention``."""
    total = _req(cfg, "num_key_value_heads", "vLLM's LoopCoderAttention reads it")
    return kv_per_rank(cfg.field("num_key_value_heads"), total, heads, tp)


def loop_layers(cfg: Config, n: int) -> list[tuple[int, int | None]]:
    """(unique layer index, window) of every attention layer, in vLLM's construction order."""
    loops = _req(cfg, "loop_num", "vLLM's LoopCoderAttention builds loop_num attentions per layer")
    if n * loops > MAX_CONFIG_LAYERS:  # before a list of them is built (10**6 loops took 220 s and 1.9 GB)
        why = (
            f"{n:,} layers x {loops:,} loops is {n * loops:,} attention layers: kvlayout plans at most "
            f"{MAX_CONFIG_LAYERS:,} (num_hidden_layers x loop_num)"
        )
        raise spec_error(cfg.field("loop_num"), loops, why)
    window = _req(cfg, "loop_window_size", "the window of every loop after the first")
    return [(j * n + i, None if j == 0 else window) for i in range(n) for j in range(loops)]


def iquest_loopcoder_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = _req(cfg, "num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    hidden = _req(cfg, "hidden_size", "the head size is hidden_size // num_attention_heads")
    head = hidden // heads
    if head < 1:
        why = f"below num_attention_heads = {heads}: the head size hidden_size // heads is 0"
        raise spec_error(cfg.field("hidden_size"), hidden, why)
    kv_heads = _kv_per_rank(cfg, heads, c.tp)
    for key in ("sliding_window", "dual_chunk_attention_config"):
        if cfg.has(key):
            why = (
                "vLLM's first loop of every layer would take it (the engine's window, or dual-chunk "
                "attention), not checked against vLLM's construction for IQuest-Coder Loop: leave it out"
            )
            raise spec_error(cfg.field(key), cfg.data[key], why)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    bucket: dict[str, list[LayerSpec]] = {}
    for idx, w in loop_layers(cfg, n):
        name = c.name(idx, "self_attn.attn")
        layer: LayerSpec
        if w is None:
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv
            )
        else:
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=w
            )
        kind = "full" if w is None else "sliding"
        c.kinds[name] = kind
        bucket.setdefault(kind, []).append(layer)
    return vllm_groups(list(bucket.items())), kv, bs
