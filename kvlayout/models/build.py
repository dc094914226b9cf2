"""The entry points: a config to vLLM's spec (and tpu-inference's arrays)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import spec_error
from ..native import NativeCacheSpec
from ..spec import KVCacheSpec
from .backends import DEFAULT_DEVICE, check_device
from .base import DEFAULT_NUM_BLOCKS, ENGINES, Ctx, ModelSpec
from .config import (
    READERS,
    Config,
    check_kv_cache_dtype,
    check_tp,
    load_config,
    resolve_model_dtype,
    text_config,
    through_transformers,
)
from .families import architecture, family_rule
from .tpu_inference import NativeModelSpec, tpu_inference_from_config


def build(
    config: Mapping[str, Any] | str | Path,
    tp: int,
    dtype: str | None,
    kv_cache_dtype: str | None,
    block_size: int | None,
    num_blocks: int,
    mamba_ssm_cache_dtype: str | None,
    *,
    device: str | None = None,
    attention_backend: str | None = None,
    reader: str = "json",
) -> tuple[ModelSpec, Ctx]:
    """vLLM's spec for ``config`` and the context it was read in. ``device`` None (tpu-inference):
    no CUDA backend is resolved, attention takes 16-token blocks and MLA 64."""
    tp = check_tp(tp)
    if device is not None:
        device = check_device(device)
    if reader not in READERS:
        raise spec_error("reader", reader, f"valid: {', '.join(READERS)}")
    notes: list[str] = []
    written = load_config(config)
    data = through_transformers(written, notes) if reader == "transformers" else written
    top = Config(data, "config", completed=data is not written)
    arch, family = architecture(top)
    text = text_config(top)
    model_dtype = resolve_model_dtype(top, text, dtype, notes)
    prefix = "language_model.model.layers" if arch.endswith("ForConditionalGeneration") else "model.layers"
    if family == "deepseek_v3" and text.has("index_topk"):
        family = "deepseek_v32"
    c = Ctx(
        top,
        text,
        family,
        tp,
        model_dtype,
        kv_cache_dtype,
        block_size,
        mamba_ssm_cache_dtype,
        prefix,
        notes,
        {},
        device=device,
        attention_backend=attention_backend,
    )
    c.kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype, family)
    groups, kv, bs = family_rule(family)(c)
    spec = KVCacheSpec(num_blocks=num_blocks, layout="packed", groups=groups)
    r = c.resolved
    ms = ModelSpec(
        spec,
        arch,
        family,
        "vllm",
        tp,
        model_dtype,
        kv,
        bs,
        dict(c.kinds),
        tuple(notes),
        device or "",
        r.backend.name if r else "",
        r.reason if r else "",
    )
    return ms, c


def from_config(
    config: Mapping[str, Any] | str | Path,
    *,
    engine: str = "vllm",
    tp: int = 1,
    dtype: str | None = None,
    kv_cache_dtype: str | None = None,
    block_size: int | None = None,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    mamba_ssm_cache_dtype: str | None = None,
    device: str = DEFAULT_DEVICE,
    attention_backend: str | None = None,
    reader: str = "json",
    **tpu_options: Any,
) -> ModelSpec | NativeModelSpec:
    """What ``engine`` allocates for the model of ``config`` (a dict or a path to ``config.json``)
    on one of ``tp`` ranks, with the decisions made on the way: a :class:`ModelSpec` for vLLM,
    a :class:`NativeModelSpec` (typed per-layer arrays) for tpu-inference. ``device`` (``hopper``,
    ``blackwell``, ``ampere``) and ``attention_backend`` (a vLLM backend name) decide the attention
    backend, hence the block size, as vLLM resolves them (:mod:`.backends`). ``reader="transformers"``
    reads the config through transformers' config class, as vLLM does (defaults, ``text_config``
    completed); the default ``"json"`` reads the fields as written (no torch import). ``tpu_options``:
    tpu-inference's mesh and options (``dp``, ``dcp``, ``model_impl``, ``max_model_len``, ...;
    :func:`.tpu_inference.tpu_inference_from_config`)."""
    if engine not in ENGINES:
        raise spec_error("engine", engine, f"valid: {', '.join(ENGINES)}")
    if engine != "tpu-inference" and tpu_options:
        key = next(iter(tpu_options))
        raise spec_error(key, tpu_options[key], "applies to engine tpu-inference only")
    if engine != "vllm" and (device != DEFAULT_DEVICE or attention_backend is not None):
        raise spec_error(
            "device", device, "a CUDA GPU and its vLLM attention backend apply to engine vllm only"
        )
    if engine == "tpu-inference":
        return tpu_inference_from_config(
            config,
            tp=tp,
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            num_blocks=num_blocks,
            mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
            reader=reader,
            **tpu_options,
        )
    ms, c = build(
        config,
        tp,
        dtype,
        kv_cache_dtype,
        block_size,
        num_blocks,
        mamba_ssm_cache_dtype,
        device=device if engine == "vllm" else None,
        attention_backend=attention_backend,
        reader=reader,
    )
    return ms


def spec_from_config(
    config: Mapping[str, Any] | str | Path, *, engine: str = "vllm", **options: Any
) -> KVCacheSpec | NativeCacheSpec:
    """The kvlayout spec of what ``engine`` allocates for ``config``: :func:`from_config`'s spec,
    with its options (``tp``, ``dtype``, ``kv_cache_dtype``, ``block_size``, ``num_blocks``,
    ``mamba_ssm_cache_dtype``, ``device``, ``attention_backend``, ``reader``). A flat-buffer
    :class:`~kvlayout.KVCacheSpec` for vLLM, a :class:`~kvlayout.native.NativeCacheSpec` of
    per-layer arrays for tpu-inference."""
    return from_config(config, engine=engine, **options).spec
