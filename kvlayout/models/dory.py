"""Dory (``DoryForCausalLM``, model_type ``dory``; vLLM 0.33's ``dory.py``, read through vLLM's own
``DoryConfig``).

- Each physical layer is attention or an MLP (``layer_types[i]``: ``sliding_attention``, ``full_attention``
  or ``mlp``). The layers ``n_input_layers <= i < n_input_layers + n_recurrent_layers`` run
  ``n_recurrent_loops`` times; with ``recurrent_kv_cache_mode`` ``per_loop`` each loop of an attention
  layer holds its own cache, loop ``j`` of layer ``i`` named
  ``backbone.layers.{j * num_hidden_layers + i}.mixer.attn`` (``last_loop``: one cache, overwritten by each
  loop), built layer by layer, loop by loop.
- Every attention: ``num_key_value_heads`` KV heads (the class's default 4), head size ``head_dim`` (256); a
  sliding layer's window is ``sliding_window`` (1024), a full layer's none (the engine's is none: the MLP
  layers are not all sliding).
- ``DoryConfig`` fills ``layer_types`` (an MLP on odd layers, full attention where ``i % 8 == 6``, else
  sliding), the partitions (0 input and output layers, the rest recurrent), one loop and ``per_loop`` where
  config.json leaves them out, and validates itself as vLLM reads it (its layout, head, flag and RoPE
  checks mirrored here, naming the field: they decide whether vLLM builds the model); ``DoryForCausalLM``
  refuses a tensor-parallel size above 1.
- Groups as vLLM's ``get_kv_cache_groups``: one page for every layer; the full and the sliding layers a
  bucket each (first seen first), split as any hybrid's (:func:`.grouping.vllm_groups`).
"""

from __future__ import annotations

from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from .base import MAX_LAYERS, Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups

#: DoryConfig's defaults that decide the cache where config.json leaves the field out (vLLM 0.33's
#: transformers_utils/configs/dory.py); its KV heads and head size come from config_aliases.DEFAULTS
SLIDING_WINDOW_DEFAULT = 1024
_TYPES = ("sliding_attention", "full_attention", "mlp")
_MODES = ("per_loop", "last_loop")


def _class_int(cfg: Config, key: str, why: str) -> int:
    """An integer field, or DoryConfig's default where left out (:data:`.config_aliases.DEFAULTS`)."""
    if key not in cfg.data:
        value = cfg.class_default(key)
        if value is not None:
            return value
    return cfg.req_int(key, why)


def _int(cfg: Config, key: str, default: int, lo: int) -> int:
    """An integer of at least ``lo``, DoryConfig's ``default`` where left out."""
    return default if key not in cfg.data else cfg.req_int(key, "DoryConfig's layer layout", lo=lo)


def layer_types(cfg: Config, n: int) -> list[str]:
    """``layer_types`` as ``DoryConfig`` holds it (its pattern where null or left out)."""
    raw: Any = cfg.data.get("layer_types")
    if raw is None:
        return ["mlp" if i % 2 else "full_attention" if i % 8 == 6 else "sliding_attention" for i in range(n)]
    if not isinstance(raw, list) or len(raw) != n:
        shown = f"{len(raw)} entries" if isinstance(raw, list) else raw
        why = f"DoryConfig takes exactly one entry per layer ({n})"
        raise spec_error(cfg.field("layer_types"), shown, why)
    for i, t in enumerate(raw):
        if t not in _TYPES:
            why = f"DoryConfig takes one of {', '.join(_TYPES)}"
            raise spec_error(f"{cfg.field('layer_types')}[{i}]", t, why)
    return list(raw)


def _check_flags(cfg: Config) -> None:
    """DoryConfig's checks beyond the layout (bias-free projections, SiLU, untied embeddings); its strict
    field types refuse a 0 for a bool flag (pass 27: ``0 != False`` is false)."""
    for key, ok, why in (
        ("attention_bias", False, "Dory requires bias-free projections"),
        ("mlp_bias", False, "Dory requires bias-free projections"),
        ("tie_word_embeddings", False, "Dory requires untied embeddings"),
        ("hidden_act", "silu", "Dory requires SiLU"),
    ):
        if key in cfg.data and (type(cfg.data[key]) is not type(ok) or cfg.data[key] != ok):
            raise spec_error(cfg.field(key), cfg.data[key], f"{why}: DoryConfig refuses it")
    init = cfg.data.get("initializer_range", 0.02)
    if isinstance(init, bool) or not isinstance(init, (int, float)) or not init > 0:
        raise spec_error(cfg.field("initializer_range"), init, "DoryConfig takes a positive number")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_rope(cfg: Config, types: list[str], head: int) -> None:
    """``DoryConfig.validate_rope``, which vLLM 0.33 runs when it reads the config: RoPE parameters for each
    attention type there is and no other (none when every layer is an MLP), default RoPE, a positive
    theta, and a rotary part ``int(head_dim * partial_rotary_factor)`` that is positive and even
    (``rope_type`` and ``rope_theta`` left out take ``default`` and ``rope_theta``'s, or 10,000)."""
    kinds = [t for t in ("sliding_attention", "full_attention") if t in types]
    if not kinds:
        why = "no attention layer: DoryConfig refuses its rope_parameters (none for an attention type)"
        raise spec_error(cfg.field("layer_types"), "all mlp", why)
    theta = cfg.data.get("rope_theta", 10000.0)
    raw: Any = cfg.data.get("rope_parameters")
    if raw is None:  # DoryConfig's default: one entry per attention type there is
        raw = {k: {"rope_type": "default", "partial_rotary_factor": 1.0} for k in kinds}
    field = cfg.field("rope_parameters")
    allowed = {"sliding_attention", "full_attention"}
    if not isinstance(raw, dict) or set(raw) - allowed or set(kinds) - set(raw):
        why = f"DoryConfig takes an entry for each attention type there is ({', '.join(kinds)}) and no other"
        raise spec_error(field, raw if not isinstance(raw, dict) else sorted(raw), why)
    for kind, rope in raw.items():
        where = f"{field}.{kind}"
        if not isinstance(rope, dict):
            raise spec_error(where, rope, "DoryConfig takes an object")
        t, th = rope.get("rope_type", "default"), rope.get("rope_theta", theta)
        if t != "default" or not _number(th) or not th > 0:
            raise spec_error(where, rope, "Dory requires default RoPE with a positive rope_theta")
        f = rope.get("partial_rotary_factor", 1.0)
        if not _number(f) or not 0 < f <= 1 or int(head * f) <= 0 or int(head * f) % 2:
            why = f"the rotary part int(head_dim {head} * partial_rotary_factor) must be positive and even"
            raise spec_error(f"{where}.partial_rotary_factor", f, f"{why}, the factor in (0, 1]")


def attention_layers(cfg: Config, n: int, types: list[str]) -> list[tuple[int, str]]:
    """(unique index, layer type) of every attention, in vLLM 0.33's construction order."""
    n_in = _int(cfg, "n_input_layers", 0, 0)
    n_out = _int(cfg, "n_output_layers", 0, 0)
    n_rec = n - n_in - n_out  # DoryConfig's where null or left out
    if cfg.has("n_recurrent_layers"):
        n_rec = cfg.req_int("n_recurrent_layers", "DoryConfig's layer layout", lo=0)
    if n_rec < 0 or n_in + n_rec + n_out != n:
        why = f"n_input_layers + n_recurrent_layers + n_output_layers must be num_hidden_layers = {n}, "
        raise spec_error(cfg.field("n_recurrent_layers"), n_rec, f"{why}none below 0: DoryConfig refuses it")
    loops = _int(cfg, "n_recurrent_loops", 1, 1)
    mode = cfg.data.get("recurrent_kv_cache_mode", "per_loop")
    if mode not in _MODES:
        why = f"DoryConfig takes {' or '.join(_MODES)}"
        raise spec_error(cfg.field("recurrent_kv_cache_mode"), mode, why)
    if n * loops > MAX_LAYERS:
        why = f"times num_hidden_layers = {n}: over {MAX_LAYERS:,} attentions"
        raise spec_error(cfg.field("n_recurrent_loops"), loops, why)
    out: list[tuple[int, str]] = []
    for i, t in enumerate(types):
        if t == "mlp":
            continue
        k = loops if n_in <= i < n_in + n_rec and mode == "per_loop" else 1
        out.extend((j * n + i, t) for j in range(k))
    return out


def dory_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    if c.tp != 1:
        raise spec_error("tp", c.tp, "vLLM 0.33's DoryForCausalLM supports tensor_parallel_size 1 only")
    n = c.num_layers()
    heads = cfg.req_int("num_attention_heads", "the query heads")
    kv_heads = _class_int(cfg, "num_key_value_heads", "the KV heads of every attention")
    if heads % kv_heads:
        why = f"does not divide num_attention_heads = {heads}: DoryConfig refuses it"
        raise spec_error(cfg.field("num_key_value_heads"), kv_heads, why)
    head = _class_int(cfg, "head_dim", "the head size")
    types = layer_types(cfg, n)
    _check_flags(cfg)
    check_rope(cfg, types, head)
    window = None
    if "sliding_attention" in types:
        if "sliding_window" not in cfg.data:
            cfg.notes.append(
                f"{cfg.field('sliding_window')} left out: DoryConfig's default, {SLIDING_WINDOW_DEFAULT} "
                "(vLLM), as vLLM reads it"
            )
            window = SLIDING_WINDOW_DEFAULT
        else:  # a 0 was made null, as vLLM's ModelConfig makes it: DoryConfig then refuses it
            window = cfg.req_int("sliding_window", "DoryConfig requires it with sliding_attention layers")
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(c.backend(mla=False).block_size)
    bucket: dict[str, list[LayerSpec]] = {}
    for idx, t in attention_layers(cfg, n, types):
        name = f"backbone.layers.{idx}.mixer.attn"
        layer: LayerSpec
        if t == "full_attention" or window is None:
            kind = "full"
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv
            )
        else:
            kind = "sliding"
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=window
            )
        c.add(kind, layer, bucket)
    return vllm_groups(list(bucket.items())), kv, bs
