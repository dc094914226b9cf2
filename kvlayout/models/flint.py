"""Flint (``FlintForCausalLM``, model_type ``flint``; vLLM 0.33's ``vllm/models/flint``, read through vLLM's
own ``FlintConfig``).

- One attention per layer (``FlintAttention``), named ``model.layers.{i}.self_attn.attn``:
  ``num_key_value_heads`` KV heads (the class's default 4), per rank ``max(1, kv // tp)`` (split when at
  least ``tp``, else replicated), head size ``head_dim`` (the class's default 128), every head with a
  learned sink.
- Layer ``i`` slides over ``sliding_window`` where ``layer_types[i]`` is ``sliding_attention``, else it is
  full. ``FlintConfig`` fills ``layer_types`` with ``full_attention`` where it is null, empty or left out
  (and refuses another length than ``num_hidden_layers``), ``sliding_window`` with 513 where left out, and
  makes it null where ``use_sliding_window`` (default true) is false; a null window leaves every layer full
  (the engine's window is none unless every layer slides, and then it is the same null).
- ``FlintAttention`` asserts FlashInfer's implementation, a bfloat16 model and a bfloat16 cache: vLLM 0.33
  builds the model only with FLASHINFER (its choice on Blackwell; on Hopper it picks FLASH_ATTN, which
  serves sinks, so FLASHINFER must be named: its sinks take TRT-LLM's decode kernel there, assumed present
  as the GPU's other run-time probes are), and refuses another model or cache dtype. kvlayout refuses each
  of those, naming the argument.
- Groups as vLLM's ``get_kv_cache_groups``: one page for every layer; the full and the sliding layers a
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

#: FlintConfig's window where config.json leaves ``sliding_window`` out (vLLM 0.33's models/flint/configs.py)
SLIDING_WINDOW_DEFAULT = 513
#: the GPU generations whose FlashInfer serves attention sinks (TRT-LLM kernels: SM90 decode, SM100 both)
_SINK_DEVICES = ("hopper", "blackwell")


def _class_int(cfg: Config, key: str, why: str) -> int:
    """An integer field, or FlintConfig's default where left out (:data:`.config_aliases.DEFAULTS`)."""
    if key not in cfg.data:
        value = cfg.class_default(key)
        if value is not None:
            return value
    return cfg.req_int(key, why)


def _layer_types(cfg: Config, n: int) -> list[Any]:
    """``layer_types`` as ``FlintConfig`` holds it: every layer ``full_attention`` where null, empty or
    left out, else exactly one string per layer."""
    raw = cfg.data.get("layer_types")
    if not raw:
        return ["full_attention"] * n
    if not isinstance(raw, list) or len(raw) != n:
        shown = f"{len(raw)} entries" if isinstance(raw, list) else raw
        why = f"FlintConfig takes exactly one entry per layer ({n})"
        raise spec_error(cfg.field("layer_types"), shown, why)
    for i, t in enumerate(raw):
        if not isinstance(t, str):
            raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, "must be a string")
    return raw


def window(cfg: Config) -> int | None:
    """``sliding_window`` as ``FlintConfig`` holds it (its default where left out; null where
    ``use_sliding_window`` is false)."""
    if "use_sliding_window" in cfg.data and not cfg.req_bool("use_sliding_window", "whether windows apply"):
        return None
    if "sliding_window" not in cfg.data:
        cfg.notes.append(
            f"{cfg.field('sliding_window')} left out: FlintConfig's default, {SLIDING_WINDOW_DEFAULT} "
            "(vLLM), as vLLM reads it"
        )
        return SLIDING_WINDOW_DEFAULT
    return cfg.opt_int("sliding_window")  # a 0 was made null, as vLLM's ModelConfig makes it


def windows(cfg: Config, n: int) -> list[int | None]:
    """Each layer's window (None: full attention), as vLLM 0.33's ``FlintAttention`` passes it."""
    types = _layer_types(cfg, n)
    w = window(cfg) if "sliding_attention" in types else None
    return [w if t == "sliding_attention" else None for t in types]


def _check_runtime(c: Ctx) -> int:
    """The FLASHINFER block size, after FlintAttention's assertions (backend, model and cache dtypes)."""
    if c.dtype != "bfloat16":
        why = "vLLM's FlintAttention asserts a bfloat16 model (the config's torch_dtype, or the dtype set)"
        raise spec_error("dtype", c.dtype, why)
    if c.kv_cache_dtype not in (None, "auto", "bfloat16"):
        why = "vLLM's FlintAttention asserts an auto or bfloat16 cache"
        raise spec_error("kv_cache_dtype", c.kv_cache_dtype, why)
    resolved = c.backend(mla=False)
    if c.device is None:  # no CUDA GPU (tpu-inference): refused by that engine, not here
        return c.block(resolved.block_size)
    if c.device not in _SINK_DEVICES:
        why = (
            f"vLLM's FlashInfer serves attention sinks only with TRT-LLM's kernels (Hopper, Blackwell), and "
            f"FlintAttention asserts FlashInfer: vLLM 0.33 does not build Flint on {c.device}"
        )
        raise spec_error("device", c.device, why)
    if resolved.backend.name != "FLASHINFER":
        named = f"vLLM's choice on {c.device}: it serves sinks"
        if c.attention_backend is not None:
            named = "named"
        raise spec_error(
            "attention_backend",
            c.attention_backend,
            f"{resolved.backend.name} ({named}): vLLM's FlintAttention asserts FlashInfer's implementation; "
            "vLLM 0.33 builds the model only with attention_backend='FLASHINFER' (--attention-backend "
            "FLASHINFER; Blackwell's own choice)",
        )
    return c.block(resolved.block_size)


def flint_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    total = _class_int(cfg, "num_key_value_heads", "the KV heads of every layer")
    kv_heads = kv_per_rank(cfg.field("num_key_value_heads"), total, heads, c.tp)
    head = _class_int(cfg, "head_dim", "the head size")
    wins = windows(cfg, n)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = _check_runtime(c)
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
