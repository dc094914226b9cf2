"""The entry points: a config to vLLM's spec or to tpu-inference's arrays, by engine.

Apart from :mod:`.build` so that :mod:`.tpu_inference` can use vLLM's reading of a config
(:func:`.build.build`) without an import cycle.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import spec_error
from ..native import NativeCacheSpec
from ..spec import KVCacheSpec
from .backends import DEFAULT_DEVICE, check_device
from .base import DEFAULT_NUM_BLOCKS, ENGINES, ModelSpec
from .build import build
from .tpu_inference import NativeModelSpec, tpu_inference_from_config


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
    reader: str = "auto",
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
        why = "a CUDA GPU and its vLLM attention backend apply to engine vllm only"
        if device != DEFAULT_DEVICE:
            raise spec_error("device", device, why)
        raise spec_error("attention_backend", attention_backend, why)
    if engine == "tpu-inference":
        known = inspect.signature(tpu_inference_from_config).parameters
        for key, value in tpu_options.items():
            if key not in known:
                valid = ", ".join(k for k, p in known.items() if p.kind is p.KEYWORD_ONLY)
                raise spec_error(key, value, f"not an option of engine tpu-inference (valid: {valid})")
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
        device=check_device(device) if engine == "vllm" else None,  # None is tpu-inference's: refused here
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
