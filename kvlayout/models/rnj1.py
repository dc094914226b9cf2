"""Rnj-1 (``Rnj1ForCausalLM``; vLLM 0.33's ``rnj1.py``; the config class is the checkpoint's remote code).

- One attention per layer (``Rnj1Attention``), named ``model.layers.{i}.self_attn.attn``:
  ``num_key_value_heads`` KV heads, per rank ``max(1, kv // tp)`` (split when at least ``tp``, else
  replicated), head size ``head_dim`` (no ``hidden_size // heads`` fallback).
- Layer ``i`` is chunked where ``layer_types[i]`` is ``chunked_attention``: it passes ``sliding_window`` as
  its window with ``chunk_lookback`` 1 (Triton's kernel lets a query read its own chunk of
  ``sliding_window // 2`` tokens and the one before, all within the window), so its cache is a sliding
  window's; ``chunk_lookback`` changes which cached keys the kernel reads, not the cache. Every other layer
  takes the engine's one window (``sliding_window`` where every ``layer_types`` entry is
  ``sliding_attention``, else none).
- The remote class may derive ``layer_types``, ``head_dim`` and the KV heads: kvlayout reads them as written
  and refuses a config that leaves one out, naming it.
- Every layer passes ``chunk_lookback`` (-1 where not chunked) to its backend's implementation: of the CUDA
  backends only TRITON_ATTN takes it (FlashAttention's and FlashInfer's fail on the keyword), so vLLM 0.33
  builds the model only with ``attention_backend='TRITON_ATTN'`` (:func:`.step1.triton_only_block`).
- Groups as vLLM's ``get_kv_cache_groups``: one page for every layer; full and sliding layers a bucket
  each (first seen first), split as any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .attention import kv_per_rank
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups
from .step1 import triton_only_block

_REMOTE = "the config class is the checkpoint's remote code, which kvlayout does not run: write it"


def _req(cfg: Config, key: str, why: str) -> int:
    """A required integer of at least 1, refused by name when left out."""
    if not cfg.has(key):
        raise spec_error(cfg.field(key), None, f"missing; {why}; {_REMOTE}")
    return cfg.req_int(key, why)


def windows(cfg: Config, n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM 0.33's ``Rnj1Attention`` and the engine give it."""
    if not cfg.has("layer_types"):
        why = "vLLM's Rnj1Attention reads layer_types[i]"
        raise spec_error(cfg.field("layer_types"), None, f"missing; {why}; {_REMOTE}")
    types = cfg.data["layer_types"]
    if not isinstance(types, (list, str)) or len(types) < n:
        shown = f"{len(types)} entries" if isinstance(types, list) else types
        raise spec_error(cfg.field("layer_types"), shown, f"must be a list of one entry per layer ({n})")
    if isinstance(types, str):  # vLLM indexes it: layer i reads its character i, no kind of attention
        cfg.notes.append(
            f"{cfg.field('layer_types')} is a string: vLLM 0.33 reads character i as layer i's kind "
            "(none chunked, no engine window)"
        )
    for i, t in enumerate(types):
        if not isinstance(t, str):
            raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, "must be a string")
    window = cfg.opt_int("sliding_window")  # 0 was made null, as vLLM's ModelConfig makes it
    engine = window if all(t == "sliding_attention" for t in types) else None  # EngineArgs reads them all
    return [window if t == "chunked_attention" else engine for t in types[:n]]


def rnj1_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = _req(cfg, "num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    total = _req(cfg, "num_key_value_heads", "vLLM's Rnj1Attention reads it")
    kv_heads = kv_per_rank(cfg.field("num_key_value_heads"), total, heads, c.tp)
    head = _req(cfg, "head_dim", "vLLM's Rnj1Attention reads config.head_dim")
    wins = windows(cfg, n)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    why = "every layer passes chunk_lookback to its implementation, which only TRITON_ATTN takes"
    bs = triton_only_block(c, why)
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
