"""Step 1 (``Step1ForCausalLM``; vLLM 0.33's ``step1.py``; the config class is the checkpoint's remote code).

- One attention per layer (``StepAttention``), named ``model.layers.{i}.self_attn.attn``, head size
  ``hidden_size // num_attention_heads`` (``head_dim`` is not read).
- KV heads: ``getattr(config, "num_attention_groups", getattr(config, "num_key_value_heads", 1))``, a null
  or a value below 1 read as 1; per rank ``max(1, kv // tp)`` (split when at least ``tp``, else replicated).
  vLLM's default 1 applies only where the remote class has neither attribute: kvlayout reads them as written
  and refuses a config that writes neither.
- No per-layer window: every layer takes the engine's one window (``sliding_window`` where ``layer_types``
  is absent or all ``sliding_attention``, else none).
- Its layers are ALiBi attention with ``use_alibi_sqrt``, which vLLM 0.33's ``Attention`` refuses unless the
  backend supports it: of the CUDA backends only TRITON_ATTN does, and it is last in every priority list, so
  the model builds only with ``attention_backend='TRITON_ATTN'``; any other backend is refused here, as
  vLLM refuses it (:func:`triton_only_block`).
"""

from __future__ import annotations

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from ..validate import is_int
from .attention import kv_per_rank
from .base import Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups

_REMOTE = "the config class is the checkpoint's remote code, which kvlayout does not run: write it"


def triton_only_block(c: Ctx, why: str) -> int:
    """The block size with the TRITON_ATTN backend, the only CUDA backend vLLM 0.33 builds the model's
    layers with (``why``); another backend, the one named or the one vLLM would pick, is refused."""
    resolved = c.backend(mla=False)
    if c.device is not None and resolved.backend.name != "TRITON_ATTN":  # None: no CUDA GPU (tpu-inference)
        named = "named" if c.attention_backend is not None else f"vLLM's choice on {c.device}"
        raise spec_error(
            "attention_backend",
            c.attention_backend,
            f"{resolved.backend.name} ({named}): {why}; vLLM 0.33 builds the model only with "
            "attention_backend='TRITON_ATTN' (--attention-backend TRITON_ATTN)",
        )
    return c.block(resolved.block_size)


def _kv_total(cfg: Config) -> tuple[int, str]:
    """(KV heads, the field read): ``num_attention_groups`` where written, else ``num_key_value_heads``."""
    for key in ("num_attention_groups", "num_key_value_heads"):
        if key not in cfg.data:
            continue
        v = cfg.data[key]
        if v is None or is_int(v) and v < 1:
            cfg.notes.append(f"{cfg.field(key)} = {v!r}: vLLM's StepAttention reads it as 1 KV head")
            return 1, key
        return cfg.req_int(key, "the KV heads"), key
    why = "vLLM's StepAttention reads num_attention_groups, else num_key_value_heads"
    raise spec_error(cfg.field("num_attention_groups"), None, f"missing; {why}; {_REMOTE}")


def engine_window(cfg: Config) -> int | None:
    """The engine's one window (``EngineArgs.create_engine_config``): ``sliding_window`` where
    ``layer_types`` is absent or every entry is ``sliding_attention``, else none."""
    if cfg.has("layer_types"):
        types = cfg.data["layer_types"]
        if isinstance(types, str):  # EngineArgs iterates it: its characters, none sliding_attention
            cfg.notes.append(
                f"{cfg.field('layer_types')} is a string: vLLM 0.33 reads its characters as the layer kinds "
                "(the engine's window only where it is empty)"
            )
        elif not isinstance(types, list):
            raise spec_error(cfg.field("layer_types"), types, "must be a list of one entry per layer")
        if any(t != "sliding_attention" for t in types):
            return None
    return cfg.opt_int("sliding_window")


def step1_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = c.cfg
    n = c.num_layers()
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    hidden = cfg.req_int("hidden_size", "the head size is hidden_size // num_attention_heads")
    if hidden < heads:
        why = f"below num_attention_heads = {heads}: the head size hidden_size // heads is 0"
        raise spec_error(cfg.field("hidden_size"), hidden, why)
    head = hidden // heads
    total, key = _kv_total(cfg)
    kv_heads = kv_per_rank(cfg.field(key), total, heads, c.tp)
    window = engine_window(cfg)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = triton_only_block(c, "its ALiBi layers take use_alibi_sqrt, which only TRITON_ATTN supports")
    kind = "full" if window is None else "sliding"
    layers: list[LayerSpec] = []
    for i in range(n):
        name = c.name(i, "self_attn.attn")
        if window is None:
            layer: LayerSpec = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv
            )
        else:
            layer = SlidingWindowSpec(
                name=name, block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv, window=window
            )
        c.kinds[name] = kind
        layers.append(layer)
    return vllm_groups([(kind, layers)]), kv, bs
