"""Inkling (``InklingForCausalLM``, model_type ``inkling_model``, and the multimodal
``InklingForConditionalGeneration``, ``inkling_mm_model``: thinkingmachines/Inkling; vLLM 0.33's
``vllm/models/inkling``, its NVIDIA variant ``nvidia/model.py``, ``sconv_swa_attn.py`` and ``attention.py``,
read through vLLM's own ``InklingModelConfig``, the multimodal one's ``text_config``).

- Every decoder layer ``i`` holds two caches, built in this order: ``model.layers.{i}.conv_state`` (the
  short convolutions' state, ``InklingConvState``) and ``model.layers.{i}.attn`` (``InklingAttention``); the
  multimodal wrapper names them the same (its text backbone is ``model``, not ``language_model``).
- A layer in ``local_layer_ids`` is local: ``swa_num_attention_heads``, ``swa_num_key_value_heads`` and
  ``swa_head_dim``, its attention sliding over ``sliding_window_size``; any other is global
  (``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, full attention).
- The conv state is a sliding-window cache of ``sconv_kernel_size`` (``K``) tokens a block and a window of
  ``K``: ``kv // tp`` heads (vLLM asserts ``tp <= kv``) of the packed K, V, attention-output and MLP-output
  streams, ``2 * head + 2 * (hidden_size // kv)`` wide, rounded up to a power of two; no V half; always
  bfloat16 (vLLM asserts the model's dtype is bfloat16; an fp8 cache is the attention's alone).
- The attention: ``kv // tp`` KV heads (``InklingAttention`` asserts the heads and KV heads divide by
  ``tp``) of the layer's head size, in the cache dtype, on the block vLLM's FLASH_ATTN takes (16 tokens):
  the layers name their backends themselves (FLASH_ATTN's metadata, ``INKLING_SCONV_SWA``), whatever
  attention backend is named.
- ``InklingModelConfig`` fills what config.json leaves out (16 layers, hidden size 1,536, 12 heads, 4 KV
  heads, ``head_dim = hidden_size // num_attention_heads``, the ``swa_`` fields from the global ones, a
  512-token window, no local layers, ``K`` from ``conv_kernel_size`` or 4); each said in a note.
- Groups as vLLM's ``get_kv_cache_groups``: pages unified to the largest (a block made that many times
  larger where the page divides it, else the page padded: :func:`.mimo_v2.unify_pages`), then each
  distinct spec a bucket, first seen first, split as any hybrid's (:func:`.grouping.vllm_groups`). Where
  every layer is local with window ``K`` and the block is ``K``, one group of per-layer pages
  (``UniformTypeKVCacheSpecs``).
"""

from __future__ import annotations

from typing import Any

from ..errors import spec_error
from ..spec import FullAttentionSpec, GroupSpec, LayerSpec, SlidingWindowSpec
from ..validate import is_int
from .backends import BACKENDS, DEVICES, VLLM_BLOCK_SIZE, Resolved
from .base import MAX_LAYERS, Ctx
from .config import Config, resolve_kv_dtype
from .grouping import vllm_groups
from .mimo_v2 import unify_pages

#: InklingModelConfig's defaults (vLLM 0.33's models/inkling/configs.py) that decide the cache
DEFAULTS: dict[str, int] = {
    "num_hidden_layers": 16,
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "sliding_window_size": 512,
}
KERNEL_DEFAULT = 4
#: the model's dtype InklingConvState asserts (sconv_swa_attn.py)
CONV_DTYPE = "bfloat16"
#: the layers' names (the text backbone is ``model`` in both architectures)
PREFIX = "model.layers"


def _int(cfg: Config, key: str, why: str) -> int:
    """An integer field, or InklingModelConfig's default where left out (said in a note); a null is kept
    by the class, and vLLM's layers fail on it."""
    if key not in cfg.data:
        cfg.notes.append(f"{cfg.field(key)} left out: InklingModelConfig's default, {DEFAULTS[key]} (vLLM)")
        return DEFAULTS[key]
    return cfg.req_int(key, why)


def _derived(cfg: Config, key: str, fallback: int, what: str) -> int:
    """A field InklingModelConfig derives where null or left out (``fallback``, said as ``what``)."""
    if cfg.data.get(key) is None:
        return fallback
    return cfg.req_int(key, f"InklingModelConfig takes {what} where null")


def local_layers(cfg: Config, n: int) -> set[int]:
    """``local_layer_ids`` as vLLM reads it: the set of the layer indices listed (none where null or left
    out; an index past the layers marks none)."""
    raw: Any = cfg.data.get("local_layer_ids")
    if raw is None:
        return set()
    if not isinstance(raw, list):
        raise spec_error(cfg.field("local_layer_ids"), raw, "must be a list of layer indices")
    for j, v in enumerate(raw):
        if not is_int(v):
            raise spec_error(f"{cfg.field('local_layer_ids')}[{j}]", v, "must be an integer layer index")
    return {int(v) for v in raw if 0 <= int(v) < n}


def kernel_size(cfg: Config) -> int:
    """``sconv_kernel_size``, else transformers' name ``conv_kernel_size``, else 4 (InklingModelConfig)."""
    for key in ("sconv_kernel_size", "conv_kernel_size"):
        if cfg.data.get(key) is not None:
            return cfg.req_int(key, "the short convolutions' kernel: the conv state's block and window")
    cfg.notes.append(
        f"{cfg.field('sconv_kernel_size')} and conv_kernel_size left out: InklingModelConfig's default, "
        f"{KERNEL_DEFAULT} (vLLM)"
    )
    return KERNEL_DEFAULT


def conv_head_size(head: int, hidden: int, kv_heads: int) -> int:
    """The conv state's packed head (``InklingConvState``): K, V and two ``hidden // kv`` output chunks,
    rounded up to a power of two so that every layer's conv page divides the others."""
    raw = 2 * head + 2 * (hidden // kv_heads)
    return 1 << (raw - 1).bit_length()


def _check_backend(c: Ctx, heads: dict[str, int], kv: str) -> None:
    """FLASH_ATTN is the attention's backend whatever is named (not checked against vLLM: refused); its
    16-token kernel block must divide a block size set; FlashAttention 4's fixed pages (head size 256 on
    Blackwell, 512 with an fp8 cache) would set vLLM's block and are not modeled."""
    if c.attention_backend not in (None, "FLASH_ATTN"):
        why = (
            "vLLM 0.33's Inkling layers name their own backends (FLASH_ATTN's metadata, INKLING_SCONV_SWA) "
            "whatever is named, not checked against vLLM here: name FLASH_ATTN or none"
        )
        raise spec_error("attention_backend", c.attention_backend, why)
    if c.block_size is not None and c.block(VLLM_BLOCK_SIZE) % VLLM_BLOCK_SIZE:
        why = f"FLASH_ATTN, Inkling's attention backend, takes blocks in multiples of {VLLM_BLOCK_SIZE}"
        raise spec_error("block_size", c.block_size, why)
    major = DEVICES[c.device][0] if c.device is not None and c.device in DEVICES else 0
    for field, h in heads.items():
        if (h == 256 and major in (10, 11)) or (h == 512 and kv.startswith("float8")):
            why = (
                f"FLASH_ATTN's FlashAttention 4 kernel page for head size {h} on {c.device} would set vLLM "
                "0.33's block size and Inkling's layers' kernel blocks: not modeled"
            )
            raise spec_error(field, h, why)


def _uniform_type(layers: list[FullAttentionSpec]) -> bool:
    """vLLM's ``UniformTypeKVCacheSpecs.is_uniform_type``: one block size, every layer sliding with one
    window (a conv state is never full attention)."""
    blocks = {x.block_size for x in layers}
    windows = {x.window if isinstance(x, SlidingWindowSpec) else None for x in layers}
    return len(blocks) == 1 and len(windows) == 1 and None not in windows


def group(layers: list[FullAttentionSpec], kinds: list[str], notes: list[str]) -> tuple[GroupSpec, ...]:
    """vLLM 0.33's ``get_kv_cache_groups`` for Inkling's specs, in model order."""
    if _uniform_type(layers):
        notes.append("every layer slides over the conv kernel's window in its block: one group (vLLM 0.33)")
        return (GroupSpec("sliding", tuple(layers)),)
    unified = unify_pages(layers, notes)
    buckets: dict[tuple[Any, ...], list[LayerSpec]] = {}
    labels: dict[tuple[Any, ...], str] = {}
    for x, kind in zip(unified, kinds, strict=True):
        key = (type(x).__name__, x.geometry_key)  # vLLM: one bucket per distinct spec, first seen first
        labels.setdefault(key, kind)
        buckets.setdefault(key, []).append(x)
    seen: dict[str, int] = {}
    for kind in labels.values():
        seen[kind] = seen.get(kind, 0) + 1
    named: list[tuple[str, list[LayerSpec]]] = []
    count: dict[str, int] = {}
    for key, members in buckets.items():
        kind = labels[key]
        if seen[kind] > 1:
            count[kind] = count.get(kind, 0) + 1
            kind = f"{kind}.{count[kind] - 1}"
        named.append((kind, members))
    return vllm_groups(named)


#: InklingMMConfig's read-only properties (its text_config's): a config.json writing one at the top level is
#: refused by the class (no setter)
MM_PROPERTIES = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "full_attention_layer_ids", "linear_layer_ids", "conv_layer_ids", "mamba_chunk_size",
    "mamba2_cache_params",
)
#: the model type vLLM 0.33 builds each architecture's config with (another fails in its constructor)
MODEL_TYPES = {"InklingForCausalLM": "inkling_model", "InklingForConditionalGeneration": "inkling_mm_model"}


def text_of(c: Ctx) -> Config:
    """The text model's config as vLLM builds it: the config itself (``inkling_model``), or the
    multimodal one's ``text_config``, InklingModelConfig's defaults where left out."""
    top = c.top
    archs: Any = top.data.get("architectures")
    arch = next((a for a in archs if a in MODEL_TYPES), "") if isinstance(archs, list) else ""
    mt = top.data.get("model_type")
    if mt != MODEL_TYPES.get(arch):
        why = f"vLLM 0.33 builds {arch or 'Inkling'} from model_type {MODEL_TYPES.get(arch)!r} only"
        raise spec_error(top.field("model_type"), mt, why)
    if mt == "inkling_model":
        return c.cfg
    for key in MM_PROPERTIES:
        if key in top.data:
            why = "a read-only property of vLLM 0.33's InklingMMConfig (its text_config's): refused by it"
            raise spec_error(top.field(key), top.data[key], why)
    if c.cfg is top:
        top.notes.append(
            f"{top.field('text_config')} left out: InklingMMConfig builds InklingModelConfig's defaults "
            "(vLLM)"
        )
        return Config({}, top.field("text_config"), notes=top.notes)
    return c.cfg


def inkling_family(c: Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    cfg = text_of(c)
    if c.dtype != CONV_DTYPE:
        why = f"vLLM 0.33's InklingConvState asserts the model's dtype is {CONV_DTYPE} (its sconv cache)"
        raise spec_error("dtype", c.dtype, why)
    n = _int(cfg, "num_hidden_layers", "the number of decoder layers")
    if n > MAX_LAYERS:
        raise spec_error(cfg.field("num_hidden_layers"), n, f"must be at most {MAX_LAYERS:,}")
    hidden = _int(cfg, "hidden_size", "the hidden size (the conv state's output streams)")
    heads = _int(cfg, "num_attention_heads", "the global layers' query heads")
    kv_heads = _int(cfg, "num_key_value_heads", "the global layers' KV heads")
    if hidden // heads < 1 and cfg.data.get("head_dim") is None:
        why = f"below num_attention_heads = {heads}: InklingModelConfig's head_dim (hidden // heads) is 0"
        raise spec_error(cfg.field("hidden_size"), hidden, why)
    head = _derived(cfg, "head_dim", hidden // heads, "hidden_size // num_attention_heads")
    local = {
        "heads": _derived(cfg, "swa_num_attention_heads", heads, "num_attention_heads"),
        "kv": _derived(cfg, "swa_num_key_value_heads", kv_heads, "num_key_value_heads"),
        "head": _derived(cfg, "swa_head_dim", head, "head_dim"),
    }
    ids = local_layers(cfg, n)
    window = _int(cfg, "sliding_window_size", "the local layers' window") if ids else 0
    k = kernel_size(cfg)
    kv = resolve_kv_dtype(c.kv_cache_dtype, c.dtype)
    used = {cfg.field("head_dim"): head} if len(ids) < n else {}
    if ids:
        used[cfg.field("swa_head_dim")] = local["head"]
    _check_backend(c, used, kv)
    bs = c.block(VLLM_BLOCK_SIZE)
    c.resolved = Resolved(BACKENDS["FLASH_ATTN"], bs, "Inkling's attention layers name it (vLLM 0.33)")
    layers: list[FullAttentionSpec] = []
    kinds: list[str] = []
    for i in range(n):
        is_local = i in ids
        sw = "swa_" if is_local else ""  # the field written (a swa_ field left out is the global one's)
        qf, kvf = (f"{sw}{k}" if cfg.data.get(f"{sw}{k}") is not None else k
                   for k in ("num_attention_heads", "num_key_value_heads"))
        q, kvh, hd = (local["heads"], local["kv"], local["head"]) if is_local else (heads, kv_heads, head)
        if c.tp > kvh:  # InklingConvState, built first
            why = f"vLLM 0.33's Inkling conv state asserts tp <= num_kv_heads, got tp = {c.tp}"
            raise spec_error(cfg.field(kvf), kvh, why)
        if q % c.tp:  # InklingAttention
            why = f"not divisible by tp = {c.tp}: vLLM 0.33's InklingAttention asserts it"
            raise spec_error(cfg.field(qf), q, why)
        if kvh % c.tp:
            why = f"not divisible by tp = {c.tp}: vLLM 0.33's InklingAttention asserts it"
            raise spec_error(cfg.field(kvf), kvh, why)
        layers.append(
            SlidingWindowSpec(
                name=f"{PREFIX}.{i}.conv_state", block_size=k, num_kv_heads=kvh // c.tp,
                head_size=conv_head_size(hd, hidden, kvh), head_size_v=0, dtype=CONV_DTYPE, window=k,
            )
        )
        kinds.append("sconv")
        name = f"{PREFIX}.{i}.attn"
        if is_local:
            layers.append(
                SlidingWindowSpec(
                    name=name, block_size=bs, num_kv_heads=kvh // c.tp, head_size=hd, dtype=kv, window=window
                )
            )
            kinds.append("sliding")
        else:
            layers.append(FullAttentionSpec(name=name, block_size=bs, num_kv_heads=kvh // c.tp, head_size=hd,
                                            dtype=kv))
            kinds.append("full")
    for x, kind in zip(layers, kinds, strict=True):
        c.kinds[x.name] = kind
    return group(layers, kinds, c.notes), kv, bs
